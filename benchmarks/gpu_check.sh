#!/usr/bin/env bash
# The GPU check, one prepared command for a fresh machine with an NVIDIA GPU, under 9 minutes (each
# stage has its own `timeout`; the limits add up to 510 s): the GPU-marked tests first (every cuda
# case of the suite, the generated kernels run for real, NCCL, the prefetcher), then the GPU
# benchmarks (bench_gpu.py: training steps, fusion, mixed precision, prefetch; activation
# checkpointing's peak memory; DDP over NCCL with one rank per GPU), then the suite's op and layer
# tests with cuda as the default device. Logs and a JSON of figures go to $OUT (default
# /tmp/minigrad-gpu-check); the summary is printed last, also when a stage times out or fails.
#
#   benchmarks/gpu_check.sh               PYTHON=/path/to/python3 to choose the interpreter
#
# What must be installed on the image: an NVIDIA driver (nvidia-smi), Python >= 3.11 with numpy,
# CuPy for the driver's CUDA (cupy-cuda12x or cupy-cuda13x: the `cuda` extra names cupy-cuda12x,
# and two CuPys in one environment conflict, so an installed one is used as it is) with NVRTC,
# cuBLAS and cuRAND (the nvidia-* wheels or a toolkit), pytest and hypothesis; NCCL (nvidia-nccl-*)
# and mpi4py for the NCCL stage; PyTorch with CUDA, optional, as the benchmarks' baseline.
# minigrad is not installed: it runs from this checkout (PYTHONPATH). The course's tools (nbformat,
# jupyter) are not needed: test modules that cannot be imported are reported and the rest run.
#
# How wheels travel: the GPU machine reaches no package registry. A missing package is downloaded
# here as a wheel for its Python into .whl/ at the repository's root (listed in .git/info/exclude,
# never committed), carried with the working tree, and installed there with
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
# which this script does itself when .whl/ holds wheels (WHEELHOUSE=dir to use another folder),
# putting /tmp/site on PYTHONPATH. Nothing is fetched from the network.
set -uo pipefail  # no -e: a failed or timed-out stage is noted and the next one runs
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/minigrad-gpu-check}
WHEELHOUSE=${WHEELHOUSE:-.whl}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
START=$SECONDS
STAGES=()   # "status|name|seconds|limit"

