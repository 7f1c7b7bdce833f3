"""Fusion and compile: an elementwise-heavy chain and an MLP training step, eager vs compiled, and memory.

(a) On 4096 x 1024 float32 values (4M): tanh-approximation GELU, a per-column scale and shift, a
sigmoid gate ``h * sigmoid(h)``, then a LayerNorm-style normalise of each row (mean, centre,
variance, rsqrt). Eager minigrad, ``minigrad.compile`` with its C kernels (``compiled``) and with
blocked numpy kernels (``compiled-numpy``), PyTorch eager and ``torch.compile`` (CPU inductor,
which compiles C++ with g++ on its first call: 30-60 s). Targets (issue 19, restated by issue 28
for any x86-64 machine, AVX2 or AVX-512): compiled >= 5x faster than eager minigrad, and at most
0.8x torch.compile's time. PyTorch gets as many threads as minigrad's C kernels use (one per
physical core: the machine probe of ``backend.machine``, printed first with the vector width it
chose). (b) bench_train's MLP 784-512-512-10 training step (batch 128, SGD with
momentum) and the same MLP with GELU, tanh and sigmoid activations, compiled vs eager; target:
compiled >= 1.2x faster (each parameter's update is one kernel: ``passes.update_fusion``;
``compiled-split`` keeps one kernel per group, the momentum's and the weight's, to show what that buys). The
last lines list every target, met or not. (c) Peak memory of the chain: eager, and the executor (each buffer freed after
its last use) on the unfused and on the fused graph, beside what keeping every value would take.
``--sweep`` times the compiled chain for block sizes and thread counts (``codegen/numpy_blocks.py`` took its
defaults from it); ``--profile`` shows where the compiled ReLU step's time goes, node by node
(``Executor.run(time_nodes=True)``), and which products the executor overlaps with the rest of the
step on a second thread (``minigrad.graph.overlap``). ``python benchmarks/bench_fusion.py [--repeats R] [--steps N]
[--sweep] [--profile]``.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import time

# torch's OpenMP threads would spin after each call, taking the cores from the next contender
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from common import conditions, interleaved, torch  # noqa: E402  (first: sets BLAS threads before numpy)

import numpy

import minigrad
from bench_train import make_step, mlp
from minigrad.graph import trace
from minigrad.backend import cc
from minigrad.graph.codegen import numpy_blocks
from minigrad.graph.executor import Executor
from minigrad.graph.ir import op_kind
from minigrad.graph.passes import default_passes, eliminate_dead_code, fuse_elementwise
from minigrad.graph.writeback import drop_overwritten_copies

SHAPE = (4096, 1024)
SPEEDUP_TARGET, TORCH_COMPILE_TARGET, STEP_TARGET = 5.0, 0.8, 1.2


def chain(lib, x, scale, shift):
    """The same expression for minigrad and torch (``lib`` is either module)."""
    g = 0.5 * x * (1 + lib.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
    h = g * scale + shift
    h = h * lib.sigmoid(h)
    d = h - h.mean(-1, keepdim=True)
    return d * lib.rsqrt((d * d).mean(-1, keepdim=True) + 1e-5)


def minigrad_chain(x, scale, shift):
    return chain(minigrad, x, scale, shift)


def torch_chain(x, scale, shift):
    return chain(torch, x, scale, shift)


def kernel_threads() -> int:
    """The threads the C kernels' parallel loops use: ``$OMP_NUM_THREADS``, else the probe's."""
    wanted = os.environ.get("OMP_NUM_THREADS", "")
    return int(wanted) if wanted.isdigit() and int(wanted) > 0 else cc.machine().threads


def chain_contenders(arrays) -> dict:
    x = [minigrad.tensor(a) for a in arrays]
    compiled = minigrad.compile(minigrad_chain)
    blocked = minigrad.compile(minigrad_chain, backend="numpy")
    expected = compiled(*x).numpy()  # traces
    for f in (compiled, blocked):
        numpy.testing.assert_allclose(f(*x).numpy(), expected, rtol=1e-4, atol=1e-5)  # builds the kernel
    runs = {"minigrad": lambda: minigrad_chain(*x), "compiled": lambda: compiled(*x),
            "compiled-numpy": lambda: blocked(*x)}
    if torch is not None:
        torch.set_num_threads(kernel_threads())
        t = [torch.from_numpy(a) for a in arrays]
        start = time.perf_counter()
        inductor = torch.compile(torch_chain)
        try:
            numpy.testing.assert_allclose(inductor(*t).numpy(), expected, rtol=1e-3, atol=1e-3)
            runs["torch.compile"] = lambda: inductor(*t)
            print(f"torch.compile: first call (compiling) took {time.perf_counter() - start:.1f} s")
        except Exception as e:  # noqa: BLE001  (report the failure, time the rest)
            print(f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        numpy.testing.assert_allclose(torch_chain(*t).numpy(), expected, rtol=1e-3, atol=1e-3)
        runs["torch"] = lambda: torch_chain(*t)
    return runs


def chain_table(ms: dict, verdicts: list[str]) -> str:
    names = list(ms)
    lines = [f"{'ms per call':22}" + "".join(f"{n:>15}" for n in names),
             f"{'chain, 4M float32':22}" + "".join(f"{ms[n]:15.2f}" for n in names), ""]
    speedup = ms["minigrad"] / ms["compiled"]
    lines.append(f"compiled vs eager minigrad: {speedup:.2f}x faster (target >= {SPEEDUP_TARGET}x: "
                 f"{'met' if speedup >= SPEEDUP_TARGET else 'not met'}); compiled-numpy: "
                 f"{ms['minigrad'] / ms['compiled-numpy']:.2f}x")
    verdicts.append(lines[-1].split(";")[0])
    if "torch.compile" in ms:
        ratio = ms["compiled"] / ms["torch.compile"]
        lines.append(f"compiled / torch.compile: {ratio:.2f}x of its time (target <= {TORCH_COMPILE_TARGET}x: "
                     f"{'met' if ratio <= TORCH_COMPILE_TARGET else 'not met'})")
        verdicts.append(lines[-1])
    else:
        verdicts.append(f"compiled / torch.compile (target <= {TORCH_COMPILE_TARGET}x): not measured, "
                        "torch.compile did not run here")
    if "torch" in ms:
        lines.append(f"torch eager / torch.compile: {ms['torch'] / ms.get('torch.compile', math.nan):.2f}x")
    return "\n".join(lines)


def smooth_mlp(lib):
    """bench_train's MLP with the activations whose backward is an elementwise chain to fuse."""
    n = lib.nn
    return n.Sequential(n.Linear(784, 512), n.GELU(), n.Linear(512, 512), n.Tanh(), n.Linear(512, 512),
                        n.Sigmoid(), n.Linear(512, 10))


