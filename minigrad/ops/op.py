"""``Op``: the base class of the built-in ops, and what an op declares about itself (chapters 02 and 03).

An op is one class: ``forward`` on raw ``xp`` arrays, ``backward`` with minigrad ops (chapter 02),
and beside them a few class attributes that tell the rest of the system what it needs to know, so
that the graph passes, the code generators, ONNX export and autocast read the op's class
(``node.fn`` in a traced graph) and keep no table of op names (chapter 03). Besides ``forward``,
an op must declare, by kind (``REQUIRED``, which the op-table test checks every op against):
every op: ``onnx`` or ``onnx_refused``; ``"elementwise"``: ``cuda``. Export then either translates
the op or says why not, and a fused CUDA kernel, which cannot call forward, can compute every
elementwise op. The rest is optional; the defaults below mean "nothing special": the op is a fusion
boundary, runs its own forward inside a generated CPU kernel and autocasts as ``"promote"``.
``Hardswish`` in ``minigrad.ops.activation`` is a complete example: declared there, it fuses,
exports and autocasts with no edit anywhere else.

``kind``
    ``"elementwise"``, ``"reduction"``, ``"matmul"`` (and conv), ``"movement"`` or ``"other"``: the
    fusion rules and the colours of a drawing go by kind.
``ufunc``
    For ops whose forward is exactly one numpy ufunc on its arguments (``"add"``): the CPU kernel
    calls ``ufunc(*args, out=block)``, and a compiled step may compute the op straight into the
    tensor it updates.
``cpu``
    Otherwise, the CPU kernel's statements for one block (``"tanh({0}, out={o})"``): ufunc calls
    separated by ``"; "``, ``{0}, {1}, ...`` the arguments in forward's order, ``{o}`` the output
    block, ``{t}`` a scratch block. Each mirrors forward ufunc for ufunc, so fused and eager agree.
``cuda``
    The CUDA expression of the op (``"tanh({0})"``), ``{T}`` the C type it computes in; or a
    function ``(args, T, out_type) -> str``. ``cuda_reduce``: a reduction's ``ReductionKernel``
    pieces ``(reduce_expr, identity, post_map_expr)``.
``c``
    The C expression of the op for compiled CPU kernels, in the same form as ``cuda`` (``{T}``:
    ``float`` or ``double``; math functions are ``<tgmath.h>``'s, so ``tanh`` of a float is ``tanhf``);
    see ``minigrad.graph.codegen.c``. Only where the CUDA expression is not plain C: without a
    ``c``, C kernels use ``cuda`` (``c_expression``).
    ``c_reduce``: a reduction's ``(update, identity, final)`` over the reduced elements, ``{a}``
    the accumulator (a double), ``{x}`` an element, ``{n}`` their count: ``("{a} + {x}", "0", "{a} / {n}")``.
``onnx``
    The ONNX op type that computes it from the same arguments (``"Tanh"``; numbers and operands
    of another dtype are cast to the result's), or ``onnx(builder, node, *args)`` returning the
    ONNX value(s); see ``minigrad.graph.onnx_export``. ``onnx_refused``: where there is none, why
    (a gradient op, communication, or an emitter not written yet): the export's error says it.
``autocast``
    Under ``minigrad.autocast``: ``"low"`` runs in float16 (matmul-like ops), ``"fp32"`` in
    float32 (sums, exponentials), ``"keep"`` is never cast (the casts themselves), ``"promote"``
    casts mixed float inputs to the widest.
``batch``
    How ``minigrad.func.vmap`` runs the op once for a whole batch (``minigrad.batching``): one word
    per kind of op. ``"dims"``/``"dim"``: argument 1 names dims (one dim) of input 0, shifted past
    the batch dim; ``"shape"``: argument 1 is a shape; ``"perm"``: a permutation; ``"matmul"``;
    ``"rows"``: the op maps over the leading dims of input 0; ``"fold"``: over dim 0 of input 0
    (a batch of images: conv, pooling); ``"index"``: basic indexing;
    ``"cat"``: argument 0 is the dim of the operands after it. Elementwise ops need none: they
    broadcast over the batch dim. Without a rule vmap runs the op once per example.
``affine``
    The op's part in an affine map ``x * s + t`` when its other operand is a constant: ``"scale"``
    (``x * s``), ``"shift"`` (``x + t``) or ``"negated_shift"`` (``x - t``, ``x`` on the left). BN
    folding (``minigrad.graph.passes.fold_bn``) finds a BatchNorm after a conv by these.
``epilogue``, ``by_rows``, ``random``, ``returns_view``, ``channel_axis``, ``involution``, ``unit``,
``is_identity``, ``compose``
    What the fusion pass, the executor, BN folding and the simplifier need to know (see each below).
"""

