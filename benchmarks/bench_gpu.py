"""GPU benchmarks: minigrad on cuda (CuPy) beside PyTorch CUDA; fusion, mixed precision and prefetch.

(a) Training steps (forward, cross-entropy, backward, SGD with momentum) at batch sizes that fill
    the GPU: an MLP 784-4096-4096-10 at batch 8192 and bench_train's CNN at batch 4096, minigrad vs
    PyTorch CUDA (same initial weights, first losses checked to agree; TF32 off in both, so both
    compute in float32). Target: minigrad <= 1.5x PyTorch.
(b) bench_fusion's elementwise chain (GELU-tanh, scale/shift, sigmoid gate, normalise) on 16384 x
    4096 float32: eager minigrad vs ``minigrad.compile`` (fused cupy kernels), beside PyTorch
    eager (``--torch-compile`` adds torch.compile, whose Triton build takes a minute). Target:
    compiled >= 3x eager.
(c) Mixed precision: an MLP 4096-4096-4096-4096-10 step at batch 8192, float32 vs autocast(float16)
    + GradScaler, in minigrad and in PyTorch. Target: autocast faster than float32.
(d) Input pipeline: the MLP step of (a) fed with host batches, copied in the loop (``x.to("cuda")``)
    vs ``DevicePrefetcher`` (pinned memory, copies on a side stream, double-buffered); the copies
    alone and the steps alone show what perfect overlap would give.

Launches return before the kernels finish, so every timed block ends with a device-wide
synchronize (which waits for PyTorch's streams too); blocks are interleaved and the median kept
(common.interleaved). Without a GPU the script says so and exits 0.
``python benchmarks/bench_gpu.py [--repeats R] [--steps N] [--torch-compile] [--json PATH]``;
benchmarks/gpu_check.sh runs it on a GPU machine and keeps its tables in benchmarks/results/gpu.json,
which chapter 03's GPU notebook shows.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from common import interleaved, table, torch  # first: sets BLAS threads before numpy

import numpy

import minigrad
from bench_fusion import SPEEDUP_TARGET, minigrad_chain, torch_chain
from bench_train import cnn, make_step
from minigrad import cuda, nn, optim
from minigrad.data import DataLoader, Dataset, DevicePrefetcher

TORCH = torch if torch is not None and torch.cuda.is_available() else None
TRAIN_TARGETS = {"MLP 784-4096-4096-10, b=8192": 1.5, "CNN 28x28, b=4096": 1.5}
CHAIN_SHAPE = (16384, 4096)


def mlp(lib, widths: list[int]):
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers += [lib.nn.Linear(a, b)] + ([lib.nn.ReLU()] if i < len(widths) - 2 else [])
    return lib.nn.Sequential(*layers)


def blocks(runs: dict, steps: int, repeats: int) -> dict[str, float]:
    """Median ms per call of each run: ``steps`` calls then a synchronize form one timed block."""
    def block(run):
        def timed():
            for _ in range(steps):
                run()
            cuda.synchronize()
        return timed

    for run in runs.values():  # warm-up: cupy compiles its kernels at their first launch
        block(run)()
    ms = interleaved({name: block(run) for name, run in runs.items()}, repeats, 1)
    return {name: t / steps for name, t in ms.items()}


def release() -> None:
    """Hand the memory pools' free blocks back between sections."""
    cuda.empty_cache()
    if TORCH is not None:
        TORCH.cuda.empty_cache()


# -- (a) training steps ---------------------------------------------------------------------------
def train_contenders(build, x0: numpy.ndarray, y0: numpy.ndarray) -> dict:
    minigrad.manual_seed(0)
    model = build(minigrad)
    runs = {}
    if TORCH is not None:  # the twin takes the weights while both are on the host
        twin = build(TORCH)
        twin.load_state_dict({k: TORCH.tensor(v.numpy()) for k, v in model.state_dict().items()})
        twin = twin.cuda()
    model = model.to("cuda")
    runs["minigrad"] = make_step(minigrad, model, minigrad.tensor(x0, device="cuda"),
                                 minigrad.tensor(y0, device="cuda"))
    if TORCH is not None:
        runs["torch"] = make_step(TORCH, twin, TORCH.tensor(x0, device="cuda"),
                                  TORCH.tensor(y0, device="cuda"))
        losses = [[runs[n]().item() for _ in range(3)] for n in ("minigrad", "torch")]
        numpy.testing.assert_allclose(losses[0], losses[1], rtol=2e-3)  # the same computation
    return runs


def training(rng: numpy.random.Generator, repeats: int, steps: int) -> str:
    cases = {
        "MLP 784-4096-4096-10, b=8192": (lambda lib: mlp(lib, [784, 4096, 4096, 10]),
                                         rng.standard_normal((8192, 784), dtype=numpy.float32),
                                         rng.integers(0, 10, 8192)),
        "CNN 28x28, b=4096": (cnn, rng.standard_normal((4096, 1, 28, 28), dtype=numpy.float32),
                              rng.integers(0, 10, 4096)),
    }
    rows = {}
    for name, (build, x0, y0) in cases.items():
        rows[name] = blocks(train_contenders(build, x0, y0), steps, repeats)
        release()
    return table(rows, TRAIN_TARGETS)


