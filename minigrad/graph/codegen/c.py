"""C kernels for fused groups: one C loop per group, compiled by the system compiler (chapter 03).

The blocked numpy kernel (``codegen.numpy_blocks``) still pays numpy's cost per call: a dozen ufunc calls
per block, each giving up and retaking the GIL. Written as one C loop, each element goes through
the whole chain in registers, the compiler vectorises the loop (``expf`` through glibc's vector
math library, float ``tanh`` as a rational function written into the source: ``_TANHF``) and
OpenMP shares it among the cores
(one thread per physical core, in pieces sized for the machine: ``backend.machine``):

    #pragma omp parallel for simd schedule(simd: dynamic, 131072) num_threads(2)
    for (long i = 0; i < 4194304; i++) {
        float a0 = x0[i];
        float v1 = a0 * a0;  // %3 Mul
        ...
        out[i] = v9 * v12;  // %14 Mul
    }

Shapes are fixed by the trace, so broadcasting is written into the loop: the output's axes are
merged where every operand steps through them alike, and an operand that is broadcast along an
axis does not advance on it (a bias reads ``x1[i1]``, a per-row value ``x2[i0]``). Each op is
written as its class declares (``c``: a C expression of its arguments ``{0}, {1}, ...`` and
``{T}``, the type it computes in; ``minigrad.ops.op``). This is what TorchInductor's C++ backend
and tinygrad's Clang backend do. Elementwise groups, with or without a product computed first
(a matmul's epilogue), become one loop nest. Groups holding reductions over whole rows (a
LayerNorm, a softmax's sum) become a loop over rows and, in each row, one loop over its columns
per stretch of ops between reductions (``_by_rows``); a reduction declares its C in ``c_reduce``.
Groups ending in any other reduction, dtypes C does not share with numpy (float16, integers) and
ops without a ``c`` declaration keep the blocked numpy kernel (``unsupported`` says why). The
library is built on the first call (``backend.cc``); where no compiler is found or it fails,
the numpy kernel runs instead and a ``KernelWarning`` says why, once. Elementwise groups of one
shape that feed each other and are each stored (an optimizer's update: the new momentum, then the
weight) can also be one loop with several results, which loads every operand of an element
before it stores any (``generate_multi``, ``MultiKernel``; ``passes.update_fusion`` makes them).

OpenMP does not survive ``fork``: libgomp keeps its pool of threads after a parallel loop, and a
forked child (a ``DataLoader`` worker) inherits the pool's bookkeeping but not its threads, so its
first parallel loop waits for them forever. An at-fork handler therefore marks the child of a
process that loaded a kernel sharing loops among threads; there those kernels run as blocked
numpy (single-threaded, as PyTorch's workers run), the others as C. ``graph.overlap.helper``
does the same for its thread.
"""

from __future__ import annotations

import ctypes
import math
import os
import re
import warnings
from typing import Any

from minigrad.backend import cpu as _cpu_device
from minigrad.backend import cc
from minigrad.backend.cc import address as _address  # (a name looked up per kernel call)
from minigrad.graph.codegen import numpy_blocks as cpu
from minigrad.graph.codegen.program import Dialect, Program, expression
from minigrad.graph.ir import Graph, Node, op_kind
from minigrad.graph.trace import ARRAY_ARG, TENSOR_ARG
from minigrad.ops.op import c_expression

__all__ = ["CKernel", "KernelWarning", "MultiKernel", "generate", "generate_multi", "unsupported"]

xp = _cpu_device.xp
_C_TYPES = {"bool": "_Bool", "float32": "float", "float64": "double"}
# glibc's vector math functions: declared ``simd`` here, as -ffast-math would (backend.cc says why not it)
_VECTOR_MATH = ("exp", "log", "sin", "cos", "tanh", "pow", "erf", "log1p")
_warned: set[str] = set()
_threads = {"loaded": False, "forked": False}  # a threaded kernel was loaded; this process is a fork since


def _after_fork_in_child() -> None:
    _threads["forked"] = _threads["forked"] or _threads["loaded"]


os.register_at_fork(after_in_child=_after_fork_in_child)


