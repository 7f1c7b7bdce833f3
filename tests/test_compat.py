"""PyTorch programs run unchanged (issue 15): the names they reach for exist and behave as torch's.

The ops with gradients (tril, triu, masked_fill, topk, norm) have rows in ``op_table.py``; this
module checks the rest: random streams, typed constructors, ``Size`` and formatting, grad modes,
attention, the settings modules, mixed-precision spellings, save/load on file objects, the lazy
sampler, and the clear errors for what minigrad does not implement.
"""

import io
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minigrad as mg
import minigrad.nn.functional as F
from minigrad.errors import DTypeError


def test_utils_data_is_the_data_package_by_import_and_by_attribute():
    from minigrad.utils.data import (  # noqa: F401
        BatchSampler, DataLoader, Dataset, DistributedSampler, RandomSampler, SequentialSampler, Subset,
        TensorDataset, default_collate, get_worker_info, random_split,
    )

    assert mg.utils.data.DataLoader is mg.data.DataLoader is DataLoader
    assert mg.utils.data.DistributedSampler is mg.distributed.DistributedSampler
    assert mg.utils.checkpoint.checkpoint is mg.memory.checkpoint
    x, y = mg.randn(10, 3), mg.arange(10)
    batches = list(DataLoader(TensorDataset(x, y), batch_size=4))
    assert [b[0].shape for b in batches] == [(4, 3), (4, 3), (2, 3)]


def test_generator_replays_randperm_rand_randn_multinomial_and_random_split():
    def draw(g):
        return (mg.randperm(10, generator=g).tolist(), mg.rand(3, generator=g).tolist(),
                mg.randn(2, generator=g).tolist(), mg.randint(0, 5, (4,), generator=g).tolist(),
                mg.multinomial(mg.ones(6), 3, generator=g).tolist(),
                [s.indices for s in mg.utils.data.random_split(range(6), [3, 3], generator=g)])

    assert draw(mg.Generator().manual_seed(3)) == draw(mg.Generator().manual_seed(3))
    assert draw(mg.Generator().manual_seed(3)) != draw(mg.Generator().manual_seed(4))
    g = mg.Generator().manual_seed(5)
    state = g.get_state()
    first = mg.randperm(8, generator=g).tolist()
    assert mg.randperm(8, generator=g.set_state(state)).tolist() == first
    assert g.initial_seed() == 5 and sorted(first) == list(range(8))


def test_dataloader_shuffles_with_a_minigrad_generator():
    ds = mg.utils.data.TensorDataset(mg.arange(20))

    def order(seed):
        loader = mg.utils.data.DataLoader(ds, batch_size=5, shuffle=True, generator=mg.Generator().manual_seed(seed))
        return [b[0].tolist() for b in loader]

    assert order(1) == order(1) != order(2)


def test_multinomial_follows_the_weights_with_and_without_replacement():
    mg.manual_seed(0)
    w = mg.tensor([0.1, 0.0, 0.6, 0.3])
    counts = np.bincount(mg.multinomial(w, 20000, replacement=True).numpy(), minlength=4) / 20000
    np.testing.assert_allclose(counts, [0.1, 0.0, 0.6, 0.3], atol=0.015)
    rows = mg.tensor([[1.0, 1.0, 0.0], [0.0, 2.0, 5.0]]).multinomial(2)
    assert rows.shape == (2, 2) and rows.dtype == mg.int64
    assert sorted(rows[0].tolist()) == [0, 1] and sorted(rows[1].tolist()) == [1, 2]
    firsts = np.bincount([mg.multinomial(mg.tensor([1.0, 3.0]), 1).item() for _ in range(4000)], minlength=2)
    np.testing.assert_allclose(firsts / 4000, [0.25, 0.75], atol=0.03)
    with pytest.raises(ValueError, match="without replacement"):
        mg.multinomial(w, 4)
    with pytest.raises(ValueError, match="non-negative"):
        mg.multinomial(mg.tensor([1.0, -1.0]), 1)


def test_from_numpy_shares_memory_both_ways():
    a = np.arange(6.0).reshape(2, 3)
    t = mg.from_numpy(a)
    a[0, 0] = 10.0
    t[1, 2] = -1.0
    assert t[0, 0].item() == 10.0 and a[1, 2] == -1.0 and t.dtype == mg.float64
    with pytest.raises(DTypeError):
        mg.from_numpy(np.array(["a"]))


