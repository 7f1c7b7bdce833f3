"""Chapter 01's regions against values worked out by hand: the order of a small graph, the edges
Function.apply records, collate, the shuffle buffer, batching, a checkpoint's save and load, and
the strided view arithmetic (index to offset, is_contiguous, when reshape must copy).

These run with only chapter 01 written (no backward engine), without PyTorch; each class checks
one region and is what ``python -m minigrad.course mutants 1`` runs for it. A failure states the
contract the region breaks.
"""

import io
import zipfile

import numpy as np
import pytest

import minigrad as mg
from minigrad.autograd import Function
from minigrad.autograd.engine import topological_order
from minigrad.data import Pipeline, default_collate
from minigrad.errors import CheckpointError, ShapeError
from minigrad.ops.layout import channels_last, dense_in_order, positions, storage_index


def names(order):
    return [type(node).__name__ for node in order]


class TestTopologicalOrder:
    def test_a_diamond_has_exactly_one_order_and_it_comes_out(self):
        # x -> a = x * 3 -> e = exp(a) -> s = a + e -> sum: the only order with every node before the
        # nodes it reads from is Sum, Add, Exp, Mul, AccumulateGrad(x)
        x = mg.tensor([0.5, -1.0], requires_grad=True)
        a = x * 3
        s = (a + a.exp()).sum()
        order = topological_order([s.grad_fn])
        assert names(order) == ["Sum", "Add", "Exp", "Mul", "AccumulateGrad"], (
            f"a topological order lists every node once, each before the nodes it reads from (outputs first); "
            f"got {names(order)}")

    def test_every_node_once_and_before_its_inputs_on_a_wider_graph(self):
        x = mg.tensor([1.0, 2.0], requires_grad=True)
        y = mg.tensor([3.0, 4.0], requires_grad=True)
        h = [x * y, x + y, x.exp()]
        out = ((h[0] * h[1]) + (h[1] * h[2]) + (h[0] * h[2])).sum()
        order = topological_order([out.grad_fn])
        assert len(order) == len(set(order)), "a topological order lists every node exactly once"
        position = {node: i for i, node in enumerate(order)}
        for node in order:
            for edge in node.next_functions:
                if edge is not None:
                    assert position[node] < position[edge[0]], (
                        f"{node.name()} must come before {edge[0].name()}, the node it reads from")
        # h: Mul, Add, Exp; the products: 3 Mul; 2 Add; Sum; an AccumulateGrad for x and for y
        assert len(order) == 11, f"every node reachable from the root, once: {names(order)}"

    def test_several_roots_share_their_nodes(self):
        x = mg.tensor(2.0, requires_grad=True)
        a = x * 2
        order = topological_order([(a * 3).grad_fn, (a + 1).grad_fn])
        assert len(order) == len(set(order)) == 4, f"shared nodes are listed once: {names(order)}"
        assert names(order)[-2:] == ["Mul", "AccumulateGrad"], names(order)


class TestApplyEdges:
    def test_a_leaf_that_requires_grad_gets_an_accumulator_edge_and_a_constant_none(self):
        x = mg.tensor([1.0, 2.0], requires_grad=True)
        c = mg.tensor([3.0, 4.0])
        edges = (x * c).grad_fn.next_functions
        assert len(edges) == 2 and edges[1] is None, (
            f"an input that does not require grad has no in-edge (None); got {edges}")
        node, nr = edges[0]
        assert type(node).__name__ == "AccumulateGrad" and node.variable is x and nr == 0, (
            "a leaf that requires grad is reached through its AccumulateGrad node, output 0")
        assert (x * 2).grad_fn.next_functions[0][0] is node, "a leaf has one AccumulateGrad node, shared by every use"

    def test_output_numbers_of_a_multi_output_function(self):
        class Split(Function):
            @staticmethod
            def forward(ctx, a):
                return a[:1].clone(), a[1:].clone()

            @staticmethod
            def backward(ctx, g0, g1):
                return g0  # never called: chapter 01 only builds the graph

        x = mg.tensor([1.0, 2.0, 3.0], requires_grad=True)
        first, second = Split.apply(x)
        edge = (second * 2).grad_fn.next_functions[0]
        assert edge == (second.grad_fn, 1), (
            f"the second output of a Function is reached through output number 1; got {edge}")
        assert (first * 2).grad_fn.next_functions[0] == (first.grad_fn, 0)

    def test_needs_input_grad_says_which_inputs_require_grad(self):
        seen = []

        class Probe(Function):
            @staticmethod
            def forward(ctx, a, b, k):
                seen.append(ctx.needs_input_grad)
                return a * b * k

            @staticmethod
            def backward(ctx, g):
                return None, None, None

        Probe.apply(mg.tensor([1.0], requires_grad=True), mg.tensor([2.0]), 3.0)
        assert seen == [(True, False, False)], (
            f"needs_input_grad is true exactly for the tensor inputs that require grad; got {seen}")