def mlp_step_contenders(build) -> dict:
    rng = numpy.random.default_rng(0)
    x = minigrad.tensor(rng.standard_normal((128, 784)).astype(numpy.float32))
    y = minigrad.tensor(rng.integers(0, 10, 128))
    # compiled-split: C kernels, but each update kept as one kernel per group (no passes.update_fusion)
    split = default_passes() + [drop_overwritten_copies, functools.partial(fuse_elementwise, backend="c")]
    runs = {}
    for name in ("minigrad", "compiled", "compiled-split", "compiled-numpy"):
        minigrad.manual_seed(0)
        step = make_step(minigrad, build(minigrad), x, y)
        step()  # the warm-up: momentum buffers exist before the trace
        runs[name] = (step if name == "minigrad" else minigrad.compile(step, passes=split) if name == "compiled-split"
                      else minigrad.compile(step, backend="c" if name == "compiled" else "numpy"))
        runs[name]()  # the compiled ones trace here
        runs[name]()  # and build their kernels here
    return runs


def step_table(ms: dict, label: str, verdicts: list[str]) -> str:
    speedup = ms["minigrad"] / ms["compiled"]
    verdicts.append(f"{label} step, compiled vs eager: {speedup:.2f}x faster (target >= {STEP_TARGET}x: "
                    f"{'met' if speedup >= STEP_TARGET else 'not met'})")
    return (f"{'ms per step':22}" + "".join(f"{n:>15}" for n in ms) + f"\n{label:22}"
            + "".join(f"{v:15.2f}" for v in ms.values())
            + f"\ncompiled vs eager: {speedup:.2f}x faster (target >= {STEP_TARGET}x: "
            f"{'met' if speedup >= STEP_TARGET else 'not met'}); "
            f"compiled-numpy vs eager: {ms['minigrad'] / ms['compiled-numpy']:.2f}x; one kernel per "
            f"parameter's update (compiled-split / compiled): {ms['compiled-split'] / ms['compiled']:.2f}x")


