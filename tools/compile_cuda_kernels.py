"""Compile every CUDA kernel minigrad generates, for sm_80 and sm_90, through NVRTC and ptxas, without a GPU.

minigrad writes a CUDA kernel (a ``cupy.ElementwiseKernel`` or ``ReductionKernel``) for each fused
group on a GPU, and cupy compiles it when it first runs. A kernel that does not compile, or that
spills registers, would first show on a GPU. Code generation is a pure function of the fusion
group, so this tool finds those kernels on a CPU: it runs test programs (by default the ones that
trace, fuse and compile) and, for every graph the fusion pass sees, fuses it again as if its
nodes lived on a GPU and keeps each distinct kernel it generates. Then it wraps each kernel as
cupy does (cupy's own headers, its ``CArray``/``CIndexer`` argument types) in three argument
layouts (1-D contiguous, 3-D strided with 32-bit and with 64-bit indexing), compiles it with
NVRTC to PTX for compute_80 and compute_90, and assembles the PTX with ``ptxas -v`` for sm_80 and
sm_90 to read registers and spills. It prints the count, the worst register figure and the time,
and exits 1 on any compile error or spill (chapter 03's GPU lesson explains the kernels).

The toolchain comes from pip wheels, no CUDA install and no driver: ``nvidia-cuda-nvrtc-cu12``
(libnvrtc), ``nvidia-cuda-runtime-cu12`` (``cuda_fp16.h``), ``nvidia-cuda-nvcc-cu12`` (ptxas) and
``cupy-cuda12x`` (only its headers are read; cupy is never imported). ``make cuda-kernels``
installs them into ``build/cuda`` and runs this with ``--toolkit build/cuda``.

    python tools/compile_cuda_kernels.py --toolkit build/cuda [--tests tests/graph/test_fusion.py ...]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parent.parent
ARCHS = (80, 90)
# The test programs whose graphs are fused: fusion and its kernels, compile (MLPs, training steps,
# the GPT), the executor, the ported programs, and the cuda tests on the stand-in.
DEFAULT_TESTS = ("tests/graph/test_fusion.py", "tests/graph/test_codegen.py", "tests/graph/test_compile.py", "tests/graph/test_executor.py",
                 "tests/backend/test_cuda_stand_in.py", "tests/suites/test_bench_transformer.py")
SWEEP_DTYPES = ("float16", "float32", "float64")
CTYPES = {"bool": "bool", "int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
          "uint8": "unsigned char", "float16": "float16", "float32": "float", "float64": "double"}
# (name, ndim of an elementwise kernel's arrays, C-contiguous, 32-bit indexing): cupy picks one per
# call. The commonest (contiguous arrays, reduced to 1-D) and the costliest in registers (strided
# 3-D with 64-bit index arithmetic) bound the others.
LAYOUTS = (("contiguous", 1, 1, 1), ("strided64", 3, 0, 0))
HEADERS = "#include <cupy/complex.cuh>\n#include <cupy/carray.cuh>\n#include <cupy/atomics.cuh>\n" \
          "#include <cupy/math_constants.h>\n#include <cupy/float16.cuh>\n"
REDUCE_BLOCK = 512


class ToolchainError(RuntimeError):
    """A piece of the CUDA toolchain (a wheel) is missing."""


# -- the toolchain from the wheels ---------------------------------------------------------------------
def find_toolchain(toolkit: str | None) -> SimpleNamespace:
    """libnvrtc, ptxas, the CUDA headers and cupy's headers, under ``toolkit`` or on ``sys.path``."""
    roots = [Path(toolkit)] if toolkit else [Path(p) for p in sys.path if p and Path(p).is_dir()]

    def find(relative: str, what: str) -> Path:
        for root in roots:
            hits = sorted(root.glob(relative))
            if hits:
                return hits[0]
        raise ToolchainError(f"{what} not found (looked for {relative} under {', '.join(map(str, roots[:3]))}...); "
                             "pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12 "
                             "cupy-cuda12x, or run make cuda-kernels")

    return SimpleNamespace(nvrtc=find("nvidia/cuda_nvrtc/lib/libnvrtc.so.*", "libnvrtc (nvidia-cuda-nvrtc-cu12)"),
                           ptxas=find("nvidia/cuda_nvcc/bin/ptxas", "ptxas (nvidia-cuda-nvcc-cu12)"),
                           cuda_include=find("nvidia/cuda_runtime/include", "cuda_fp16.h (nvidia-cuda-runtime-cu12)"),
                           cupy_include=find("cupy/_core/include", "cupy's headers (cupy-cuda12x)"))


