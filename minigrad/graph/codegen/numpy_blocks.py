"""CPU kernels for fused groups: generated Python that evaluates a group block by block (chapter 03).

Eager numpy runs ``0.5 * x * (1 + tanh(c * (x + 0.044715 * x**3)))`` one op at a time over the
whole array: every op reads and writes 16 MB for 4M float32 values and allocates its result, so
the chain is bound by memory traffic. A fused kernel walks the output in blocks of ``BLOCK_SIZE``
elements and applies the group's ufuncs to each block with ``out=`` into a few scratch buffers
allocated once per call: intermediates stay in the caches and nothing is allocated per op.
Inputs are broadcast to the output's shape as views and axes that every operand can merge are
collapsed (``_collapse``), so per-row and per-column operands, scalars and non-contiguous views all
block alike. A group that holds a reduction keeping axis 0 (a row's mean, a softmax) runs by
blocks of whole rows instead (``run_rows``): the reduction sees complete rows, and its per-row
result, shape ``(rows, 1)``, broadcasts back over them in the same block, so a LayerNorm-style
normalise fused with what feeds it reads its input once. Blocks are shared among ``NUM_THREADS``
threads (numpy releases the GIL in ufunc loops). The ufunc calls for each op are what its class
declares (``ufunc`` or ``cpu``, ``minigrad.ops.op``), mirroring its ``forward`` ufunc for ufunc, so
fused and eager results agree bit for bit; an op that declares none runs its own ``forward`` on
each block.

``BLOCK_SIZE``, ``NUM_THREADS`` and ``PARALLEL_MIN_SIZE`` come from the block-size and thread sweep
of ``benchmarks/bench_fusion.py --sweep``; benchmarks/README.md keeps the figures and why plain numpy.
"""

from __future__ import annotations

import linecache
import math
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from minigrad.backend import cpu as _cpu_device
from minigrad.graph.codegen.program import Program, program, reduces_rows
from minigrad.graph.interpret import node_runner
from minigrad.graph.ir import Graph, Node, op_kind
from minigrad.graph.trace import ARRAY_ARG, TENSOR_ARG

__all__ = ["BLOCK_SIZE", "CpuKernel", "NUM_THREADS", "NodeForward", "PARALLEL_MIN_SIZE", "generate",
           "generate_program", "one_ufunc", "row_program", "rows_shape", "run_blocked", "run_rows", "statements"]

xp = _cpu_device.xp
BLOCK_SIZE = 262144  # elements per block (benchmarks/README.md: the sweep)
NUM_THREADS = min(2, os.cpu_count() or 1)  # threads sharing the blocks of one large kernel call
# Elements; smaller kernel calls (numpy blocks or compiled C loops alike) run on one thread. Waking
# the others costs more than it saves, and on a busy machine the loop's end waits for a thread the
# OS has not run yet: an MLP step's C loops (an SGD update over 400k weights, a GELU backward over
# 65k values) ran 2-3% faster on one thread of 2 busy cores.
PARALLEL_MIN_SIZE = 1 << 20

class CpuKernel:
    """A fused group compiled to a Python function: ``kernel(*arrays, out=None) -> array`` (into
    ``out`` when given: an array of the result's shape and dtype). ``source`` is the generated
    code; ``ops`` the member ops it evaluates."""

    def __init__(self, name: str, source: str, fn: Callable[..., Any], ops: tuple[str, ...]) -> None:
        self.name, self.source, self.ops, self._fn = name, source, ops, fn

    def __call__(self, *arrays: Any, out: Any = None) -> Any:
        return self._fn(*arrays, out=out)

    def __repr__(self) -> str:
        return f"<CpuKernel {self.name}: {len(self.ops)} ops>"


def generate(group: Graph) -> CpuKernel:
    """Generate, compile and return the CPU kernel of a fused group's sub-graph."""
    return generate_program(*row_program(group))


def row_program(group: Graph) -> tuple[Program, tuple | None]:
    """A fused group's program, and the shape its blocks of rows cover when it runs by rows
    (``rows_shape``), in which case the root reduction is one more step of each block."""
    prog = program(group)
    rows = rows_shape(prog)
    if rows:
        prog = prog._replace(ops=prog.ops + [prog.reduction] * (prog.reduction is not None), reduction=None, shape=rows)
    return prog, rows


