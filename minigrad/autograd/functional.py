"""Jacobians, Hessians and their products with vectors, all from reverse mode (chapter 02).

``vjp`` (v^T J) is one backward pass. ``jvp`` (J v, forward mode) comes from reverse mode by the
double-vjp trick: ``u -> J^T u`` is linear in a dummy cotangent ``u``, so the vjp of *that*
function with ``v`` is ``J v``. ``jacobian`` takes one vjp per output element; ``hessian`` is the
Jacobian of the gradient; ``vhp`` and ``hvp`` get a Hessian-vector product from two or three
backward passes without forming the Hessian. All of it works because backward rules are minigrad
ops (``create_graph=True``). Signatures and results follow ``torch.autograd.functional``: inputs
are detached and made to require grad inside, and a function of one Tensor gets Tensors back.
"""

from __future__ import annotations

from typing import Any, Callable

from minigrad.autograd.engine import grad
from minigrad.autograd.grad_mode import enable_grad
from minigrad.creation import zeros_like
from minigrad.errors import AutogradError
from minigrad._tensor import Tensor, _wrap

__all__ = ["hessian", "hvp", "jacobian", "jvp", "vhp", "vjp"]

Tensors = Tensor | tuple[Tensor, ...]
_OUTPUTS = "outputs of the user-provided function"  # as error messages name them


def vjp(func: Callable[..., Tensors], inputs: Tensors, v: Tensors | None = None,
        create_graph: bool = False, strict: bool = False) -> tuple[Tensors, Tensors]:
    """``(func(inputs), v^T J)``: the vector-Jacobian product, one backward pass."""
    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "vjp")
        inputs = _prepare(inputs, create_graph, need_graph=True)
        is_outputs_tuple, outputs = _as_tuple(func(*inputs), _OUTPUTS, "vjp")
        _check_requires_grad(outputs, "outputs", strict)
        v = _vector(v, outputs, is_outputs_tuple, create_graph, "vjp", "the function's output")
        result = _fill_in_zeros(_grad(outputs, inputs, v, create_graph), inputs, strict, create_graph, "back")
    outputs, result = _detach(outputs, create_graph), _detach(result, create_graph)
    return _unpack(outputs, is_outputs_tuple), _unpack(result, is_inputs_tuple)


def jvp(func: Callable[..., Tensors], inputs: Tensors, v: Tensors | None = None,
        create_graph: bool = False, strict: bool = False) -> tuple[Tensors, Tensors]:
    """``(func(inputs), J v)``: the Jacobian-vector product, by the double-vjp trick."""
    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "jvp")
        inputs = _prepare(inputs, create_graph, need_graph=True)
        v = _vector(v, inputs, is_inputs_tuple, create_graph, "jvp", "the input")
        is_outputs_tuple, outputs = _as_tuple(func(*inputs), _OUTPUTS, "jvp")
        _check_requires_grad(outputs, "outputs", strict)
        # J^T u is linear in u, so u's value never enters the second backward: zeros will do.
        u = tuple(zeros_like(o, requires_grad=True) for o in outputs)
        grad_inputs = _grad(outputs, inputs, u, create_graph=True)
        _check_requires_grad(grad_inputs, "grad_inputs", strict)
        result = _fill_in_zeros(_grad(grad_inputs, u, v, create_graph), outputs, strict, create_graph,
                                "back_trick")
    outputs, result = _detach(outputs, create_graph), _detach(result, create_graph)
    return _unpack(outputs, is_outputs_tuple), _unpack(result, is_outputs_tuple)


def jacobian(func: Callable[..., Tensors], inputs: Tensors, create_graph: bool = False,
             strict: bool = False) -> Tensor | tuple:
    """The Jacobian, one backward pass per output element (``minigrad.func.jacrev`` batches them
    into one), the rows stacked once.

    Entry ``[i][k]`` has shape ``outputs[i].shape + inputs[k].shape``; the outer tuple is dropped
    when ``func`` returns a Tensor, the inner one when ``inputs`` is a Tensor.
    """
    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "jacobian")
        inputs = _prepare(inputs, create_graph, need_graph=True)
        is_outputs_tuple, outputs = _as_tuple(func(*inputs), _OUTPUTS, "jacobian")
        _check_requires_grad(outputs, "outputs", strict)
        jac = []
        for i, out in enumerate(outputs):
            rows: list[list[Tensor]] = [[] for _ in inputs]  # rows[k][j] = d out.flat[j] / d inputs[k]
            for j in range(out.numel()):
                row = _grad((out,), inputs, (_unit(out, j),), create_graph, retain_graph=True)
                for k, g in enumerate(_fill_in_zeros(row, inputs, strict, create_graph, "back")):
                    rows[k].append(g)
            jac.append(tuple(_stack(r, x, out.shape + x.shape) for r, x in zip(rows, inputs)))
    return _unpack_nested(_detach(tuple(jac), create_graph), is_outputs_tuple, is_inputs_tuple)