KernelWarning = cc.KernelWarning  # a kernel could not be built or loaded: the blocked numpy kernel runs instead


class CKernel:
    """A fused group as one C function: ``kernel(*arrays, out=None) -> array``. ``source`` is the
    C source; ``fallback`` the blocked numpy kernel that runs when no compiler can build it."""

    def __init__(self, prog: Program, source: str, leaves: list[int], fallback: cpu.CpuKernel) -> None:
        self.name, self.source, self.fallback, self.ops = prog.name, source, fallback, fallback.ops
        self._leaves = leaves
        self._anchor = cpu.NodeForward(prog.anchor) if prog.anchor is not None else None
        self._anchor_args = [prog.inputs.index(i) for i in prog.anchor.inputs] if prog.anchor is not None else []
        self._types = [str(prog.inputs[k].dtype) for k in leaves] + (
            [str(prog.anchor.dtype)] if prog.anchor is not None else [])
        self._shape, self._dtype = tuple(prog.root.shape), xp.dtype(str(prog.root.dtype))
        self.threaded = "omp parallel" in source  # its loop starts OpenMP's threads (unsafe after fork)
        self._fn: Any = None

    def __call__(self, *arrays: Any, out: Any = None) -> Any:
        if self._fn is None:
            self._fn = self._load()
        if self._fn is False or (self.threaded and _threads["forked"]):
            return self.fallback(*arrays, out=out)
        ins = [arrays[k] for k in self._leaves]
        if self._anchor is not None:
            ins.append(self._anchor(*[arrays[k] for k in self._anchor_args]))
        ins = [xp.ascontiguousarray(x, dtype=t) for x, t in zip(ins, self._types)]
        target = out if out is not None and self._writable(out, ins) else None
        if target is None:
            m = ins[-1] if self._anchor is not None else None
            target = m if m is not None and self._writable(m, ins[:-1]) and m.base is None else xp.empty(
                self._shape, self._dtype)
        self._fn(_address(target), *[_address(x) for x in ins])
        if out is not None and target is not out:
            xp.copyto(out, target)
            return out
        return target

    def _writable(self, a: Any, ins: list) -> bool:
        """Whether the loop may write into ``a``: its shape and dtype, contiguous, and sharing
        memory with no input other than one it reads element for element (the same buffer)."""
        return (a.shape == self._shape and a.dtype == self._dtype and a.flags.c_contiguous and a.flags.writeable
                and not any(xp.may_share_memory(a, x) and not (x.ctypes.data == a.ctypes.data and x.shape == a.shape)
                            for x in ins))

    def _load(self) -> Any:
        return _load(self.source, self.name, 1 + len(self._types), self.threaded)

    def __repr__(self) -> str:
        return f"<CKernel {self.name}: {len(self.ops)} ops>"


def _load(source: str, name: str, n_args: int, threaded: bool) -> Any:
    """The compiled function ``name`` of ``source`` taking ``n_args`` pointers; False (after one
    warning per reason) when no compiler can build it."""
    try:
        fn = getattr(cc.build(source), name)
    except cc.CompilerUnavailable as e:
        if str(e) not in _warned:
            _warned.add(str(e))
            warnings.warn(f"compiled C kernels are off ({e}); fused groups run as blocked numpy", KernelWarning,
                          stacklevel=5)
        return False
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p] * n_args
    _threads["loaded"] = _threads["loaded"] or threaded
    return fn