def generate_program(prog: Program, rows: tuple | None) -> CpuKernel:
    """The CPU kernel of a program ``row_program`` made."""
    names = {p: f"x{k}" for k, p in enumerate(prog.inputs)}
    env: dict[str, Any] = {"empty": xp.empty, "copyto": xp.copyto}  # and the ufuncs the ops' statements call
    env.update(run_blocked=run_blocked, run_rows=run_rows, reuse_or_empty=reuse_or_empty)
    head = []
    if prog.anchor is not None:  # the product first: the block function is its epilogue
        head.append(f"m = {_bind(env, prog.anchor)}{_tuple(names[i] for i in prog.anchor.inputs)}"
                    f"  # {_describe(prog.anchor)}")
        names[prog.anchor] = "m"
    body, slots = _block_code(prog, names, env, rows is not None)
    leaves = [v for n, v in names.items() if any(n in op.inputs for op in prog.ops)]
    block = [f"def block({', '.join(['o'] + leaves + [f's{k}' for k in range(len(slots))])}):"]
    block += ["    " + line for line in body]
    head += _entry_code(prog, names, env, _tuple(leaves), tuple(slots), rows is not None)
    red = prog.reduction
    ops = tuple(n.op for n in [prog.anchor] * (prog.anchor is not None) + prog.ops + [red] * (red is not None))
    how = "by blocks of rows" if rows else "block by block"
    doc = f'"""{", ".join(ops)} -> {tuple(prog.root.shape)} {prog.root.dtype}, {how}."""'
    entry = [f"def {prog.name}({', '.join([names[p] for p in prog.inputs] + ['out=None'])}):", "    " + doc]
    source = "\n".join(block) + "\n\n\n" + "\n".join(entry + ["    " + line for line in head]) + "\n"
    filename = f"<minigrad kernel {prog.name}-{next(_counter)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks show it
    exec(compile(source, filename, "exec"), env)
    return CpuKernel(prog.name, source, env[prog.name], ops)


def rows_shape(prog: Program) -> tuple | None:
    """The shape a group's blocks of rows cover when it runs by rows: when it holds a reduction that
    keeps axis 0 (inside it or at its end) or values of several row shapes, (N, C) and (N, 1).
    ``None``: it runs over flat blocks."""
    reductions = [n for n in prog.ops if op_kind(n) == "reduction"]
    if prog.reduction is not None and reduces_rows(prog.reduction):
        reductions.append(prog.reduction)
    shapes = {tuple(n.shape) for n in prog.ops} | {tuple(r.inputs[0].shape) for r in reductions}
    if not reductions and len(shapes) == 1:
        return None
    return tuple(int(n) for n in xp.broadcast_shapes(*shapes))


def _entry_code(prog: Program, names: dict[Node, str], env: dict[str, Any], args: str, slots: tuple,
                rows: bool) -> list[str]:
    """The kernel's lines after the product: allocate the output, run the blocks, reduce."""
    shape, dtype, red, root = prog.shape, str(prog.ops[-1].dtype), prog.reduction, prog.root
    alloc = f"out = empty({tuple(root.shape)}, {str(root.dtype)!r}) if out is None else out"
    if rows:
        return [alloc, f"run_rows(block, out, {args}, {shape}, {slots})", "return out"]
    if red is not None:  # the reduction needs the whole prologue: materialise only its last value
        return [f"p = empty({shape}, {dtype!r})", f"run_blocked(block, p, {args}, {slots})",
                f"r = {_bind(env, red)}(p)  # {_describe(red)}",
                "if out is None:", "    return r", "copyto(out, r)", "return out"]
    if prog.anchor is not None and one_ufunc(prog.ops[-1]) and prog.anchor.dtype == prog.ops[-1].dtype:
        inputs = _tuple(names[i] for i in prog.anchor.inputs)
        alloc = (f"out = reuse_or_empty(m, {inputs}, {shape}, {dtype!r}) if out is None else out"
                 "  # write the result over m")
    return [alloc, f"run_blocked(block, out, {args}, {slots})", "return out"]