# -- (b) fused vs unfused elementwise chain -------------------------------------------------------
def fusion(rng: numpy.random.Generator, repeats: int, steps: int, with_torch_compile: bool) -> str:
    arrays = [rng.standard_normal(CHAIN_SHAPE, dtype=numpy.float32),
              rng.standard_normal(CHAIN_SHAPE[1:], dtype=numpy.float32),
              rng.standard_normal(CHAIN_SHAPE[1:], dtype=numpy.float32)]
    x = [minigrad.tensor(a, device="cuda") for a in arrays]
    compiled = minigrad.compile(minigrad_chain)
    expected = minigrad_chain(*x).numpy()
    numpy.testing.assert_allclose(compiled(*x).numpy(), expected, rtol=1e-4, atol=1e-4)
    runs = {"eager": lambda: minigrad_chain(*x), "compiled": lambda: compiled(*x)}
    if TORCH is not None:
        t = [TORCH.tensor(a, device="cuda") for a in arrays]
        numpy.testing.assert_allclose(torch_chain(*t).cpu().numpy(), expected, rtol=1e-3, atol=1e-3)
        runs["torch"] = lambda: torch_chain(*t)
        if with_torch_compile:
            start = time.perf_counter()
            inductor = TORCH.compile(torch_chain)
            inductor(*t)
            print(f"torch.compile: first call (compiling) took {time.perf_counter() - start:.1f} s")
            runs["torch.compile"] = lambda: inductor(*t)
    ms = blocks(runs, steps, repeats)
    gb = 2 * math.prod(CHAIN_SHAPE) * 4 / 1e9  # one read of x and one write of the result
    label = f"chain, {math.prod(CHAIN_SHAPE) >> 20}M float32"
    lines = [f"{'ms per call':28}" + "".join(f"{n:>15}" for n in ms),
             f"{label:28}" + "".join(f"{v:15.3f}" for v in ms.values()),
             f"{'GB/s (x read + y written)':28}" + "".join(f"{gb / v * 1e3:15.0f}" for v in ms.values())]
    speedup = ms["eager"] / ms["compiled"]
    lines.append(f"\ncompiled vs eager: {speedup:.2f}x faster (target >= {SPEEDUP_TARGET}x: "
                 f"{'met' if speedup >= SPEEDUP_TARGET else 'not met'})")
    release()
    return "\n".join(lines)


# -- (c) float16 autocast vs float32 --------------------------------------------------------------
def amp_step(lib, model, x, y, mixed: bool):
    if lib is minigrad:
        opt, scaler = optim.SGD(model.parameters(), lr=0.01, momentum=0.9), minigrad.GradScaler(enabled=mixed)
        region, loss_fn = (lambda: minigrad.autocast("cuda", enabled=mixed)), nn.CrossEntropyLoss()
    else:
        opt = lib.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        scaler, loss_fn = lib.amp.GradScaler("cuda", enabled=mixed), lib.nn.CrossEntropyLoss()
        region = lambda: lib.autocast("cuda", dtype=lib.float16, enabled=mixed)  # noqa: E731

    def step():
        opt.zero_grad()
        with region():
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return step


def mixed_precision(rng: numpy.random.Generator, repeats: int, steps: int) -> str:
    widths, batch = [4096, 4096, 4096, 4096, 10], 8192
    x0, y0 = rng.standard_normal((batch, widths[0]), dtype=numpy.float32), rng.integers(0, 10, batch)
    rows: dict[str, dict[str, float]] = {}
    for mixed, label in ((False, "float32"), (True, "autocast float16")):
        minigrad.manual_seed(0)
        runs = {"minigrad": amp_step(minigrad, mlp(minigrad, widths).to("cuda"),
                                     minigrad.tensor(x0, device="cuda"), minigrad.tensor(y0, device="cuda"), mixed)}
        if TORCH is not None:
            runs["torch"] = amp_step(TORCH, mlp(TORCH, widths).cuda(), TORCH.tensor(x0, device="cuda"),
                                     TORCH.tensor(y0, device="cuda"), mixed)
        rows[label] = blocks(runs, steps, repeats)
        release()
    lines = [table(rows), ""]
    for name in rows["float32"]:
        speedup = rows["float32"][name] / rows["autocast float16"][name]
        lines.append(f"{name}: autocast {speedup:.2f}x faster than float32 (target > 1x: "
                     f"{'met' if speedup > 1 else 'not met'})")
    return "\n".join(lines)


