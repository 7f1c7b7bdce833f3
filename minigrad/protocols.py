"""What the layers below ``nn`` ask of a model, answered by duck typing (docs/architecture.md).

Tracing, ONNX export, checkpointing and the memory tools take models, yet they sit below
``minigrad.nn`` in the package's layers: nn's layers are built on them, so they never import
``Module`` or ``Parameter``. They ask the questions here instead, which nn's classes answer by what
they declare (as a Python protocol: anything that behaves like a Module is treated as one), and a
model from elsewhere that keeps the same protocol works too (chapter 02 builds ``nn.Module``).
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol, runtime_checkable

__all__ = ["ModuleLike", "is_module", "is_parameter", "is_plain_linear", "is_sequential"]


@runtime_checkable
class ModuleLike(Protocol):
    """A model: it has a training flag, switches modes, runs ``forward``, and lists its submodules,
    parameters and buffers."""

    training: bool

    def train(self, mode: bool = True) -> Any: ...

    def eval(self) -> Any: ...

    def modules(self) -> Iterator[Any]: ...

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Any]]: ...

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Any]]: ...

    def forward(self, *args: Any, **kwargs: Any) -> Any: ...


def is_module(obj: Any) -> bool:
    """True for a model (``nn.Module`` or anything that keeps its protocol)."""
    return isinstance(obj, ModuleLike)


def is_parameter(t: Any) -> bool:
    """True for a trainable weight a model registered (``nn.Parameter`` declares ``_is_param``, as torch's)."""
    return getattr(type(t), "_is_param", False)


def is_sequential(obj: Any) -> bool:
    """True for a chain that runs its layers in order and iterates over them (``nn.Sequential``
    declares ``runs_layers_in_order``), which the memory planner may cut into segments."""
    return getattr(type(obj), "runs_layers_in_order", False)


def is_plain_linear(obj: Any) -> bool:
    """True for a layer whose forward is exactly ``ops.linalg.Linear`` on its ``weight`` and ``bias``
    (``nn.Linear`` declares ``forward_is_linear_op`` in its own class body: a subclass, which may
    change forward, does not count), so checkpointing may run that op's backward instead of the layer."""
    return bool(type(obj).__dict__.get("forward_is_linear_op", False))
