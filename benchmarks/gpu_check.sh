#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, run the whole test suite (with a GPU present its
# cuda cases run: every op of the op table and every layer against the cpu, the NCCL checks, the
# prefetcher, the generated CUDA kernels and compiled == eager on cuda, the digits CNN trained on
# cuda), then the whole suite once more with cuda as the default device (MINIGRAD_TEST_DEVICE=cuda:
# every tensor a test makes without naming a device lives on the GPU, and results are read back
# through .cpu(); the few tests about the cpu itself pin it and say why), then
# benchmarks/bench_gpu.py, and print a summary. Fails at once, loudly, when no GPU is seen.
# A few minutes on one GPU; each stage has a time limit (TEST_TIMEOUT for each of the two test
# stages, BENCH_TIMEOUT, seconds).
#
#   benchmarks/gpu_check.sh                  PYTHON=/path/to/python to choose the interpreter
#
# It runs in the chosen Python's environment (a GPU image's own Python usually has CuPy, NCCL and
# PyTorch CUDA already; a fresh venv made beside it would see none of them). What is missing
# there is installed with pip, into that environment: the 'cuda' extra when CuPy is missing, pytest
# and hypothesis from the 'dev' extra when they are. WHEELHOUSE=dir (default .whl/ when present)
# installs offline from wheels that travelled with the repository. An installed CuPy for another
# CUDA (cupy-cuda13x beside a CUDA 13 driver, say) is used as it is: the extra names cupy-cuda12x,
# and two CuPys in one environment conflict. PyTorch CUDA, when importable, is the benchmarks'
# baseline; without it they print minigrad's figures alone. Logs go to GPU_CHECK_LOG.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
LOG=${GPU_CHECK_LOG:-/tmp/minigrad-gpu-check}
WHEELHOUSE=${WHEELHOUSE:-.whl}
TEST_TIMEOUT=${TEST_TIMEOUT:-240}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-150}
mkdir -p "$LOG"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

die() {
    echo "gpu_check: FAILED: $*" >&2
    exit 1
}

echo "== the GPU"
command -v nvidia-smi >/dev/null || die "nvidia-smi is not here: no NVIDIA driver, so no GPU to check"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader \
    || die "nvidia-smi sees no GPU"

echo "== Python packages ($PY)"
missing=$("$PY" - <<'EOF'
import importlib.util
import tomllib

extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
wanted = {"cupy": extras["cuda"],
          "pytest": [r for r in extras["dev"] if r.startswith("pytest")],
          "hypothesis": [r for r in extras["dev"] if r.startswith("hypothesis")]}
print(" ".join(r for module, reqs in wanted.items() if importlib.util.find_spec(module) is None for r in reqs))
EOF
) || die "$PY cannot read pyproject.toml (Python >= 3.11 is needed)"
if [ -n "$missing" ]; then
    offline=()
    if [ -d "$WHEELHOUSE" ]; then offline=(--no-index --find-links "$WHEELHOUSE"); fi
    echo "installing: $missing ${offline[*]+from $WHEELHOUSE}"
    # shellcheck disable=SC2086  # one requirement per word
    "$PY" -m pip install --quiet ${offline[@]+"${offline[@]}"} $missing || die "pip could not install: $missing"
fi
"$PY" - <<'EOF' || die "minigrad does not see the GPU (above: what is missing)"
import sys

import cupy
import numpy

from minigrad import cuda

assert cuda.is_available(), "minigrad.cuda.is_available() is False, yet nvidia-smi sees a GPU"
from cupy.cuda import nccl

line = (f"python {sys.version.split()[0]}, numpy {numpy.__version__}, cupy {cupy.__version__} "
        f"(CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}), "
        f"NCCL {nccl.get_version() if nccl.available else 'not loadable'}, {cuda.device_count()} GPU(s)")
try:
    import torch

    line += f", torch {torch.__version__} (CUDA {'yes' if torch.cuda.is_available() else 'no'})"
except ImportError:
    line += ", no torch"
print(line)
EOF

status=0
summary=()
stage() {  # stage NAME COMMAND...: run it, note how it went, carry on with the next stage
    local name=$1 start=$SECONDS
    shift
    echo
    echo "== $name"
    if "$@"; then
        summary+=("ok      $name ($((SECONDS - start)) s)")
    else
        summary+=("FAILED  $name (exit $?, $((SECONDS - start)) s; log in $LOG)")
        status=1
    fi
}

all_tests() {
    timeout "$TEST_TIMEOUT" "$PY" -m pytest tests -q -p no:randomly -p no:cacheprovider 2>&1 | tee "$LOG/tests.log"
}

tests_on_cuda() {
    MINIGRAD_TEST_DEVICE=cuda timeout "$TEST_TIMEOUT" "$PY" -m pytest tests -q -p no:randomly -p no:cacheprovider \
        2>&1 | tee "$LOG/tests_cuda_default.log"
}

gpu_benchmarks() {
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE timeout "$BENCH_TIMEOUT" "$PY" benchmarks/bench_gpu.py \
        --json benchmarks/results/gpu.json 2>&1 | tee "$LOG/bench_gpu.log"
    local rc=${PIPESTATUS[0]}
    cp benchmarks/results/gpu.json "$LOG/" 2>/dev/null || true  # the tables, for 05_gpu.ipynb
    return "$rc"
}

stage "test suite, cuda cases included (limit ${TEST_TIMEOUT} s)" all_tests
stage "test suite with cuda as the default device (limit ${TEST_TIMEOUT} s)" tests_on_cuda
stage "GPU benchmarks (limit ${BENCH_TIMEOUT} s)" gpu_benchmarks

echo
echo "== summary"
printf '%s\n' "${summary[@]}"
for f in tests.log tests_cuda_default.log; do
    grep -E "passed|failed|error" "$LOG/$f" | tail -1 || true
done
if [ "$status" -ne 0 ]; then
    echo "gpu_check: FAILED (see above)" >&2
fi
exit "$status"
