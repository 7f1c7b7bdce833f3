"""Parallel branches on 2 threads: where running independent nodes at once pays, and where it loses.

First, measured before building (issue 34): two independent copies of one op, one after the other
vs on two threads (the second handed to a pool thread). numpy releases the GIL inside a matrix
product and a ufunc over a large array, so those overlap; a small op is mostly Python, which holds
the GIL, and the hand-off costs more than it saves. Then graphs, traced and run by the executor one
node at a time, threaded (``parallel=True``: every fork cut, every branch handed to a thread)
and with ``parallel="auto"`` (``minigrad.graph.parallel``: the threads take whole branches, an
attention head at a time; its cost model decides, and stays sequential where the simulation
says parallelism does not pay; where the model says it pays, its first calls time both ways and
keep the faster): multi-head attention with the heads as branches and an Inception-style block
(wide), an MLP chain and a graph of small ops (narrow: the cost model should keep them
sequential). All are timed in turn within each repeat and the medians compared; ``A/A`` is a
second sequential executor timed the same way, the noise of this run (1.00x on a quiet machine).
The threaded plans' planned peaks follow (branches at once keep more alive than one order does).
Beside them PyTorch: the same models with
one intra-op thread, run straight and with each branch in ``torch.jit.fork`` of a TorchScript
function on 2 inter-op threads. Target: a wide graph >= 1.4x faster on 2 threads than sequential,
and no graph slower (auto / sequential <= 1.05, the tolerance this benchmark allows for noise; on
a loaded machine two medians of one code path can differ by more, which the printed load average
tells).

Run alone on a quiet machine: ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1
.venv/bin/python benchmarks/bench_parallel.py [--repeats R] [--steps N]`` (the load average is
printed: on 2 shared cores another process's work takes the second core the branches need).
"""

from __future__ import annotations

import argparse
import math
import os
from concurrent.futures import ThreadPoolExecutor

from common import conditions, interleaved, torch  # first: sets BLAS threads before numpy

import numpy as np

import minigrad as mg
from minigrad.graph import trace
from minigrad.graph.executor import Executor
from minigrad.ops.conv import conv2d
from minigrad.ops.pool import max_pool2d

WIDE_TARGET, NOISE = 1.4, 1.05


# -- measured first: pairs of independent ops -------------------------------------------------------------
def pair_speedup(op, a, b, pool: ThreadPoolExecutor, repeats: int) -> tuple[float, float]:
    """Median microseconds of op(a), op(b) one after the other and on two threads."""
    def sequential():
        op(a), op(b)

    def threaded():
        f = pool.submit(op, a)
        op(b)
        f.result()
    ms = interleaved({"seq": sequential, "par": threaded}, repeats, 5)
    return ms["seq"] * 1e3, ms["par"] * 1e3


def measure_pairs(repeats: int) -> list[tuple[str, float, float]]:
    rng = np.random.default_rng(0)
    pool = ThreadPoolExecutor(1)
    rows = []
    for n in (64, 128, 256, 512):
        a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
        rows.append((f"matmul {n}x{n}", *pair_speedup(lambda x: x @ x, a, b, pool, repeats)))
    for n in (1_000, 100_000, 1_000_000):
        a, b = rng.standard_normal(n), rng.standard_normal(n)
        rows.append((f"exp of {n:,}", *pair_speedup(np.exp, a, b, pool, repeats)))
        out_a, out_b = np.empty(n), np.empty(n)  # preallocated: fresh pages would be timed too
        rows.append((f"add of {n:,} (out=)",
                     *pair_speedup(lambda x: np.add(x, x, out=out_a if x is a else out_b), a, b, pool, repeats)))
    small = [rng.standard_normal(16) for _ in range(2)]
    rows.append(("20 ops on 16 elements", *pair_speedup(lambda x: [x * 2.0 + 1.0 for _ in range(10)], *small, pool,
                                                         repeats)))
    pool.shutdown()
    return rows


# -- the graphs ------------------------------------------------------------------------------------------------
def attention(lib, x, weights):
    """Multi-head self-attention, each head a branch: softmax(q k^T / sqrt(d)) v, projected by its
    slice of the output projection and summed (the same as concatenating heads before one product)."""
    out = None
    for wq, wk, wv, wo in weights:
        q, k, v = x @ wq, x @ wk, x @ wv
        a = ((q @ k.T) * (1 / math.sqrt(wq.shape[1]))).softmax(-1)
        head = (a @ v) @ wo
        out = head if out is None else out + head
    return out


