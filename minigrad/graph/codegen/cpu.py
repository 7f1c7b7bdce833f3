"""CPU kernels for fused groups: generated Python that evaluates a group block by block (chapter 03).

Eager numpy runs ``0.5 * x * (1 + tanh(c * (x + 0.044715 * x**3)))`` one op at a time over the
whole array: every op reads and writes 16 MB for 4M float32 values and allocates its result, so
the chain is bound by memory traffic. A fused kernel walks the output in blocks of ``BLOCK_SIZE``
elements and applies the group's ufuncs to each block with ``out=`` into a few scratch buffers
allocated once per call: intermediates stay in the caches and nothing is allocated per op.
Inputs are broadcast to the output's shape as views and axes that every operand can merge are
collapsed (``_collapse``), so per-row and per-column operands, scalars and non-contiguous views all
block alike. Blocks are shared among ``NUM_THREADS`` threads (numpy releases the GIL in ufunc
loops). Each template below mirrors its op's ``forward`` ufunc for ufunc, so fused and eager
results agree bit for bit; ops without a template run their own ``forward`` on each block.

Measured here (2 shared AMD EPYC cores with AVX2, 512 KB of L2 each; numpy 2.4) with
``python benchmarks/bench_fusion.py --sweep``: the whole GELU-gate-normalise chain on 4M float32,
compiled, ms per call, best of 9 interleaved rounds while other work kept the load average near 2
(eager minigrad: ~100 ms):

    =================  ====  ====  ====  ====  ====  ====
    block (elements)    8K   16K   32K   64K  128K  256K
    1 thread             72    61    55    49    53    58
    2 threads            70    63    45    42    36    35
    =================  ====  ====  ====  ====  ====  ====

Blocks below 32K pay Python's per-call cost (~2 us a ufunc call here); from 64K up the figures
are within the noise of each other (a thread's few block buffers stay in the 32 MB L3 either way),
so 128K, near the best on one thread and on two. On this CPU numpy's float32 ``tanh`` costs ~3 ns
a value, so the chain's two tanh take ~24 ms of one core whatever the schedule: blocking removes
the rest of the memory traffic, threads split the tanh. Splitting pays only for large calls
(``PARALLEL_MIN_SIZE``), and blocks are handed out on demand, so a busy second core costs little.
numexpr (no VML: a scalar tanh) and numba (no SVML) ran such chains slower than plain numpy,
which is why kernels are plain numpy.
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
from minigrad.graph.codegen import Program, program
from minigrad.graph.ir import Graph, Node
from minigrad.graph.trace import ARRAY_ARG, TENSOR_ARG, run_node

__all__ = ["BLOCK_SIZE", "CpuKernel", "NUM_THREADS", "PARALLEL_MIN_SIZE", "generate", "reduce_rows", "run_blocked"]

xp = _cpu_device.xp
BLOCK_SIZE = 131072  # elements per block (see the measurements above)
NUM_THREADS = min(2, os.cpu_count() or 1)  # threads sharing the blocks of one large kernel call
PARALLEL_MIN_SIZE = 1 << 20  # elements; below, waking a second thread costs more than it saves

# One ufunc call per line, each as the op's forward computes it: {o} is the op's output block,
# {t} a scratch block of its dtype, {0}, {1}, ... its arguments in the order forward takes them.
_TEMPLATES = {
    "Add": "add({0}, {1}, out={o})",
    "Sub": "subtract({0}, {1}, out={o})",
    "Mul": "multiply({0}, {1}, out={o})",
    "Div": "divide({0}, {1}, out={o})",
    "Pow": "power({0}, {1}, out={o})",
    "Neg": "negative({0}, out={o})",
    "Exp": "exp({0}, out={o})",
    "Log": "log({0}, out={o})",
    "Sqrt": "sqrt({0}, out={o})",
    "Rsqrt": "sqrt({0}, out={o}); divide(1, {o}, out={o})",
    "Abs": "absolute({0}, out={o})",
    "Sign": "sign({0}, out={o})",
    "Sin": "sin({0}, out={o})",
    "Cos": "cos({0}, out={o})",
    "Tanh": "tanh({0}, out={o})",
    "TanhBackward": "multiply({1}, {1}, out={o}); subtract(1, {o}, out={o}); multiply({0}, {o}, out={o})",
    "Sigmoid": "multiply(0.5, {0}, out={o}); tanh({o}, out={o}); multiply(0.5, {o}, out={o}); add(0.5, {o}, out={o})",
    "SigmoidBackward": "multiply({0}, {1}, out={o}); subtract(1, {1}, out={t}); multiply({o}, {t}, out={o})",
    "Relu": "maximum({0}, 0, out={o})",
    "Clamp": "clip({0}, {1}, {2}, out={o})",
    "Maximum": "maximum({0}, {1}, out={o})",
    "Minimum": "minimum({0}, {1}, out={o})",
    "Where": "copyto({o}, {2}); copyto({o}, {1}, where={0})",
    "Cast": "copyto({o}, {0}, casting='unsafe')",
    "Clone": "copyto({o}, {0})",
    "Contiguous": "copyto({o}, {0})",
    "Equal": "equal({0}, {1}, out={o})",
    "NotEqual": "not_equal({0}, {1}, out={o})",
    "Less": "less({0}, {1}, out={o})",
    "LessEqual": "less_equal({0}, {1}, out={o})",
    "Greater": "greater({0}, {1}, out={o})",
    "GreaterEqual": "greater_equal({0}, {1}, out={o})",
    "LogicalAnd": "logical_and({0}, {1}, out={o})",
    "LogicalOr": "logical_or({0}, {1}, out={o})",
    "LogicalNot": "logical_not({0}, out={o})",
}
_NUMPY_NAMES = sorted({line.split("(")[0] for t in _TEMPLATES.values() for line in t.split("; ")} | {"empty"})


class CpuKernel:
    """A fused group compiled to a Python function: ``kernel(*arrays) -> array``. ``source`` is
    the generated code; ``ops`` the member ops it evaluates."""

    def __init__(self, name: str, source: str, fn: Callable[..., Any], ops: tuple[str, ...]) -> None:
        self.name, self.source, self.ops, self._fn = name, source, ops, fn

    def __call__(self, *arrays: Any) -> Any:
        return self._fn(*arrays)

    def __repr__(self) -> str:
        return f"<CpuKernel {self.name}: {len(self.ops)} ops>"


def generate(group: Graph) -> CpuKernel:
    """Generate, compile and return the CPU kernel of a fused group's sub-graph."""
    prog = program(group)
    names = {p: f"x{k}" for k, p in enumerate(prog.inputs)}
    env: dict[str, Any] = {name: getattr(xp, name) for name in _NUMPY_NAMES}
    env.update(run_blocked=run_blocked, reduce_rows=reduce_rows, reuse_or_empty=reuse_or_empty)
    head = []
    if prog.anchor is not None:  # the product first: the block function is its epilogue
        head.append(f"m = {_bind(env, prog.anchor)}{_tuple(names[i] for i in prog.anchor.inputs)}"
                    f"  # {_describe(prog.anchor)}")
        names[prog.anchor] = "m"
    body, slots = _block_code(prog, names, env)
    leaves = [v for n, v in names.items() if any(n in op.inputs for op in prog.ops)]
    block = [f"def block({', '.join(['o'] + leaves + [f's{k}' for k in range(len(slots))])}):"]
    block += ["    " + line for line in body]
    head += _entry_code(prog, names, env, _tuple(leaves), tuple(slots))
    red = prog.reduction
    ops = tuple(n.op for n in [prog.anchor] * (prog.anchor is not None) + prog.ops + [red] * (red is not None))
    doc = f'"""{", ".join(ops)} -> {tuple(prog.root.shape)} {prog.root.dtype}, block by block."""'
    entry = [f"def {prog.name}({', '.join(names[p] for p in prog.inputs)}):", "    " + doc]
    source = "\n".join(block) + "\n\n\n" + "\n".join(entry + ["    " + line for line in head]) + "\n"
    filename = f"<minigrad kernel {prog.name}-{next(_counter)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks show it
    exec(compile(source, filename, "exec"), env)
    return CpuKernel(prog.name, source, env[prog.name], ops)


