"""benchmarks/bench_gpu.py and benchmarks/gpu_check.sh where there is no GPU: the benchmark says
so and exits 0 (``make bench`` runs it everywhere), the check script fails at once and loudly, and
the script parses. On a GPU machine gpu_check.sh itself is the check."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minigrad import cuda

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPT = BENCHMARKS / "gpu_check.sh"
without_gpu = pytest.mark.skipif(cuda.is_available() or shutil.which("nvidia-smi") is not None,
                                 reason="checks the behaviour on a machine without a GPU")


def test_gpu_check_is_an_executable_strict_bash_script_that_fits_the_gpu_machines_limit():
    assert os.access(SCRIPT, os.X_OK)
    text = SCRIPT.read_text()
    # -u and pipefail, not -e: a stage that fails or times out is noted and the next one runs
    assert text.startswith("#!/usr/bin/env bash\n") and "\nset -uo pipefail  #" in text
    assert "MINIGRAD_TEST_DEVICE=cuda" in text and "benchmarks/bench_gpu.py" in text
    limits = [int(n) for n in re.findall(r"^stage (\d+) ", text, re.MULTILINE)]
    assert len(limits) >= 5 and sum(limits) < 540  # a GPU machine runs one command for at most 9 minutes
    assert "--continue-on-collection-errors" in text  # optional imports missing there stop no collection
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@without_gpu
def test_gpu_check_fails_loudly_without_a_gpu_and_still_ends_with_its_summary(tmp_path):
    result = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "OUT": str(tmp_path)})
    assert result.returncode == 1
    assert "gpu_check: FAILED" in result.stderr and "GPU" in result.stderr
    assert "== summary" in result.stdout and result.stdout.rstrip().splitlines()[-2].startswith("FAILED(1) ")
    stages = json.loads((tmp_path / "gpu_check.json").read_text())["stages"]
    assert [s["status"] for s in stages] == ["FAILED(1)"]


@without_gpu
def test_bench_gpu_says_there_is_no_gpu_and_exits_cleanly():
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)}
    result = subprocess.run([sys.executable, str(BENCHMARKS / "bench_gpu.py")], capture_output=True,
                            text=True, timeout=120, env=env, cwd=BENCHMARKS.parent)
    assert result.returncode == 0, result.stderr
    assert "no CUDA GPU here" in result.stdout and "nothing to measure" in result.stdout


def test_bench_gpu_keeps_each_table_in_its_json_file(simulated_cuda, monkeypatch, tmp_path):
    # the sections' own work needs a GPU's speed; here each returns a stand-in table, so that only
    # what main() does with them (print, then write the file after every section) is checked
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_gpu

    monkeypatch.setattr(bench_gpu, "header", lambda: "bench_gpu on a simulated device")
    for name in ("training", "fusion", "mixed_precision", "prefetch"):
        monkeypatch.setattr(bench_gpu, name, lambda *args, name=name: f"table of {name}")
    out = tmp_path / "results" / "gpu.json"
    monkeypatch.setattr(sys, "argv", ["bench_gpu.py", "--json", str(out)])
    assert bench_gpu.main() == 0
    report = json.loads(out.read_text())
    assert report["header"] == "bench_gpu on a simulated device"
    assert [t.split()[0] for t in report["sections"]] == ["(a)", "(b)", "(c)", "(d)"]
    assert list(report["sections"].values()) == [f"table of {n}" for n in
                                                 ("training", "fusion", "mixed_precision", "prefetch")]