class MultiKernel:
    """Elementwise groups of one shape, each feeding the next, as one C loop that stores every
    group's result: an optimizer's update of one parameter (the momentum and the weight; Adam's
    two moments and the weight) in one pass over memory, where one kernel per group reads each
    new moment back. ``kernel(*arrays, out=(a, b, ...)) -> tuple``, an array per result, each
    written into its ``out`` (a tensor's own memory) when the loop may. Where no compiler builds
    it, the groups' own kernels (``parts``: kernel and, per argument, an input's index or an
    earlier part's ``("part", k)``) run one after the other."""

    def __init__(self, group: Graph, name: str, source: str, leaves: list[int], types: list[str],
                 parts: list[tuple[Any, list]]) -> None:
        self.group, self.name, self.source, self.parts = group, name, source, parts
        self._leaves, self._types = leaves, types
        results = group.outputs
        self._results = [(tuple(r.shape), xp.dtype(str(r.dtype))) for r in results]
        self.ops = tuple(op for kernel, _ in parts for op in kernel.ops)
        self.threaded = "omp parallel" in source
        self._fn: Any = None

    def __call__(self, *arrays: Any, out: tuple | None = None) -> tuple:
        if self._fn is None:
            self._fn = _load(self.source, self.name, len(self._results) + len(self._types), self.threaded)
        outs = out or (None,) * len(self._results)
        if self._fn is False or (self.threaded and _threads["forked"]):
            return self._by_parts(arrays, outs)
        ins = [xp.ascontiguousarray(arrays[k], dtype=t) for k, t in zip(self._leaves, self._types)]
        spans = [_span(x) for x in ins]
        places = [_span(o) if o is not None and o.flags.c_contiguous and o.flags.writeable else None for o in outs]
        where, made = [], False
        for k, (o, (shape, dtype)) in enumerate(zip(outs, self._results)):
            place = places[k]
            if place is not None and o.shape == shape and o.dtype == dtype and _apart(place, spans, outs, places, k):
                where.append(place[0])
            else:
                where.append(None)
                made = True
        if made:  # a result the loop may not store in place: into a new array, copied after
            targets = [outs[k] if w is not None else xp.empty(*self._results[k]) for k, w in enumerate(where)]
            where = [w if w is not None else _address(t) for w, t in zip(where, targets)]
        else:
            targets = outs
        self._fn(*where, *[x[0] for x in spans])
        if made:
            for o, t in zip(outs, targets):
                if o is not None and t is not o:
                    xp.copyto(o, t)
            return tuple(o if o is not None else t for o, t in zip(outs, targets))
        return tuple(outs)

    def _by_parts(self, arrays: tuple, outs: tuple) -> tuple:
        """The groups' kernels in turn, into new arrays (a later group may read what an earlier
        one's ``out`` held), then copied into ``outs``."""
        values: list[Any] = []
        for kernel, args in self.parts:
            values.append(kernel(*[values[a[1]] if isinstance(a, tuple) else arrays[a] for a in args]))
        return into_outs(outs, values)

    def __repr__(self) -> str:
        return f"<MultiKernel {self.name}: {len(self._results)} results, {len(self.ops)} ops>"


def into_outs(outs: tuple, values: list) -> tuple:
    """The results of a kernel with several: each value copied into its ``out`` array where one
    is given (and it is not that array already), the value itself where none is."""
    for o, v in zip(outs, values):
        if o is not None and v is not o:
            xp.copyto(o, v)
    return tuple(o if o is not None else v for o, v in zip(outs, values))


def _apart(a: tuple, ins: list[tuple], outs: tuple, places: list, k: int) -> bool:
    """Whether the loop may store result ``k`` into the contiguous array spanning ``a`` (``_span``):
    it shares memory with no other result (``outs``, spanning ``places``), and with no input other
    than one read element for element (the same buffer: each iteration loads before it stores).
    Contiguous arrays share memory exactly when their byte ranges meet, which is cheaper to ask
    than ``may_share_memory`` (on an optimizer's update of a bias, most of a call's time; hence
    the plain loops, too)."""
    start, end, shape = a
    for x in ins:
        if x[0] < end and start < x[1] and not (x[0] == start and x[2] == shape):
            return False
    for j, o in enumerate(outs):
        if j != k and o is not None:
            span = places[j]
            if (start < span[1] and span[0] < end) if span is not None else _meets(o, a):
                return False
    return True


def _span(a: Any) -> tuple[int, int, tuple]:
    """A contiguous array's bytes, ``[start, end)``, and its shape."""
    start = _address(a)
    return start, start + a.nbytes, a.shape


def _meets(o: Any, a: tuple) -> bool:
    """Whether any array ``o`` (not contiguous, say) may share memory with the bytes ``a`` spans."""
    low, high = xp.lib.array_utils.byte_bounds(o) if hasattr(xp.lib, "array_utils") else xp.byte_bounds(o)
    return low < a[1] and a[0] < high


