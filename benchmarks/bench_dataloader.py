"""Data loading throughput: worker processes and prefetch, side by side (chapter 01).

Each sample goes through a CPU-heavy transform (a few ms of numpy: a jitter, blur and normalise
of a 3x64x64 image). Part 1 times ``DataLoader`` with 0, 1 and 2 worker processes: with the
transform as the bottleneck, 2 workers should approach 2x on 2 free cores. Part 2 adds a
simulated training step (a matrix-multiply loop, one BLAS thread, lasting about as long as
preparing one batch) and times a ``Pipeline`` without and with ``prefetch``: without it, data
and compute take turns; with it, the next batch is prepared while the step computes.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_dataloader.py
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core for the "training step", one for data

import time  # noqa: E402

import numpy as np  # noqa: E402

from minigrad.data import DataLoader, Dataset, Pipeline  # noqa: E402

N, BATCH, SIZE, REPEATS = 256, 32, 64, 3


def heavy_transform(image: np.ndarray) -> np.ndarray:
    """A few milliseconds of numpy per sample: the kind of augmentation a loader must hide."""
    rng = np.random.default_rng(int(image[0, 0, 0] * 1e6) % 2**32)
    x = image
    for _ in range(10):
        x = x + rng.normal(0.0, 0.01, x.shape).astype(np.float32)
        x = (x + np.roll(x, 1, axis=1) + np.roll(x, -1, axis=1)
             + np.roll(x, 1, axis=2) + np.roll(x, -1, axis=2)) / 5
    return ((x - x.mean()) / (x.std() + 1e-6)).astype(np.float32)


class Images(Dataset):
    def __init__(self, n: int) -> None:
        self.images = np.random.default_rng(0).random((n, 3, SIZE, SIZE), dtype=np.float32)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return heavy_transform(self.images[i]), i


def best_times(runs: dict) -> dict:
    """Best of REPEATS wall times per run, the runs interleaved so a change in the machine's
    load hits them all alike."""
    best = {name: float("inf") for name in runs}
    for _ in range(REPEATS):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def loader_epoch(num_workers: int):
    loader = DataLoader(Images(N), batch_size=BATCH, num_workers=num_workers,
                        persistent_workers=num_workers > 0)
    next(iter(loader))  # start (and, when persistent, keep) the workers outside the timing
    return lambda: sum(1 for _ in loader)


def make_step(seconds: float):
    """A stand-in for forward + backward: matmuls (they release the GIL) lasting ``seconds``."""
    # Few, large BLAS calls: after each one the main thread must win the GIL back from the
    # prefetch thread, which costs up to the 5 ms switch interval.
    a = np.random.default_rng(1).random((640, 640))
    start = time.perf_counter()
    for _ in range(3):
        a @ a
    reps = max(1, round(seconds / ((time.perf_counter() - start) / 3)))

    def step():
        for _ in range(reps):
            a @ a
    return step


def pipeline_epoch(step, prefetch: int | None, parallel: int | None):
    p = Pipeline.from_tensor_slices(Images(N).images)
    p = p.map(heavy_transform, num_parallel_calls=parallel).batch(BATCH)
    if prefetch:
        p = p.prefetch(prefetch)

    def epoch():
        for _ in p:
            step()
    return epoch


def table(title: str, baseline: str, best: dict, note: str = "") -> None:
    print(f"  {title:<44} {'samples/s':>10} {'vs first':>9}{note}")
    for name, seconds in best.items():
        print(f"  {name:<44} {N / seconds:>10.0f} {best[baseline] / seconds:>8.2f}x")


def main() -> None:
    sample = Images(1).images[0]
    per_sample = best_times({"t": lambda: heavy_transform(sample)})["t"]
    print(f"transform: {per_sample * 1e3:.1f} ms/sample; {N} samples, batch {BATCH}, best of "
          f"{REPEATS}; {os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.2f}")
    loaders = {f"num_workers={w}": loader_epoch(w) for w in (0, 1, 2)}
    table("DataLoader (loading only)", "num_workers=0", best_times(loaders))

    step = make_step(per_sample * BATCH)
    compute = best_times({"step": lambda: [step() for _ in range(N // BATCH)]})["step"]
    pipelines = {
        "map, no prefetch (data and step take turns)": pipeline_epoch(step, None, None),
        "map + prefetch(2) (thread)": pipeline_epoch(step, 2, None),
        "map(num_parallel_calls=2) + prefetch(2)": pipeline_epoch(step, 2, 2),
    }
    table("Pipeline + training step", "map, no prefetch (data and step take turns)",
          best_times(pipelines), f"   (step alone: {N / compute:.0f} samples/s)")
    print(f"load average at end {os.getloadavg()[0]:.2f} (other processes share the cores)")


if __name__ == "__main__":
    main()