class NVRTC:
    """The few calls of NVRTC's C API this tool needs, through ctypes."""

    def __init__(self, path: Path) -> None:
        self.lib = ctypes.CDLL(str(path))
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = f"{major.value}.{minor.value}"

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{call}: {self.lib.nvrtcGetErrorString(status).decode()}")

    def ptx(self, source: str, options: list[str]) -> tuple[str | None, str]:
        """``(ptx, log)``; ptx is None when the source does not compile."""
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernels.cu", 0, None, None),
                    "nvrtcCreateProgram")
        try:
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            status = self.lib.nvrtcCompileProgram(prog, len(options), opts)
            size = ctypes.c_size_t()
            self._check(self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
            log = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            if status != 0:
                return None, log.value.decode(errors="replace")
            self._check(self.lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
            ptx = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
            return ptx.value.decode(), log.value.decode(errors="replace")
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


# -- harvesting the kernels the programs generate ------------------------------------------------------
class Harvest:
    """While installed, every graph the fusion pass groups is fused once more with its nodes on a
    stand-in GPU device, and every CUDA kernel generated (for that or for a real cuda graph) is
    kept, once per distinct ``(kind, params)``."""

    def __init__(self) -> None:
        self.kernels: dict[tuple, dict[str, str]] = {}
        self.kinds: dict[tuple, str] = {}
        self.from_programs: set[tuple] = set()  # the kernels of the test programs (the rest: the op sweep)
        self.graphs = self.failures = 0
        self.errors: list[str] = []
        self._busy = False

    @contextlib.contextmanager
    def installed(self) -> Iterable[None]:
        from minigrad.graph.codegen import cuda
        from minigrad.graph.passes import fusion

        groups, generate = fusion.fusion_groups, cuda.generate

        def recording_generate(group: Any) -> Any:
            kernel = generate(group)
            key = (kernel.kind, tuple(sorted(kernel.params.items())))
            self.kernels.setdefault(key, kernel.params)
            self.kinds[key] = kernel.kind
            return kernel

        def harvesting_groups(graph: Any, *args: Any, **kwargs: Any) -> Any:
            found = groups(graph, *args, **kwargs)
            if not self._busy:
                self._busy = True
                try:
                    self._as_on_a_gpu(graph, fusion)
                finally:
                    self._busy = False
            return found

        fusion.fusion_groups, cuda.generate = harvesting_groups, recording_generate
        try:
            yield
        finally:
            fusion.fusion_groups, cuda.generate = groups, generate

    def _as_on_a_gpu(self, graph: Any, fusion: Any) -> None:
        nodes = list(graph)
        if any(getattr(n.meta.get("device"), "type", None) == "cuda" for n in nodes):
            return  # a graph on cuda (the stand-in) generates its CUDA kernels itself
        gpu = SimpleNamespace(type="cuda", index=0)  # what the fusion pass and codegen ask of a device
        saved = [(n, n.meta.get("device", None), "device" in n.meta) for n in nodes]
        self.graphs += 1
        try:
            for n in nodes:
                n.meta["device"] = gpu
            fusion.fuse_elementwise(graph)
        except Exception as e:  # a graph the GPU path cannot fuse is a finding too: reported, fails the check
            self.errors.append(f"{type(e).__name__}: {e}")
        finally:
            for n, device, had in saved:
                if had:
                    n.meta["device"] = device
                else:
                    n.meta.pop("device", None)


def sweep_ops(found: Harvest) -> int:
    """Every row of the op table (tests/op_table.py) in float16, float32 and float64, between two
    elementwise ops so that it lands in a fused group: each op's CUDA expression in each dtype.
    Returns how many programs were traced (a row a dtype cannot run is left out)."""
    import numpy

    import minigrad
    from minigrad.graph import trace
    from minigrad.graph.passes import fusion
    from op_table import OPS

    traced = 0
    with found.installed():
        for row in OPS:
            for dtype in SWEEP_DTYPES:
                def program(*xs: Any) -> Any:
                    out = row.mg(*[x * 1.5 for x in xs])
                    return out * 2 if isinstance(out, minigrad.Tensor) else out

                try:
                    with numpy.errstate(all="ignore"):
                        inputs = [minigrad.tensor(a, dtype=dtype) for a in row.arrays("float64")]
                        graph = trace(program, *inputs).graph
                except Exception:  # a row this dtype does not support: nothing to compile for it
                    continue
                fusion.fusion_groups(graph)
                traced += 1
    return traced


def harvest(tests: list[str]) -> Harvest:
    """Run the test programs in this process (quietly) with the harvest installed, then sweep the
    op table."""
    import pytest

    found = Harvest()
    outcomes: dict[str, int] = {}

    class Count:
        def pytest_runtest_logreport(self, report: Any) -> None:
            if report.when == "call" or report.outcome != "passed":
                outcomes[report.outcome] = outcomes.get(report.outcome, 0) + 1

    os.chdir(ROOT)
    with found.installed(), contextlib.redirect_stdout(io.StringIO()):
        code = pytest.main([*tests, "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-W", "ignore"],
                           plugins=[Count()])
    found.failures = outcomes.get("failed", 0)
    programs = len(found.kernels)
    found.from_programs = set(found.kernels)
    swept = sweep_ops(found)
    print(f"harvested {programs} kernels from {len(tests)} test file(s) (pytest exit {int(code)}: "
          + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())) + f") and {len(found.kernels) - programs} more "
          f"from {swept} op-table programs; {found.graphs} graph(s) fused as on a GPU")
    return found