def generate_multi(group: Graph, parts: list[tuple[Any, list]]) -> MultiKernel | None:
    """One C loop for ``group``: a sub-graph of elementwise ops whose ``outputs`` (several) all
    have one shape; None when C cannot write it (``unsupported``), or an op is not elementwise."""
    results = group.outputs
    members = [n for n in group.topological_order() if n.op not in ("placeholder", "output")]
    shape = tuple(results[-1].shape)
    prog = Program(f"fused_{len(results)}_results", group.placeholders, None, members, None, shape, results[-1])
    if (any(tuple(r.shape) != shape or r.op == "placeholder" for r in results)
            or any(op_kind(n) != "elementwise" for n in members) or unsupported(prog) is not None):
        return None
    names = {p: f"x{k}" for k, p in enumerate(prog.inputs)}
    leaves = [p for p in prog.inputs if any(p in op.inputs for op in members)]
    dims, full = _merge_axes(shape, [tuple(p.shape) for p in leaves])
    body = [f"{_ctype(p)} a{k} = {names[p]}[{_index(dims, f)}];" for k, (p, f) in enumerate(zip(leaves, full))]
    value = {p: f"a{k}" for k, p in enumerate(leaves)}
    body += [_assign(n, value) for n in members]
    where = _index(dims, (True,) * len(dims))
    body += [f"out{k}[{where}] = {value[r]};  // {r.name}, after every load" for k, r in enumerate(results)]
    args = [f"{_ctype(r)} *out{k}" for k, r in enumerate(results)] + [f"const {_ctype(p)} *{names[p]}" for p in leaves]
    ops = " | ".join(", ".join(k.ops) for k, _ in parts)
    source = _source(prog.name, f"{ops} -> {len(results)} x {shape} {results[-1].dtype}", ", ".join(args),
                     _loops(dims, body, math.prod(shape)))
    return MultiKernel(group, prog.name, source, [prog.inputs.index(p) for p in leaves],
                       [str(p.dtype) for p in leaves], parts)


def _source(name: str, comment: str, args: str, body: list[str]) -> str:
    """A kernel's C file: the vector math functions its body calls, declared ``simd``, then the function."""
    used = [f for f in _VECTOR_MATH if re.search(rf"\b{f}\(", "\n".join(body))]
    lines = [f"/* {name}: {comment} */", "#include <math.h>"]
    if used:
        lines.append('#define SIMD __attribute__((__simd__("notinbranch")))  /* glibc has vector versions */')
        lines += [f"SIMD float {f}f(float{', float' * (f == 'pow')}); SIMD double {f}(double{', double' * (f == 'pow')});"
                  for f in used]
    lines += ["#include <tgmath.h>"] + (_TANHF if "tanh" in used else [])
    lines += ["", f"void {name}({args})", "{"] + body
    return "\n".join(lines + ["}", ""])


# float tanh as a rational function, inlined into the loop: glibc's vector tanhf took 1 ns an
# element on one Zen 3 core, this 0.4 ns (bench_fusion's chain calls two per element, GELU's and
# a sigmoid's). tanh(x) = x P(x^2) / Q(x^2) on [-9.2, 9.2], both of degree 4, fitted for relative
# error (2.5e-8 in exact arithmetic), and outside that range the value at its end, which rounds
# to 1 as tanh does there. Evaluated in float (with fused multiply-adds where the CPU has them),
# it is within 5.7 ulp of the exact tanh for every float32 (6.2 without FMA; checked over all of
# them, and a test sweeps a sample), where glibc's is within 1: the tests compare kernels with
# eager at a relative 1e-6 (16 ulp) or looser. NaN stays NaN,
# -0 stays -0, and +-inf give +-1. Doubles keep glibc's tanh.
_TANHF = """\
#ifdef __FMA__
#define MINIGRAD_MAC(a, b, c) fmaf(a, b, c)
#else
#define MINIGRAD_MAC(a, b, c) ((a) * (b) + (c))
#endif
static inline float minigrad_tanhf(float x)
{
    float c = x < -9.2f ? -9.2f : x > 9.2f ? 9.2f : x;
    float s = c * c;
    float p = MINIGRAD_MAC(MINIGRAD_MAC(MINIGRAD_MAC(MINIGRAD_MAC(1.3002049e-08f, s, 2.0353298e-05f), s,
                           0.0034799937f), s, 0.1336788f), s, 1.0f);
    float q = MINIGRAD_MAC(MINIGRAD_MAC(MINIGRAD_MAC(MINIGRAD_MAC(7.631842e-07f, s, 0.00032601663f), s,
                           0.025817607f), s, 0.46701193f), s, 1.0f);
    return c * p / q;
}
#undef tanh
#define tanh(x) _Generic((x), float: minigrad_tanhf, default: tanh)(x)""".splitlines()