def hessian(func: Callable[..., Tensor], inputs: Tensors, create_graph: bool = False,
            strict: bool = False) -> Tensor | tuple:
    """The Hessian of a scalar function: the Jacobian of its gradient.

    Entry ``[k][l]`` has shape ``inputs[k].shape + inputs[l].shape``; a Tensor when ``inputs`` is one.
    """
    is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "hessian")

    def scalar(*xs: Tensor) -> Tensor:
        return _scalar_output(func, xs, strict, "hessian").reshape(())

    def gradient(*xs: Tensor) -> tuple:
        g = jacobian(scalar, xs, create_graph=True)  # the graph of the gradient is what we differentiate
        _check_requires_grad(g, "jacobian", strict)
        return g

    return _unpack_nested(jacobian(gradient, inputs, create_graph, strict), is_inputs_tuple, is_inputs_tuple)


def vhp(func: Callable[..., Tensor], inputs: Tensors, v: Tensors | None = None,
        create_graph: bool = False, strict: bool = False) -> tuple[Tensor, Tensors]:
    """``(func(inputs), v^T H)`` for a scalar function: the vjp of its gradient, two backward passes."""
    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "vhp")
        inputs = _prepare(inputs, create_graph, need_graph=True)
        v = _vector(v, inputs, is_inputs_tuple, create_graph, "vhp", "the input")
        output = _scalar_output(func, inputs, strict, "vhp")
        jac = _grad((output,), inputs, create_graph=True)
        _check_requires_grad(jac, "jacobian", strict)
        result = _fill_in_zeros(_grad(jac, inputs, v, create_graph), inputs, strict, create_graph,
                                "double_back")
    return _detach(output, create_graph), _unpack(_detach(result, create_graph), is_inputs_tuple)


def hvp(func: Callable[..., Tensor], inputs: Tensors, v: Tensors | None = None,
        create_graph: bool = False, strict: bool = False) -> tuple[Tensor, Tensors]:
    """``(func(inputs), H v)`` for a scalar function, by the double-vjp trick on the gradient.

    For a twice continuously differentiable function H is symmetric and ``vhp`` gives the same
    result with one backward pass less, as torch's documentation notes.
    """
    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "hvp")
        inputs = _prepare(inputs, create_graph, need_graph=True)
        v = _vector(v, inputs, is_inputs_tuple, create_graph, "hvp", "the input")
        output = _scalar_output(func, inputs, strict, "hvp")
        jac = _grad((output,), inputs, create_graph=True)
        _check_requires_grad(jac, "jacobian", strict)
        u = tuple(zeros_like(x, requires_grad=True) for x in inputs)  # H^T u is linear in u
        double_back = _grad(jac, inputs, u, create_graph=True)
        _check_requires_grad(double_back, "hessian", strict)
        result = _fill_in_zeros(_grad(double_back, u, v, create_graph), inputs, strict, create_graph,
                                "double_back_trick")
    return _detach(output, create_graph), _unpack(_detach(result, create_graph), is_inputs_tuple)


# ---------------------------------------------------------------------------------------------
def _as_tuple(x: Any, what: str, fn_name: str) -> tuple[bool, tuple]:
    """``(was it a tuple, the tensors as a tuple)``."""
    is_tuple = isinstance(x, tuple)
    items = x if is_tuple else (x,)
    for i, t in enumerate(items):
        if not isinstance(t, Tensor):
            kind = type(t).__name__
            at = f" but the value at index {i} has type {kind}" if is_tuple else f", got {kind}"
            raise TypeError(f"{fn_name}: the {what} must be a Tensor or a tuple of Tensors{at}")
    return is_tuple, items


def _prepare(tensors: tuple, create_graph: bool, need_graph: bool) -> tuple:
    """Fresh tensors to differentiate with respect to. With ``create_graph`` an input that requires
    grad stays connected to the caller's graph (a differentiable copy), so the result can itself be
    differentiated with respect to the caller's tensors."""
    return tuple(t.clone() if create_graph and t.requires_grad else t.detach().requires_grad_(need_graph)
                 for t in tensors)


def _vector(v: Tensors | None, like: tuple, is_like_tuple: bool, create_graph: bool, fn_name: str,
            of: str) -> tuple:
    """Check ``v`` against the tensors it multiplies; it may be omitted only for one scalar."""
    if v is None:
        if len(like) != 1 or like[0].numel() != 1:
            raise AutogradError(f"{fn_name}: v can only be None if {of} is a single Tensor with a single "
                                "element")
        return (None,)
    _, v = _as_tuple(v, "v", fn_name)
    v = _prepare(v, create_graph, need_graph=False)
    if len(v) != len(like):
        raise AutogradError(
            f"{fn_name}: v is a tuple of invalid length: should be {len(like)} but got {len(v)}"
            if is_like_tuple else f"{fn_name}: the given v should contain a single Tensor"
        )
    for i, (a, b) in enumerate(zip(v, like)):
        if a.shape != b.shape:
            entry = f"entry {i} in " if is_like_tuple else ""
            raise AutogradError(f"{fn_name}: {entry}v has invalid size: should be {tuple(b.shape)} "
                                f"but got {tuple(a.shape)}")
    return v


