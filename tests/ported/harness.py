"""Running a ported program on minigrad and, with its original import lines put back, on PyTorch,
from the same weights. A ported file differs from its source only in its import lines,
each original kept in a comment; ``source(name, "torch")`` puts them back. ``same_draws`` makes the
two libraries start from one set of numbers without touching the program: while it is open, the
random creation functions, the ``nn.init`` functions and every layer's ``reset_parameters`` draw
from one seeded numpy stream, so a program that builds its model the same way gets the same
weights on either library, and its losses and gradients can be compared."""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

HERE = Path(__file__).resolve().parent
TORCH_IMPORT = re.compile(r"^(\s*)\S.*  # ((?:import|from) torch(?!vision)\b.*)$", re.M)
# the MNIST test split that shared/ (beside the repository) holds; tests that need it skip without it
MNIST_DIR = HERE.parents[2] / "shared" / "data" / "mnist"
HAVE_MNIST = (MNIST_DIR / "t10k-images-idx3-ubyte.gz").exists()


def lib_module(lib: str) -> types.ModuleType:
    """``minigrad`` or ``torch`` itself (the caller skips the torch side where torch is absent)."""
    if lib == "torch":
        import torch
        return torch
    import minigrad
    return minigrad


def source(name: str, lib: str = "minigrad") -> str:
    """The ported file's text; for ``lib="torch"`` with its original import lines back in place."""
    text = (HERE / f"{name}.py").read_text()
    if lib == "torch":
        text = TORCH_IMPORT.sub(lambda m: m.group(1) + m.group(2), text)
    return text


@dataclass
class Run:
    """What running a program left: its global names and what it printed."""
    namespace: dict[str, Any]
    stdout: str


def run(name: str, lib: str = "minigrad", argv: list[str] | None = None, main: bool = True,
        cwd: Path | None = None) -> Run:
    """Execute the program (as ``__main__`` unless ``main=False``), with ``argv`` as its command
    line, in directory ``cwd``, printing into the returned ``Run``."""
    module = types.ModuleType("__main__" if main else f"ported_{name}_{lib}")
    module.__file__ = str(HERE / f"{name}.py")
    out = io.StringIO()
    old_argv, old_cwd, old_main = sys.argv, os.getcwd(), sys.modules.get(module.__name__)
    sys.argv = [f"{name}.py", *(argv or [])]
    sys.modules[module.__name__] = module  # dataclasses and pickle look their module up
    sys.path.insert(0, str(HERE))  # programs import their sibling files and torchvision_shim
    import torchvision_shim

    torchvision_shim.LIB = lib  # its images come as this library's tensors
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out):
            exec(compile(source(name, lib), str(HERE / f"{name}.py"), "exec"), module.__dict__)
    except SystemExit as done:  # a program may end with sys.exit(); only a failing status is an error
        if done.code not in (None, 0):
            raise
    finally:
        sys.argv = old_argv
        os.chdir(old_cwd)
        sys.path.remove(str(HERE))
        torchvision_shim.LIB = "minigrad"
        if old_main is None:
            del sys.modules[module.__name__]
        else:
            sys.modules[module.__name__] = old_main
    return Run(module.__dict__, out.getvalue())


def numbers_after(text: str, label: str) -> list[float]:
    """Every number printed right after ``label`` (a regular expression)."""
    return [float(v) for v in re.findall(label + r"\s*([-+0-9.eE]+)", text)]


# -- one set of starting numbers for both libraries ------------------------------------------------
def _fill(lib: types.ModuleType, tensor: Any, values: np.ndarray) -> None:
    with lib.no_grad():
        tensor.copy_(lib.tensor(values.astype(str(tensor.dtype).split(".")[-1])))


