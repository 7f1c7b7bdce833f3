"""Multi-tensor kernels: the same small loop over many tensors as one C call (chapter 03).

An optimizer steps every parameter with the same few elementwise ops: Adam's update of a hundred
tensors is a hundred kernels that differ only in their pointers and lengths, each paying a Python
call (tens of microseconds) to do a microsecond of work, and so are the bias corrections and the
step counts before it. ``MultiTensorKernel`` runs one loop body over a list of tensors in one call,
as PyTorch's ``_foreach`` ops and apex's multi-tensor apply do: the kernel walks a table of
pointers, one row per tensor (its results, then its operands), each tensor's loop as long as that
tensor. An operand is read element by element (``p[i]``) or is one number for its tensor
(``p[0]``: a bias correction). The addresses of arrays that stay the same from call to call (the
parameters and their moments) are looked up once. Where no compiler builds it, each member's own
kernel (``parts``) runs in turn, so the numpy fallback computes the same values.

Only bodies without vector math calls are written so (an optimizer's ``sqrt`` is exact in every
width), and a table of single numbers is a plain loop, so each value is the same bit for bit as
its own kernel's or eager's.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from minigrad.backend import cc
from minigrad.backend import cpu as _cpu_device
from minigrad.backend.cc import address as _address
from minigrad.graph.codegen.program import Dialect, expression
from minigrad.graph.ir import Graph, Node

__all__ = ["MultiTensorKernel", "body_of", "generate_multi_tensor"]

xp = _cpu_device.xp


def body_of(group: Graph, dialect: Dialect) -> tuple[list[str], list[int]] | None:
    """The loop body of one member's sub-graph (``group``: placeholders, elementwise members,
    results of one shape), written with names that do not depend on the member (``a0``: an
    operand, ``v3``: a value, ``o1``: a result), and which placeholders it reads; None when an
    operand is neither whole nor one number. Members with the same body share a kernel."""
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
        lines.append(f"{ctype} a{j} = (({'const ' + ctype} *)row[{len(results) + j}])[{index}];")
        value[p] = f"a{j}"
    for j, m in enumerate(members):
        expr = expression(m, value, dialect)
        value[m] = f"v{j}"
        lines.append(f"{dialect.ctypes[str(m.dtype)]} v{j} = {expr};  // {m.op}")
    lines += [f"(({dialect.ctypes[str(r.dtype)]} *)row[{k}])[i] = {value[r]};" for k, r in enumerate(results)]
    return lines, leaves


def generate_multi_tensor(name: str, body: list[str], sizes: Sequence[int], width: int) -> str:
    """The C source of one multi-tensor kernel: for tensor ``t``, ``row = table + t * width``
    holds its results' and operands' addresses, and its loop runs ``sizes[t]`` times."""
    n = len(sizes)
    loop = (["    #pragma omp simd", "    for (long i = 0; i < sizes[t]; i++) {"] if max(sizes) > 1
            else ["    {", "    const long i = 0;"])
    lines = [f"/* {name}: one loop body over {n} tensors */", "#include <math.h>", "#include <tgmath.h>", "",
             f"static const long sizes[{n}] = {{{', '.join(map(str, sizes))}}};", "",
             f"void {name}(void **table)", "{", f"  for (long t = 0; t < {n}L; t++) {{",
             f"    void **row = table + t * {width}L;"]
    lines += loop + ["        " + line for line in body] + ["    }", "  }", "}", ""]
    return "\n".join(lines)


class MultiTensorKernel:
    """One loop body over many tensors: ``kernel(*arrays, out=None) -> tuple``. ``arrays`` are
    the members' inputs one member after another (``arity`` each), the results come back the
    same way (``results`` per member), each written into its ``out`` array (a tensor's memory)
    when given. ``leaves`` are the inputs of a member that the body reads, ``types`` their
    dtypes and ``shapes``/``dtypes`` each member's results'. Without a compiler, ``parts`` (each
    member's own kernel, or its op's forward: arrays in, value out) compute the same values."""

    def __init__(self, name: str, source: str, arity: int, leaves: list[int], types: list[str],
                 results: list[tuple], parts: list[Any], group: Graph) -> None:
        self.name, self.source, self.parts, self.group = name, source, parts, group
        self.arity, self._leaves, self._types = arity, leaves, [xp.dtype(t) for t in types]
        self._results = results  # per member: a (shape, dtype) per result
        self.per_member = len(results[0])
        self.ops = tuple(n.op for n in group.topological_order() if n.op not in ("placeholder", "output"))
        self._fn: Any = None
        self._known: list[Any] = []  # the arrays of the last call's table, kept so that "is" compares live ones
        self._table: Any = None

    def __call__(self, *arrays: Any, out: tuple | None = None) -> tuple:
        if self._fn is None:
            self._fn = _load(self.source, self.name)
        count, per_member, leaves = len(self.parts), self.per_member, len(self._leaves)
        outs = out or (None,) * (count * per_member)
        if self._fn is False:
            return self._by_parts(arrays, outs)
        row, known, ready = [], self._known, self._table is not None
        for m in range(count):  # a row of the table per tensor: its results, then its operands
            base = m * (per_member + leaves)
            for r in range(per_member):
                o = outs[m * per_member + r]
                if o is None or not (ready and o is known[base + r]) and not _fits(o, *self._results[m][r]):
                    o = xp.empty(*self._results[m][r])
                row.append(o)
            for j, k in enumerate(self._leaves):
                x = arrays[m * self.arity + k]
                if not (ready and x is known[base + per_member + j]):
                    t = self._types[j]
                    if type(x) is not xp.ndarray or x.dtype is not t or not x.flags.c_contiguous:
                        x = xp.ascontiguousarray(x, t)
                row.append(x)
        table = self._addresses(row)
        if self._overlap(table):  # a result would clobber what another tensor reads: into new arrays
            row = list(row)  # a new list: the last one is what _addresses compares with
            for m in range(count):
                for r in range(per_member):
                    row[m * (per_member + leaves) + r] = xp.empty(*self._results[m][r])
            table = self._addresses(row)
        self._fn(_address(table))
        results = [row[m * (per_member + leaves) + r] for m in range(count) for r in range(per_member)]
        for o, r in zip(outs, results):
            if o is not None and r is not o:
                xp.copyto(o, r)
        return tuple(o if o is not None else r for o, r in zip(outs, results))

    def _addresses(self, row: list) -> Any:
        """The table of addresses for ``row``: looked up again only for the arrays that are not
        the very ones of the last call (the parameters and their moments stay). The last call's
        arrays are kept, so that "is" compares live arrays only."""
        table, known = self._table, self._known
        if table is None:
            table = self._table = xp.array([_address(x) for x in row], dtype=xp.intp)
            self._bytes = xp.array([x.nbytes for x in row], dtype=xp.intp).reshape(len(self.parts), -1)
        else:
            for k, x in enumerate(row):
                if x is not known[k]:
                    table[k] = _address(x)
        self._known = row
        return table

    def _overlap(self, table: Any) -> bool:
        """Whether a result shares memory with another result, or with an operand other than the
        same array of its own tensor (read element for element before it is written). Contiguous
        arrays share memory exactly when their byte ranges meet: sorted by start, disjoint results
        each end before the next starts, and an operand meets one only if it meets the last
        result starting before its end."""
        per = self.per_member
        starts = table.reshape(len(self.parts), -1)
        ends = starts + self._bytes
        rs, re_ = starts[:, :per], ends[:, :per]
        xs, xe = starts[:, per:], ends[:, per:]
        same = ((xs[:, :, None] == rs[:, None, :]) & (xe[:, :, None] == re_[:, None, :])).any(-1)
        keep = self._bytes[:, :per] > 0
        rs, re_ = rs[keep], re_[keep]
        order = xp.argsort(rs, kind="stable")
        rs, re_ = rs[order], re_[order]
        if len(rs) > 1 and (rs[1:] < re_[:-1]).any():
            return True
        free = ~same & (self._bytes[:, per:] > 0)
        xs, xe = xs[free], xe[free]
        last = xp.searchsorted(rs, xe, side="left") - 1
        return bool(((last >= 0) & (re_[xp.maximum(last, 0)] > xs)).any()) if len(rs) else False

    def _by_parts(self, arrays: tuple, outs: tuple) -> tuple:
        """Each member's own kernel in turn (the numpy fallback), copied into ``outs``."""
        values = []
        for m, part in enumerate(self.parts):
            value = part(*arrays[m * self.arity:(m + 1) * self.arity])
            values += list(value) if type(value) is tuple else [value]
        for o, v in zip(outs, values):
            if o is not None:
                xp.copyto(o, v)
        return tuple(o if o is not None else v for o, v in zip(outs, values))

    def __repr__(self) -> str:
        return f"<MultiTensorKernel {self.name}: {len(self.parts)} tensors, {len(self.ops)} ops>"


def _fits(a: Any, shape: tuple, dtype: Any) -> bool:
    """Whether the loop may store a result of ``shape`` and ``dtype`` straight into array ``a``."""
    return type(a) is xp.ndarray and a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable


def _load(source: str, name: str) -> Any:
    """The built function (one pointer: the table), or False when no compiler builds it."""
    from minigrad.graph.codegen.c import _load as load_c

    return load_c(source, name, 1, False)
