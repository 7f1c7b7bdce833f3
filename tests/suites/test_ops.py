"""Every row of the op table, four ways: gradcheck in float64, gradgradcheck for smooth rows,
values, gradients and output dtypes against PyTorch in float32 and float64 (skipped without torch),
and float32 values and gradients on every device against the float64 cpu results (the ``device``
fixture: cpu, and cuda where a GPU is present).

The checks use ``minigrad.autograd.gradcheck``/``gradgradcheck``. Two tests keep the table
complete: every public function of ``minigrad.ops`` has a row, and every op class runs in some
row's forward or backward and declares what fusion and export need (``minigrad.ops.op``).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import minigrad
import minigrad.ops as M
from minigrad.autograd.binding import ArrayOps
from minigrad.autograd.function import Function
from minigrad.autograd.gradcheck import gradcheck, gradgradcheck
from minigrad.ops.op import REQUIRED, Op, missing_declarations, required_text
from op_table import OPS, OpInfo

DIFFERENTIABLE = [op for op in OPS if op.differentiable and op.float64 and op.finite_differences]
SMOOTH = [op for op in DIFFERENTIABLE if op.smooth]


def outputs(result) -> list:
    """A callable's result as a list of tensors (split, chunk and max(dim) return several)."""
    return list(result) if isinstance(result, (tuple, list)) else [result]


def float_outputs(fn):
    """``fn`` restricted to its floating outputs (max(dim) also returns int64 indices)."""

    def f(*xs):
        outs = tuple(o for o in outputs(fn(*xs)) if o.dtype.kind == "f")
        return outs[0] if len(outs) == 1 else outs

    return f


def _inputs(op: OpInfo, dtype: str = "float64", requires_grad: bool = True) -> list[minigrad.Tensor]:
    return [minigrad.tensor(a, requires_grad=requires_grad) for a in op.arrays(dtype)]


# -- (a) and (b): gradients against finite differences --------------------------------------------
@pytest.mark.parametrize("op", DIFFERENTIABLE, ids=str)
def test_gradcheck(op: OpInfo):
    assert gradcheck(float_outputs(op.mg), _inputs(op), eps=1e-6, atol=1e-5, rtol=1e-3)


@pytest.mark.parametrize("op", SMOOTH, ids=str)
def test_gradgradcheck(op: OpInfo):
    assert gradgradcheck(float_outputs(op.mg), _inputs(op))