# -- cupy's kernel source around the generated pieces --------------------------------------------------
def _params(spec: str) -> list[tuple[str, str]]:
    """``"float32 x0, float16 x1"`` as ``[("float", "x0"), ("float16", "x1")]``."""
    out = []
    for p in filter(None, (s.strip() for s in spec.split(","))):
        dtype, name = p.split()[-2:]
        out.append((CTYPES[dtype], name))
    return out


def elementwise_source(params: dict[str, str], name: str, layout: tuple) -> str:
    _, ndim, contiguous, small = layout
    ins, outs = _params(params["in_params"]), _params(params["out_params"])
    array = "CArray<{t}, %d, %d, %d>" % (ndim, contiguous, small)
    args = [f"const {array.format(t=t)} _raw_{n}" for t, n in ins] + [f"{array.format(t=t)} _raw_{n}" for t, n in outs]
    reads = [f"const {t} &{n} = _raw_{n}[_ind.get()];" for t, n in ins] + \
            [f"{t} &{n} = _raw_{n}[_ind.get()];" for t, n in outs]
    body = "\n      ".join(reads + [params["operation"]])
    return (f"{params.get('preamble', '')}\n"
            f"extern \"C\" __global__ void {name}({', '.join(args)}, CIndexer<{ndim}, {small}> _ind) {{\n"
            f"  #pragma unroll 1\n  CUPY_FOR(i, _ind.size()) {{\n    _ind.set(i);\n      {body};\n  }}\n}}\n")