from __future__ import annotations

from typing import Any, Callable

from minigrad.autograd.function import Function

__all__ = ["Op", "REQUIRED", "all_ops", "missing_declarations", "required_text", "same_value"]

# The declarations an op cannot leave out, by kind (None: every op), each a tuple of alternatives of
# which one must be set. The module docstring states it (``required_text``; a test keeps the two equal).
REQUIRED: dict[str | None, tuple[tuple[str, ...], ...]] = {
    None: (("onnx", "onnx_refused"),),
    "elementwise": (("cuda",),),
}


class Op(Function):
    """A built-in op: forward receives and returns raw ``xp`` arrays; class attributes declare the rest."""

    array_forward = True
    tensor_backward = False  # the rule is written against ctx.ops (an op that cannot be says why)
    kind = "other"
    ufunc: str | None = None
    cpu: str | None = None
    cuda: str | Callable[..., str] | None = None
    cuda_kinds: str | None = None  # the dtype kinds the CUDA expression handles ("f": floats only); None: all
    cuda_reduce: tuple[str, str, str] | None = None
    c: str | Callable[..., str] | None = None
    c_reduce: tuple[str, str, str] | None = None
    onnx: str | Callable[..., Any] | None = None
    onnx_refused: str | None = None
    autocast = "promote"
    batch: str | None = None  # vmap's batching rule; None: elementwise ops broadcast, others loop
    epilogue = False  # a matmul or conv that may start a fused group (GEMM + bias + ReLU)
    by_rows = False  # a reduction whose forward on a block of rows gives those rows of its result
    random = False  # draws from the device's random generator: never fused, folded or removed
    returns_view = False  # its result shares its input's buffer
    channel_axis: int | None = None  # a conv or linear layer: the axis of its output channels
    affine: str | None = None  # "scale", "shift" or "negated_shift": its part in x * s + t (BN folding)
    involution = False  # applied twice it gives its input back: -(-x) is x
    # ``(u, sides)``: the op returns its other operand when the number ``u`` is one of ``sides`` (0: left)
    unit: tuple[Any, tuple[int, ...]] | None = None
    # returns its input unchanged whenever shape and dtype stay: True, or a function of the attrs that says when
    is_identity: bool | Callable[[dict], bool] = False
    compose: Callable[[dict, dict], dict] | None = None  # (inner attrs, outer attrs) -> one op's attrs


# why an op that exists only in backward graphs has no ONNX translation (its ``onnx_refused``)
GRADIENT_OP = "a gradient op (it appears in backward graphs; export takes inference graphs)"


def c_expression(fn: Any) -> str | Callable[..., str] | None:
    """The C expression of op class ``fn``: its ``c``, or else its ``cuda``, which is C too."""
    c = getattr(fn, "c", None)
    return c if c is not None else getattr(fn, "cuda", None)


def same_value(b: Any, node: Any, a: Any, *_: Any) -> Any:
    """An ONNX emitter for ops whose value is their input's in an inference graph (a copy, dropout)."""
    return a


def missing_declarations(cls: type[Op]) -> list[str]:
    """What op class ``cls`` leaves out of ``REQUIRED`` for its kind, as ``"onnx or onnx_refused"``."""
    needed = REQUIRED.get(None, ()) + REQUIRED.get(cls.kind, ())
    return [" or ".join(alts) for alts in needed if all(getattr(cls, a, None) is None for a in alts)]


def required_text() -> str:
    """``REQUIRED`` as the module docstring states it: ``every op: ``onnx`` or ``onnx_refused``; ...``."""
    return "; ".join(("every op" if kind is None else f'``"{kind}"``') + ": "
                     + ", ".join(" or ".join(f"``{a}``" for a in alts) for alts in needed)
                     for kind, needed in REQUIRED.items())


def all_ops() -> list[type[Op]]:
    """Every built-in op class (the subclasses of ``Op``, depth first), for tests and listings."""
    found, stack = [], list(Op.__subclasses__())
    while stack:
        cls = stack.pop(0)
        if cls.__module__.startswith("minigrad."):  # not the probes tests define
            found.append(cls)
        stack[:0] = cls.__subclasses__()
    return found