def test_type_names_and_typed_constructors():
    x = mg.FloatTensor([1, 2, 3])
    assert x.dtype == mg.float32 and x.type() == "minigrad.FloatTensor"
    assert mg.LongTensor(2, 3).shape == (2, 3) and mg.LongTensor(2, 3).dtype == mg.int64
    assert x.type("torch.LongTensor").dtype == mg.int64 and x.type(mg.float64).dtype == mg.float64
    assert isinstance(x, mg.FloatTensor) and not isinstance(x, mg.LongTensor) and not isinstance(3, mg.FloatTensor)
    assert mg.BoolTensor([True]).type() == "minigrad.BoolTensor" and mg.FloatTensor().shape == (0,)
    assert x.nelement() == x.numel() == 3
    with pytest.raises(ValueError, match="unknown tensor type"):
        x.type("minigrad.ComplexTensor")


def test_shape_is_a_size_and_prints_as_torch():
    x = mg.zeros(64, 1, 28, 28)
    assert isinstance(x.shape, tuple) and isinstance(x.size(), mg.Size)
    assert repr(x.shape) == "minigrad.Size([64, 1, 28, 28])" and x.shape == (64, 1, 28, 28)
    assert repr(x.shape[1:]) == "minigrad.Size([1, 28, 28])" and x.shape[0] == 64 and x.shape.numel() == 50176
    assert "dtype=minigrad.float64" in repr(mg.zeros(2, dtype=mg.float64))


@settings(max_examples=50, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True, width=32), st.sampled_from([".4f", ".2e", "g", "10.3f", "+.1%"]))
def test_format_of_a_0d_tensor_formats_its_value(v, spec):
    assert f"{mg.tensor(v, dtype=mg.float64):{spec}}" == f"{v:{spec}}"


def test_format_without_a_spec_is_the_repr_and_a_spec_needs_one_element():
    x = mg.tensor([1.0, 2.0])
    assert f"{x}" == repr(x) == str(x)
    assert f"{mg.tensor(3)}" == "tensor(3)" and f"{mg.tensor(3):>4}" == "   3"
    with pytest.raises(TypeError):
        f"{x:.2f}"


def test_inference_mode_is_no_grad_as_context_and_decorator():
    w = mg.ones(2, requires_grad=True)
    with mg.inference_mode():
        assert not (w * 2).requires_grad
        with mg.inference_mode(False):
            assert (w * 2).requires_grad

    @mg.inference_mode()
    def f(x):
        return x * 2

    @mg.inference_mode
    def g(x):
        return x * 2

    assert not f(w).requires_grad and not g(w).requires_grad and (w * 2).requires_grad
    assert mg.autograd.inference_mode is mg.inference_mode


@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "float_mask_scale"])
def test_scaled_dot_product_attention_matches_torch(case):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 5, 4)) for _ in range(3))
    mask = rng.random((5, 5)) > 0.3
    np.fill_diagonal(mask, True)
    kw = {"plain": {}, "causal": {"is_causal": True}, "bool_mask": {"attn_mask": mask},
          "float_mask_scale": {"attn_mask": rng.standard_normal((5, 5)), "scale": 0.3}}[case]
    mk = {n: mg.tensor(a) if isinstance(a, np.ndarray) else a for n, a in kw.items()}
    tk = {n: torch.tensor(a) if isinstance(a, np.ndarray) else a for n, a in kw.items()}
    qm, km, vm = (mg.tensor(a, requires_grad=True) for a in (q, k, v))
    qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    om, ot = F.scaled_dot_product_attention(qm, km, vm, **mk), torch.nn.functional.scaled_dot_product_attention(
        qt, kt, vt, **tk)
    np.testing.assert_allclose(om.detach().numpy(), ot.detach().numpy(), atol=1e-10)
    (om * om).sum().backward()
    (ot * ot).sum().backward()
    for a, b in ((qm, qt), (km, kt), (vm, vt)):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), atol=1e-9)


def test_bfloat16_is_a_name_that_raises_a_dtype_error_on_use():
    assert repr(mg.bfloat16) == "minigrad.bfloat16"
    assert {"float32": mg.float32, "bfloat16": mg.bfloat16}["bfloat16"] is mg.bfloat16
    for use in (lambda: mg.zeros(2, dtype=mg.bfloat16), lambda: mg.ones(2).to(mg.bfloat16),
                lambda: mg.tensor([1.0], dtype="bfloat16"), lambda: mg.autocast("cpu", dtype=mg.bfloat16)):
        with pytest.raises(DTypeError, match="bfloat16"):
            use()
    assert mg.cuda.is_bf16_supported() is False


