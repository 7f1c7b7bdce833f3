"""Fuzzing the public ops against PyTorch: random shapes (0-d and 0-size included), every dtype,
scalars of every kind on either side, and bad arguments (dims out of range, zero chunks...).

Each call must either match PyTorch, value and dtype, or raise one of minigrad's documented
errors (``minigrad.errors``) with a message naming the op. Where PyTorch refuses a call, minigrad
must refuse it too. Cases come from a seeded ``random.Random`` so that a failure prints a case
anyone can rerun (``case(seed)``); hypothesis draws the seeds, a fixed number, derandomized.
"""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minigrad
from minigrad import errors

torch = pytest.importorskip("torch")

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]
DOCUMENTED = (errors.ShapeError, errors.DTypeError, errors.DeviceError, errors.AutogradError,
              errors.ArgumentError)
# how an op's errors may name it besides its own name (the Function's class name)
ALIASES = {"lt": "less", "ne": "notequal", "ge": "greaterequal", "eq": "equal", "and": "bitwise_and",
           "or": "bitwise_or", "invert": "bitwise_not", "reshape": "view", "float": "cast", "long": "cast"}
# Where minigrad deliberately differs from PyTorch: matmul promotes mixed dtypes as every other
# binary op does (torch refuses them); sign(NaN) is NaN as in numpy and IEEE (torch gives 0);
# a Python int the tensor's dtype cannot hold is compared exactly or refused (torch wraps it
# around, so 1 < 2**40 is False for an int16 tensor), and with a float16 tensor it rounds to
# float16 (torch computes with it in float32): the fuzz does not compare those cases.
EXTENSIONS = {"matmul"}
COMPARISONS = {"eq", "ne", "lt", "ge"}


def _dim(r: random.Random, ndim: int) -> int:
    """Mostly a valid dim, sometimes one just out of range."""
    return r.randint(-ndim - 1, ndim) if r.random() < 0.15 else r.randint(-max(ndim, 1), max(ndim, 1) - 1)


def _scalar(r: random.Random):
    return r.choice([0, 1, -1, 2, 3, 2**40, -(2**63), 0.5, -2.5, 1e30, float("inf"), True, False])


# name -> (number of tensor inputs, function of (library, tensors, random) -> call)
UNARY = {
    "neg": lambda L, x, r: -x, "abs": lambda L, x, r: x.abs(), "sign": lambda L, x, r: x.sign(),
    "exp": lambda L, x, r: x.exp(), "log": lambda L, x, r: x.log(), "sqrt": lambda L, x, r: x.sqrt(),
    "rsqrt": lambda L, x, r: x.rsqrt(), "sin": lambda L, x, r: x.sin(), "cos": lambda L, x, r: x.cos(),
    "tanh": lambda L, x, r: x.tanh(), "sigmoid": lambda L, x, r: x.sigmoid(), "relu": lambda L, x, r: x.relu(),
    "invert": lambda L, x, r: ~x, "clone": lambda L, x, r: x.clone(),
    "float": lambda L, x, r: x.float(), "long": lambda L, x, r: x.long(), "bool": lambda L, x, r: x.bool(),
}
BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "pow": lambda a, b: a ** b, "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b, "lt": lambda a, b: a < b, "ge": lambda a, b: a >= b,
    "and": lambda a, b: a & b, "or": lambda a, b: a | b,
}


def _reduce(name):
    def call(L, x, r):
        if r.random() < 0.3:
            return getattr(x, name)()
        return getattr(x, name)(_dim(r, x.ndim), keepdim=r.random() < 0.5)
    return call


def _with_dim(name):
    return lambda L, x, r: getattr(x, name)(_dim(r, x.ndim))


def _index(r: random.Random, x, L, dim: int, n: int):
    size = x.shape[dim % x.ndim] if x.ndim else 1
    idx = [r.randrange(max(size, 1)) for _ in range(n)] if size else []
    return L.tensor(idx, dtype=L.int64)