summary() {
    echo
    echo "== summary ($((SECONDS - START)) s in all; logs and figures in $OUT)"
    local failed=0 line status name took limit
    for line in "${STAGES[@]}"; do
        IFS='|' read -r status name took limit <<<"$line"
        printf '%-8s %-58s %4s s (limit %s s)\n' "$status" "$name" "$took" "$limit"
        [ "$status" = ok ] || failed=1
    done
    for log in "$OUT"/*.log; do
        [ -f "$log" ] || continue
        last=$(grep -E "(passed|failed|error)" "$log" | grep -E "^(=|[0-9])" | tail -1)
        [ -n "$last" ] && printf '  %-22s %s\n' "$(basename "$log")" "$last"
    done
    "$PY" - "$OUT" "${STAGES[@]}" <<'EOF' 2>/dev/null || true
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
figures = {}
for f in sorted(out.glob("*.json")):
    if f.name != "gpu_check.json":
        try:
            figures[f.stem] = json.loads(f.read_text())
        except ValueError:
            pass
stages = [dict(zip(("status", "stage", "seconds", "limit"), s.split("|"))) for s in sys.argv[2:]]
(out / "gpu_check.json").write_text(json.dumps({"stages": stages, "figures": figures}, indent=1))
print(f"  figures: {', '.join(figures) or 'none'} -> {out / 'gpu_check.json'}")
EOF
    if [ "$failed" = 0 ]; then echo "gpu_check: all stages passed"; else echo "gpu_check: FAILED (see above and the logs)" >&2; fi
}
trap summary EXIT
trap "exit 143" TERM INT  # a stopped run still prints its summary

stage() {  # stage LIMIT NAME FUNCTION: run it in a bash under `timeout`, note how it went
    local limit=$1 name=$2 start=$SECONDS rc
    shift 2
    echo
    echo "== $name (limit $limit s)"
    timeout --kill-after=10 "$limit" bash -o pipefail -c "$(declare -f "$1"); $1"
    rc=$?
    local status=ok
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then status=TIMEOUT; elif [ "$rc" != 0 ]; then status="FAILED($rc)"; fi
    STAGES+=("$status|$name|$((SECONDS - start))|$limit")
}

environment() {
    command -v nvidia-smi >/dev/null || { echo "nvidia-smi is not here: no NVIDIA driver, so no GPU to check" >&2; return 1; }
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || return 1
    "$PY" - <<'EOF'
import json, os, sys
import numpy
import minigrad
from minigrad import cuda
try:
    import cupy
except ImportError as e:
    sys.exit(f"cupy is not importable ({e}): carry cupy-cuda12x or cupy-cuda13x as a wheel (see this script's header)")
assert cuda.is_available(), "minigrad.cuda.is_available() is False, yet nvidia-smi sees a GPU"
facts = {"python": sys.version.split()[0], "numpy": numpy.__version__, "cupy": cupy.__version__,
         "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(), "gpus": cuda.device_count(),
         "gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()}
try:
    from cupy.cuda import nccl
    facts["nccl"] = nccl.get_version() if nccl.available else None
except ImportError:
    facts["nccl"] = None
try:
    import torch
    facts["torch"] = f"{torch.__version__} (CUDA {'yes' if torch.cuda.is_available() else 'no'})"
except ImportError:
    facts["torch"] = None
print(", ".join(f"{k} {v}" for k, v in facts.items()))
with open(os.path.join(os.environ["OUT"], "environment.json"), "w") as f:
    json.dump(facts, f, indent=1)
EOF
}

gpu_tests() {  # every test with a cuda case, the NCCL and GPU data tests, and the kernels run for real
    "$PY" -m pytest tests -k "cuda or nccl or gpu" -q -p no:randomly -p no:cacheprovider \
        --continue-on-collection-errors -o addopts="" -rfE 2>&1 | tee "$OUT/tests_gpu.log"
    local rc=${PIPESTATUS[0]}
    # pytest exits 1 when a module could not be imported, even if every test it ran passed: a module
    # that needs a package the GPU image lacks (the course's nbformat) is reported, not a failure
    if [ "$rc" = 1 ] && ! grep -qE "^(FAILED|ERROR) tests/[^ ]*::" "$OUT/tests_gpu.log"; then
        echo "(test modules not importable here, their tests not run: $(grep -cE '^ERROR tests/[^ :]*( |$)' \
            "$OUT/tests_gpu.log"); every test that ran passed)"
        return 0
    fi
    return "$rc"
}

benchmarks() {  # training steps, fusion, autocast + GradScaler, prefetch: minigrad beside PyTorch CUDA
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$PY" benchmarks/bench_gpu.py --repeats 3 \
        --json "$OUT/bench_gpu.json" 2>&1 | tee "$OUT/bench_gpu.log"
    return "${PIPESTATUS[0]}"
}

checkpointing() {  # activation checkpointing on the GPU: peak memory and step time, kept vs recomputed
    "$PY" - <<'EOF' 2>&1 | tee "$OUT/checkpointing.log"
import json, os, time
import minigrad
from minigrad import cuda, memory, nn
from minigrad.memory import checkpoint_sequential

minigrad.manual_seed(0)
layers = [m for _ in range(16) for m in (nn.Linear(2048, 2048), nn.GELU())]
model = nn.Sequential(*layers).to("cuda")
x = minigrad.randn(4096, 2048, device="cuda", requires_grad=True)
rows = {}
for name, run in (("all kept", lambda: model(x)), ("checkpointed, 4 segments", lambda: checkpoint_sequential(model, 4, x))):
    for _ in range(2):  # the first round warms cupy's kernel cache and pool
        cuda.synchronize(); cuda.reset_peak_memory_stats(); base = cuda.memory_allocated()
        start = time.perf_counter()
        run().sum().backward()
        cuda.synchronize()
        took = time.perf_counter() - start
        x.grad = None
        model.zero_grad(set_to_none=True)
    rows[name] = {"peak_mb": round((cuda.max_memory_allocated() - base) / 2**20, 1), "step_ms": round(took * 1e3, 1)}
    print(f"{name:26s} peak {rows[name]['peak_mb']:9.1f} MB   step {rows[name]['step_ms']:8.1f} ms")
with open(os.path.join(os.environ["OUT"], "checkpointing.json"), "w") as f:
    json.dump(rows, f, indent=1)
EOF
    return "${PIPESTATUS[0]}"
}

ddp_nccl() {  # DDP and the collectives over NCCL, one rank per GPU (tests/distributed/nccl_checks.py)
    "$PY" - <<'EOF' 2>&1 | tee "$OUT/ddp_nccl.log"
import os, subprocess, sys, time
from pathlib import Path
from minigrad import cuda, distributed as dist
from minigrad.distributed import launcher

script, ranks = Path("tests/distributed/nccl_checks.py").resolve(), cuda.device_count()
start = time.perf_counter()
if launcher.find_mpiexec() is not None:
    result = dist.launch(script, ranks, timeout=25)
else:  # one rank: MPI starts as a singleton without mpiexec
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=25)
print(result.stdout[-3000:], result.stderr[-3000:], sep="\n")
print(f"{ranks} rank(s) over NCCL in {time.perf_counter() - start:.1f} s")
sys.exit(0 if "ok nccl" in result.stdout else 1)
EOF
    return "${PIPESTATUS[0]}"
}

tests_on_cuda() {  # the op table and the layers with cuda as the default device of every tensor
    MINIGRAD_TEST_DEVICE=cuda "$PY" -m pytest tests/suites/test_ops.py tests/nn/test_nn_layers.py tests/nn/test_nn_loss.py \
        tests/graph/test_compile.py -q -p no:randomly -p no:cacheprovider -o addopts="" -rfE -x 2>&1 \
        | tee "$OUT/tests_cuda_default.log"
    return "${PIPESTATUS[0]}"
}

export OUT PY
if compgen -G "$WHEELHOUSE/*.whl" >/dev/null; then  # the carried wheels, for every stage
    echo "== installing the carried wheels: $(ls "$WHEELHOUSE"/*.whl | xargs -n1 basename | tr '\n' ' ')"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELHOUSE"/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
stage 30 "the GPU and the Python packages" environment
if [ "${STAGES[0]%%|*}" != ok ]; then
    echo "gpu_check: no usable GPU or CuPy (above): nothing else can run" >&2
    exit 1
fi
stage 170 "GPU-marked tests (-k 'cuda or nccl or gpu')" gpu_tests
stage 150 "GPU benchmarks (bench_gpu.py)" benchmarks
stage 40 "activation checkpointing on the GPU" checkpointing
stage 30 "DDP over NCCL, one rank per GPU" ddp_nccl
stage 90 "op, layer, loss and compile tests with cuda as default" tests_on_cuda
status=0
for line in "${STAGES[@]}"; do [ "${line%%|*}" = ok ] || status=1; done
exit "$status"
