# make lab: set everything up and open the chapters in JupyterLab.  make test: run the test suite.
# The virtual environment lives in .venv; it is (re)installed only when pyproject.toml changes. It holds
# minigrad with its dev extra, which includes the course extra: everything the four chapters run,
# MPI for chapter 04 included, so a fresh clone needs no other command before these two.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# BLAS settings some machines export for old OpenBLAS builds; they slow a current numpy, so the
# benchmarks run without them (the tests keep whatever the environment has).
BENCH_ENV := env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE
# JupyterLab refuses to start as root unless told it may.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: help venv graphviz gcc lab chapters chapters-portability test course-check torch onnx check-install bench cuda-toolchain cuda-kernels clean

help:
	@echo "make lab       set up .venv and graphviz, then open JupyterLab on chapters/"
	@echo "make chapters  run every chapter notebook headless and compare its outputs (nbval)"
	@echo "make test      run the test suite and the chapter notebooks (PyTorch cross-checks skip unless 'make torch')"
	@echo "make chapters-portability  the notebooks again under two other OpenBLAS kernels and thread counts"
	@echo "make course-check  student exercises = release of the solutions (100% / 0%); chapter order of the package regions;"
	@echo "                   each region's absence and every catalogued student mistake fail its chapter's tests"
	@echo "make torch     install PyTorch 2.13.0 (CPU) into .venv for cross-checks and benchmarks"
	@echo "make onnx      install onnx and onnxruntime (the course extra already has them; for a venv without it)"
	@echo "make check-install  pip install . into a bare venv (build/bare) and run the examples there"
	@echo "make bench     run every benchmark in benchmarks/"
	@echo "make cuda-kernels  compile every CUDA kernel minigrad generates for sm_80/sm_90, no GPU needed (NVRTC wheels)"
	@echo "make venv      create .venv and install minigrad with its dev extra"
	@echo "make graphviz  install graphviz's 'dot' (needed to draw graphs) if it is missing"
	@echo "make gcc       install a C compiler (compiled kernels; without one they run as numpy) if missing"
	@echo "make clean     remove caches and build outputs (rm -rf .venv to start over)"

venv: $(STAMP) gcc

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --progress-bar off -e '.[dev]'
	touch $@

graphviz:
	@if command -v dot >/dev/null 2>&1; then \
		true; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null 2>&1 || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz; }; \
	else \
		echo "graphviz's 'dot' is missing (graphs will not render); install it with:"; \
		echo "    sudo apt-get install -y graphviz"; \
	fi

# minigrad.compile writes fused kernels in C and builds them with the system compiler; without
# one they run as blocked numpy (slower, same results), so a missing gcc is installed, not required.
gcc:
	@if command -v gcc >/dev/null 2>&1 || command -v cc >/dev/null 2>&1; then \
		true; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null 2>&1 || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev; }; \
	else \
		echo "no C compiler (compiled kernels will run as numpy); install one with:"; \
		echo "    sudo apt-get install -y gcc"; \
	fi

lab: venv graphviz
	$(VENV)/bin/jupyter lab $(ROOT_FLAG) --notebook-dir=chapters

# The first matplotlib import on a machine builds its font cache and says so on stderr, which nbval
# would compare against the stored outputs: import it once before the notebooks run.
chapters: venv graphviz
	@if [ -z "$$(find chapters -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*' | head -1)" ]; then \
		echo "no notebooks in chapters/ yet"; \
	else \
		$(PY) -c "import matplotlib.pyplot" && \
		$(PY) -m pytest -p no:randomly --nbval chapters --nbval-sanitize-with chapters/nbval_sanitize.cfg; \
	fi

test: venv graphviz
	$(PY) -m pytest
	@$(MAKE) --no-print-directory chapters