def unsupported(prog: Program, rows: tuple | None = None, split: int | None = None) -> str | None:
    """Why the C generator leaves this group to the numpy one; None when it writes it. A group that
    runs by ``rows`` comes with ``split = _row_split(prog, rows)``."""
    if prog.reduction is not None:
        return "a reduction over more than whole rows"
    values = prog.ops + [i for n in prog.ops for i in n.inputs]
    if any(str(n.dtype) not in _C_TYPES for n in values):
        return "a dtype C does not share with numpy"
    for n in prog.ops:
        if op_kind(n) == "reduction" and getattr(n.fn, "c_reduce", None) is not None:
            continue
        if op_kind(n) != "elementwise" or c_expression(n.fn) is None or n.meta.get("kwargs"):
            return f"{n.op} declares no C expression"
        if any(k not in (TENSOR_ARG, ARRAY_ARG) and not _is_scalar(n.attrs[k]) for k in n.meta["args"]):
            return f"{n.op} has a constant argument C cannot spell"
    if rows is not None:
        if split is None:
            return "values that are neither whole rows nor one number per row"
        if math.prod(rows[split:]) * 8 * len(prog.ops) > _ROW_BUFFER_BYTES:
            return "rows too long for the row buffers"
    return None


def generate(group: Graph) -> CKernel | cpu.CpuKernel:
    """The C kernel of a fused group (compiled on its first call), or the numpy one (``unsupported``)."""
    prog, rows = cpu.row_program(group)
    split = _row_split(prog, rows) if rows else None
    fallback = cpu.generate_program(prog, rows)
    if unsupported(prog, rows, split) is not None:
        return fallback
    names = {p: f"x{k}" for k, p in enumerate(prog.inputs)}
    leaves = [p for p in prog.inputs if any(p in op.inputs for op in prog.ops)]
    params = leaves + ([prog.anchor] if prog.anchor is not None else [])
    if prog.anchor is not None:
        names[prog.anchor] = "m"
    args = ", ".join([f"{_ctype(prog.root)} *out"] + [f"const {_ctype(p)} *{names[p]}" for p in params])
    ops = ", ".join(n.op for n in [prog.anchor] * (prog.anchor is not None) + prog.ops)
    how = f", by rows of {math.prod(rows[split:])}" if rows else ""
    body = _by_rows(prog, params, names, rows, split) if rows else _flat(prog, params, names)
    source = _source(prog.name, f"{ops} -> {tuple(prog.root.shape)} {prog.root.dtype}{how}", args, body)
    return CKernel(prog, source, [prog.inputs.index(p) for p in leaves], fallback)


def _flat(prog: Program, params: list[Node], names: dict[Node, str]) -> list[str]:
    """An elementwise group: one loop nest over the output, every op in its body."""
    dims, full = _merge_axes(prog.shape, [tuple(p.shape) for p in params])
    body = [f"{_ctype(p)} a{k} = {names[p]}[{_index(dims, f)}];" for k, (p, f) in enumerate(zip(params, full))]
    value = {p: f"a{k}" for k, p in enumerate(params)}
    for n in prog.ops:
        if n is prog.ops[-1]:
            body.append(f"out[{_index(dims, (True,) * len(dims))}] = {expression(n, value, _C)};  // {n.name} {n.op}")
        else:
            body.append(_assign(n, value))
    return _loops(dims, body, math.prod(prog.shape))