def test_backends_and_accelerator_answer_for_minigrad(monkeypatch):
    import minigrad.backends.cudnn as cudnn

    monkeypatch.setattr(cudnn, "benchmark", False)  # restored after: benchmark turns on conv autotuning
    monkeypatch.setattr(mg.backends.cuda.matmul, "allow_tf32", False)
    mg.backends.cuda.matmul.allow_tf32 = True
    cudnn.benchmark = True
    assert mg.backends.cudnn is cudnn and cudnn.benchmark and mg.backends.cuda.matmul.allow_tf32
    assert mg.backends.mps.is_available() is False
    assert mg.accelerator.is_available() == mg.cuda.is_available()
    current = mg.accelerator.current_accelerator()
    assert (current is None) == (not mg.cuda.is_available())


def test_grad_scaler_takes_torchs_argument_orders():
    from minigrad.cuda.amp import GradScaler, autocast

    new = mg.amp.GradScaler("cpu", 8.0, growth_interval=3)
    old = GradScaler(8.0, 3.0)
    assert new.get_scale() == 8.0 and old.get_scale() == 8.0 and old._growth_factor == 3.0
    assert mg.cuda.amp.GradScaler is GradScaler and isinstance(autocast(), mg.amp.autocast)
    with pytest.raises(ValueError, match="device"):
        mg.amp.GradScaler("tpu")


def test_grad_scaler_signatures_accept_torchs_parameter_names():
    torch = pytest.importorskip("torch")
    import inspect

    for mine, theirs in ((mg.amp.GradScaler, torch.amp.GradScaler), (mg.cuda.amp.GradScaler, torch.cuda.amp.GradScaler)):
        assert list(inspect.signature(theirs).parameters) == list(inspect.signature(mine).parameters)


def test_save_and_load_through_file_objects(tmp_path):
    state = {"w": mg.randn(3, 2), "step": 7}
    buf = io.BytesIO()
    mg.save(state, buf)
    buf.seek(0)
    back = mg.load(buf, map_location="cpu", weights_only=True)
    assert back["step"] == 7 and np.array_equal(back["w"].numpy(), state["w"].numpy())
    with open(tmp_path / "ck.pt", "wb") as f:
        mg.save(state, f)
    with open(tmp_path / "ck.pt", "rb") as f:
        assert mg.load(f, weights_only=False)["step"] == 7
    with pytest.raises(mg.serialization.CheckpointError, match="BytesIO"):
        mg.load(io.BytesIO(b"not a checkpoint"))


def test_random_sampler_with_replacement_draws_lazily():
    sampler = mg.utils.data.RandomSampler(range(5), replacement=True, num_samples=10**10)
    first = [i for _, i in zip(range(100), sampler)]
    assert len(sampler) == 10**10 and len(first) == 100 and set(first) <= set(range(5))
    assert len(list(mg.utils.data.RandomSampler(range(5), replacement=True, num_samples=70))) == 70


@pytest.mark.parametrize("path", sorted(__import__("minigrad.unsupported").unsupported.MISSING))
def test_unsupported_features_raise_an_error_naming_them(path):
    import importlib

    module, _, name = path.rpartition(".")
    torch_name = "torch" + path[len("minigrad"):]
    if path in __import__("minigrad.torch_paths").torch_paths.MODULES:  # a module: it imports, its names raise
        module, name, torch_name = path, "anything", torch_name + ".anything"
    with pytest.raises(NotImplementedError, match=f"minigrad does not implement {torch_name}"):
        getattr(importlib.import_module(module), name)


def test_unknown_names_are_still_attribute_errors_pointing_at_the_table():
    with pytest.raises(AttributeError, match="pytorch_compat.md"):
        mg.no_such_function
    assert not hasattr(mg, "no_such_function") and hasattr(mg, "tensor")


def test_topk_returns_named_values_and_indices_as_torch():
    x = mg.tensor([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]])
    values, indices = x.topk(2)
    assert values.tolist() == [[3.0, 2.0], [5.0, 4.0]] and indices.tolist() == [[0, 2], [1, 2]]
    assert mg.topk(x, 1, dim=0, largest=False).indices.tolist() == [[1, 0, 0]]
    assert mg.norm(mg.tensor([3.0, 4.0])).item() == 5.0 and math.isclose(x.norm(math.inf).item(), 5.0)


def test_in_place_masked_fill_and_triangles():
    x = mg.ones(3, 3)
    x.masked_fill_(mg.eye(3, dtype=mg.bool_), 0.0).triu_(0)
    assert x.tolist() == [[0, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert mg.ones(3, 3).tril_(-1).sum().item() == 3
    w = mg.ones(2, 2, requires_grad=True)
    y = w * 1
    y.masked_fill_(mg.tensor([[True, False], [False, True]]), 5.0)
    y.sum().backward()
    assert w.grad.tolist() == [[0, 1], [1, 0]]