def _tuple(items: Any) -> str:
    items = list(items)
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


# -- generating the block function ----------------------------------------------------------------
def _block_code(prog: Program, names: dict[Node, str], env: dict[str, Any],
                rows: bool = False) -> tuple[list[str], list[Any]]:
    """The lines of ``block`` and the kind of each scratch buffer ``s0, s1, ...``: its dtype, and
    when the kernel runs by rows also the shape of a row of it (a row's full width, or 1 for a
    per-row statistic). Buffers are reused once their value is dead (a linear scan), so a long
    chain needs two or three.

    The walk visits ``prog.ops`` in order. ``names`` gives the block's name of each value read
    from outside (``x0, x1, ...``, ``m``); each op writes its value into a destination, which later
    ops then read by that name: the last op into ``o``, the output block; an op of one ufunc call
    (``one_ufunc``) into a scratch buffer of its kind that one of its inputs frees at this very op
    (a ufunc reads each element before it writes it), any other into a buffer taken from the free
    ones of its kind or a new one (``s{len(slots)}``). A buffer is free once the op that reads its
    value last (``last_use``) has run. An op's lines are its ``statements`` with its operands
    (``_operands``) for ``{0}, {1}, ...``, the destination for ``{o}`` and a scratch buffer held
    only during the op for ``{t}``; an op with no statements (or called with keywords) copies its
    own forward's result (``_bind``) into the destination. ``y = tanh(x0 * 2) + x0`` is::

        multiply(x0, 2, out=s0)  # %1 = Mul
        tanh(s0, out=s0)  # %2 = Tanh
        add(s0, x0, out=o)  # %3 = Add
    """
    ### BEGIN SOLUTION chapter 03: the numpy-block kernel's expression walk
    last_use = {i: k for k, n in enumerate(prog.ops) for i in n.inputs}
    value = dict(names)
    slots: list[Any] = []
    free: dict[Any, list[str]] = {}

    def take(kind: Any) -> str:
        if free.get(kind):
            return free[kind].pop()
        slots.append(kind)
        return f"s{len(slots) - 1}"

    lines = []
    for k, n in enumerate(prog.ops):
        args = _operands(n, value, env)
        template = None if n.meta.get("kwargs") else statements(n)
        kind = (str(n.dtype), tuple(n.shape[1:])) if rows else str(n.dtype)
        dying = [value[i] for i in dict.fromkeys(n.inputs) if last_use.get(i) == k and value[i].startswith("s")]
        if k == len(prog.ops) - 1:
            dest = "o"
        elif one_ufunc(n) and any(slots[int(s[1:])] == kind for s in dying):
            dest = next(s for s in dying if slots[int(s[1:])] == kind)  # one ufunc may work in place
            dying.remove(dest)
        else:
            dest = take(kind)
        if template is None:  # no template: the op's own forward on the block, copied into place
            fname = _bind(env, n)
            template = [f"copyto({{o}}, {fname}({', '.join(value[i] for i in n.inputs)}))"]
        temp = take(kind) if any("{t}" in line for line in template) else None
        for j, line in enumerate(template):
            env.setdefault(line.split("(")[0], getattr(xp, line.split("(")[0], None))
            lines.append(line.format(*args, o=dest, t=temp) + (f"  # {n.name} = {n.op}" if j == 0 else ""))
        for s in dying + ([temp] if temp else []):
            free.setdefault(slots[int(s[1:])], []).append(s)
        value[n] = dest
    return lines, slots
    ### END SOLUTION


def statements(node: Node) -> list[str] | None:
    """The op's ufunc calls for one block, as its class declares them: ``ufunc`` (one call on
    its arguments) or ``cpu`` (calls separated by ``"; "``); None when it declares neither."""
    ufunc = getattr(node.fn, "ufunc", None)
    if ufunc is not None:
        return [f"{ufunc}({', '.join('{%d}' % k for k in range(len(node.meta['args'])))}, out={{o}})"]
    template = getattr(node.fn, "cpu", None)
    return template.split("; ") if template is not None else None