def _assign(n: Node, value: dict[Node, str]) -> str:
    """``float v7 = <n's expression>;  // %7 Tanh``, naming n's value ``v7`` in ``value``."""
    expr = expression(n, value, _C)
    value[n] = "v" + _short(n)
    return f"{_ctype(n)} {value[n]} = {expr};  // {n.name} {n.op}"


# -- groups that run by rows ----------------------------------------------------------------------
_ROW_BUFFER_BYTES = 1 << 18  # the row buffers live on each thread's stack


def _row_split(prog: Program, rows: tuple) -> int | None:
    """The number ``k`` of leading axes that make a row's index, such that every value of the group
    is whole on the other axes (a wide value) or 1 on all of them (one number per row), and every
    reduction reduces exactly those; None if there is no such ``k``."""
    for k in range(1, len(rows)):
        values = [_part(tuple(n.shape), rows, k) for n in prog.ops if not _reduces(n)]
        leaves = [_part(tuple(p.shape), rows, k) for p in prog.inputs]
        if (all(row == "whole" and cols != "mixed" for row, cols in values)
                and all("mixed" not in part for part in leaves)
                and all(_reduces_cols(n, rows, k) for n in prog.ops if _reduces(n))):
            return k
    return None


def _part(shape: tuple, rows: tuple, k: int) -> tuple[str, str]:
    """How a value of ``shape`` (broadcast, right-aligned) covers the row axes ``rows[:k]`` and the
    column axes ``rows[k:]``: ``"whole"``, ``"one"`` (all 1) or ``"mixed"``."""
    padded = (1,) * (len(rows) - len(shape)) + shape

    def kind(got: tuple, full: tuple) -> str:
        return "whole" if got == full else "one" if all(n == 1 for n in got) else "mixed"
    return kind(padded[:k], rows[:k]), kind(padded[k:], rows[k:])


def _reduces(n: Node) -> bool:
    return op_kind(n) == "reduction"


def _reduces_cols(n: Node, rows: tuple, k: int) -> bool:
    dims = n.attrs.get("dims")
    dims = (dims,) if isinstance(dims, int) else dims
    return (dims is not None and tuple(n.inputs[0].shape) == rows
            and sorted(d % len(rows) for d in dims) == list(range(k, len(rows))))