class WrongGrad(minigrad.autograd.Function):
    """sin with the derivative of cos: every checker must reject it."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return -g * x.sin()


def test_gradcheck_rejects_a_wrong_gradient():
    x = minigrad.tensor([0.3, 1.2], dtype=minigrad.float64, requires_grad=True)
    with pytest.raises((AssertionError, RuntimeError)):
        gradcheck(WrongGrad.apply, [x])


@pytest.mark.parametrize("op", OPS, ids=str)
def test_float32_in_float32_out_and_no_graph_under_no_grad(op: OpInfo):
    xs = _inputs(op, "float32", requires_grad=op.differentiable)
    for out in outputs(op.mg(*xs)):
        assert out.dtype.kind != "f" or out.dtype == minigrad.float32, f"{op.name}: float32 input gave {out.dtype}"
        assert out.requires_grad == (op.differentiable and out.dtype.kind == "f")
    with minigrad.no_grad():
        assert all(not out.requires_grad and out.grad_fn is None for out in outputs(op.mg(*xs)))


# Public functions of minigrad.ops that have no row, and why.
NO_ROW = {
    "all_ops": "lists the op classes; not an op",
    "equal": "returns a Python bool (all elements equal), nothing to differentiate",
    "allclose": "returns a Python bool, as equal",
    "copy_from": "in place: writes into an existing tensor (test_tensor.py, test_autograd.py)",
    "fill_": "in place, as copy_from",
    "inplace": "runs an op in place (the a.add_(b) methods, test_tensor.py)",
    "setitem": "in place: t[i] = v (test_indexing.py); index_put is its out-of-place row",
    "multinomial": "random draws with no gradient: test_compat.py checks their distribution",
}
# Op classes that no row runs, and why (tests/distributed runs these under MPI).
NOT_RUN = {
    "CopyToParallel": "model parallelism: needs a process group (tests/distributed runs it under MPI)",
    "ReduceFromParallel": "as CopyToParallel",
    "GatherFromParallel": "as CopyToParallel",
    "ScatterToParallel": "as CopyToParallel",
    "Int8Linear": "an int8 inference kernel without gradient (tests/quantization/test_quantization.py checks it against float "
                  "and onnxruntime)",
    "Int8Conv2d": "as Int8Linear",
    "DynamicInt8Linear": "as Int8Linear",
}

def test_every_public_op_has_a_row():
    names = {op.name.split("[")[0] for op in OPS}
    public = [n for n in dir(M) if not n.startswith("_") and inspect.isfunction(getattr(M, n))]
    missing = [n for n in public if n not in NO_ROW and not any(r == n or r.startswith(n + "_") for r in names)]
    assert not missing, f"public ops without a row in tests/op_table.py (add one, or a reason to NO_ROW): {missing}"


def test_every_op_class_runs_in_a_row_and_declares_what_fusion_and_export_need(monkeypatch):
    seen = set()
    apply = Function.apply.__func__

    def spy(cls, *args, **kwargs):
        seen.add(cls)
        return apply(cls, *args, **kwargs)

    monkeypatch.setattr(Function, "apply", classmethod(spy))
    array_apply = ArrayOps.apply  # rules run by the array binding call an op's forward through it

    def array_spy(self, cls, *args, **kwargs):
        seen.add(cls)
        return array_apply(self, cls, *args, **kwargs)

    monkeypatch.setattr(ArrayOps, "apply", array_spy)
    for op in OPS:  # forward, backward, and backward of backward (the gradients' own backward rules)
        xs = _inputs(op, requires_grad=op.differentiable)
        outs = [o for o in outputs(op.mg(*xs)) if o.requires_grad]
        if outs:
            vs = [minigrad.ones_like(o).requires_grad_() for o in outs]
            grads = minigrad.grad(outs, xs, vs, create_graph=True, allow_unused=True)
            second = [g.sum() for g in grads if g is not None and g.requires_grad]
            if second:
                minigrad.grad(second, xs + vs, allow_unused=True)
    ops = M.all_ops()
    assert not [c.__name__ for c in ops if c not in seen and c.__name__ not in NOT_RUN], "op classes no row runs"
    for cls in ops:
        missing = missing_declarations(cls)
        assert not missing, f"{cls.__name__} ({cls.kind}) must declare {missing} (minigrad.ops.op.REQUIRED)"
        assert cls.autocast in ("low", "fp32", "keep", "promote"), f"{cls.__name__}: autocast {cls.autocast!r}"


def test_op_py_states_the_minimum_the_checks_hold_ops_to():
    doc = " ".join(M.op.__doc__.split())
    assert required_text() in doc, f"minigrad/ops/op.py's docstring must state REQUIRED as: {required_text()}"
    assert "every op: ``onnx`` or ``onnx_refused``" in required_text() and '``"elementwise"``: ``cuda``' in required_text()


def test_missing_declarations_names_each_alternative_an_op_left_out():
    class Bare(Op):
        kind = "elementwise"

    class Reasoned(Op):
        kind = "reduction"
        onnx_refused = "not written yet"

    assert missing_declarations(Bare) == ["onnx or onnx_refused", "cuda"]
    assert missing_declarations(Reasoned) == []
    Bare.kind = "movement"
    assert missing_declarations(Bare) == ["onnx or onnx_refused"]
    assert set(REQUIRED) <= {None, "elementwise", "reduction", "matmul", "movement", "other"}


# -- (c) PyTorch cross-check (skipped when torch is not installed) --------------------------------
@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="torch is not installed: PyTorch cross-checks skipped")


def _tolerance(op: OpInfo, dtype: str) -> tuple[float, float]:
    if dtype == "float64":
        return 1e-7, 1e-9
    return (1e-4, 1e-5) if op.reduction else (1e-5, 1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", OPS, ids=str)
def test_matches_torch(op: OpInfo, dtype: str, torch):
    if dtype == "float64" and not op.float64:
        pytest.skip(f"{op.name} does not support float64")
    rtol, atol = _tolerance(op, dtype)
    arrays = op.arrays(dtype)
    req = op.differentiable
    mx = [minigrad.tensor(a, requires_grad=req) for a in arrays]
    tx = [torch.from_numpy(a.copy()).requires_grad_(req) for a in arrays]
    mo, to = outputs(op.mg(*mx)), outputs(op.th(*tx))

    assert len(mo) == len(to), f"{op.name}: {len(mo)} outputs, torch gives {len(to)}"
    for k, (m, t) in enumerate(zip(mo, to)):
        assert tuple(m.shape) == tuple(t.shape), f"output {k}: shape {tuple(m.shape)}, torch {tuple(t.shape)}"
        assert str(m.dtype) == str(t.dtype).removeprefix("torch."), f"output {k}: dtype {m.dtype}, torch {t.dtype}"
        np.testing.assert_allclose(m.detach().numpy(), t.detach().numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"{op.name}: output {k}")
    if not req:
        assert all(not m.requires_grad for m in mo)
        return

    rng = np.random.default_rng(2)
    pairs = [(m, t, rng.standard_normal(t.shape).astype(dtype)) for m, t in zip(mo, to) if t.requires_grad]
    m_grads = minigrad.grad([m for m, _, _ in pairs], mx, [minigrad.tensor(v) for _, _, v in pairs],
                            allow_unused=True)
    t_grads = torch.autograd.grad([t for _, t, _ in pairs], tx, [torch.from_numpy(v) for _, _, v in pairs],
                                  allow_unused=True)
    for i, (mg, tg, x) in enumerate(zip(m_grads, t_grads, arrays)):
        expected = np.zeros_like(x) if tg is None else tg.numpy()
        actual = np.zeros_like(x) if mg is None else mg.detach().numpy()
        assert actual.shape == x.shape, f"gradient of input {i} has shape {actual.shape}, input {x.shape}"
        assert actual.dtype == x.dtype, f"gradient of input {i} has dtype {actual.dtype}, input {x.dtype}"
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=f"{op.name}: gradient {i}")


# -- (d) every device against the cpu (the cuda cases are skipped without a GPU) -----------------
def _run_on(op: OpInfo, dtype: str, device: str) -> tuple[list, list]:
    """The row's outputs and input gradients (for fixed cotangents), computed on ``device`` and
    copied to the host. The row's constants (indices, masks) are made on ``device`` too."""
    with minigrad.device(device):
        xs = [minigrad.tensor(a, requires_grad=op.differentiable) for a in op.arrays(dtype)]
        outs = outputs(op.mg(*xs))
        grads = []
        if op.differentiable:
            rng = np.random.default_rng(3)
            pairs = [(o, minigrad.tensor(rng.standard_normal(o.shape), dtype=o.dtype)) for o in outs if o.requires_grad]
            grads = minigrad.grad([o for o, _ in pairs], xs, [v for _, v in pairs], allow_unused=True)
    for t in outs + [g for g in grads if g is not None]:
        assert t.device == minigrad.device(device), f"{op.name}: a result is on {t.device}, not on {device}"
    host = lambda t: None if t is None else t.detach().cpu().numpy()  # noqa: E731
    return [host(o) for o in outs], [host(g) for g in grads]


@pytest.mark.parametrize("op", OPS, ids=str)
def test_float32_on_device_matches_float64_on_cpu(op: OpInfo, device: str):
    rtol, atol = _tolerance(op, "float32")
    ref_outs, ref_grads = _run_on(op, "float64" if op.float64 else "float32", "cpu")
    outs, grads = _run_on(op, "float32", device)
    for k, (o, r) in enumerate(zip(outs, ref_outs)):
        if r.dtype.kind == "f":
            assert o.dtype == np.float32, f"{op.name}: output {k} is {o.dtype}"
            np.testing.assert_allclose(o, r, rtol=rtol, atol=atol, err_msg=f"{op.name}: output {k}")
        else:
            np.testing.assert_array_equal(o, r, err_msg=f"{op.name}: output {k}")
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert (g is None) == (r is None), f"{op.name}: gradient {i} is missing on one device"
        if g is not None:
            np.testing.assert_allclose(g, r, rtol=rtol, atol=atol, err_msg=f"{op.name}: gradient {i}")