# What nbval compares must not be one machine's rounding: the chapters again under two OpenBLAS
# kernels other than the ones current x86 CPUs pick (Haswell, Zen, SkylakeX), with one thread and
# with two (these override the notebooks' own default of one), the second also with numpy's AVX2
# loops off (its other exp, log and tanh). `make chapters` covers the machine's own settings.
PORTABILITY_RUNS := "OPENBLAS_CORETYPE=Prescott OPENBLAS_NUM_THREADS=1" \
	"OPENBLAS_CORETYPE=Sandybridge OPENBLAS_NUM_THREADS=2 NPY_DISABLE_CPU_FEATURES=X86_V3"
chapters-portability: venv graphviz
	$(PY) -c "import matplotlib.pyplot"
	@status=0; for run in $(PORTABILITY_RUNS); do \
		echo "== nbval with $$run"; \
		env $$run $(PY) -m pytest -p no:randomly -q --nbval chapters --nbval-sanitize-with chapters/nbval_sanitize.cfg || status=1; \
	done; exit $$status

# The course: chapters/*/exercises.ipynb must be exactly the release of chapters/*/solutions/,
# grading must give the solutions every exercise and the student versions none, and each chapter's
# tests must pass in a student repository with chapters 1..k written and the later ones empty.
course-check: venv
	$(PY) -m minigrad.course ship --check chapters
	$(PY) -m minigrad.course check-order
	$(PY) -m minigrad.course check-order --per-region --jobs 2
	$(PY) -m minigrad.course mutants --jobs 2
	@status=0; for nb in chapters/*/solutions/exercises.ipynb; do \
		$(PY) -m minigrad.course verify $$nb || status=1; \
	done; exit $$status

torch: venv
	$(PY) -m pip install --quiet --progress-bar off torch==2.13.0

onnx: venv
	$(PY) -m pip install --quiet --progress-bar off -e '.[onnx]'

# What a user of the package (not the course) gets: `pip install .` into a bare virtual environment
# trains the digits example; `pip install .[mpi]` adds a working mpiexec for the DDP example.
BARE := build/bare
check-install:
	rm -rf $(BARE) && $(PYTHON) -m venv $(BARE)
	$(BARE)/bin/python -m pip install --quiet --progress-bar off .
	cd $(BARE) && bin/python -c "import minigrad; print('minigrad', minigrad.__version__, 'from', minigrad.__file__)"
	cd $(BARE) && bin/python -m minigrad.examples.train_digits --epochs 2 --no-progress --checkpoint digits.ckpt
	$(BARE)/bin/python -m pip install --quiet --progress-bar off '.[mpi]'
	cd $(BARE) && bin/mpiexec -n 2 bin/python -m minigrad.examples.train_digits_ddp --epochs 2

bench: venv
	@status=0; for script in benchmarks/bench_*.py; do \
		echo "== $$script"; \
		$(BENCH_ENV) $(PY) $$script || status=1; \
		echo; \
	done; exit $$status

# GPU readiness without a GPU: every CUDA kernel the test programs make minigrad generate, compiled
# for sm_80 and sm_90 by NVRTC and ptxas (registers and spills), from pip wheels: NVRTC, the CUDA
# headers, ptxas, and cupy's headers (cupy is not imported). They go to build/cuda, not .venv: a
# cupy in .venv would be the one every test imports, on a machine without a GPU.
CUDA_TOOLKIT := build/cuda
CUDA_WHEELS := nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-nvcc-cu12==12.9.86 \
	cupy-cuda12x==14.2.0
cuda-toolchain: venv
	@test -d $(CUDA_TOOLKIT)/nvidia/cuda_nvrtc || \
		$(PY) -m pip install --quiet --progress-bar off --no-deps --target $(CUDA_TOOLKIT) $(CUDA_WHEELS)

cuda-kernels: cuda-toolchain
	$(PY) tools/compile_cuda_kernels.py --toolkit $(CUDA_TOOLKIT)

clean:
	rm -rf build dist *.egg-info .pytest_cache .hypothesis
	find . -path ./$(VENV) -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -print | xargs -r rm -rf