def memory_rows(arrays) -> list[str]:
    from minigrad.memory import track

    x = [minigrad.tensor(a) for a in arrays]
    with minigrad.no_grad(), track() as mem:
        minigrad_chain(*x)
    rows = [f"{'eager (no_grad)':32}{'':>14}{mem.peak - mem.start:>14,}"]
    graph = eliminate_dead_code(trace(minigrad_chain, *x).graph)
    for name, g in (("executor, unfused graph", graph), ("executor, fused graph", fuse_elementwise(graph))):
        ex = Executor(g)
        ex.run(x, measure=True)
        rows.append(f"{name:32}{ex.planned_peak:>14,}{ex.measured_peak or 0:>14,}")
        rows.append(f"{'  run_graph keeps every value':32}{keep_every_value(g):>14,}")
    return [f"{'peak bytes of intermediates':32}{'planned':>14}{'measured':>14}"] + rows


def keep_every_value(graph) -> int:
    """The bytes of every value the graph computes: what ``run_graph``, which frees nothing, holds."""
    return sum(math.prod(n.shape) * n.dtype.itemsize for n in graph
               if n.shape is not None and n.op not in ("placeholder", "constant", "parameter", "output"))


def sweep(arrays, repeats: int) -> str:
    x = [minigrad.tensor(a) for a in arrays]
    compiled = minigrad.compile(minigrad_chain, backend="numpy")
    compiled(*x)
    saved = numpy_blocks.BLOCK_SIZE, numpy_blocks.NUM_THREADS
    sizes = (32768, 65536, 131072, 262144, 524288, 1048576)

    def config(block: int, threads: int):
        def run():
            numpy_blocks.BLOCK_SIZE, numpy_blocks.NUM_THREADS = block, threads
            compiled(*x)
        return run

    runs = {(b, t): config(b, t) for t in (1, 2) for b in sizes}
    samples = [interleaved(runs, 1, 1) for _ in range(repeats)]  # one interleaved round each
    numpy_blocks.BLOCK_SIZE, numpy_blocks.NUM_THREADS = saved
    lines = [f"{'block (elements)':22}" + "".join(f"{b:>9}" for b in sizes)]
    for stat in (min, statistics.median):
        for t in (1, 2):
            label = f"{t} thread(s), {'best' if stat is min else 'median'}"
            lines.append(f"{label:22}" + "".join(f"{stat(s[(b, t)] for s in samples):9.1f}" for b in sizes))
    return "\n".join(lines)


