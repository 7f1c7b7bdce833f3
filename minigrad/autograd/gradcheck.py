"""Gradient checking: compare the Jacobian backward computes with one from finite differences (chapter 02).

For every input ``x_i`` that requires grad and every output ``y_j``, the numerical Jacobian moves
one element of ``x_i`` by ``+eps`` and ``-eps`` and takes ``(y(x + eps) - y(x - eps)) / 2 eps``
(central differences, error O(eps^2)); the analytical Jacobian asks the engine for one row at a
time, ``grad(y_j, x, grad_outputs=unit vector)``. They must agree to ``atol + rtol * |numerical|``.
``gradgradcheck`` runs the same check on the gradient function itself, which is how second
derivatives (``create_graph=True``) are tested. Same signatures as ``torch.autograd``.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

from minigrad import backend
from minigrad.autograd.engine import grad
from minigrad.errors import DTypeError
from minigrad._tensor import Tensor, _wrap

__all__ = ["GradcheckError", "gradcheck", "gradgradcheck"]


class GradcheckError(RuntimeError):
    """The analytical and numerical Jacobians disagree (raised by ``gradcheck``, as in torch)."""


def gradcheck(fn: Callable[..., Any], inputs: Tensor | Sequence[Any], eps: float = 1e-6,
              atol: float = 1e-5, rtol: float = 1e-3, raise_exception: bool = True,
              nondet_tol: float = 0.0) -> bool:
    """Check ``fn``'s gradients w.r.t. every float64 input that requires grad, element by element.

    ``fn(*inputs)`` returns a Tensor or a tuple of Tensors. Returns True, or on a mismatch raises
    ``GradcheckError`` naming the input, the output and the worst element (returns False instead
    when ``raise_exception=False``). ``nondet_tol`` is how much two backward passes with the same
    inputs may differ.
    """
    inputs = _as_tuple(inputs)
    wrt = _checked_inputs(inputs)
    outputs = _as_tuple(fn(*inputs))

    numerical = _numerical_jacobian(fn, inputs, wrt, outputs, eps)
    analytical = _analytical_jacobian(inputs, wrt, outputs)
    for (i, j), num in numerical.items():
        ana = analytical[i, j]
        if not inputs[i].device.xp.allclose(ana, num, rtol=rtol, atol=atol):
            return _fail(_mismatch(i, j, inputs[i], outputs[j], num, ana, atol, rtol), raise_exception)

    again = _analytical_jacobian(inputs, wrt, outputs)
    for (i, j), ana in analytical.items():
        if not inputs[i].device.xp.allclose(ana, again[i, j], rtol=0.0, atol=nondet_tol):
            return _fail(
                f"Backward is not reentrant: two backward passes for output {j} with respect to input {i} "
                f"gave different values (max difference {float(abs(ana - again[i, j]).max()):.3g}, "
                f"nondet_tol={nondet_tol}), although the analytical gradient matches the numerical one",
                raise_exception,
            )
    return True


def gradgradcheck(fn: Callable[..., Any], inputs: Tensor | Sequence[Any],
                  grad_outputs: Tensor | Sequence[Tensor] | None = None, eps: float = 1e-6,
                  atol: float = 1e-5, rtol: float = 1e-3, raise_exception: bool = True) -> bool:
    """Check second derivatives: ``gradcheck`` of ``(inputs, v) -> grad(fn(inputs), inputs, v)``.

    The gradient is a function of the inputs and of the cotangents ``v`` (``grad_outputs``, one
    per output that requires grad; random in [-1, 1), seeded, when not given), and is computed
    with ``create_graph=True`` so that backward can run through it.
    """
    inputs = _as_tuple(inputs)
    if grad_outputs is None:
        rng = backend.numpy.random.default_rng(0)  # its own seed: the check must not move the user's RNG
        grad_outputs = tuple(
            Tensor(rng.uniform(-1.0, 1.0, o.shape), dtype=o.dtype, device=o.device, requires_grad=True)
            for o in _as_tuple(fn(*inputs)) if isinstance(o, Tensor) and o.requires_grad
        )
    grad_outputs = _as_tuple(grad_outputs)
    n = len(inputs)

    def first_derivative(*args: Any) -> tuple:
        xs, vs = args[:n], args[n:]
        outs = [o for o in _as_tuple(fn(*xs)) if isinstance(o, Tensor) and o.requires_grad]
        wrt = [x for x in xs if isinstance(x, Tensor) and x.requires_grad]
        grads = grad(outs, wrt, list(vs), create_graph=True, allow_unused=True)
        return tuple(g for g in grads if g is not None)

    return gradcheck(first_derivative, inputs + grad_outputs, eps=eps, atol=atol, rtol=rtol,
                     raise_exception=raise_exception)


# ---------------------------------------------------------------------------------------------
# The Jacobians are dicts {(input index, output index): array of shape (input numel, output numel)}:
# entry [a, b] is d outputs[j].flat[b] / d inputs[i].flat[a], as in torch's gradcheck.
def _numerical_jacobian(fn: Callable, inputs: tuple, wrt: list[int], outputs: tuple, eps: float) -> dict:
    """The Jacobians by central differences, ``(f(x + eps e_a) - f(x - eps e_a)) / (2 eps)``.

    ``inputs``: fn's arguments; ``wrt``: the indices of those to differentiate; ``outputs``:
    fn's outputs at ``inputs`` (only the floating ones, ``_is_float``, are checked). Return the
    dict described above, one zero-filled array per (input, checked output), of the output's
    dtype, row ``a`` filled from the two evaluations of fn (``_evaluate(fn, inputs, checked)``)
    with element ``a`` of the input (in ``_indices(x.shape)`` order) moved by +eps and -eps.
    Move the element in ``x.array`` itself (an in-place op would be recorded and bump the
    version counter) and put its exact old value back afterwards: the inputs must leave
    unchanged.
    """
    ### BEGIN SOLUTION chapter 02: gradcheck's central differences
    checked = [j for j, o in enumerate(outputs) if _is_float(o)]
    jac = {}
    for i in wrt:
        x = inputs[i]
        for j in checked:
            jac[i, j] = x.device.xp.zeros((x.numel(), outputs[j].numel()), dtype=outputs[j].dtype)
        for a, index in enumerate(_indices(x.shape)):
            # Write into the array itself: an in-place op would bump the version counter and be
            # recorded; the value is restored exactly afterwards.
            orig = x.array[index].item()
            x.array[index] = orig + eps
            plus = _evaluate(fn, inputs, checked)
            x.array[index] = orig - eps
            minus = _evaluate(fn, inputs, checked)
            x.array[index] = orig
            for j, p, m in zip(checked, plus, minus):
                jac[i, j][a] = (p - m) / (2 * eps)
    return jac
    ### END SOLUTION


def _evaluate(fn: Callable, inputs: tuple, checked: list[int]) -> list:
    """The checked outputs of ``fn`` as flat copies (an output may be a view of a perturbed input).
    Grad mode stays on, as in torch: ``fn`` may differentiate inside (a MAML step, a gradient penalty)."""
    outputs = _as_tuple(fn(*inputs))
    return [outputs[j].array.flatten() for j in checked]


def _analytical_jacobian(inputs: tuple, wrt: list[int], outputs: tuple) -> dict:
    jac = {}
    for j, y in enumerate(outputs):
        if not _is_float(y):
            continue
        xp = y.device.xp
        for i in wrt:
            jac[i, j] = xp.zeros((inputs[i].numel(), y.numel()), dtype=y.dtype)
        if not y.requires_grad:
            continue  # an output that does not depend on the inputs: its Jacobian is zero
        for b, index in enumerate(_indices(y.shape)):
            unit = xp.zeros(y.shape, dtype=y.dtype)
            unit[index] = 1
            row = grad(y, [inputs[i] for i in wrt], grad_outputs=_wrap(unit, y.device),
                       retain_graph=True, allow_unused=True)
            for i, g in zip(wrt, row):
                if g is not None:
                    jac[i, j][:, b] = g.array.reshape(-1)
    return jac


def _mismatch(i: int, j: int, x: Tensor, y: Tensor, num: Any, ana: Any, atol: float, rtol: float) -> str:
    """Name the element that breaks the tolerance the most, then show both Jacobians."""
    diff = abs(ana - num)
    a, b = divmod(int((diff - rtol * abs(num)).argmax()), num.shape[1])
    x_index, y_index = _unravel(a, x.shape), _unravel(b, y.shape)
    return (
        f"Jacobian mismatch for output {j} with respect to input {i}: worst element "
        f"d output{j}{list(y_index)} / d input{i}{list(x_index)} is {float(num[a, b]):.6g} numerically "
        f"but {float(ana[a, b]):.6g} analytically; max abs difference {float(diff.max()):.3g} "
        f"(atol={atol}, rtol={rtol}).\nnumerical (rows: input elements, columns: output elements):\n"
        f"{num}\nanalytical:\n{ana}"
    )


def _fail(message: str, raise_exception: bool) -> bool:
    if raise_exception:
        raise GradcheckError(message)
    return False


def _checked_inputs(inputs: tuple) -> list[int]:
    """The indices of the inputs to check; finite differences are only trustworthy in float64."""
    wrt = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    if not wrt:
        raise ValueError("gradcheck expects at least one input tensor to require gradient")
    for i in wrt:
        if inputs[i].dtype != backend.float64:
            raise DTypeError(
                f"gradcheck: input {i} requires grad but has dtype {inputs[i].dtype}; finite "
                "differences need float64 inputs (pass x.double())"
            )
    return wrt


def _as_tuple(x: Any) -> tuple:
    return (x,) if isinstance(x, Tensor) else tuple(x)


def _is_float(t: Any) -> bool:
    return isinstance(t, Tensor) and t.dtype.kind == "f"


def _indices(shape: tuple):
    """Every multi-index of ``shape`` in row-major order (the order of ``flatten``)."""
    return itertools.product(*(range(n) for n in shape))


def _unravel(flat: int, shape: tuple) -> tuple:
    index = []
    for n in reversed(shape):
        flat, r = divmod(flat, n)
        index.append(r)
    return tuple(reversed(index))