@contextlib.contextmanager
def same_draws(lib: types.ModuleType, seed: int = 0) -> Iterator[np.random.Generator]:
    """Within the block, ``lib``'s random creation functions, its ``nn.init`` functions and every
    ``reset_parameters`` of ``lib.nn`` draw from one numpy stream seeded with ``seed``: the same
    program builds the same weights on minigrad and on torch. A layer keeps the zeros and ones its
    reset gives (LayerNorm's); other parameters become U(-b, b) with b = 1/sqrt(fan_in)."""
    rng = np.random.default_rng(seed)
    inside_reset = [False]
    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, new: Any) -> None:
        saved.append((owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)))
        setattr(owner, name, new)

    def creator(draw: Callable[[tuple[int, ...]], np.ndarray]) -> Callable:
        def make(*size: Any, dtype: Any = None, requires_grad: bool = False, **_: Any) -> Any:
            shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
            values = draw(shape)
            out = lib.tensor(values, dtype=dtype or lib.get_default_dtype())
            return out.requires_grad_(requires_grad)
        return make

    patch(lib, "randn", creator(lambda s: rng.standard_normal(s)))
    patch(lib, "rand", creator(lambda s: rng.random(s)))
    patch(lib, "randn_like", lambda t, dtype=None, **_: lib.tensor(rng.standard_normal(tuple(t.shape)),
                                                                     dtype=dtype or t.dtype))

    def init_fn(original: Callable, draw: Callable[[Any, tuple], np.ndarray]) -> Callable:
        def fill(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if inside_reset[0]:
                return original(tensor, *args, **kwargs)
            _fill(lib, tensor, draw(tensor, *args, **kwargs))
            return tensor
        return fill

    def fan_in(t: Any) -> int:
        return max(1, int(np.prod(tuple(t.shape)[1:])) if t.dim() > 1 else int(t.shape[0]))

    uniform_draw = lambda t, *a, **k: rng.uniform(-1, 1, tuple(t.shape)) / math.sqrt(fan_in(t))  # noqa: E731
    normal_draw = lambda t, mean=0.0, std=1.0, *a, **k: mean + std * rng.standard_normal(tuple(t.shape))  # noqa: E731
    for name, draw in [("normal_", normal_draw), ("uniform_", lambda t, a=0.0, b=1.0, *r, **k: rng.uniform(a, b, tuple(t.shape))),
                       ("xavier_uniform_", uniform_draw), ("xavier_normal_", uniform_draw),
                       ("kaiming_uniform_", uniform_draw), ("kaiming_normal_", uniform_draw),
                       ("orthogonal_", uniform_draw), ("trunc_normal_", normal_draw)]:
        if hasattr(lib.nn.init, name):
            patch(lib.nn.init, name, init_fn(getattr(lib.nn.init, name), draw))

    def reset(original: Callable) -> Callable:
        def reset_parameters(self: Any, *args: Any, **kwargs: Any) -> Any:
            was, inside_reset[0] = inside_reset[0], True
            try:
                original(self, *args, **kwargs)
            finally:
                inside_reset[0] = was
            for _, p in sorted(self.named_parameters(recurse=False)):
                values = p.detach().numpy()
                if not (np.all(values == 0) or np.all(values == 1)):  # keep zeros and ones (norm layers)
                    _fill(lib, p, rng.uniform(-1, 1, values.shape) / math.sqrt(fan_in(p)))
        return reset_parameters

    layers = [c for c in vars(lib.nn).values() if isinstance(c, type) and issubclass(c, lib.nn.Module)]
    for cls in {base for c in layers for base in c.__mro__}:  # torch keeps Conv2d's reset on _ConvNd
        for name in ("reset_parameters", "_reset_parameters"):
            if name in cls.__dict__:
                patch(cls, name, reset(cls.__dict__[name]))
    try:
        yield rng
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def grads_of(model: Any) -> dict[str, np.ndarray]:
    """Every parameter's gradient, by name (absent gradients left out)."""
    return {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters() if p.grad is not None}


def compare(mg: dict[str, Any], th: dict[str, Any], rtol: float = 1e-4, atol: float = 1e-5) -> float:
    """Assert two runs' ``losses`` (and ``grads``, if given) agree; return the largest loss difference."""
    lm, lt = np.asarray(mg["losses"], dtype=np.float64), np.asarray(th["losses"], dtype=np.float64)
    assert lm.shape == lt.shape and lm.size, (lm, lt)
    np.testing.assert_allclose(lm, lt, rtol=rtol, atol=atol, err_msg="losses")
    for name, g in mg.get("grads", {}).items():
        np.testing.assert_allclose(g, th["grads"][name], rtol=rtol * 10, atol=atol * 10, err_msg=name)
    assert set(mg.get("grads", {})) == set(th.get("grads", {}))
    return float(np.max(np.abs(lm - lt)))