def one_ufunc(node: Node) -> bool:
    """Whether the op is one ufunc call (or a copy of forward's result), which may write over
    its own input: an op of several calls writes its output before it has read every input."""
    return len(statements(node) or ()) <= 1


def _operands(node: Node, value: dict[Node, str], env: dict[str, Any]) -> list[str]:
    """The op's arguments as code, in forward's order: block names for its inputs, literals (or
    names bound in the kernel's namespace) for the constant arguments the trace recorded."""
    inputs = iter(node.inputs)
    out = []
    for k in node.meta["args"]:
        if k in (TENSOR_ARG, ARRAY_ARG):
            out.append(value[next(inputs)])
        else:
            out.append(_literal(node.attrs[k], env))
    return out


def _literal(v: Any, env: dict[str, Any]) -> str:
    if v is None or type(v) in (bool, int) or (type(v) is float and math.isfinite(v)):
        return repr(v)
    name = f"c{sum(k.startswith('c') and k[1:].isdigit() for k in env)}"
    env[name] = v
    return name


def _bind(env: dict[str, Any], node: Node) -> str:
    """Put a call of ``node``'s own forward into the kernel's namespace; returns its name."""
    name = node.op.lower() + "_" + re.sub(r"\W", "_", node.name.lstrip("%"))
    env[name] = NodeForward(node)
    return name