# -- (d) prefetch vs synchronous copies -----------------------------------------------------------
class HostBatches(Dataset):
    """Ready-made batches in ordinary (pageable) host memory: with ``batch_size=None`` the loader
    hands them out as CPU tensors without copying, so what is timed is the copy and the step."""

    def __init__(self, rng: numpy.random.Generator, n: int, batch: int, features: int) -> None:
        self.x = [rng.standard_normal((batch, features), dtype=numpy.float32) for _ in range(n)]
        self.y = [rng.integers(0, 10, batch) for _ in range(n)]

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def prefetch(rng: numpy.random.Generator, repeats: int) -> str:
    data = HostBatches(rng, 8, 8192, 784)
    loader = DataLoader(data, batch_size=None)
    minigrad.manual_seed(0)
    model = mlp(minigrad, [784, 4096, 4096, 10]).to("cuda")
    opt, loss_fn = optim.SGD(model.parameters(), lr=0.01, momentum=0.9), nn.CrossEntropyLoss()
    on_gpu = [(x.to("cuda"), y.to("cuda")) for x, y in loader]

    def step(x, y):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    def synchronous():
        for x, y in loader:
            step(x.to("cuda"), y.to("cuda"))

    prefetcher = DevicePrefetcher(loader, "cuda")

    def prefetched():
        for x, y in prefetcher:
            step(x, y)

    runs = {"copies in the loop": synchronous, "DevicePrefetcher": prefetched,
            "copies alone": lambda: [(x.to("cuda"), y.to("cuda")) for x, y in loader],
            "steps alone": lambda: [step(x, y) for x, y in on_gpu]}
    ms = {name: v / len(data) for name, v in blocks(runs, 1, repeats).items()}
    mb = data.x[0].nbytes / 2**20
    lines = [f"{'ms per batch (' + format(mb, '.1f') + ' MB of x)':34}{'ms':>10}"]
    lines += [f"{name:34}{v:10.3f}" for name, v in ms.items()]
    ideal = max(ms["copies alone"], ms["steps alone"])
    serial = ms["copies in the loop"]
    lines.append(f"\nprefetch vs copies in the loop: {serial / ms['DevicePrefetcher']:.2f}x faster "
                 f"(perfect overlap, max(copy, step): {serial / ideal:.2f}x)")
    release()
    return "\n".join(lines)


def header() -> str:
    cupy = minigrad.device("cuda").xp
    props = cupy.cuda.runtime.getDeviceProperties(cuda.current_device())
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    versions = f"cupy {cupy.__version__}, CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}"
    if TORCH is not None:
        versions += f", torch {TORCH.__version__} (CUDA {TORCH.version.cuda})"
    elif torch is not None:
        versions += f", torch {torch.__version__} without CUDA: minigrad's figures only"
    else:
        versions += "; torch is not installed: minigrad's figures only"
    return f"bench_gpu on {name} ({props['totalGlobalMem'] / 2**30:.0f} GiB); {versions}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (median taken)")
    parser.add_argument("--steps", type=int, default=3, help="steps per timed block")
    parser.add_argument("--torch-compile", action="store_true", help="add torch.compile to (b)")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the tables to this file (chapter 03's GPU notebook shows them)")
    args = parser.parse_args()
    if not cuda.is_available():
        print("bench_gpu: no CUDA GPU here (cupy is not installed, or it sees no GPU), so there is "
              "nothing to measure. Run it on a machine with an NVIDIA GPU and the 'cuda' extra "
              "(benchmarks/gpu_check.sh does both).")
        return 0
    if TORCH is not None:  # float32 matmuls and convolutions in float32, as cupy computes them
        TORCH.backends.cuda.matmul.allow_tf32 = False
        TORCH.backends.cudnn.allow_tf32 = False
    rng = numpy.random.default_rng(0)
    report = {"header": header(),
              "timing": f"median of {args.repeats} interleaved blocks of {args.steps} steps, each ending in a synchronize",
              "sections": {}}
    print(report["header"])
    print(report["timing"])
    sections = [
        ("(a) training step: forward, cross-entropy, backward, SGD with momentum (float32)",
         lambda: training(rng, args.repeats, args.steps)),
        (f"(b) GELU (tanh) -> scale/shift -> sigmoid gate -> normalise, {CHAIN_SHAPE[0]} x {CHAIN_SHAPE[1]} float32",
         lambda: fusion(rng, args.repeats, args.steps, args.torch_compile)),
        ("(c) MLP 4096-4096-4096-4096-10 step at batch 8192: float32 vs autocast(float16) + GradScaler",
         lambda: mixed_precision(rng, args.repeats, args.steps)),
        ("(d) 8 host batches of 8192 x 784 float32 through the MLP 784-4096-4096-10 step: copies in the loop "
         "vs DevicePrefetcher", lambda: prefetch(rng, args.repeats)),
    ]
    for title, run in sections:
        print(f"\n{title}")
        report["sections"][title] = run()
        print(report["sections"][title])
        if args.json is not None:  # written after each section, so a run cut short keeps what it measured
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