def _entry_code(prog: Program, names: dict[Node, str], env: dict[str, Any], args: str, slots: tuple) -> list[str]:
    """The kernel's lines after the product: allocate the output, run the blocks, reduce."""
    shape, dtype, red = prog.shape, str(prog.ops[-1].dtype), prog.reduction
    if red is not None and _row_blockable(red, shape):
        return [f"return reduce_rows(block, {_bind(env, red)}, {args}, {shape}, {dtype!r}, {tuple(red.shape)}, "
                f"{str(red.dtype)!r}, {slots})  # {_describe(red)}, each block of rows"]
    if red is not None:  # the reduction needs the whole prologue: materialise only its last value
        return [f"p = empty({shape}, {dtype!r})", f"run_blocked(block, p, {args}, {slots})",
                f"return {_bind(env, red)}(p)  # {_describe(red)}"]
    if prog.anchor is not None and _one_ufunc(prog.ops[-1]) and prog.anchor.dtype == prog.ops[-1].dtype:
        inputs = _tuple(names[i] for i in prog.anchor.inputs)
        alloc = f"out = reuse_or_empty(m, {inputs}, {shape}, {dtype!r})  # write the result over m"
    else:
        alloc = f"out = empty({shape}, {dtype!r})"
    return [alloc, f"run_blocked(block, out, {args}, {slots})", "return out"]


