"""Sparse COO tensors (minigrad.sparse), sparse embedding gradients and the optimizers that apply
them, against PyTorch where it is installed, and against numpy's scatter-add for any entries."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minigrad as mg
from minigrad.autograd.gradcheck import gradcheck
from minigrad.errors import ArgumentError, ShapeError

DENSE = np.array([[0.0, 2.0, 0.0, 0.0], [1.0, 0.0, 0.0, -4.0], [0.0, 0.0, 3.0, 0.0]])


def test_to_sparse_and_back_match_torch():
    torch = pytest.importorskip("torch")
    for sparse_dim in (None, 1):
        s = mg.tensor(DENSE).to_sparse(sparse_dim)
        ts = torch.from_numpy(DENSE).to_sparse(sparse_dim or 2)
        assert s.is_sparse and not mg.tensor(DENSE).is_sparse and s.is_coalesced()
        assert np.array_equal(s.indices().numpy(), ts.indices().numpy())
        assert np.array_equal(s.values().numpy(), ts.values().numpy())
        assert s.shape == tuple(ts.shape) and s._nnz() == ts._nnz() and s.sparse_dim() == ts.sparse_dim()
        assert np.array_equal(s.to_dense().numpy(), DENSE)


def test_coalesce_sorts_and_sums_repeats_as_torch():
    torch = pytest.importorskip("torch")
    idx, val = [[2, 0, 2, 1], [1, 3, 1, 0]], [1.0, 2.0, 3.0, 4.0]
    s = mg.sparse_coo_tensor(idx, val, (3, 4))
    ts = torch.sparse_coo_tensor(idx, val, (3, 4))
    assert not s.is_coalesced() and not ts.is_coalesced()
    c, tc = s.coalesce(), ts.coalesce()
    assert np.array_equal(c.indices().numpy(), tc.indices().numpy())
    assert np.array_equal(c.values().numpy(), tc.values().numpy())
    assert np.array_equal(s.to_dense().numpy(), ts.to_dense().numpy())
    assert mg.sparse_coo_tensor(idx, val).shape == tuple(torch.sparse_coo_tensor(idx, val).shape) == (3, 4)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 5), st.floats(-3, 3)), max_size=20))
def test_coalesced_and_dense_agree_with_a_scatter_add(entries):
    idx = np.array([[r for r, _, _ in entries], [c for _, c, _ in entries]], dtype=np.int64).reshape(2, -1)
    val = np.array([v for _, _, v in entries], dtype=np.float64)
    want = np.zeros((5, 6))
    np.add.at(want, tuple(idx), val)
    s = mg.sparse_coo_tensor(idx, val, (5, 6))
    np.testing.assert_allclose(s.to_dense().numpy(), want)
    c = s.coalesce()
    np.testing.assert_allclose(c.to_dense().numpy(), want)
    keys = c.indices().numpy()[0] * 6 + c.indices().numpy()[1]
    assert np.all(np.diff(keys) > 0)  # sorted, each position once


def test_mm_values_and_gradients_match_torch():
    torch = pytest.importorskip("torch")
    d = np.random.default_rng(0).standard_normal((4, 5))
    a = mg.tensor(DENSE, requires_grad=True)
    x = mg.tensor(d, requires_grad=True)
    ta, tx = torch.from_numpy(DENSE).to_sparse().requires_grad_(), torch.from_numpy(d).requires_grad_()
    y, ty = mg.sparse.mm(a.to_sparse(), x), torch.sparse.mm(ta, tx)
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy())
    (y ** 2).sum().backward()
    (ty ** 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.to_dense().numpy())  # only at the stored entries


def test_mm_gradients_by_finite_differences():
    s = mg.sparse_coo_tensor([[0, 2, 2, 0], [1, 0, 3, 1]], [1.0, -2.0, 0.5, 3.0], (3, 4))
    x = mg.tensor(np.random.default_rng(1).standard_normal((4, 2)), requires_grad=True)
    assert gradcheck(lambda d: mg.sparse.mm(s, d), [x])
    v = mg.tensor([1.0, -2.0, 0.5, 3.0], dtype=mg.float64, requires_grad=True)
    assert gradcheck(lambda w: mg.sparse.mm(mg.sparse_coo_tensor(s.indices(), w, (3, 4)), x.detach()), [v])


def test_sparse_embedding_gradient_matches_torch():
    torch = pytest.importorskip("torch")
    e = mg.nn.Embedding(6, 3, sparse=True)
    te = torch.nn.Embedding(6, 3, sparse=True)
    with torch.no_grad():
        te.weight.copy_(torch.from_numpy(e.weight.array))
    for batch in ([1, 1, 4], [[2, 4]]):
        (e(mg.tensor(batch)) ** 2).sum().backward()
        (te(torch.tensor(batch)) ** 2).sum().backward()
    g, tg = e.weight.grad, te.weight.grad
    assert g.is_sparse and tg.is_sparse and not g.is_coalesced() and g._nnz() == 5  # one row per lookup
    assert np.array_equal(g.coalesce().indices().numpy(), tg.coalesce().indices().numpy())
    np.testing.assert_allclose(g.to_dense().numpy(), tg.to_dense().numpy(), rtol=1e-6)
    dense = mg.tensor(np.ones((6, 3), dtype=np.float32))
    np.testing.assert_allclose((g + dense).numpy(), (torch.ones(6, 3) + tg).numpy(), rtol=1e-6)


@pytest.mark.parametrize("opt,kw", [("SGD", dict(lr=0.1)), ("SGD", dict(lr=0.1, momentum=0.9)),
                                    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
                                    ("SGD", dict(lr=0.1, momentum=0.5, dampening=0.3, maximize=True)),
                                    ("SparseAdam", dict(lr=0.05)), ("SparseAdam", dict(lr=0.05, maximize=True))])
def test_optimizers_apply_sparse_gradients_as_torch(opt, kw):
    torch = pytest.importorskip("torch")
    e = mg.nn.Embedding(8, 2, sparse=True, dtype=mg.float64)
    te = torch.nn.Embedding(8, 2, sparse=True, dtype=torch.float64)
    with torch.no_grad():
        te.weight.copy_(torch.from_numpy(e.weight.array))
    o, to = getattr(mg.optim, opt)(e.parameters(), **kw), getattr(torch.optim, opt)(te.parameters(), **kw)
    for batch in ([1, 1, 5], [2, 5], [7], [1, 3, 3]):
        o.zero_grad()
        to.zero_grad()
        (e(mg.tensor(batch)) ** 3).sum().backward()
        (te(torch.tensor(batch)) ** 3).sum().backward()
        o.step()
        to.step()
        np.testing.assert_allclose(e.weight.detach().numpy(), te.weight.detach().numpy(), rtol=1e-12)


def test_a_module_zeroes_and_converts_its_sparse_gradients():
    emb = mg.nn.Embedding(10, 3, sparse=True)
    emb(mg.tensor([1, 2, 2])).sum().backward()
    emb.to(mg.float64)  # the values convert, the indices stay int64
    g = emb.weight.grad
    assert g.is_sparse and g.dtype == mg.float64 and g.indices().dtype == mg.int64
    np.testing.assert_array_equal(g.to_dense().numpy().sum(1), [0, 3, 6, 0, 0, 0, 0, 0, 0, 0])
    emb.zero_grad(set_to_none=False)  # a sparse gradient is dropped, as the optimizers do
    assert emb.weight.grad is None


def test_sgd_with_sparse_momentum_saves_and_resumes_exactly(tmp_path):
    """SGD's sparse momentum buffer goes into a checkpoint as indices, values and size."""
    def run(resume: bool):
        mg.manual_seed(0)
        emb = mg.nn.Embedding(10, 3, sparse=True)
        opt = mg.optim.SGD(emb.parameters(), lr=0.1, momentum=0.9)
        for step, ids in enumerate(([1, 2, 2], [2, 5], [7, 1])):
            if resume and step == 2:
                mg.save({"emb": emb.state_dict(), "opt": opt.state_dict()}, tmp_path / "ck")
                ck = mg.load(tmp_path / "ck")
                emb, opt = mg.nn.Embedding(10, 3, sparse=True), None
                emb.load_state_dict(ck["emb"])
                opt = mg.optim.SGD(emb.parameters(), lr=0.1, momentum=0.9)
                opt.load_state_dict(ck["opt"])
                assert opt.state[emb.weight]["momentum_buffer"].is_sparse
            opt.zero_grad()
            (emb(mg.tensor(ids)) ** 2).sum().backward()
            opt.step()
        return emb.weight.detach().numpy()

    np.testing.assert_array_equal(run(resume=True), run(resume=False))