class TestCollate:
    def test_tensors_are_stacked_into_one_batch_tensor(self):
        batch = default_collate([mg.tensor([1.0, 2.0]), mg.tensor([3.0, 4.0]), mg.tensor([5.0, 6.0])])
        assert isinstance(batch, mg.Tensor), f"a batch of tensors is one stacked tensor, not a {type(batch).__name__}"
        np.testing.assert_array_equal(batch.numpy(), [[1, 2], [3, 4], [5, 6]])

    def test_pairs_are_collated_field_by_field(self):
        batch = default_collate([(mg.tensor([1.0, 2.0]), 0), (mg.tensor([3.0, 4.0]), 1), (mg.tensor([5.0, 6.0]), 2)])
        assert isinstance(batch, (list, tuple)) and len(batch) == 2, (
            f"a batch of (x, y) samples is (the x's stacked, the y's stacked); got {len(batch)} fields")
        np.testing.assert_array_equal(batch[0].numpy(), [[1, 2], [3, 4], [5, 6]])
        np.testing.assert_array_equal(batch[1].numpy(), [0, 1, 2])

    def test_dicts_and_numpy_arrays(self):
        batch = default_collate([{"x": np.ones(2), "id": 7}, {"x": np.zeros(2), "id": 8}])
        np.testing.assert_array_equal(batch["x"].numpy(), [[1, 1], [0, 0]])
        np.testing.assert_array_equal(batch["id"].numpy(), [7, 8])


class TestShuffle:
    def test_a_small_buffer_still_moves_most_elements(self):
        # with a buffer of 10, an element stays in place only when it is drawn at its own turn:
        # a little over 1 in 10 on average. A buffer used as a queue keeps the order.
        in_place = [sum(v == k for k, v in enumerate(Pipeline.range(100).shuffle(10, seed=s))) for s in range(20)]
        assert sum(in_place) / len(in_place) < 30, (
            f"a shuffle buffer sends out a random element of the buffer, not the oldest: on average "
            f"{sum(in_place) / len(in_place):.0f} of 100 elements stayed in place")

    def test_it_is_a_permutation_and_an_element_comes_at_most_buffer_size_early(self):
        out = list(Pipeline.range(60).shuffle(7, seed=3))
        assert sorted(out) == list(range(60)), "a shuffle sends out every element exactly once"
        assert all(v < k + 7 for k, v in enumerate(out)), "output k is one of the first k + buffer_size inputs"

    def test_a_buffer_larger_than_the_stream_shuffles_all_of_it_uniformly(self):
        # the whole stream sits in the buffer: the end of the stream must be drawn at random too
        firsts = [next(iter(Pipeline.range(5).shuffle(100, seed=s))) for s in range(400)]
        counts = [firsts.count(v) for v in range(5)]
        assert all(40 <= c <= 130 for c in counts), (
            f"when the stream ends, the elements left in the buffer come out in random order; the first "
            f"element over 400 seeds was 0..4 this often: {counts} (about 80 each expected)")
        lasts = [list(Pipeline.range(5).shuffle(100, seed=s))[-1] for s in range(400)]
        assert all(40 <= lasts.count(v) <= 130 for v in range(5)), (
            f"the last element out of a full buffer is random too; over 400 seeds it was 0..4 this often: "
            f"{[lasts.count(v) for v in range(5)]}")


class TestBatch:
    def test_batches_of_4_from_10_elements(self):
        got = [b.tolist() for b in Pipeline.range(10).batch(4)]
        assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]], (
            f"batch(4) groups consecutive elements and keeps the short last batch; got {got}")

    def test_drop_remainder_drops_only_the_short_last_batch(self):
        got = [b.tolist() for b in Pipeline.range(10).batch(4, drop_remainder=True)]
        assert got == [[0, 1, 2, 3], [4, 5, 6, 7]], f"drop_remainder=True drops the short last batch; got {got}"
        assert [b.tolist() for b in Pipeline.range(8).batch(4, drop_remainder=True)] == [[0, 1, 2, 3], [4, 5, 6, 7]]

    def test_pairs_batch_into_a_tuple(self):
        x = mg.arange(6.0).reshape(3, 2)
        y = mg.tensor([0, 1, 2])
        (bx, by), = list(Pipeline.from_tensor_slices((x, y)).batch(3))
        np.testing.assert_array_equal(bx.numpy(), x.numpy())
        np.testing.assert_array_equal(by.numpy(), [0, 1, 2])


