"""Multi-tensor kernels: the same small loop over many tensors as one C call (chapter 03).

An optimizer steps every parameter with the same few elementwise ops: Adam's update of a hundred
tensors is a hundred kernels that differ only in their pointers and lengths, each paying a Python
call (tens of microseconds) to do a microsecond of work, and so are the bias corrections and the
step counts before it. ``MultiTensorKernel`` runs one loop body over a list of tensors in one call,
as PyTorch's ``_foreach`` ops and apex's multi-tensor apply do: the kernel walks a table of
pointers (every tensor's results, then every tensor's operands), each tensor's loop as long as
that tensor. An operand is read element by element (``p[i]``) or is one number for its tensor
(``p[0]``: a bias correction). The addresses of arrays that stay the same from call to call (the
parameters and their moments) are looked up once. Where no compiler builds it, each member's own
kernel (``parts``) runs in turn, so the numpy fallback computes the same values.

Only bodies without vector math calls are written so (an optimizer's ``sqrt`` is exact in every
width), and a table of single numbers is a plain loop, so each value is the same bit for bit as
its own kernel's or eager's.
"""

from __future__ import annotations

import math
from itertools import compress
from operator import is_not, itemgetter
from typing import Any, Sequence

from minigrad.backend import cpu as _cpu_device
from minigrad.backend.cc import address as _address
from minigrad.graph.codegen.c import _load as load_c
from minigrad.graph.codegen.c import into_outs
from minigrad.graph.codegen.program import Dialect, expression
from minigrad.graph.ir import Graph, Node

__all__ = ["MultiTensorKernel", "body_of", "generate_multi_tensor"]

xp = _cpu_device.xp


def body_of(group: Graph, dialect: Dialect) -> tuple[list[str], list[int]] | None:
    """The loop body of one member's sub-graph (``group``: placeholders, elementwise members,
    results of one shape), written with names that do not depend on the member (``arg[0]``: an
    operand's address, ``a0`` its element, ``v3``: a value, ``res[1]``: a result's address), and
    which placeholders it reads; None when an operand is neither whole nor one number. Members
    with the same body share a kernel."""
    results = group.outputs
    size = math.prod(results[0].shape)
    members = [n for n in group.topological_order() if n.op not in ("placeholder", "output")]
    leaves = [k for k, p in enumerate(group.placeholders) if any(p in m.inputs for m in members)]
    value: dict[Node, str] = {}
    lines = []
    for j, k in enumerate(leaves):
        p = group.placeholders[k]
        n = math.prod(p.shape)
        if n != size and n != 1:
            return None
        ctype = dialect.ctypes[str(p.dtype)]
        index = "i" if n == size and size > 1 else "0"
        lines.append(f"{ctype} a{j} = ((const {ctype} *)arg[{j}])[{index}];")
        value[p] = f"a{j}"
    for j, m in enumerate(members):
        expr = expression(m, value, dialect)
        value[m] = f"v{j}"
        lines.append(f"{dialect.ctypes[str(m.dtype)]} v{j} = {expr};  // {m.op}")
    lines += [f"(({dialect.ctypes[str(r.dtype)]} *)res[{k}])[i] = {value[r]};" for k, r in enumerate(results)]
    return lines, leaves


def generate_multi_tensor(name: str, body: list[str], sizes: Sequence[int], results: int, operands: int) -> str:
    """The C source of one multi-tensor kernel over ``len(sizes)`` tensors: ``table`` holds the
    addresses of every tensor's ``results``, then of every tensor's ``operands``; the loop of
    tensor ``t`` runs ``sizes[t]`` times (a plain statement when every size is one)."""
    n = len(sizes)
    loop = (["    #pragma omp simd", "    for (long i = 0; i < sizes[t]; i++) {"] if max(sizes) > 1
            else ["    {", "        const long i = 0;"])
    lines = [f"/* {name}: one loop body over {n} tensors */", "#include <math.h>", "#include <tgmath.h>", "",
             f"static const long sizes[{n}] = {{{', '.join(map(str, sizes))}}};", "",
             f"void {name}(void **table)", "{", f"  for (long t = 0; t < {n}L; t++) {{",
             f"    void **res = table + t * {results}L, **arg = table + {n * results}L + t * {operands}L;"]
    lines += loop + ["        " + line for line in body] + ["    }", "  }", "}", ""]
    return "\n".join(lines)