@pytest.mark.parametrize("edit", ["float indices", "3-d indices", "nnz mismatch", "out of range", "dense dims"])
def test_a_damaged_sparse_tensor_in_a_checkpoint_is_refused(tmp_path, edit):
    from checkpoint_mutants import members, npy_header, with_array, with_meta
    import json
    from minigrad.serialization import CheckpointError

    mg.save({"s": mg.sparse_coo_tensor([[0, 2], [1, 0]], [1.0, 2.0], (3, 2))}, tmp_path / "ok")
    entries = members((tmp_path / "ok").read_bytes())
    meta = json.loads(entries["metadata.json"])
    if edit == "dense dims":
        meta["tree"]["__dict__"][0][1]["size"] = [3, 2, 4]
        data = with_meta(entries, json.dumps(meta))
    else:
        shape, descr, body = {"float indices": ((2, 2), "<f8", b"\0" * 32),
                              "3-d indices": ((2, 2, 1), "<i8", b"\0" * 32),
                              "nnz mismatch": ((2, 3), "<i8", b"\0" * 48),
                              "out of range": ((2, 2), "<i8", np.array([[0, 9], [1, 0]], np.int64).tobytes())}[edit]
        data = with_array(entries, 0, npy_header(shape, descr) + body)
    (tmp_path / "bad").write_bytes(data)
    with pytest.raises(CheckpointError, match="sparse tensor"):
        mg.load(tmp_path / "bad")


def test_optimizers_that_cannot_take_sparse_gradients_say_so():
    e = mg.nn.Embedding(4, 2, sparse=True)
    e(mg.tensor([1])).sum().backward()
    with pytest.raises(ArgumentError, match="Adam does not support sparse gradients"):
        mg.optim.Adam(e.parameters()).step()
    with pytest.raises(ArgumentError, match="weight_decay"):
        mg.optim.SGD(e.parameters(), lr=0.1, weight_decay=0.1).step()
    d = mg.nn.Embedding(4, 2)
    d(mg.tensor([1])).sum().backward()
    with pytest.raises(ArgumentError, match="dense"):
        mg.optim.SparseAdam(d.parameters()).step()


def test_construction_errors_name_the_shapes():
    with pytest.raises(ShapeError, match="nnz"):
        mg.sparse_coo_tensor([[0, 1]], [1.0, 2.0, 3.0])
    with pytest.raises(ShapeError, match="does not hold"):
        mg.sparse_coo_tensor([[0, 5]], [1.0, 2.0], (3,))
    with pytest.raises(ShapeError, match="cannot multiply"):
        mg.sparse.mm(mg.tensor(DENSE).to_sparse(), mg.zeros(3, 2))