def _by_rows(prog: Program, params: list[Node], names: dict[Node, str], rows: tuple, k: int) -> list[str]:
    """A group holding row reductions: a loop over rows (the first ``k`` axes of ``rows``), and in
    each row a loop over its columns for every stretch of ops between reductions (a phase). Wide
    values that a later phase reads wait in row buffers; numbers per row are plain variables.
    A phase with more than one vector math call is split into loops of one each (``_stages``)."""
    n_rows, n_cols = math.prod(rows[:k]), math.prod(rows[k:])
    parts = {p: _part(tuple(p.shape), rows, k) for p in params}
    wide = {n for n in prog.ops if not _reduces(n) and _part(tuple(n.shape), rows, k)[1] == "whole"}
    wide |= {p for p in params if parts[p][1] == "whole"}
    phase: dict[Node, int] = {p: 0 for p in params}  # the phase whose loop (or prologue) computes each value
    ready: dict[Node, int] = {p: 0 for p in params}  # the first phase that may read it
    for n in prog.ops:
        phase[n] = max([ready[i] for i in n.inputs], default=0)
        ready[n] = phase[n] + 1 if _reduces(n) else phase[n]
    stage: dict[Node, int] = {}  # each wide op's and reduction's loop within its phase
    for ph in range(max(phase.values()) + 1):
        stage.update(_stages([n for n in prog.ops if phase[n] == ph and n in wide],
                             [n for n in prog.ops if phase[n] == ph and _reduces(n)]))
    at = {n: (phase[n], stage.get(n, 0)) for n in list(params) + prog.ops}  # the loop that computes n
    buffered = {i for n in prog.ops for i in n.inputs if i in wide and i in prog.ops and at[i] < at[n]}
    value: dict[Node, str] = {}
    body = [f"{_ctype(n)} b{_short(n)}[{n_cols}];" for n in prog.ops if n in buffered]
    for j, p in enumerate(params):
        if p not in wide:
            row = "r" if parts[p][0] == "whole" else "0"
            body.append(f"{_ctype(p)} a{j} = {names[p]}[{row}];")
            value[p] = f"a{j}"
    for ph in range(max(phase.values()) + 1):
        for n in prog.ops:  # numbers per row first: what this phase's loop reads
            if phase[n] == ph and n not in wide and not _reduces(n):
                body.append(_assign(n, value))
                if n is prog.root:
                    body.append(f"out[r] = {value[n]};")
        reductions = [n for n in prog.ops if phase[n] == ph and _reduces(n)]
        for n in reductions:
            body.append(f"double s{_short(n)} = {n.fn.c_reduce[1]};  // {n.name} {n.op}")
        for st in sorted({stage[n] for n in prog.ops if phase[n] == ph and n in stage}):
            here = (ph, st)
            members = [n for n in prog.ops if at[n] == here and n in wide]
            summed = [n for n in reductions if at[n] == here]
            read = {i for n in members + summed for i in n.inputs}
            loop = [f"{_ctype(p)} a{j} = {names[p]}[{'r * ' + str(n_cols) + 'L + j' if parts[p][0] == 'whole' else 'j'}];"
                    for j, p in enumerate(params) if p in wide and p in read]
            inner = dict(value) | {p: f"a{j}" for j, p in enumerate(params) if p in wide}
            inner.update({i: f"b{_short(i)}[j]" for i in buffered if at[i] < here})
            for n in members:
                if n is prog.root:
                    loop.append(f"out[r * {n_cols}L + j] = {expression(n, inner, _C)};  // {n.name} {n.op}")
                    continue
                loop.append(_assign(n, inner))
                if n in buffered:
                    loop.append(f"b{_short(n)}[j] = {inner[n]};")
            for n in summed:
                update = n.fn.c_reduce[0].format(a=f"s{_short(n)}", x=inner[n.inputs[0]])
                loop.append(f"s{_short(n)} = {update};")
            if not summed:
                body.append("#pragma omp simd")
            body += [f"for (long j = 0; j < {n_cols}L; j++) {{"] + ["    " + line for line in loop] + ["}"]
        for n in reductions:
            final = n.fn.c_reduce[2].format(a=f"s{_short(n)}", n=f"{n_cols}.0")
            value[n] = f"v{_short(n)}"
            body.append(f"{_ctype(n)} {value[n]} = ({_ctype(n)})({final});")
            if n is prog.root:
                body.append(f"out[r] = {value[n]};")
    head = [f"    #pragma omp {_shared(n_rows)}"] if n_rows * n_cols >= cpu.PARALLEL_MIN_SIZE and n_rows > 1 else []
    return head + [f"    for (long r = 0; r < {n_rows}L; r++) {{"] + ["        " + line for line in body] + ["    }"]


def _stages(members: list[Node], reductions: list[Node]) -> dict[Node, int]:
    """Which loop of its phase each op runs in. A vector math call (``tanhf``...) is a long chain
    of dependent instructions, and a loop body holding two in a row (GELU's tanh, then a
    sigmoid's) leaves the core waiting on them: it keeps only a few iterations in flight. So a
    phase is split before each op that calls one when its loop already holds one; values that
    a later loop reads wait in row buffers, which stay in L1. On bench_fusion's chain (GELU, then
    a sigmoid gate) the row kernel ran 1.3x faster on one Zen 3 core. A reduction sums in the
    loop that computes its input."""
    stage: dict[Node, int] = {}
    current, calls = 0, 0
    for n in members:
        call = _calls_math(n)
        if call and calls:
            current, calls = current + 1, 0
        stage[n] = current
        calls += call
    for n in reductions:
        stage[n] = stage.get(n.inputs[0], 0)
    return stage


def _calls_math(n: Node) -> bool:
    """Whether ``n``'s C expression calls one of the vector math functions."""
    text = expression(n, {i: "x" for i in n.inputs}, _C)
    return any(re.search(rf"\b{f}\(", text) for f in _VECTOR_MATH)


def _short(n: Node) -> str:
    return re.sub(r"\W", "_", n.name.lstrip("%"))


