"""``Optimizer``: parameter groups, per-parameter state, ``zero_grad`` and ``state_dict`` (chapter 02).

An optimizer holds references to parameters, grouped in ``param_groups`` (each group a dict of
hyper-parameters plus its ``params``), and a ``state`` dict per parameter (momentum buffers,
Adam's moments). Updates run under ``no_grad`` with in-place tensor ops, so parameters keep
their identity and a traced training step (chapter 03) sees the update as ordinary ops.
``state_dict`` refers to parameters by index, so it can be loaded into a fresh optimizer built
over a fresh model with the same architecture, as in PyTorch.

An update rule is written once and runs under two bindings, as a backward rule does with
``ctx.ops`` (DESIGN.md principle 2): ``self._bind`` hands it the parameter, its gradient and its
state either as Tensors with ``UPDATE_TENSOR_OPS``, when a mode records (a traced step), or as
the arrays inside them with the array module's ``UpdateArrayOps``, when nobody does. In-place
operators (``m *= b1``) and the few ``ops`` functions mean the same under both, bit for bit, and
the array binding skips the graph machinery that an update of a hundred small tensors otherwise
pays about ten times per parameter.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Iterable

from minigrad import backend
from minigrad.autograd import mode
from minigrad.autograd.grad_mode import enable_grad
from minigrad.errors import ArgumentError
from minigrad.creation import tensor
from minigrad._tensor import Tensor, _zero_grad


class Optimizer:
    """Base class: subclasses set ``defaults`` and implement ``step(closure=None)``."""

    accepts_sparse = False  # SGD and SparseAdam apply sparse gradients

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self.state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(params[0], dict):
            params = [{"params": params}]
        for group in params:
            self.add_param_group(group)

    def add_param_group(self, group: dict[str, Any]) -> None:
        group = dict(group)
        ps = group["params"]
        group["params"] = [ps] if isinstance(ps, Tensor) else list(ps)
        for p in group["params"]:
            if not isinstance(p, Tensor):
                raise TypeError(f"{type(self).__name__} can only optimize Tensors, got {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError(f"{type(self).__name__}: can't optimize a non-leaf Tensor (shape {tuple(p.shape)})")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                _zero_grad(p, set_to_none)

    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        raise NotImplementedError(f"{type(self).__name__} does not implement step()")

    def _evaluate(self, closure: Callable[[], Tensor] | None) -> Tensor | None:
        """Run the closure (it recomputes the loss and calls backward) with grad mode on. Every
        step starts here, so here the modes hear that it reads the optimizer's Python numbers."""
        mode.reads_python_state(self)
        if closure is None:
            return None
        with enable_grad():
            return closure()

    def python_state(self) -> tuple:
        """The Python numbers a step reads: each group's hyper-parameters and the numbers in the
        per-parameter state (Adam's step count). No op sees them, so ``minigrad.compile`` makes
        them part of a compiled step's signature instead of freezing them."""
        groups = tuple(tuple((k, v) for k, v in g.items() if k != "params" and _is_number(v))
                       for g in self.param_groups)
        state = tuple(tuple((k, v) for k, v in s.items() if _is_number(v)) for s in self.state.values())
        return groups, state

    @staticmethod
    def _bind(p: Tensor, t: Tensor, *state: Tensor) -> tuple[Any, tuple]:
        """``(ops, (w, g, t, *state))``: parameter ``p``, its gradient, its step count ``t`` and its
        ``state`` tensors as the values an update rule computes on, and the binding ``ops`` for them.
        With a mode on the stack (the tracer of a compiled step), the Tensors themselves and
        ``UPDATE_TENSOR_OPS``, so every op is seen; else, on the cpu, the arrays inside them (the
        step count as a 0-d float64 array) and the array binding, whose in-place writes land in the
        same memory. A gradient of another dtype or device than ``p`` keeps the Tensors, where
        promotion applies, and so does a GPU, where ``ops.scalar``'s float() would wait for the device."""
        g = p.grad
        if (mode.current_modes() or p.device.type != "cpu" or g.array.dtype is not p.array.dtype
                or g.device is not p.device):
            return UPDATE_TENSOR_OPS, (p, g, t) + state
        for x in (p,) + state:
            x._bump_version()  # the writes that follow are in place, as the Tensor binding's
        return _array_update_ops(p.device), (p.array, g.array, t.array) + tuple(s.array for s in state)

    @staticmethod
    def _count_step(state: dict[str, Any], p: Tensor) -> Tensor:
        """Add one to parameter ``p``'s step count and return it: a float64 0-d tensor on ``p``'s
        device (torch keeps a tensor too), so a compiled step (chapter 03) counts as well, and Adam's
        bias corrections computed from it are ops a trace sees. An int count (a new state, an older
        checkpoint) becomes one."""
        step = state.get("step", 0)
        if not isinstance(step, Tensor):
            step = state["step"] = tensor(float(step), dtype=backend.float64, device=p.device)
        if mode.current_modes():
            step += 1  # in place: state["step"] is this tensor, and a trace sees the write
        else:
            step.array += 1  # the same write, without the op machinery (nobody records it)
            step._bump_version()
        return step

    def _params_with_grad(self, group: dict[str, Any]) -> Iterable[Tensor]:
        """The group's parameters that have a gradient; a sparse one (``minigrad.ops.sparse``) is an
        error unless the optimizer sets ``accepts_sparse``, as in PyTorch."""
        for p in group["params"]:
            if p.grad is not None:
                if p.grad.is_sparse and not self.accepts_sparse:
                    raise ArgumentError(f"{type(self).__name__} does not support sparse gradients; use "
                                        "optim.SparseAdam or optim.SGD")
                yield p

    @staticmethod
    def _descent_gradient(p: Tensor, group: dict[str, Any]) -> Tensor:
        """``p``'s gradient negated under ``maximize``, plus ``weight_decay * p`` (L2 regularisation)."""
        g = -p.grad if group["maximize"] else p.grad
        return g + group["weight_decay"] * p if group["weight_decay"] else g

    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {...}}, "param_groups": [{..., "params": [indices]}]}``, as torch."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {
            index[id(p)]: {k: (v.clone() if isinstance(v, Tensor) else v) for k, v in s.items()}
            for p, s in self.state.items() if id(p) in index
        }
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(
                f"load_state_dict: the state has {len(groups)} parameter group(s), the optimizer has "
                f"{len(self.param_groups)}"
            )
        params: dict[int, Tensor] = {}
        for i, (mine, saved) in enumerate(zip(self.param_groups, groups)):
            if len(mine["params"]) != len(saved["params"]):
                raise ValueError(
                    f"load_state_dict: parameter group {i} has {len(saved['params'])} parameter(s) in the "
                    f"state and {len(mine['params'])} in the optimizer"
                )
            params.update(zip(saved["params"], mine["params"]))
        self.state = defaultdict(dict)
        for key, s in state_dict["state"].items():
            p = params[int(key)]
            self.state[p] = {k: _like_param(v, p, k) for k, v in s.items()}
        for mine, saved in zip(self.param_groups, groups):
            mine.update({k: v for k, v in saved.items() if k != "params"})

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in sorted(group.items()) if k != "params"]
        return "\n".join(lines + [")"])