MOVEMENT = {
    "transpose": lambda L, x, r: x.transpose(_dim(r, x.ndim), _dim(r, x.ndim)),
    "reshape": lambda L, x, r: x.reshape(-1),
    "flatten": lambda L, x, r: x.flatten(),
    "squeeze": _with_dim("squeeze"), "unsqueeze": lambda L, x, r: x.unsqueeze(_dim(r, x.ndim + 1)),
    "flip": lambda L, x, r: x.flip((_dim(r, x.ndim),)),
    "roll": lambda L, x, r: x.roll(r.randint(-3, 3), _dim(r, x.ndim)),
    "narrow": lambda L, x, r: x.narrow(_dim(r, x.ndim), r.randint(-1, 2), r.randint(-1, 2)),
    "chunk": lambda L, x, r: x.chunk(r.randint(0, 3), _dim(r, x.ndim)),
    "split": lambda L, x, r: x.split(r.randint(1, 3), _dim(r, x.ndim)),
    "index_select": lambda L, x, r: (lambda d: x.index_select(d, _index(r, x, L, d, 2)))(_dim(r, x.ndim)),
    "gather": lambda L, x, r: (lambda d, i: x.gather(d, i.reshape((i.numel(),) + (1,) * (x.ndim - 1))
                                                     if x.ndim else i.reshape(())))(
        *(lambda d: (d, _index(r, x, L, d, 1)))(_dim(r, x.ndim))),
    "permute": lambda L, x, r: x.permute(tuple(r.sample(range(x.ndim), x.ndim))),
    "clamp": lambda L, x, r: x.clamp(r.choice([None, -1, 0.5]), r.choice([None, 2, 1.5])),
}
REDUCE = {name: _reduce(name) for name in ("sum", "mean", "prod", "amax", "amin", "all", "any",
                                            "argmax", "argmin", "std")}
REDUCE |= {"max": _reduce("max"), "cumsum": _with_dim("cumsum"), "softmax": _with_dim("softmax"),
           "logsumexp": _with_dim("logsumexp")}
PAIRS = {
    "allclose": lambda L, a, b, r: L.allclose(a, b), "equal": lambda L, a, b, r: L.equal(a, b),
    "maximum": lambda L, a, b, r: L.maximum(a, b), "minimum": lambda L, a, b, r: L.minimum(a, b),
    "cat": lambda L, a, b, r: L.cat([a, b], _dim(r, a.ndim)),
    "stack": lambda L, a, b, r: L.stack([a, b], _dim(r, a.ndim + 1)),
    "matmul": lambda L, a, b, r: a @ b,
    "where": lambda L, a, b, r: L.where(a > 0, a, b),
}
OPS = sorted(UNARY) + sorted(BINARY) + sorted(MOVEMENT) + sorted(REDUCE) + sorted(PAIRS)


def _shape(r: random.Random) -> tuple:
    ndim = r.choice([0, 0, 1, 1, 2, 2, 3])
    return tuple(r.choice([0, 1, 1, 2, 3]) for _ in range(ndim))


def _array(r: random.Random, shape: tuple, dtype: str, name: str) -> np.ndarray:
    rng = np.random.default_rng(r.randrange(2**32))
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("float"):
        a = rng.choice([0.0, -1.5, 0.5, 2.0, 3.25, -0.0, np.inf, np.nan, 1e4], size=shape)
        if name == "sign":
            a[np.isnan(a)] = 1.0
        return a.astype(dtype)
    lo = 0 if dtype == "uint8" else -4
    return rng.integers(lo, 6, size=shape).astype(dtype)


