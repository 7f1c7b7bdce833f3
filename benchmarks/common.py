"""What the benchmarks share: one BLAS thread count for numpy and torch, interleaved timing with
medians, and the side-by-side table with its ratio and target.

Import this module before numpy: OpenBLAS reads OPENBLAS_NUM_THREADS once, when numpy loads.
The count is one unless set (on a small machine shared with other work a second BLAS thread
mostly waits for a busy core); torch is given the same count.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import time
from typing import Callable

THREADS = int(os.environ.setdefault("OPENBLAS_NUM_THREADS", "1"))

try:
    import torch

    torch.set_num_threads(THREADS)
except ImportError:
    torch = None


def blas_info() -> str:
    """numpy's BLAS, its kernel and its threads, when threadpoolctl is there to ask."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return f"numpy BLAS x{THREADS} (pip install threadpoolctl to see which kernel)"
    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    return "numpy BLAS " + ", ".join(
        f"{i['internal_api']} {i.get('architecture', '')} x{i['num_threads']}" for i in blas)


def processor() -> str:
    """The processor's model name and core count (Linux's /proc/cpuinfo; ``platform`` elsewhere,
    which on Linux only says ``x86_64``)."""
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or platform.machine()
    return f"{name}, {os.cpu_count()} cores"


def conditions() -> str:
    """What a timing depends on besides the code: the processor, numpy's BLAS, the load average."""
    return f"{processor()}; {blas_info()}; load average {os.getloadavg()[0]:.2f}"


def machine() -> str:
    """Where the figures come from: the processor, numpy's BLAS, and the torch they are set against."""
    return f"{processor()}; {blas_info()}; torch {torch.__version__ if torch else 'not installed'}"


def interleaved(runs: dict, repeats: int, steps: int) -> dict:
    """Median milliseconds per call of each run, timed in turn within every repeat so that load
    changes on the machine hit all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            gc.collect()
            t0 = time.perf_counter()
            for _ in range(steps):
                run()
            times[name].append((time.perf_counter() - t0) * 1e3 / steps)
    return {name: statistics.median(t) for name, t in times.items()}


def interleaved_cases(runs: dict[str, dict[str, Callable[[], None]]], repeats: int,
                      steps: int) -> dict[str, dict[str, float]]:
    """``interleaved`` over case -> {contender: fn}: every case and contender timed in turn."""
    ms = interleaved({(case, who): fn for case, fns in runs.items() for who, fn in fns.items()}, repeats, steps)
    out: dict[str, dict[str, float]] = {case: {} for case in runs}
    for (case, who), t in ms.items():
        out[case][who] = t
    return out


def table(rows: dict[str, dict[str, float]], targets: dict[str, float] | None = None) -> str:
    """One line per case: each contender's ms, then minigrad / torch and the case's target when
    torch ran."""
    names = list(next(iter(rows.values())))
    lines = [f"{'ms per step':28}" + "".join(f"{n:>12}" for n in names)
             + ("     ratio   target" if "torch" in names else "")]
    for case, ms in rows.items():
        line = f"{case:28}" + "".join(f"{ms[n]:12.3f}" for n in names)
        if "torch" in ms:
            ratio = ms["minigrad"] / ms["torch"]
            line += f"{ratio:9.2f}x"
            target = (targets or {}).get(case)
            if target is not None:
                line += f"   <= {target}x ({'met' if ratio <= target else 'not met'})"
        lines.append(line)
    if torch is None:
        lines.append("torch is not installed: minigrad's figures only (make torch installs it)")
    return "\n".join(lines)