def _merge_axes(shape: tuple, shapes: list[tuple]) -> tuple[list[int], list[tuple[bool, ...]]]:
    """The output's axes (size-1 ones dropped) with neighbours merged where every operand is either
    whole on both or broadcast on both; for each operand, whether it is whole on each merged axis."""
    dims: list[int] = []
    full: list[list[bool]] = [[] for _ in shapes]
    for k, n in enumerate(shape):
        if n == 1:
            continue
        here = [k - len(shape) + len(s) >= 0 and s[k - len(shape) + len(s)] == n for s in shapes]  # right-aligned
        if dims and all(f[-1] == h for f, h in zip(full, here)):
            dims[-1] *= n
            continue
        dims.append(n)
        for f, h in zip(full, here):
            f.append(h)
    return dims, [tuple(f) for f in full]


def _index(dims: list[int], full: tuple[bool, ...]) -> str:
    """An operand's flat index from the loop counters ``i0, i1, ...``: it advances on its whole axes."""
    if len(dims) <= 1:
        return "i" if full and full[0] else "0"
    terms, stride = [], 1
    for k in reversed(range(len(dims))):
        if full[k]:
            terms.insert(0, f"i{k}" + (f" * {stride}" if stride != 1 else "") + "L" * (stride != 1))
            stride *= dims[k]
    return " + ".join(terms) or "0"


def _shared(n: int, simd: bool = False) -> str:
    """The OpenMP pragma that shares ``n`` iterations among this machine's threads (one per
    physical core, ``cc.machine()``; ``$OMP_NUM_THREADS`` when set) in pieces handed out as threads
    ask: on a busy machine a thread the OS has not run yet leaves its share to the others. A
    vectorised loop's pieces are whole vectors of the machine's width."""
    machine = cc.machine()
    wanted = os.environ.get("OMP_NUM_THREADS", "").strip()
    threads = int(wanted) if wanted.isdigit() and int(wanted) > 0 else machine.threads
    chunk = machine._replace(threads=threads).chunk(n, machine.vector_bits // 32 if simd else 1)
    clause = "" if wanted else f" num_threads({threads})"
    return (f"parallel for simd schedule(simd: dynamic, {chunk}){clause}" if simd
            else f"parallel for schedule(dynamic, {chunk}){clause}")


def _loops(dims: list[int], body: list[str], size: int) -> list[str]:
    """Nested loops over the merged axes: the outer shared among threads, the inner vectorised."""
    threads = size >= cpu.PARALLEL_MIN_SIZE
    if len(dims) <= 1:
        n = dims[0] if dims else 1
        return [f"    #pragma omp {_shared(n, simd=True) if threads else 'simd'}",
                f"    for (long i = 0; i < {n}L; i++) {{"] + ["        " + line for line in body] + ["    }"]
    lines, pad = [], "    "
    for k, n in enumerate(dims):
        pragma = "simd" if k == len(dims) - 1 else _shared(n) if k == 0 and threads else None
        if pragma:
            lines.append(f"{pad}#pragma omp {pragma}")
        lines.append(f"{pad}for (long i{k} = 0; i{k} < {n}L; i{k}++) {{")
        pad += "    "
    lines += [pad + line for line in body]
    for k in reversed(range(len(dims))):
        pad = pad[:-4]
        lines.append(pad + "}")
    return lines


def _is_scalar(v: Any) -> bool:
    """A constant C can spell: a number, None (an absent bound) or a dtype (a cast's target)."""
    return (v is None or isinstance(v, (bool, int, float, xp.dtype, type))
            or (hasattr(v, "item") and getattr(v, "shape", None) == ()))


def _spell(v: Any, ctype: str) -> str | None:
    """C's own literals: a dtype (a cast's target) as its C type, a bool as 1 or 0, NaN and the
    infinities as math.h's macros."""
    if isinstance(v, (xp.dtype, type)):
        return _C_TYPES.get(str(xp.dtype(v)), "void")
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float) and not math.isfinite(v):
        return f"({ctype})" + ("NAN" if v != v else "-INFINITY" if v < 0 else "INFINITY")
    return None


_C = Dialect(_C_TYPES, c_expression, _spell)


def _ctype(node: Node) -> str:
    return _C_TYPES[str(node.dtype)]