def _rewrite_member(data: bytes, name: str, edit) -> bytes:
    """The checkpoint ``data`` with member ``name`` changed by ``edit`` (zip CRCs made valid again)."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members[name] = edit(members[name])
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        for n, raw in members.items():
            z.writestr(n, raw)
    return out.getvalue()


class TestCheckpoint:
    def test_round_trip_keeps_each_tensor_under_its_name(self, tmp_path):
        state = {"w": mg.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), "b": mg.tensor([7.0, 8.0]),
                 "step": mg.tensor(3), "nested": [mg.tensor([9.0]), 4]}
        mg.save(state, tmp_path / "ck.mg")
        back = mg.load(tmp_path / "ck.mg")
        assert set(back) == set(state)
        for key in ("w", "b", "step"):
            assert back[key].shape == state[key].shape and back[key].dtype == state[key].dtype, (
                f"'{key}' must load with the shape and dtype it was saved with")
            np.testing.assert_array_equal(back[key].numpy(), state[key].numpy(), err_msg=f"'{key}' loaded other values")
        np.testing.assert_array_equal(back["nested"][0].numpy(), [9.0])
        assert back["nested"][1] == 4

    def test_a_modified_array_is_refused(self, tmp_path):
        mg.save({"w": mg.tensor([1.0, 2.0, 3.0]), "b": mg.tensor([4.0])}, tmp_path / "ck.mg")
        data = (tmp_path / "ck.mg").read_bytes()
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            first = next(n for n in z.namelist() if n.endswith(".npy"))
        flipped = _rewrite_member(data, first, lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]))
        (tmp_path / "bad.mg").write_bytes(flipped)
        with pytest.raises(CheckpointError, match="checksum"):
            mg.load(tmp_path / "bad.mg")
            pytest.fail("loading must compare each array with its sha256 digest and refuse a modified one")

    def test_the_file_is_a_zip_of_npy_arrays_and_metadata(self, tmp_path):
        mg.save({"w": mg.tensor([1.0, 2.0])}, tmp_path / "ck.mg")
        with zipfile.ZipFile(tmp_path / "ck.mg") as z:
            arrays = [n for n in z.namelist() if n.endswith(".npy")]
            assert len(arrays) == 1 and "metadata.json" in z.namelist()
            np.testing.assert_array_equal(np.load(io.BytesIO(z.read(arrays[0])), allow_pickle=False), [1.0, 2.0])


def shares_storage(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


class TestStorageIndex:
    def test_offsets_of_one_element_worked_out_by_hand(self):
        # element [1, 2] of x = arange(12).reshape(3, 4): row 1 starts at 4, plus 2 -> 6; of x.T,
        # strides (1, 4): 1 + 8 -> 9; element [2, 1] of x[:, 1:3], strides (4, 1) from offset 1: 1 + 8 + 1 -> 10
        for index, stride, offset, want in [((1, 2), (4, 1), 0, 6), ((1, 2), (1, 4), 0, 9), ((2, 1), (4, 1), 1, 10),
                                            ((1, 0, 2), (12, 4, 1), 5, 19), ((2,), (3,), 4, 10), ((), (), 3, 3)]:
            got = storage_index(index, stride, offset)
            assert got == want, (f"element {index} of a view with strides {stride} at storage offset {offset} is "
                                 f"storage element offset + sum(index * stride) = {want}; got {got}")

    def test_every_position_of_a_window_view(self):
        # windows of 3 over a signal of 6, one element apart, starting 1 element in
        got = np.asarray(positions(np, (3, 3), (1, 1), 1)).tolist()
        assert got == [[1, 2, 3], [2, 3, 4], [3, 4, 5]], f"positions of as_strided((3, 3), (1, 1), 1): got {got}"
        got = np.asarray(positions(np, (2, 3), (1, 2), 0)).tolist()
        assert got == [[0, 2, 4], [1, 3, 5]], f"positions of a column-major (2, 3) view, strides (1, 2): got {got}"

    def test_as_strided_reads_and_bounds_its_view_by_that_rule(self):
        x = mg.arange(6.0)
        np.testing.assert_array_equal(x.as_strided((2, 2), (2, 1), 2).numpy(), [[2, 3], [4, 5]])
        with pytest.raises(ShapeError, match="storage of 6 elements"):
            x.as_strided((2, 2), (2, 1), 3)  # its last element, [1, 1], would be storage element 3 + 2 + 1 = 6
            pytest.fail("as_strided refuses a view whose last element, offset + sum((size - 1) * stride), "
                        "lies past the storage's end")


class TestIsContiguous:
    def test_dense_layouts_worked_out_by_hand(self):
        row_major = (0, 1, 2)
        for shape, stride, want in [((2, 3, 4), (12, 4, 1), True), ((2, 3, 4), (1, 2, 6), False),
                                    ((2, 3, 4), (12, 1, 3), False), ((3, 4), (8, 2), False),
                                    ((2, 3, 4), (24, 8, 2), False), ((2, 3, 4), (12, 4, 0), False)]:
            got = dense_in_order(shape, stride, row_major[:len(shape)])
            assert got == want, f"shape {shape} with strides {stride} is {'' if want else 'not '}row-major dense; got {got}"

    def test_a_size_1_dim_may_have_any_stride(self):
        for shape, stride in [((4, 1), (1, 7)), ((1, 4), (9, 1)), ((2, 1, 3), (3, 0, 1))]:
            assert dense_in_order(shape, stride, range(len(shape))), (
                f"shape {shape} with strides {stride} is row-major dense: a dim of size 1 is never stepped "
                f"along, so its stride does not matter (PyTorch's rule)")

    def test_it_agrees_with_numpy_on_views(self):
        x = mg.arange(24.0).reshape(2, 3, 4)
        for v in [x, x.transpose(0, 2), x[:, 1:], x[:, :, 1:3], x[1], x[:1], x[:, :1].expand(2, 5, 4),
                  x.permute(1, 0, 2), x[:, None], x.reshape(6, 4)[::2]]:
            want = bool(v.array.flags.c_contiguous)
            got = dense_in_order(v.shape, v.stride(), range(v.ndim))
            assert got == want, f"shape {tuple(v.shape)} with strides {v.stride()}: numpy says dense={want}, got {got}"

    def test_channels_last(self):
        img = mg.arange(24.0).reshape(2, 3, 2, 2)
        nhwc = img.to(memory_format=channels_last)
        assert nhwc.stride() == (12, 1, 6, 3)
        assert nhwc.is_contiguous(memory_format=channels_last), (
            "(N, C, H, W) with strides (12, 1, 6, 3) is dense in channels_last's order (N, H, W, C)")
        assert not img.is_contiguous(memory_format=channels_last), (
            "(N, C, H, W) with strides (12, 4, 2, 1) is not dense in channels_last's order")


class TestViewOrCopy:
    def test_a_contiguous_tensor_views_as_any_shape_of_its_size(self):
        x = mg.arange(12.0).reshape(3, 4)
        for shape in [(12,), (2, 6), (2, 2, 3), (3, 1, 4, 1), (1, 12)]:
            v = x.view(shape)
            assert shares_storage(v, x) and v.shape == shape
        np.testing.assert_array_equal(x.view(2, 6).numpy(), np.arange(12.0).reshape(2, 6))

    def test_a_transpose_views_only_as_shapes_that_keep_its_chunks(self):
        t = mg.arange(12.0).reshape(3, 4).T  # (4, 3), strides (1, 4): two chunks, 4 and 3
        v = t.view(2, 2, 3)
        assert v.stride() == (2, 1, 4), f"(4, 3) with strides (1, 4) viewed as (2, 2, 3): strides (2, 1, 4); got {v.stride()}"
        np.testing.assert_array_equal(v.numpy(), t.numpy().reshape(2, 2, 3))
        for shape in [(12,), (3, 4), (6, 2)]:
            with pytest.raises(ShapeError, match="without a copy"):
                t.view(shape)
                pytest.fail(f"(4, 3) with strides (1, 4) cannot be viewed as {shape}: it would need one stride "
                            f"across the two chunks")

    def test_evenly_spaced_elements_are_one_chunk(self):
        y = mg.arange(24.0).reshape(4, 6)[:, ::2]  # (4, 3), strides (6, 2): 12 elements, 2 apart
        v = y.view(12)
        assert v.stride() == (2,) and shares_storage(v, y), (
            f"(4, 3) with strides (6, 2) is one run of 12 elements 2 apart: view(12) has stride (2,); got {v.stride()}")
        np.testing.assert_array_equal(v.numpy(), np.arange(0.0, 24.0, 2.0))

    def test_a_size_1_dim_never_breaks_a_chunk(self):
        z = mg.arange(6.0).reshape(2, 3)[:, None, :]  # (2, 1, 3); the size-1 dim's stride is 0
        v = z.view(6)
        assert shares_storage(v, z) and v.stride() == (1,)

    def test_reshape_copies_exactly_when_view_refuses(self):
        x = mg.arange(24.0).reshape(2, 3, 4)
        for v, shape in [(x.transpose(1, 2), (2, 12)), (x.transpose(1, 2), (8, 3)), (x[:, :, ::2], (12,)),
                         (x[:, 1:], (16,)), (x[:, 1:], (2, 8)), (x.permute(2, 0, 1), (4, 6)), (x[:, :2, :2], (2, 4))]:
            try:
                v.view(shape)
                viewable = True
            except ShapeError:
                viewable = False
            copied = not shares_storage(v.reshape(shape), v)
            assert copied != viewable, (f"shape {tuple(v.shape)} with strides {v.stride()} as {shape}: view "
                                        f"{'works' if viewable else 'refuses'}, and reshape {'copies' if copied else 'does not'}")