def reduction_source(params: dict[str, str], name: str, layout: tuple) -> str:
    """A block-per-output-slice tree reduction in cupy's argument types, with the generated map,
    reduce, identity and post-map pieces where cupy puts them."""
    _, ndim, contiguous, small = layout
    ins, ((out_t, out_n),) = _params(params["in_params"]), _params(params["out_params"])
    in_nd, out_nd = ndim + 1, ndim
    arr = "CArray<{t}, {nd}, %d, %d>" % (contiguous, small)
    args = [f"const {arr.format(t=t, nd=in_nd)} _raw_{n}" for t, n in ins]
    args += [f"{arr.format(t=out_t, nd=out_nd)} _raw_{out_n}", f"CIndexer<{in_nd}, {small}> _in_ind",
             f"CIndexer<{out_nd}, {small}> _out_ind", "const int _block_stride"]
    reads = " ".join(f"const {t} &{n} = _raw_{n}[_in_ind.get()];" for t, n in ins)
    return f"""{params.get('preamble', '')}
#define REDUCE(a, b) ({params['reduce_expr']})
#define POST_MAP(a) ({params['post_map_expr']})
typedef {out_t} _type_reduce;
extern "C" __global__ void {name}({', '.join(args)}) {{
  __shared__ char _sdata_raw[{REDUCE_BLOCK} * sizeof(_type_reduce)];
  _type_reduce *_sdata = reinterpret_cast<_type_reduce*>(_sdata_raw);
  const unsigned int _tid = threadIdx.x, _stride = _block_stride;
  const ptrdiff_t _j_offset = (ptrdiff_t)(_tid / _stride) * _out_ind.size();
  const ptrdiff_t _j_step = (ptrdiff_t)({REDUCE_BLOCK} / _stride) * _out_ind.size();
  for (ptrdiff_t _i_base = (ptrdiff_t)blockIdx.x * _stride; _i_base < _out_ind.size();
       _i_base += (ptrdiff_t)gridDim.x * _stride) {{
    const ptrdiff_t _i = _i_base + _tid % _stride;
    _type_reduce _s = _type_reduce({params['identity']});
    for (ptrdiff_t _j = _i + _j_offset; _i < _out_ind.size() && _j < _in_ind.size(); _j += _j_step) {{
      _in_ind.set(_j);
      {reads}
      _type_reduce _a = static_cast<_type_reduce>({params['map_expr']});
      _s = REDUCE(_s, _a);
    }}
    _sdata[_tid] = _s;
    __syncthreads();
    for (unsigned int _k = {REDUCE_BLOCK} / 2; _k >= _stride && _k > 0; _k >>= 1) {{
      if (_tid < _k) {{ _type_reduce _a = _sdata[_tid], _b = _sdata[_tid + _k]; _sdata[_tid] = REDUCE(_a, _b); }}
      __syncthreads();
    }}
    if (_tid < _stride && _i < _out_ind.size()) {{
      _s = _sdata[_tid];
      _out_ind.set(_i);
      {out_t} &{out_n} = _raw_{out_n}[_out_ind.get()];
      POST_MAP(_s);
    }}
    __syncthreads();
  }}
}}
#undef REDUCE
#undef POST_MAP
"""


def unit(kernels: list[tuple[int, str, dict[str, str], tuple]]) -> tuple[str, dict[str, tuple[int, str]]]:
    """One translation unit holding ``kernels``, each in its layouts, each in a namespace of its own
    (its preamble's helpers keep their names) under a unique C name; returns the source and the map
    from C name to (kernel number, layout)."""
    parts, names = [HEADERS], {}
    for number, kind, params, layouts in kernels:
        for layout in layouts:
            cname = f"{params['name']}_{number}_{layout[0]}"
            names[cname] = (number, layout[0])
            write = elementwise_source if kind == "ElementwiseKernel" else reduction_source
            parts.append(f"namespace k{number}_{layout[0]} {{\n{write(params, cname, layout)}}}\n")
    return "\n".join(parts), names


# -- compiling --------------------------------------------------------------------------------------------
PTXAS_FUNCTION = re.compile(r"Function properties for (\w+)")
PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
PTXAS_REGISTERS = re.compile(r"Compiling entry function '(\w+)'|Used (\d+) registers")


