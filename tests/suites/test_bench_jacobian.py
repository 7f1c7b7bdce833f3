"""benchmarks/bench_jacobian.py at a small width: it runs (checking minigrad against torch.func
itself where PyTorch is installed) and prints a row and a verdict for jacrev and for hessian. No
timing is asserted."""

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_jacobian.py"


def test_the_benchmark_runs_and_prints_both_rows():
    env = dict(os.environ, PYTHONPATH=str(BENCH.parent.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, str(BENCH), "--width", "16", "--repeats", "1"], env=env,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("jacrev ", "hessian "))}
    assert set(rows) == {"jacrev", "hessian"}, out
    # with torch in the benchmark's environment each row ends in its target's verdict
    assert "torch is not installed" in out or all(row.endswith(("(met)", "(not met)")) for row in rows.values()), out