def inception(lib, x, w):
    """An Inception-style block: 1x1, 1x1 -> 3x3, 1x1 -> 5x5 and 3x3 max-pool -> 1x1 branches on
    one input, concatenated along channels."""
    conv = conv2d if lib is mg else torch.nn.functional.conv2d
    pool = max_pool2d if lib is mg else torch.nn.functional.max_pool2d
    b1 = conv(x, w[0]).relu()
    b2 = conv(conv(x, w[1]).relu(), w[2], padding=1).relu()
    b3 = conv(conv(x, w[3]).relu(), w[4], padding=2).relu()
    b4 = conv(pool(x, 3, 1, 1), w[5]).relu()
    return lib.cat([b1, b2, b3, b4], 1)


def mlp(lib, x, weights):
    for w in weights:
        x = (x @ w).tanh()
    return x


def small_ops(lib, x, weights):
    outs = [((x * 2.0 + 1.0).exp() - x.sin()) * x.cos() for _ in range(4)]
    return outs[0] + outs[1] + outs[2] + outs[3]


def cases(rng):
    """name -> (function, input array, weight arrays, wide?)."""
    def arr(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    t, d, h = 512, 512, 8
    heads = [tuple(arr(d, d // h, scale=d ** -0.5) for _ in range(3)) + (arr(d // h, d, scale=d ** -0.5),)
             for _ in range(h)]
    c = 64
    inc = [arr(32, c, 1, 1, scale=c ** -0.5), arr(48, c, 1, 1, scale=c ** -0.5), arr(64, 48, 3, 3, scale=(48 * 9) ** -0.5),
           arr(16, c, 1, 1, scale=c ** -0.5), arr(32, 16, 5, 5, scale=(16 * 25) ** -0.5), arr(32, c, 1, 1, scale=c ** -0.5)]
    return {
        "attention 8 heads, 512x512": (attention, arr(t, d), heads, True),
        "inception block 8x64x28x28": (inception, arr(8, c, 28, 28), inc, True),
        "MLP chain 256, 4 layers": (mlp, arr(256, 256), [arr(256, 256, scale=1 / 16) for _ in range(4)], False),
        "small ops 32x32, 4 branches": (small_ops, arr(32, 32), [], False),
    }


def nested(weights):
    """The weights as a flat list (the traced function's inputs) and how to rebuild them."""
    if weights and isinstance(weights[0], tuple):
        flat = [w for group in weights for w in group]
        size = len(weights[0])
        return flat, lambda ws: [tuple(ws[i:i + size]) for i in range(0, len(ws), size)]
    return list(weights), list


def torch_forked(fn, x, weights):
    """The model as TorchScript with each branch forked (``torch.jit.fork``), or None where the
    model has no branches to fork."""
    if fn is attention:
        @torch.jit.script
        def head(x, wq, wk, wv, wo, scale: float):
            a = torch.softmax((x @ wq) @ (x @ wk).t() * scale, -1)
            return (a @ (x @ wv)) @ wo

        @torch.jit.script
        def forked(x, ws: list[list[torch.Tensor]], scale: float):
            futures = [torch.jit.fork(head, x, w[0], w[1], w[2], w[3], scale) for w in ws]
            out = torch.jit.wait(futures[0])
            for f in futures[1:]:
                out = out + torch.jit.wait(f)
            return out
        ws = [list(w) for w in weights]
        scale = 1 / math.sqrt(weights[0][0].shape[1])
        return lambda: forked(x, ws, scale)
    if fn is inception:
        @torch.jit.script
        def one(x, w):
            return torch.relu(torch.conv2d(x, w))

        @torch.jit.script
        def two(x, w1, w2, pad: int):
            return torch.relu(torch.conv2d(torch.relu(torch.conv2d(x, w1)), w2, padding=pad))

        @torch.jit.script
        def pooled(x, w):
            return torch.relu(torch.conv2d(torch.max_pool2d(x, 3, 1, 1), w))

        @torch.jit.script
        def forked(x, w: list[torch.Tensor]):
            f1 = torch.jit.fork(one, x, w[0])
            f2 = torch.jit.fork(two, x, w[1], w[2], 1)
            f3 = torch.jit.fork(two, x, w[3], w[4], 2)
            b4 = pooled(x, w[5])
            return torch.cat([torch.jit.wait(f1), torch.jit.wait(f2), torch.jit.wait(f3), b4], 1)
        return lambda: forked(x, list(weights))
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="interleaved repeats (median taken)")
    parser.add_argument("--steps", type=int, default=5, help="calls per repeat")
    args = parser.parse_args()
    if torch is not None:
        torch.set_num_interop_threads(2)  # before any inter-op work; intra-op threads: common's one
    print(f"bench_parallel: {conditions()}")
    print(f"median of {args.repeats} interleaved repeats x {args.steps} calls")
    print()
    print("measured first: two independent ops, one after the other vs on 2 threads (us)")
    print(f"{'':28}{'sequential':>12}{'2 threads':>12}{'speed-up':>10}")
    for name, seq, par in measure_pairs(args.repeats):
        print(f"{name:28}{seq:12.1f}{par:12.1f}{seq / par:9.2f}x  {'pays' if seq / par > NOISE else 'does not pay'}")
    print()

    rng = np.random.default_rng(0)
    header = f"{'ms per call':28}{'sequential':>11}{'threaded':>10}{'auto':>9}{'speed-up':>10}{'A/A':>7}  auto chose "
    header += f"{'torch 1 thr':>11}{'torch fork':>11}{'speed-up':>10}" if torch is not None else ""
    print(header)
    verdicts, peaks = [], []
    for name, (fn, x0, weights, wide) in cases(rng).items():
        flat, rebuild = nested(weights)
        inputs = [mg.tensor(x0)] + [mg.tensor(w) for w in flat]
        with mg.no_grad():
            graph = trace(lambda x, *ws: fn(mg, x, rebuild(ws)), *inputs).graph
        sequential, threaded = Executor(graph), Executor(graph, parallel=True)
        again = Executor(graph)  # the noise: a second sequential executor, timed like the others
        auto = Executor(graph, parallel="auto")
        want = sequential.run(inputs)[0]
        np.testing.assert_allclose(threaded.run(inputs)[0], want, rtol=1e-4, atol=1e-5)
        for _ in range(10):  # auto's trial: it times both ways on its first calls and keeps the faster
            np.testing.assert_allclose(auto.run(inputs)[0], want, rtol=1e-4, atol=1e-5)
        runs = {"seq": lambda: sequential.run(inputs), "thr": lambda: threaded.run(inputs),
                "auto": lambda: auto.run(inputs), "again": lambda: again.run(inputs)}
        forked = None
        if torch is not None:
            tx, tw = torch.from_numpy(x0), [torch.from_numpy(w) for w in flat]
            tweights = rebuild(tw)
            with torch.no_grad():
                np.testing.assert_allclose(fn(torch, tx, tweights).numpy(), want, rtol=1e-3, atol=1e-4)
                forked = torch_forked(fn, tx, tweights)
            runs["torch"] = lambda: torch.no_grad()(fn)(torch, tx, tweights)
            if forked is not None:
                np.testing.assert_allclose(forked().numpy(), want, rtol=1e-3, atol=1e-4)
                runs["fork"] = forked
        for run in runs.values():  # warm up: caches, TorchScript's first runs
            for _ in range(3):
                run()
        ms = interleaved(runs, args.repeats, args.steps)
        speedup = ms["seq"] / ms["auto"]
        chosen = "threaded" if auto.parallel else "sequential" if auto.measured_choice else "sequential (model)"
        noise = ms["seq"] / ms["again"]
        line = f"{name:28}{ms['seq']:11.3f}{ms['thr']:10.3f}{ms['auto']:9.3f}{speedup:9.2f}x{noise:6.2f}x  {chosen:19}"
        if torch is not None:
            fork = f"{ms['fork']:11.3f}{ms['torch'] / ms['fork']:9.2f}x" if "fork" in ms else f"{'-':>11}{'-':>10}"
            line += f"{ms['torch']:11.3f}{fork}"
        print(line)
        verdicts.append((name, wide, speedup))
        peaks.append(f"{name:28}{sequential.planned_peak / 1e6:11.2f}{threaded.planned_parallel_peak / 1e6:10.2f}"
                     f"{auto.planned_parallel_peak / 1e6 if auto.parallel else sequential.planned_peak / 1e6:9.2f}")
    print()
    print(f"{'planned peak, MB':28}{'sequential':>11}{'threaded':>10}{'auto':>9}  (the threaded plans' own: "
          "branches at once, inputs held to a branch's end)")
    print("\n".join(peaks))
    print()
    wide_ok = [s >= WIDE_TARGET for _, wide, s in verdicts if wide]
    slower = [name for name, _, s in verdicts if s < 1 / NOISE]
    print(f"target: a wide graph >= {WIDE_TARGET}x on 2 threads (auto vs sequential): "
          f"{'met' if any(wide_ok) else 'not met'} (best {max(s for _, w, s in verdicts if w):.2f}x)")
    print(f"target: no graph slower than sequential beyond noise ({NOISE}x): "
          f"{'met' if not slower else 'not met: ' + ', '.join(slower)}")
    load = os.getloadavg()[0]
    if load > 1.5:
        print(f"note: load average {load:.2f} at the end of this run, about 1 of it this run's own: "
              "other processes shared the 2 cores")


if __name__ == "__main__":
    main()
