"""Timing for the MPI benchmarks: interleaved repeats, each timing started by all ranks together.

Not ``common.interleaved``: importing ``common`` loads PyTorch into every rank, seconds each, and
makes its ``gc.collect()`` calls slow.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import minigrad.distributed as dist


def interleaved(runs: dict[str, Callable[[], None]], repeats: int, steps: int) -> dict[str, float]:
    """Median ms per call of each run, timed in turn within each repeat (so load changes hit all
    alike), every timing started by all ranks together."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                run()
            times[name].append((time.perf_counter() - t0) * 1e3 / steps)
    return {name: statistics.median(t) for name, t in times.items()}