def _like_param(value: Any, p: Tensor, name: str) -> Any:
    """A loaded state tensor, moved to its parameter's device (and dtype, for floating state)."""
    if not isinstance(value, Tensor):
        return value
    if value.shape != p.shape and value.ndim != 0:
        raise ValueError(
            f"load_state_dict: state '{name}' has shape {tuple(value.shape)} but its parameter has "
            f"shape {tuple(p.shape)}"
        )
    if name == "step":  # a step count is float64 (torch's is float32), so bias corrections stay exact
        dtype = backend.float64
    else:  # floating state takes the parameter's dtype
        dtype = p.dtype if value.dtype.kind == "f" else value.dtype
    return value.detach().to(device=p.device, dtype=dtype).clone()


def _is_number(v: Any) -> bool:
    """A Python value a step may read as a number: bool, int, float, None, or a tuple of them (betas)."""
    if isinstance(v, tuple):
        return all(_is_number(x) for x in v)
    return v is None or isinstance(v, (bool, int, float))


class UpdateTensorOps:
    """The recorded binding of an update rule: its values are Tensors, every op is minigrad's."""

    arrays = False

    @staticmethod
    def sqrt(x: Tensor) -> Tensor:
        from minigrad.ops import sqrt

        return sqrt(x)

    @staticmethod
    def maximum(a: Tensor, b: Tensor) -> Tensor:
        from minigrad.ops import maximum

        return maximum(a, b)

    @staticmethod
    def copy_(dst: Tensor, src: Tensor) -> Tensor:
        return dst.copy_(src)

    @staticmethod
    def scalar(x: Tensor) -> Tensor:
        """A number computed from the step count (a bias correction): it stays a 0-d Tensor, so a
        trace sees it change from step to step."""
        return x


class UpdateArrayOps:
    """The unrecorded binding of an update rule on one device: its values are the arrays inside the
    Tensors, its ops the array module's, each the array forward of the op the Tensor binding runs."""

    arrays = True

    def __init__(self, xp: Any) -> None:
        self.sqrt, self.maximum = xp.sqrt, xp.maximum
        self.copyto = xp.copyto

    def copy_(self, dst: Any, src: Any) -> Any:
        self.copyto(dst, src)
        return dst

    @staticmethod
    def scalar(x: Any) -> float:
        """A 0-d float64 result as a Python float. A Tensor op rounds a 0-d float64 operand to the
        other operand's dtype before it computes (PyTorch's promotion); numpy does the same with a
        Python float (NEP 50), and would instead promote the whole array to float64 with a numpy one."""
        return float(x)


UPDATE_TENSOR_OPS = UpdateTensorOps()
_ARRAY_UPDATE_OPS: dict[Any, UpdateArrayOps] = {}


def _array_update_ops(device: Any) -> UpdateArrayOps:
    """The array binding of ``device`` (made once per device)."""
    ops = _ARRAY_UPDATE_OPS.get(device)
    if ops is None:
        ops = _ARRAY_UPDATE_OPS[device] = UpdateArrayOps(device.xp)
    return ops