def ptxas(tool: SimpleNamespace, ptx: str, arch: int) -> tuple[dict[str, int], dict[str, int], str]:
    """Registers and spilled bytes per kernel of ``ptx`` assembled for sm_``arch``, and the log."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernels.ptx"
        src.write_text(ptx)
        run = subprocess.run([str(tool.ptxas), f"-arch=sm_{arch}", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True)
    log = run.stdout + run.stderr
    if run.returncode != 0:
        return {}, {}, log
    registers, spills, current = {}, {}, None
    for line in log.splitlines():
        m = PTXAS_REGISTERS.search(line)
        if m and m.group(1):
            current = m.group(1)
        elif m and current:
            registers[current] = int(m.group(2))
        f = PTXAS_FUNCTION.search(line)
        if f:
            current = f.group(1)
        s = PTXAS_SPILLS.search(line)
        if s and current:
            spills[current] = int(s.group(1)) + int(s.group(2))
    return registers, spills, log


def compile_all(tool: SimpleNamespace, kernels: list[tuple[str, dict[str, str], tuple]], chunk: int = 48) -> dict:
    """Compile ``(kind, params, layouts)`` kernels for every arch: errors, registers and spills per
    (C name, arch), and how many compilations that was."""
    nvrtc = NVRTC(tool.nvrtc)
    numbered = [(k, kind, params, layouts) for k, (kind, params, layouts) in enumerate(kernels)]
    batches = [numbered[i:i + chunk] for i in range(0, len(numbered), chunk)]
    result = {"errors": [], "registers": {}, "spills": {}, "compilations": 0, "nvrtc": nvrtc.version}

    def options(arch: int) -> list[str]:
        cccl = tool.cupy_include / "cupy" / "_cccl"  # the thrust, cub and libcudacxx cupy ships
        return [f"-arch=compute_{arch}", "--std=c++17", "-ftz=true", f"-I{tool.cupy_include}",
                f"-I{cccl / 'libcudacxx'}", f"-I{cccl / 'thrust'}", f"-I{cccl / 'cub'}", f"-I{tool.cuda_include}"]

    def one(batch: list, arch: int) -> None:
        source, names = unit(batch)
        ptx, log = nvrtc.ptx(source, options(arch))
        if ptx is None:
            if len(batch) > 1:  # find the kernel(s) at fault, one by one
                for single in batch:
                    one([single], arch)
                return
            number, kind, params, _ = batch[0]
            result["errors"].append(f"NVRTC, compute_{arch}, kernel {params['name']} #{number}:\n{log[-3000:]}")
            return
        registers, spills, log = ptxas(tool, ptx, arch)
        if not registers:
            result["errors"].append(f"ptxas, sm_{arch}, kernels #{batch[0][0]}..#{batch[-1][0]}:\n{log[-3000:]}")
            return
        for cname, count in registers.items():
            result["registers"][(cname, arch)] = count
            result["compilations"] += 1
        for cname, spilled in spills.items():
            if spilled:
                result["spills"][(cname, arch)] = spilled

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        list(pool.map(lambda job: one(*job), [(b, arch) for arch in ARCHS for b in batches]))
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--toolkit", help="folder the wheels were installed into (pip install --target); "
                                      "default: this Python's site-packages")
    ap.add_argument("--tests", nargs="+", default=list(DEFAULT_TESTS), help="test files whose programs are fused")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    try:
        tool = find_toolchain(args.toolkit)
    except ToolchainError as e:
        print(f"compile_cuda_kernels: {e}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT / "tests"))
    found = harvest(args.tests)
    harvested = time.perf_counter() - start
    # The programs' kernels in every layout; the op sweep's, which check each op's expression in
    # each dtype, in the contiguous one (half the compile time; the index code is the same).
    kernels = [(found.kinds[key], params, LAYOUTS if key in found.from_programs else LAYOUTS[:1])
               for key, params in found.kernels.items()]
    elementwise = sum(kind == "ElementwiseKernel" for kind, _, _ in kernels)
    result = compile_all(tool, kernels)
    took = time.perf_counter() - start
    worst = max(result["registers"].items(), key=lambda kv: kv[1], default=(("-", 0), 0))
    print(f"NVRTC {result['nvrtc']}: {len(kernels)} distinct kernels ({elementwise} elementwise, "
          f"{len(kernels) - elementwise} reduction; {len(found.from_programs)} of the test programs in "
          f"{len(LAYOUTS)} argument layouts, the op sweep's in 1) x sm_{'/sm_'.join(map(str, ARCHS))}"
          f" = {result['compilations']} compilations")
    print(f"worst register count: {worst[1]} ({worst[0][0]}, sm_{worst[0][1]}); "
          f"spills: {len(result['spills'])}; errors: {len(result['errors']) + len(found.errors)}")
    print(f"time: {took:.1f} s ({harvested:.1f} s harvesting, {took - harvested:.1f} s compiling)")
    for (cname, arch), spilled in sorted(result["spills"].items()):
        print(f"SPILL  {cname} on sm_{arch}: {spilled} bytes spilled")
    for message in found.errors + result["errors"]:
        print(f"ERROR  {message}")
    if not kernels:
        print("ERROR  no kernel was harvested: the test programs fused nothing")
        return 1
    return 1 if result["errors"] or result["spills"] or found.errors else 0


if __name__ == "__main__":
    sys.exit(main())