def _tuple(items: Any) -> str:
    items = list(items)
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


# -- generating the block function ----------------------------------------------------------------
def _block_code(prog: Program, names: dict[Node, str], env: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The lines of ``block`` and the dtype of each scratch buffer ``s0, s1, ...``. Buffers are
    reused once their value is dead (a linear scan), so a long chain needs two or three."""
    last_use = {i: k for k, n in enumerate(prog.ops) for i in n.inputs}
    value = dict(names)
    slots: list[str] = []
    free: dict[str, list[str]] = {}

    def take(dtype: str) -> str:
        if free.get(dtype):
            return free[dtype].pop()
        slots.append(dtype)
        return f"s{len(slots) - 1}"

    lines = []
    for k, n in enumerate(prog.ops):
        args = _operands(n, value, env)
        template = _TEMPLATES[n.op].split("; ") if n.op in _TEMPLATES and not n.meta.get("kwargs") else None
        dtype = str(n.dtype)
        dying = [value[i] for i in dict.fromkeys(n.inputs) if last_use.get(i) == k and value[i].startswith("s")]
        if k == len(prog.ops) - 1:
            dest = "o"
        elif _one_ufunc(n) and any(slots[int(s[1:])] == dtype for s in dying):
            dest = next(s for s in dying if slots[int(s[1:])] == dtype)  # one ufunc may work in place
            dying.remove(dest)
        else:
            dest = take(dtype)
        if template is None:  # no template: the op's own forward on the block, copied into place
            fname = _bind(env, n)
            template = [f"copyto({{o}}, {fname}({', '.join(value[i] for i in n.inputs)}))"]
        temp = take(dtype) if any("{t}" in line for line in template) else None
        for j, line in enumerate(template):
            lines.append(line.format(*args, o=dest, t=temp) + (f"  # {n.name} = {n.op}" if j == 0 else ""))
        for s in dying + ([temp] if temp else []):
            free.setdefault(slots[int(s[1:])], []).append(s)
        value[n] = dest
    return lines, slots


def _one_ufunc(node: Node) -> bool:
    """Whether the op is one ufunc call (or a copy of forward's result), which may write over
    its own input: an op of several calls writes its output before it has read every input."""
    return "; " not in _TEMPLATES.get(node.op, "")


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
    env[name] = _Forward(node)
    return name


class _Forward:
    """``node``'s op forward as a function of its input arrays (attributes as the trace saw them)."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def __call__(self, *arrays: Any) -> Any:
        return run_node(self.node, arrays)[0]


def _describe(node: Node) -> str:
    attrs = ", ".join(f"{k}={v!r}" for k, v in node.attrs.items())
    return f"{node.name} = {node.op}({attrs}) -> {tuple(node.shape)} {node.dtype}"


def _row_blockable(reduction: Node, shape: tuple) -> bool:
    """Whether the reduction keeps axis 0, so that each block of rows reduces on its own."""
    attrs = reduction.attrs
    dims = attrs["dims"] if "dims" in attrs else attrs.get("dim", ())
    if len(shape) < 2 or dims is None or dims == () or reduction.op not in _ROW_REDUCTIONS:
        return False
    dims = (dims,) if isinstance(dims, int) else dims
    return all(d % len(shape) != 0 for d in dims)


_ROW_REDUCTIONS = frozenset({"Sum", "Mean", "Prod", "Amax", "Amin", "Var", "Logsumexp", "Softmax", "LogSoftmax",
                             "Cumsum", "Argmax", "Argmin"})
_counter = iter(range(1, 1 << 62))


# -- running a block function ---------------------------------------------------------------------
def run_blocked(block: Callable[..., None], out: Any, inputs: Sequence[Any], slots: Sequence[str]) -> None:
    """Call ``block(out_block, *input_blocks, *scratch)`` over ``out`` in blocks of about
    ``BLOCK_SIZE`` elements, on up to ``NUM_THREADS`` threads. Inputs broadcast to ``out``."""
    if out.size <= BLOCK_SIZE:  # one block: ufuncs broadcast the inputs themselves
        block(out, *inputs, *[xp.empty(out.shape, dt) for dt in slots])
        return
    shape, views = _collapse(out.shape, [out] + [xp.broadcast_to(x, out.shape) for x in inputs])
    blocks = _blocks(shape, BLOCK_SIZE)
    size = max(n for _, n, _ in blocks)

    def work(take: Callable[[], Any]) -> None:
        scratch = [xp.empty(size, dt) for dt in slots]
        while (b := take()) is not None:
            index, n, bshape = b
            block(*[v[index] for v in views], *[s[:n].reshape(bshape) for s in scratch])

    _parallel(work, blocks, out.size)


def reduce_rows(block: Callable[..., None], reduce: Callable[[Any], Any], inputs: Sequence[Any], shape: tuple,
                dtype: str, out_shape: tuple, out_dtype: str, slots: Sequence[str]) -> Any:
    """Evaluate ``block`` over blocks of rows (axis 0) of ``shape`` and ``reduce`` each block into
    the same rows of the output: the reduced value never exists at full size."""
    inner = math.prod(shape[1:])
    rows = max(1, BLOCK_SIZE // max(inner, 1))
    if shape[0] <= rows:
        p = xp.empty(shape, dtype)
        block(p, *inputs, *[xp.empty(shape, dt) for dt in slots])
        return reduce(p)
    out = xp.empty(out_shape, out_dtype)
    views = [xp.broadcast_to(x, shape) for x in inputs]

    def work(take: Callable[[], Any]) -> None:
        buffers = [xp.empty(rows * inner, dt) for dt in (dtype, *slots)]
        while (b := take()) is not None:
            lo, hi = b
            p, *scratch = [b[:(hi - lo) * inner].reshape((hi - lo,) + shape[1:]) for b in buffers]
            block(p, *[v[lo:hi] for v in views], *scratch)
            out[lo:hi] = reduce(p)

    _parallel(work, [(lo, min(lo + rows, shape[0])) for lo in range(0, shape[0], rows)], math.prod(shape))
    return out


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