def step_profile(repeats: int) -> str:
    """Each node's median time in the compiled ReLU step (C kernels) over ``repeats`` timed runs,
    summed by what runs it; the runner's own time is each run's wall time less its nodes' times.
    A timed run runs node after node: the products an untimed run overlaps are named below."""
    (graph,) = mlp_step_contenders(mlp)["compiled"].graphs.values()
    timed = Executor(graph)  # a second executor of the compiled graph: the same step, timed node by node
    walls, samples = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        timed.run([], time_nodes=True)
        walls.append(time.perf_counter() - start)
        samples.append(timed.node_seconds)
    ms = {n: 1e3 * statistics.median(s[n] for s in samples) for n in samples[0]}

    def part(n) -> str:
        if op_kind(n) == "matmul" or n.meta.get("kind") == "matmul":
            return "matrix products (BLAS; a fused one with its C epilogue)"
        if n.op == "fused":
            return "fused C kernels (elementwise, row reductions)"
        if op_kind(n) == "effect":
            return "write-backs (copy_, set_grad)"
        return "lookups (sources, saved arrays)" if n.op in ("constant", "parameter", "grad", "saved",
                                                              "getitem") else "other ops (numpy)"
    parts: dict[str, float] = {}
    for n, t in ms.items():
        parts[part(n)] = parts.get(part(n), 0.0) + t
    rest = 1e3 * statistics.median(w - sum(s.values()) for w, s in zip(walls, samples))
    lines = [f"{'ms per step':58}{1e3 * statistics.median(walls):8.2f}"]
    lines += [f"  {k:56}{v:8.2f}" for k, v in parts.items()]
    lines.append(f"  {'the runner between nodes':56}{rest:8.2f}")
    lines.append("slowest nodes:")
    for n in sorted(ms, key=ms.get, reverse=True)[:10]:
        what = "+".join(n.attrs["ops"]) if n.op == "fused" else n.op
        lines.append(f"  {n.name:6} {what:30} {str(n.shape):14}{ms[n]:8.3f}")
    lines.append("an untimed step runs on a second thread, while the rest goes on: " + ", ".join(
        f"{n.name} {n.op} {n.shape}" for n in timed.overlap))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats (median taken)")
    parser.add_argument("--steps", type=int, default=3, help="calls per repeat")
    parser.add_argument("--sweep", action="store_true", help="also time block sizes and thread counts")
    parser.add_argument("--profile", action="store_true", help="also time the compiled ReLU step node by node")
    args = parser.parse_args()
    rng = numpy.random.default_rng(0)
    arrays = [rng.standard_normal(SHAPE).astype(numpy.float32), rng.standard_normal(SHAPE[1:]).astype(numpy.float32),
              rng.standard_normal(SHAPE[1:]).astype(numpy.float32)]
    print(f"bench_fusion on {conditions()}")
    machine = cc.machine()
    flags = " ".join(f for f in cc.flags() if f not in ("-fPIC", "-shared"))
    print(f"machine probe: {machine.isa}, {machine.vector_bits}-bit vectors, {machine.threads} physical core(s)")
    print(f"kernels: C ({flags}, {kernel_threads()} OpenMP threads); "
          f"numpy blocks of {numpy_blocks.BLOCK_SIZE} elements on {numpy_blocks.NUM_THREADS} thread(s); "
          f"median of {args.repeats} interleaved repeats x {args.steps} calls")
    print()
    verdicts: list[str] = []
    runs = chain_contenders(arrays)
    print("(a) GELU (tanh) -> scale/shift -> sigmoid gate -> LayerNorm-style normalise, 4096 x 1024 float32")
    print(chain_table(interleaved(runs, args.repeats, args.steps), verdicts))
    print()
    print("(b) MLP training steps, batch 128, SGD with momentum")
    print(step_table(interleaved(mlp_step_contenders(mlp), args.repeats, args.steps), "784-512-512-10 ReLU",
                     verdicts))
    print(step_table(interleaved(mlp_step_contenders(smooth_mlp), args.repeats, args.steps),
                     "GELU/tanh/sigmoid x3", verdicts))
    print()
    print("(c) peak memory of the chain's intermediate values (inputs not counted)")
    print("\n".join(memory_rows(arrays)))
    if args.sweep:
        print()
        print("(d) compiled chain, ms per call by block size and threads (best and median of the repeats)")
        print(sweep(arrays, args.repeats))
    if args.profile:
        print()
        print(f"(e) where the compiled ReLU step's time goes (median of {args.repeats * args.steps} timed steps)")
        print(step_profile(args.repeats * args.steps))
    print("\ntargets (issues 19 and 28):")
    for line in verdicts:
        print("  " + line)
    print(f"load average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