def _scalar_output(func: Callable, inputs: tuple, strict: bool, fn_name: str) -> Tensor:
    is_tuple, outputs = _as_tuple(func(*inputs), _OUTPUTS, fn_name)
    _check_requires_grad(outputs, "outputs", strict)
    if is_tuple:
        raise AutogradError(f"{fn_name}: the function should return a single Tensor, got a tuple of "
                            f"{len(outputs)}")
    if outputs[0].numel() != 1:
        raise AutogradError(f"{fn_name}: the function should return a Tensor with a single element, "
                            f"got shape {tuple(outputs[0].shape)}")
    return outputs[0]


def _grad(outputs: tuple, inputs: tuple, grad_outputs: tuple | None = None, create_graph: bool = False,
          retain_graph: bool | None = None) -> tuple:
    """``grad`` that skips outputs with no graph and gives None for inputs they do not use."""
    grad_outputs = grad_outputs if grad_outputs is not None else (None,) * len(outputs)
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o is not None and o.requires_grad]
    if not pairs:
        return (None,) * len(inputs)
    outs, gos = zip(*pairs)
    return grad(list(outs), list(inputs), list(gos), retain_graph=retain_graph,
                create_graph=create_graph, allow_unused=True)


_INDEPENDENT = {  # why a gradient is None, by the stage that produced it (strict mode refuses it)
    "back": "the output of the user-provided function is independent of input {i}",
    "back_trick": "the gradient with respect to the input is independent of entry {i} in the grad_outputs "
                  "when using the double backward trick to compute forward mode gradients",
    "double_back": "the jacobian of the user-provided function is independent of input {i}",
    "double_back_trick": "the hessian of the user-provided function is independent of entry {i} in the "
                         "grad_jacobian, which prevents the double backward trick",
}

_NO_GRAPH = {  # why a result must require grad in strict mode, by what it is
    "outputs": "output {i} of the user-provided function does not require gradients; in strict mode the "
               "outputs must be computed in a differentiable manner from the inputs",
    "grad_inputs": "the gradient with respect to input {i} is independent of the inputs of the function",
    "jacobian": "while computing the hessian, the jacobian with respect to input {i} turned out independent "
                "of the inputs (the function must be twice differentiable and not linear)",
    "hessian": "the hessian with respect to input {i} is independent of the inputs (the function must be "
               "thrice differentiable)",
}


def _fill_in_zeros(grads: tuple, refs: tuple, strict: bool, create_graph: bool, stage: str) -> tuple:
    """Zeros for the inputs a result does not depend on (errors in strict mode)."""
    out = []
    for i, (g, ref) in enumerate(zip(grads, refs)):
        if g is None:
            if strict:
                raise AutogradError(_INDEPENDENT[stage].format(i=i) + "; this is not allowed in strict mode")
            g = zeros_like(ref)
        elif strict and create_graph and not g.requires_grad:
            what = "hessian" if "double" in stage else "jacobian"
            raise AutogradError(f"the {what} of the user-provided function is independent of input {i}; "
                                "this is not allowed in strict mode when create_graph=True")
        out.append(g)
    return tuple(out)


def _check_requires_grad(tensors: Tensors, kind: str, strict: bool) -> None:
    if not strict:
        return
    for i, t in enumerate(tensors if isinstance(tensors, tuple) else (tensors,)):
        if t is None:
            raise AutogradError(_INDEPENDENT["back"].format(i=i) + "; this is not allowed in strict mode")
        if not t.requires_grad:
            raise AutogradError(_NO_GRAPH[kind].format(i=i))


def _unit(t: Tensor, j: int) -> Tensor:
    """The one-hot tensor shaped like ``t`` with a 1 at flat index ``j``: picks row j of a Jacobian."""
    unit = t.device.xp.zeros(t.numel(), dtype=t.dtype)
    unit[j] = 1
    return _wrap(unit.reshape(t.shape), t.device)


def _stack(rows: list[Tensor], like: Tensor, shape: tuple) -> Tensor:
    """The Jacobian rows (each shaped like the input ``like``) stacked into ``shape``: one stack op,
    so the result stays differentiable when the rows carry a graph."""
    from minigrad.ops import stack  # ops import autograd, so not at module level

    if not rows:
        return _wrap(like.device.xp.zeros(shape, like.dtype), like.device)
    return stack(rows, 0).reshape(shape)


def _detach(x: Any, create_graph: bool) -> Any:
    """Without ``create_graph`` the results are handed back cut from the internal graph."""
    if create_graph:
        return x
    return tuple(_detach(e, False) for e in x) if isinstance(x, tuple) else x.detach()


def _unpack(res: tuple, is_tuple: bool) -> Tensors:
    return res if is_tuple else res[0]


def _unpack_nested(res: tuple, outer_is_tuple: bool, inner_is_tuple: bool) -> Any:
    if not inner_is_tuple:
        res = tuple(r[0] for r in res)
    return res if outer_is_tuple else res[0]