def case(seed: int):
    """(description, call on minigrad, call on torch) for one seeded case."""
    r = random.Random(seed)
    name = r.choice(OPS)
    dtype, dtype2 = r.choice(DTYPES), r.choice(DTYPES)
    shape = _shape(r)
    shape2 = shape if r.random() < 0.6 else _shape(r)
    a, b = _array(r, shape, dtype, name), _array(r, shape2, dtype2, name)
    s, scalar_side = _scalar(r), r.random()
    args_seed = r.randrange(2**32)

    def call(L):
        x, y = L.tensor(a), L.tensor(b)
        rr = random.Random(args_seed)  # the same bad or good arguments for both libraries
        if name in UNARY:
            return UNARY[name](L, x, rr)
        if name in BINARY:
            if scalar_side < 0.5:
                return BINARY[name](x, y)
            return BINARY[name](x, s) if scalar_side < 0.75 else BINARY[name](s, x)
        if name in MOVEMENT:
            return MOVEMENT[name](L, x, rr)
        if name in REDUCE:
            return REDUCE[name](L, x, rr)
        return PAIRS[name](L, x, y, rr)

    if isinstance(s, int) and not isinstance(s, bool) and name in BINARY and scalar_side >= 0.5:
        if dtype == "float16" and abs(s) > 65504 or (
                dtype[0] in "iu" and not np.iinfo(dtype).min <= s <= np.iinfo(dtype).max and name in COMPARISONS):
            s = 1
    what = (f"{name}: x {dtype}{list(shape)}, y {dtype2}{list(shape2)}, scalar {s!r} "
            f"({'tensors' if scalar_side < 0.5 else 'x op s' if scalar_side < 0.75 else 's op x'})")
    return name, what, call


def _flat(out):
    if isinstance(out, (tuple, list)):
        return [o for item in out for o in _flat(item)]
    return [out]


def _same(m, t, name) -> str | None:
    """None when minigrad's result ``m`` matches torch's ``t``; otherwise how it differs."""
    ms, ts = _flat(m), _flat(t)
    if len(ms) != len(ts):
        return f"{len(ms)} outputs, torch {len(ts)}"
    for mo, to in zip(ms, ts):
        if not isinstance(to, torch.Tensor):
            if isinstance(mo, minigrad.Tensor) or mo != to:
                return f"returned {mo!r}, torch {to!r}"
            continue
        if not isinstance(mo, minigrad.Tensor):
            return f"returned {type(mo).__name__}, torch a tensor"
        tdt = str(to.dtype).removeprefix("torch.")
        if mo.dtype.name != tdt:
            return f"dtype {mo.dtype.name}, torch {tdt}"
        if tuple(mo.shape) != tuple(to.shape):
            return f"shape {tuple(mo.shape)}, torch {tuple(to.shape)}"
        mv, tv = mo.detach().numpy(), to.detach().numpy()
        tol = {"float16": 2e-3, "float32": 1e-5}.get(tdt, 1e-12)
        if tdt.startswith("float") and not np.allclose(mv, tv, rtol=tol, atol=tol, equal_nan=True):
            return f"values {mv.tolist()} != torch {tv.tolist()}"
        if not tdt.startswith("float") and not np.array_equal(mv, tv):
            return f"values {mv.tolist()} != torch {tv.tolist()}"
    return None


def check(seed: int) -> str | None:
    """None when the case behaves; otherwise a line saying what went wrong."""
    name, what, call = case(seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = call(torch)
        torch_error = None
    except Exception as e:  # noqa: BLE001 - torch's refusals are any exception type
        expected, torch_error = None, e
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            got = call(minigrad)
    except DOCUMENTED as e:
        message = str(e).lower().replace("_", "")
        if not any(k.replace("_", "") in message for k in (name, ALIASES.get(name, name))):
            return f"{what}: {type(e).__name__} does not name the op: {e}"
        return None
    except Exception as e:  # noqa: BLE001 - any other exception is what the fuzz looks for
        return f"{what}: {type(e).__name__}: {str(e)[:100]}"
    if torch_error is not None:
        return None if name in EXTENSIONS else f"{what}: torch refuses ({str(torch_error)[:60]}) but minigrad returns"
    diff = _same(got, expected, name)
    return f"{what}: {diff}" if diff else None


@settings(max_examples=400, derandomize=True, deadline=None, database=None)
@given(st.integers(0, 2**31))
def test_public_ops_match_torch_or_raise_a_documented_error(seed):
    failure = check(seed)
    assert failure is None, f"case({seed}) {failure}"