class MultiTensorKernel:
    """One loop body over many tensors: ``kernel(*arrays, out=None) -> tuple``. ``arrays`` are
    the members' inputs one member after another (``arity`` each), the results come back the
    same way (``results[m]``: member m's, a (shape, dtype) each), each written into its ``out``
    array (a tensor's memory) when given. ``leaves`` are the inputs of a member that the body
    reads, ``types`` their dtypes. The results at the flat indices in ``kept`` are read only by
    other kernels of the same run (the pass knows), so they live in arrays the kernel keeps from
    call to call, whose addresses stay. Without a compiler, ``parts`` (each member's own kernel,
    or its op's forward: arrays in, value out) compute the same values."""

    def __init__(self, name: str, source: str, arity: int, leaves: list[int], types: list[str],
                 results: list[list[tuple]], parts: list[Any], group: Graph, kept: frozenset = frozenset()) -> None:
        self.name, self.source, self.parts, self.group = name, source, parts, group
        self.arity, self._leaves, self._types = arity, leaves, [xp.dtype(t) for t in types]
        self._results = results
        self.per_member = len(results[0])
        self.kept = kept
        self.ops = tuple(n.op for n in group.topological_order() if n.op not in ("placeholder", "output"))
        count = len(parts)
        self._specs = [spec for member in results for spec in member]
        self._operands = [m * arity + k for m in range(count) for k in leaves]  # in the table's order
        self._operand_types = self._types * count
        self._operand_picker = itemgetter(*self._operands) if len(self._operands) > 1 else (
            lambda arrays: tuple(arrays[k] for k in self._operands))
        self._fn: Any = None
        self._own: list[Any] = [None] * len(self._specs)  # the kept results' arrays
        self._row: list[Any] = []  # the arrays whose addresses the table holds: results, then operands
        self._table: Any = None

    def __call__(self, *arrays: Any, out: tuple | None = None) -> tuple:
        if self._fn is None:
            self._fn = _load(self.source, self.name)
            self._own = [xp.empty(*spec) if k in self.kept else None for k, spec in enumerate(self._specs)]
        outs = out or (None,) * len(self._specs)
        if self._fn is False:
            return self._by_parts(arrays, outs)
        if self._table is None:
            changed = self._first(arrays, outs)
        else:  # only what differs from the last call is looked at again (the same arrays, mostly)
            changed = self._update(arrays, outs)
        if changed and self._overlap():  # a result would clobber what another tensor reads: into new arrays
            for k, spec in enumerate(self._specs):
                self._set(k, xp.empty(*spec))
                self._outs[k] = None  # looked at again next time
            self._fresh = range(len(self._specs))
        self._fn(self._pointer)
        results = self._row[:len(self._specs)]
        if out is None:
            return tuple(results)
        if not any(map(is_not, out, results)):  # every result went straight into its out
            return out
        return into_outs(outs, results)

    def _first(self, arrays: tuple, outs: tuple) -> bool:
        """The first call: every result's and operand's array and address."""
        results = [self._result(k, o) for k, o in enumerate(outs)]
        operands = [_contiguous(arrays[k], t) for k, t in zip(self._operands, self._operand_types)]
        self._row = results + operands
        self._table = xp.array([_address(x) for x in self._row], dtype=xp.intp)
        self._bytes = xp.array([x.nbytes for x in self._row], dtype=xp.intp)
        self._pointer = _address(self._table)
        self._outs, self._given = list(outs), list(self._operand_picker(arrays))
        self._fresh = [k for k, r in enumerate(results) if r is not outs[k] and r is not self._own[k]]
        return True

    def _update(self, arrays: tuple, outs: tuple) -> bool:
        """The arrays of this call where they are not the last call's: a result's ``out`` that
        changed, a new array for a result with neither ``out`` nor memory of its own, an operand
        that changed; their addresses into the table. Whether anything changed."""
        split, row, last_outs, given = len(self._specs), self._row, self._outs, self._given
        moved = list(compress(range(split), map(is_not, outs, last_outs)))
        for k in moved:
            last_outs[k] = outs[k]
        fresh = self._fresh
        for k in set(moved).union(fresh) if moved and fresh else moved or fresh:
            self._set(k, self._result(k, outs[k]))
        self._fresh = [k for k in set(moved).union(fresh)
                       if row[k] is not outs[k] and row[k] is not self._own[k]] if moved else fresh
        operands = self._operand_picker(arrays)
        changed = list(compress(range(len(operands)), map(is_not, operands, given)))
        types = self._operand_types
        for j in changed:
            given[j] = operands[j]
            self._set(split + j, _contiguous(operands[j], types[j]))
        return bool(moved or fresh or changed)

    def _result(self, k: int, o: Any) -> Any:
        """Where result ``k`` goes: the kernel's own memory, else ``o`` when the loop may store
        into it, else a new array."""
        own = self._own[k]
        if own is not None:
            return own
        return o if o is not None and _fits(o, *self._specs[k]) else xp.empty(*self._specs[k])

    def _set(self, k: int, x: Any) -> None:
        if self._row[k] is not x:
            self._row[k] = x
            self._table[k] = _address(x)

    def _overlap(self) -> bool:
        """Whether a result shares memory with another result, or with an operand other than the
        same array of its own tensor (read element for element before it is written). Contiguous
        arrays share memory exactly when their byte ranges meet: sorted by start, disjoint results
        each end before the next starts, and an operand meets one only if it meets the last
        result starting before its end."""
        count, split = len(self.parts), len(self._specs)
        starts, ends = self._table, self._table + self._bytes
        rs, re_ = starts[:split].reshape(count, -1), ends[:split].reshape(count, -1)
        xs, xe = starts[split:].reshape(count, -1), ends[split:].reshape(count, -1)
        same = ((xs[:, :, None] == rs[:, None, :]) & (xe[:, :, None] == re_[:, None, :])).any(-1)
        full = self._bytes[:split].reshape(count, -1) > 0
        rs, re_ = rs[full], re_[full]
        order = xp.argsort(rs, kind="stable")
        rs, re_ = rs[order], re_[order]
        if len(rs) > 1 and (rs[1:] < re_[:-1]).any():
            return True
        free = ~same & (self._bytes[split:].reshape(count, -1) > 0)
        xs, xe = xs[free], xe[free]
        last = xp.searchsorted(rs, xe, side="left") - 1
        return bool(((last >= 0) & (re_[xp.maximum(last, 0)] > xs)).any()) if len(rs) else False

    def _by_parts(self, arrays: tuple, outs: tuple) -> tuple:
        """Each member's own kernel in turn (the numpy fallback), copied into ``outs``."""
        values = []
        for m, part in enumerate(self.parts):
            value = part(*arrays[m * self.arity:(m + 1) * self.arity])
            values += list(value) if type(value) is tuple else [value]
        return into_outs(outs, values)

    def __repr__(self) -> str:
        return f"<MultiTensorKernel {self.name}: {len(self.parts)} tensors, {len(self.ops)} ops>"


def _contiguous(x: Any, dtype: Any) -> Any:
    """``x`` as a contiguous array of ``dtype`` (itself when it is one)."""
    if type(x) is xp.ndarray and x.dtype is dtype and x.flags.c_contiguous:
        return x
    return xp.ascontiguousarray(x, dtype)


def _fits(a: Any, shape: tuple, dtype: Any) -> bool:
    """Whether the loop may store a result of ``shape`` and ``dtype`` straight into array ``a``."""
    return (type(a) is xp.ndarray and a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
            and a.flags.writeable)


def _load(source: str, name: str) -> Any:
    """The built function (one pointer: the table), or False when no compiler builds it."""
    return load_c(source, name, 1, False)
