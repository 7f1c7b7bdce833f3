"""The ported-program corpus side by side: each public PyTorch program in ``tests/ported/``, run on
minigrad and on PyTorch from the same weights (issue 31).

For every program the test modules list in ``PAIRS`` (a function that runs a fixed piece of the
program, its own training steps, on one library and returns its losses), this runs it on both,
and prints what it exercises, whether it ran, the largest relative loss difference (|a - b| /
max(|b|, 1); printed values where a program prints tensors, not losses) and the time ratio
(minigrad's time / torch's; both single-threaded, so the ratio is the libraries' and not the
BLAS's thread count). A program that needs a feature minigrad does not have yet prints why.

``OMP_NUM_THREADS=1 python benchmarks/bench_ported.py`` (needs torch; MNIST for the MNIST programs).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
import time
import warnings
from pathlib import Path


PORTED = Path(__file__).resolve().parents[1] / "tests" / "ported"
MODULES = ["test_ported_tutorials", "test_ported_examples", "test_ported_karpathy"]


def timed(fn, lib: str) -> tuple[dict, float]:
    """The run's result and its best time of two (the first also warms imports and caches)."""
    best, result = float("inf"), None
    for _ in range(2):
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            result = fn(lib)
        best = min(best, time.perf_counter() - start)
    return result, best


def main() -> int:
    sys.path.insert(0, str(PORTED))
    warnings.simplefilter("ignore")
    import torch  # noqa: F401  (the comparison needs it)

    rows = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name, (what, fn) in module.PAIRS.items():
            try:
                mg, t_mg = timed(fn, "minigrad")
            except Exception as error:  # noqa: BLE001  (a missing feature: say which, go on)
                rows.append((name, what, f"not run: {type(error).__name__}: {str(error)[:70]}", "", ""))
                continue
            th, t_th = timed(fn, "torch")
            pairs = zip(mg["losses"], th["losses"]) if len(mg["losses"]) else (
                (a, b) for x, y in zip(mg["printed"], th["printed"]) for a, b in zip(x, y))  # printed values
            diff = max(abs(a - b) / max(abs(b), 1.0) for a, b in pairs)
            rows.append((name, what, "runs", f"{diff:.1e}", f"{t_mg / t_th:.1f}x"))
    print("| program | exercises | result | max relative loss difference | time minigrad / torch |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