class NodeForward:
    """``node``'s op forward as a function of its input arrays (attributes as the trace saw them).
    A fused kernel's anchor (the matrix product of a ``Matmul, Add`` group) runs on every call of
    a compiled step, 29 times in an LSTM's: through ``node_runner``, which looks the node's
    device, argument layout and keyword arguments up once (at the first call, when every pass
    has run), not ``run_node``, which looks them up each time."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._run: Callable[[Sequence[Any]], tuple[Any, Any]] | None = None

    def __call__(self, *arrays: Any) -> Any:
        run = self._run
        if run is None:
            run = self._run = node_runner(self.node)
        return run(arrays)[0]


def _describe(node: Node) -> str:
    attrs = ", ".join(f"{k}={v!r}" for k, v in node.attrs.items())
    return f"{node.name} = {node.op}({attrs}) -> {tuple(node.shape)} {node.dtype}"


_counter = iter(range(1, 1 << 62))


# -- running a block function ---------------------------------------------------------------------
def run_blocked(block: Callable[..., None], out: Any, inputs: Sequence[Any], slots: Sequence[str]) -> None:
    """Call ``block(out_block, *input_blocks, *scratch)`` over ``out`` in blocks of about
    ``BLOCK_SIZE`` elements, on up to ``NUM_THREADS`` threads. Inputs broadcast to ``out``."""
    if out.size <= BLOCK_SIZE:  # one block: ufuncs broadcast the inputs themselves
        block(out, *inputs, *[xp.empty(out.shape, dt) for dt in slots])
        return
    if all(x.shape == out.shape and x.flags.c_contiguous for x in (out, *inputs)):  # the common case, quickly
        shape, views = (out.size,), [x.reshape(-1) for x in (out, *inputs)]
    else:
        shape, views = _collapse(out.shape, [out] + [xp.broadcast_to(x, out.shape) for x in inputs])
    blocks = _blocks(shape, BLOCK_SIZE)
    size = max(n for _, n, _ in blocks)

    def work(take: Callable[[], Any]) -> None:
        scratch = [xp.empty(size, dt) for dt in slots]
        while (b := take()) is not None:
            index, n, bshape = b
            block(*[v[index] for v in views], *[s[:n].reshape(bshape) for s in scratch])

    _parallel(work, blocks, out.size)


def run_rows(block: Callable[..., None], out: Any, inputs: Sequence[Any], shape: tuple,
             slots: Sequence[tuple]) -> None:
    """Call ``block(out_rows, *input_rows, *scratch)`` over blocks of whole rows (ranges of axis
    0) of ``shape``, on up to ``NUM_THREADS`` threads: a row reduction inside the block sees each
    of its rows whole, so reduced values never exist at full size. An input with rows of its own
    (axis 0 of ``shape``'s length) is cut into the same rows; any other broadcasts whole."""
    inner = math.prod(shape[1:])
    rows = max(1, BLOCK_SIZE // max(inner, 1))
    cut = [x.ndim == len(shape) and x.shape[0] == shape[0] for x in inputs]

    def work(take: Callable[[], Any]) -> None:
        scratch = [xp.empty((min(rows, shape[0]),) + tail, dt) for dt, tail in slots]
        while (b := take()) is not None:
            lo, hi = b
            block(out[lo:hi], *[x[lo:hi] if c else x for x, c in zip(inputs, cut)], *[s[:hi - lo] for s in scratch])

    _parallel(work, [(lo, min(lo + rows, shape[0])) for lo in range(0, shape[0], rows)], math.prod(shape))


def reuse_or_empty(m: Any, inputs: Sequence[Any], shape: tuple, dtype: str) -> Any:
    """``m`` itself when the epilogue can overwrite it (a fresh, contiguous array of the result's
    shape and dtype, sharing no memory with an input), else a new array."""
    if (m.shape == shape and m.dtype == dtype and m.flags.c_contiguous and m.flags.writeable
            and not any(xp.may_share_memory(m, x) for x in inputs)):
        return m
    return xp.empty(shape, dtype)


def _collapse(shape: tuple, views: list) -> tuple[tuple, list]:
    """Merge adjacent axes wherever every view steps through them as through one axis (size-1
    axes dropped), so contiguous operands become 1-D and blocks can be flat ranges."""
    keep = [k for k, n in enumerate(shape) if n != 1]
    dims: list[int] = []
    strides: list[list[int]] = [[] for _ in views]
    for k in reversed(keep):
        if dims and all(v.strides[k] == s[0] * dims[0] for v, s in zip(views, strides)):
            dims[0] *= shape[k]
            continue
        dims.insert(0, shape[k])
        for v, s in zip(views, strides):
            s.insert(0, v.strides[k])
    as_strided = xp.lib.stride_tricks.as_strided
    return tuple(dims), [as_strided(v, dims, s, writeable=(j == 0)) for j, (v, s) in enumerate(zip(views, strides))]


def _blocks(shape: tuple, size: int) -> list[tuple]:
    """``(index, n, block_shape)`` for blocks of about ``size`` elements: whole trailing axes
    after a split axis, a range of the split axis, one block per index of the axes before it."""
    if not shape:
        return [(Ellipsis, 1, ())]
    j, inner = len(shape) - 1, 1
    while j > 0 and inner * shape[j] <= size:
        inner *= shape[j]
        j -= 1
    rows = max(1, size // inner)
    out = []
    for lead in xp.ndindex(*shape[:j]):
        for lo in range(0, shape[j], rows):
            hi = min(lo + rows, shape[j])
            out.append((lead + (slice(lo, hi),), (hi - lo) * inner, (hi - lo,) + shape[j + 1:]))
    return out


_pools: dict[int, ThreadPoolExecutor] = {}
_pool_lock = threading.Lock()


def _parallel(work: Callable[[Callable[[], Any]], None], blocks: list, size: int) -> None:
    """Run ``work(take)`` here and on up to ``NUM_THREADS - 1`` threads of a persistent pool; each
    calls ``take()`` for its next block until none is left (None). Blocks are handed out as they
    are asked for, so on a busy machine this thread does all of them rather than wait for a pool
    thread the OS has not run yet, which then finds nothing left (or was never started)."""
    k = min(NUM_THREADS, len(blocks)) if size >= PARALLEL_MIN_SIZE else 1
    source, lock = iter(blocks), threading.Lock()

    def take() -> Any:
        with lock:
            return next(source, None)

    if k <= 1:
        work(take)
        return
    with _pool_lock:
        pool = _pools.get(k - 1) or _pools.setdefault(k - 1, ThreadPoolExecutor(k - 1, "minigrad-kernel"))
    futures = [pool.submit(work, take) for _ in range(k - 1)]
    try:
        work(take)
    finally:
        for f in futures:
            if not f.cancel():
                f.result()
