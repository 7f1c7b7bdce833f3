"""Compiled C kernels: every op that declares a C expression agrees with eager (NaN and Inf
included), arithmetic rounds as numpy's does bit for bit (no FMA contraction), groups with row
reductions and broadcast operands agree, the source reads as a loop,
libraries are cached and shared by processes building at once, and where no compiler is found
or it fails the blocked numpy kernel runs after one warning."""

import ctypes
import hashlib
import os
import shutil
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import minigrad as mg
from minigrad.errors import ArgumentError
from minigrad.graph import trace
from minigrad.backend import cc, machine
from minigrad.graph.codegen import c, numpy_blocks
from minigrad.graph.passes import fuse_elementwise
from minigrad.graph.trace import run_graph
from op_table import OPS

pytestmark = pytest.mark.skipif(cc.compiler() is None, reason="no C compiler on this machine")


@pytest.fixture(autouse=True)
def on_cpu():
    mg.set_default_device("cpu")


def c_nodes(fn, *inputs):
    """The traced graph of ``fn``, the graph fused with the C backend, and its C kernels."""
    graph = trace(fn, *inputs).graph
    new = fuse_elementwise(graph, backend="c")
    return graph, new, [n.fn for n in new if n.op == "fused" and isinstance(n.fn, c.CKernel)]


def check(fn, *inputs, rtol=1e-5):
    graph, new, kernels = c_nodes(fn, *inputs)
    assert kernels, "no C kernel was made"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # eager's own overflow and invalid-value notes
        got, want = run_graph(new, inputs), run_graph(graph, inputs)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6, equal_nan=True)
    return kernels


def with_specials(a: np.ndarray) -> np.ndarray:
    """``a`` with NaN, Inf, -Inf and a zero among its values (where it has room)."""
    a = a.copy()
    flat = a.reshape(-1)
    flat[:4] = [np.nan, np.inf, -np.inf, 0.0][:flat.size]
    return a


ELEMENTWISE = [row for row in OPS if row.shapes and all(s == row.shapes[0] for s in row.shapes)]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # eager's notes on the NaN and Inf it meets
@pytest.mark.parametrize("row", ELEMENTWISE, ids=repr)
def test_every_op_with_a_c_expression_agrees_with_eager_nan_and_inf_included(row):
    """Each row's op between two more (so that it sits inside a group), on float32 values with
    NaN, Inf and 0 among them: where the group becomes C, C and eager agree."""
    inputs = [mg.tensor(with_specials(a)) for a in row.arrays("float32")]

    def fn(*xs):
        out = row.mg(*[x * 1.0 for x in xs])
        return out * 2.0 if isinstance(out, mg.Tensor) and out.dtype.kind == "f" else out

    with mg.no_grad():
        graph, new, kernels = c_nodes(fn, *inputs)
        if not kernels:
            pytest.skip("no C kernel for this op (a reduction, a movement, or no c declaration)")
        check(fn, *inputs)


def layer_norm(x, w, b):
    d = x - x.mean(-1, keepdim=True)
    return d * ((d * d).mean(-1, keepdim=True) + 1e-5).rsqrt() * w + b


@pytest.mark.parametrize("fn", [lambda g, y: g * (1 - y * y),  # tanh's backward, where y nears 1
                                lambda v, g: (v * 0.9 + g * g * 0.1).sqrt() + 1e-8],  # an RMSprop update
                         ids=["tanh-backward", "rmsprop"])
def test_arithmetic_rounds_as_eager_bit_for_bit(fn):
    """No product and sum is contracted into one FMA (rounded once, where numpy rounds twice)."""
    rng = np.random.default_rng(0)
    inputs = [mg.tensor(rng.uniform(0.9, 1.0, (64, 64)).astype(np.float32)) for _ in range(2)]
    graph, new, kernels = c_nodes(fn, *inputs)
    assert kernels
    (got,), (want,) = run_graph(new, inputs), run_graph(graph, inputs)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", [(6, 10), (2, 5, 8), (1, 3)])
def test_a_layer_norm_is_one_c_kernel_by_rows(shape):
    x, w, b = mg.randn(*shape), mg.randn(shape[-1]), mg.randn(shape[-1])
    (kernel,) = check(layer_norm, x, w, b)
    assert "by rows of" in kernel.source and len(re.findall(r"double s\w+ = 0;", kernel.source)) == 2  # two means


@pytest.mark.parametrize("reduce", [lambda h: h.sum(-1), lambda h: h.amax(-1, keepdim=True),
                                    lambda h: h.amin(-1), lambda h: (h - h.mean(1, keepdim=True)).exp()])
def test_row_reductions_and_what_follows_them(reduce):
    x = mg.tensor(with_specials(mg.randn(5, 7).numpy()))
    check(lambda a, s: reduce((a * s).tanh() + 1), x, mg.randn(5, 1))


def test_broadcast_operands_index_their_own_axes():
    x, row, col, s = mg.randn(4, 3, 5), mg.randn(4, 1, 1), mg.randn(5), mg.randn()
    (kernel,) = check(lambda x, r, c_, s: ((x * r + c_) * s).sigmoid() - x, x, row, col, s)
    assert "#pragma omp simd" in kernel.source and "x2[i2]" in kernel.source  # the column operand


def test_a_non_contiguous_input_is_read_in_order():
    x = mg.randn(6, 4)
    check(lambda a: (a * 2).tanh() + 1, x.transpose(0, 1))


def test_the_source_is_one_readable_loop():
    x = mg.randn(64, 32)
    (kernel,) = check(lambda a: 0.5 * a * (1 + (0.79788 * (a + 0.044715 * a * a * a)).tanh()), x)
    src = kernel.source
    assert src.startswith("/* fused_tanh") and "void fused_tanh" in src
    assert "= tanh(" in src and "// " in src and "out[i] = " in src


def test_float_tanh_is_within_6_2_ulp_of_the_exact_value():
    """The kernels' own float tanh (a rational function, ``c._TANHF``) against float64 tanh on a
    sweep of float32 values: every 509th bit pattern from 0 to 10 (about 2 million values, both
    signs), where it is not a constant; NaN, the infinities and signed zeros as tanh has them."""
    bits = np.arange(0, np.float32(10).view(np.int32), 509, dtype=np.int32)
    x = bits.view(np.float32)
    x = np.concatenate([x, -x, np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 9.2, 1e-30])])
    graph, new, kernels = c_nodes(lambda a: (a * 1.0).tanh() * 2.0, mg.tensor(x))
    assert kernels and "minigrad_tanhf" in kernels[0].source
    (got,) = run_graph(new, [mg.tensor(x)])
    got = got / 2  # the * 2.0 around it (so that it is a group) is exact
    want = np.tanh(x.astype(np.float64))
    finite = np.isfinite(x)
    ulps = np.abs(got[finite] - want[finite]) / np.spacing(np.abs(want[finite]).astype(np.float32))
    assert ulps.max() <= 6.2, f"{ulps.max():.2f} ulp at x = {x[finite][ulps.argmax()]!r}"
    assert np.isnan(got[-7]) and got[-6] == 1 and got[-5] == -1 and got[-1] == np.float32(1e-30)
    assert not np.signbit(got[-4]) and np.signbit(got[-3])


def test_a_row_phase_with_two_math_calls_runs_as_one_loop_each():
    """A tanh then a sigmoid (a tanh too) before a row's mean: the phase splits into two column
    loops, the values between them kept in a row buffer, and still agrees with eager."""
    def fn(a):
        h = (a * 0.7).tanh() + a
        g = h * h.sigmoid()
        return g - g.mean(-1, keepdim=True)
    (kernel,) = check(fn, mg.randn(6, 40))
    assert kernel.source.count("for (long j = 0;") == 3  # phase 0 twice, then the subtraction


def test_a_product_with_its_epilogue_and_the_output_written_in_place():
    x, w, b = mg.randn(8, 5), mg.randn(6, 5), mg.randn(6)
    (kernel,) = check(lambda x, w, b: mg.nn.functional.linear(x, w, b).tanh() * 2, x, w, b)
    out = np.empty((8, 6), np.float32)
    res = kernel(x.array, w.array, b.array, out=out)
    assert res is out and np.allclose(out, np.tanh(x.numpy() @ w.numpy().T + b.numpy()) * 2, atol=1e-6)


# -- the compiler and its cache ---------------------------------------------------------------------
SOURCE = "void twice(float *out, const float *x) { for (long i = 0; i < 4; i++) out[i] = 2 * x[i]; }\n"


def test_libraries_are_cached_by_source_and_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cc, "_loaded", {})
    monkeypatch.setattr(cc, "_machines", {})  # a first process: probes the machine, and keeps the answer
    cc.build(SOURCE)
    (library,) = (tmp_path / "kernels").glob("*.so")
    assert library == cc.library_path(SOURCE)
    stamp = library.stat().st_mtime_ns
    monkeypatch.setattr(cc, "_loaded", {})  # a new process: loads the library, compiles nothing
    fn = cc.build(SOURCE).twice
    record = library.with_suffix(".sha256")
    machine = tmp_path / "kernels" / cc.MACHINE_FILE  # the probe's answer, kept beside the libraries
    assert library.stat().st_mtime_ns == stamp and sorted((tmp_path / "kernels").iterdir()) == sorted(
        [library, record, machine])
    assert record.read_text() == f"{hashlib.sha256(library.read_bytes()).hexdigest()}  {library.name}\n"
    assert (tmp_path / "kernels").stat().st_mode & 0o777 == 0o700
    x, out = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    fn(ctypes.c_void_p(out.ctypes.data), ctypes.c_void_p(x.ctypes.data))
    assert out.tolist() == [0, 2, 4, 6]


# -- the machine probe: vector width and OpenMP split ------------------------------------------------
ZEN3 = "fpu sse sse2 avx f16c fma bmi2 avx2 sha_ni vaes"
ZEN4 = ZEN3 + " avx512f avx512dq avx512bw avx512vl avx512_vbmi2 avx512_bf16"
SKYLAKE_SP = "fpu sse sse2 avx fma avx2 avx512f avx512dq avx512bw avx512vl"
GCC_AVX512 = {"avx", "avx2", "fma", "avx512f", "avx512bw"}


@pytest.mark.parametrize("flags, compiler, arch, isa, bits", [
    (ZEN3, None, "x86_64", "avx2", 256),                           # gcc tunes Zen 3 to 128: asked for 256
    (ZEN4, GCC_AVX512, "x86_64", "avx512", 512),                   # full-clock AVX-512
    (ZEN4, {"avx", "avx2", "fma"}, "x86_64", "avx2", 256),         # a compiler that cannot emit it
    (SKYLAKE_SP, GCC_AVX512, "x86_64", "avx512", 256),             # 512-bit instructions lower its clock
    ("fpu sse sse2 avx", None, "x86_64", "avx", 256),
    ("fpu sse sse2", None, "x86_64", "sse2", 128),
    ("fp asimd evtstrm", None, "aarch64", "aarch64", 128),
])
def test_the_probe_picks_the_vector_width_from_the_cpu_and_the_compiler(flags, compiler, arch, isa, bits):
    m = machine.choose(set(flags.split()), compiler, arch, 4)
    assert (m.isa, m.vector_bits, m.threads) == (isa, bits, 4)
    assert m.flags == ((f"-mprefer-vector-width={bits}",) if arch == "x86_64" else ())
    assert m.chunk(1 << 22, bits // 32) == (1 << 22) // (4 * machine.PIECES_PER_THREAD)
    assert m.chunk(1000, bits // 32) == 16 * (bits // 32)  # never under 16 vectors a piece
    assert machine.cpu_flags("processor\t: 0\nflags\t\t: " + flags + "\n") == set(flags.split())


def fake_cpu(monkeypatch, flags: str, probes: list) -> None:
    """Make the probe see a CPU with ``flags`` (and a compiler enabling AVX-512), counting its runs."""
    monkeypatch.setattr(machine, "_cpuinfo", lambda: f"processor\t: 0\nmodel name\t: Fake\nflags\t\t: {flags}\n")
    monkeypatch.setattr(machine.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(machine, "compiler_extensions", lambda cc: probes.append(cc) or GCC_AVX512)
    monkeypatch.setattr(cc, "_machines", {})


def test_the_probe_runs_once_and_its_cached_answer_sets_the_flags_and_the_split(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    probes: list = []
    fake_cpu(monkeypatch, ZEN4, probes)
    m = cc.machine()
    assert (m.isa, m.vector_bits) == ("avx512", 512) and probes == [cc.compiler()]
    assert cc.flags()[-1] == "-mprefer-vector-width=512" and cc.flags()[:len(cc.FLAGS)] == cc.FLAGS
    cached = tmp_path / "kernels" / cc.MACHINE_FILE
    assert cached.stat().st_mode & 0o777 == 0o600
    monkeypatch.setattr(cc, "_machines", {})  # a new process: reads the answer back, probes nothing
    assert cc.machine() == m and len(probes) == 1
    graph = trace(lambda a: (a * 3).tanh() + a, mg.randn(1 << 21)).graph
    (kernel,) = [n.fn for n in fuse_elementwise(graph, backend="c") if n.op == "fused"]
    piece = (1 << 21) // (m.threads * machine.PIECES_PER_THREAD)
    assert f"schedule(simd: dynamic, {max(piece, 256)}) num_threads({m.threads})" in kernel.source
    fake_cpu(monkeypatch, ZEN3, probes)  # another CPU (the cache moved with a home directory): probed again
    assert cc.machine().vector_bits == 256 and len(probes) == 2 and cc.flags()[-1] == "-mprefer-vector-width=256"
    monkeypatch.setattr(cc, "_machines", {})
    assert cc.machine().vector_bits == 256 and len(probes) == 2


@pytest.mark.parametrize("forged", ['{"key": "%s", "isa": "avx2", "vector_bits": "256 -fplugin=x.so", "threads": 2}',
                                    '{"key": "%s", "isa": "avx2", "vector_bits": 256, "threads": 0}',
                                    'not json'])
def test_a_damaged_or_forged_probe_cache_is_probed_over(tmp_path, monkeypatch, forged):
    monkeypatch.setenv("MINIGRAD_CACHE_DIR", str(tmp_path))
    probes: list = []
    fake_cpu(monkeypatch, ZEN4, probes)
    cc.machine()
    cached = tmp_path / "kernels" / cc.MACHINE_FILE
    cached.write_text(forged.replace("%s", machine.probe_key(cc.compiler())))
    monkeypatch.setattr(cc, "_machines", {})
    assert cc.machine().vector_bits == 512 and len(probes) == 2
    assert machine.loads(cached.read_text(), machine.probe_key(cc.compiler())).vector_bits == 512


def test_processes_building_the_same_kernel_at_once_all_load_it(tmp_path):
    code = ("import sys; from minigrad.backend import cc; "
            f"cc.build({SOURCE!r}).twice; print('ok')")
    env = {"MINIGRAD_CACHE_DIR": str(tmp_path), "PATH": os.environ["PATH"]}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    assert [p.communicate(timeout=120)[0].strip() for p in procs] == ["ok"] * 4
    assert len(list((tmp_path / "kernels").glob("*.so"))) == 1
    assert not list((tmp_path / "kernels").glob("tmp*"))  # no temporary file left behind


SOURCE_THRICE = SOURCE.replace("2 * x[i]", "3 * x[i]")  # the same symbol, other constants


def build_in_a_new_process(cache: Path, env: dict | None = None, prelude: str = "",
                           source: str = SOURCE) -> subprocess.CompletedProcess:
    """``cc.build(source).twice`` on [0, 1, 2, 3] in a fresh process (which a bad library may kill,
    and which maps no library that a test then damages): prints the result, or the
    CompilerUnavailable it raised, then each warning."""
    code = ("import ctypes, warnings; import numpy as np; from minigrad.backend import cc\n"
            f"{prelude}\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    try:\n"
            f"        fn = cc.build({source!r}).twice\n"
            "        x, out = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)\n"
            "        fn(ctypes.c_void_p(out.ctypes.data), ctypes.c_void_p(x.ctypes.data))\n"
            "        print(out.tolist())\n"
            "    except cc.CompilerUnavailable as e:\n"
            "        print('unavailable:', e)\n"
            "for w in caught:\n"
            "    print(w.category.__name__ + ':', w.message)\n")
    env = {"MINIGRAD_CACHE_DIR": str(cache), "PATH": os.environ["PATH"],
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")} | (env or {})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def cached_library(cache: Path, monkeypatch, source: str = SOURCE) -> Path:
    monkeypatch.setenv("MINIGRAD_CACHE_DIR", str(cache))
    return cc.library_path(source)


PLANTED = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) { FILE *f = fopen("%s", "w"); if (f) fclose(f); }
void twice(float *out, const float *x) { for (long i = 0; i < 4; i++) out[i] = 1e22f * x[i]; }
"""


def plant(library: Path, marker: Path, record: bool = False) -> None:
    """Another user's library at ``library``'s name, whose constructor creates ``marker`` (and,
    with ``record``, a record of its hash beside it, as a forger would write)."""
    library.parent.mkdir(parents=True, exist_ok=True)
    c_file = library.parent / "planted.c"
    c_file.write_text(PLANTED % marker)
    subprocess.run([cc.compiler(), "-shared", "-fPIC", "-o", str(library), str(c_file)], check=True, timeout=120)
    c_file.unlink()
    if record:
        digest = hashlib.sha256(library.read_bytes()).hexdigest()
        library.with_suffix(".sha256").write_text(f"{digest}  {library.name}\n")


@pytest.mark.parametrize("how", ["a library", "a link to one", "a FIFO"])
def test_a_library_planted_at_the_cached_name_is_never_loaded(tmp_path, monkeypatch, how):
    library, marker = cached_library(tmp_path, monkeypatch), tmp_path / "constructor-ran"
    if how == "a library":
        plant(library, marker)  # no record: minigrad did not build it
    else:
        plant(tmp_path / "elsewhere.so", marker, record=True)
        library.parent.mkdir(mode=0o700, exist_ok=True)
        if how == "a FIFO":  # reading it would block forever
            os.mkfifo(library)
        else:
            library.symlink_to(tmp_path / "elsewhere.so")
            library.with_suffix(".sha256").write_text(
                (tmp_path / "elsewhere.sha256").read_text().replace("elsewhere.so", library.name))
    done = build_in_a_new_process(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "[0.0, 2.0, 4.0, 6.0]" and not marker.exists()
    assert library.with_suffix(".sha256").exists()  # rebuilt, and recorded this time


@pytest.mark.parametrize("how", ["writable by others", "owned by another user"])
def test_a_cache_directory_others_can_write_is_refused_with_its_libraries(tmp_path, monkeypatch, how):
    library, marker = cached_library(tmp_path, monkeypatch), tmp_path / "constructor-ran"
    plant(library, marker, record=True)  # a forged record that matches: only the directory tells
    if how == "writable by others":
        library.parent.chmod(0o777)
        says = "writable by group or others"
    else:
        if os.getuid() != 0:
            pytest.skip("giving a directory to another user needs root")
        os.chown(library.parent, 4321, 4321)
        says = "belongs to uid 4321"
    done = build_in_a_new_process(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("unavailable: refusing the kernel cache") and says in done.stdout
    assert not marker.exists()


def test_a_library_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    if os.getuid() != 0:
        pytest.skip("giving a file to another user needs root")
    library, marker = cached_library(tmp_path, monkeypatch), tmp_path / "constructor-ran"
    library.parent.mkdir(mode=0o700, parents=True)
    plant(library, marker, record=True)
    os.chown(library, 4321, 4321)
    done = build_in_a_new_process(tmp_path)
    assert "unavailable: refusing" in done.stdout and "belongs to uid 4321" in done.stdout
    assert not marker.exists()


def test_one_kernels_library_copied_over_anothers_name_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_CACHE_DIR", str(tmp_path))
    build_in_a_new_process(tmp_path), build_in_a_new_process(tmp_path, source=SOURCE_THRICE)
    shutil.copy(cc.library_path(SOURCE_THRICE), cc.library_path(SOURCE))
    done = build_in_a_new_process(tmp_path)
    lines = done.stdout.splitlines()
    assert lines[0] == "[0.0, 2.0, 4.0, 6.0]", done.stdout + done.stderr
    assert any(line.startswith("KernelWarning:") and "does not match the SHA-256" in line for line in lines)
    assert build_in_a_new_process(tmp_path).stdout.splitlines() == ["[0.0, 2.0, 4.0, 6.0]"]  # once rebuilt, quiet


@pytest.mark.parametrize("keep", [0, 4096, 0.5])
def test_a_truncated_library_is_rebuilt_and_never_mapped(tmp_path, monkeypatch, keep):
    monkeypatch.setenv("MINIGRAD_CACHE_DIR", str(tmp_path))
    build_in_a_new_process(tmp_path)  # not here: truncating a library this process maps would kill it
    library = cc.library_path(SOURCE)
    size = library.stat().st_size
    os.truncate(library, int(size * keep) if isinstance(keep, float) else keep)
    done = build_in_a_new_process(tmp_path)
    assert done.returncode == 0, f"killed by signal {-done.returncode}: {done.stderr}"  # SIGBUS was 7
    assert done.stdout.splitlines()[0] == "[0.0, 2.0, 4.0, 6.0]"
    assert library.stat().st_size == size


def test_a_compiler_that_hangs_is_killed_after_the_timeout(tmp_path):
    hanging = tmp_path / "cc"
    hanging.write_text("#!/bin/sh\nsleep 100\nexit 1\n")
    hanging.chmod(0o755)
    done = build_in_a_new_process(tmp_path, {"CC": str(hanging)}, prelude="cc.COMPILE_TIMEOUT = 1")
    assert done.stdout.startswith("unavailable: cc did not finish within 1 s"), done.stdout + done.stderr
    assert not list((tmp_path / "kernels").glob("tmp*"))


@pytest.mark.parametrize("where", ["cache is a file", "kernels is a file"])
def test_a_cache_path_that_cannot_be_a_directory_falls_back_with_a_warning(tmp_path, monkeypatch, where):
    root = tmp_path / "cache"
    if where == "cache is a file":
        root.write_text("")
    else:
        root.mkdir()
        (root / "kernels").write_text("")
    monkeypatch.setenv("MINIGRAD_CACHE_DIR", str(root))
    monkeypatch.setattr(cc, "_loaded", {})
    monkeypatch.setattr(c, "_warned", set())
    x = mg.randn(5, 3)
    compiled = mg.compile(lambda a: (a * 3).tanh() + a, backend="c")
    with mg.no_grad(), pytest.warns(c.KernelWarning, match="kernel cache .* cannot be used"):
        compiled(x)  # the first call traces (and runs eagerly); the second runs the kernel
        got = compiled(x)
    np.testing.assert_allclose(got.numpy(), np.tanh(x.numpy() * 3) + x.numpy(), rtol=1e-6)


FORKED = """
import os, signal, sys
import numpy as np
import minigrad as mg
from minigrad.data import DataLoader, Dataset
from minigrad.graph.codegen import numpy_blocks

n = 2 * numpy_blocks.PARALLEL_MIN_SIZE  # big enough that the kernel's loop is shared among OpenMP's threads
f = mg.compile(lambda a: (a * 3).tanh() + a, backend="c")
x = mg.randn(n)
with mg.no_grad():
    f(x)
    want = f(x).numpy()  # the parent ran the threaded kernel: libgomp's pool now exists
(kernel,) = [m.fn for g in f.graphs.values() for m in g if m.op == "fused"]
assert "omp parallel" in kernel.source and kernel._fn not in (None, False), kernel


class Compiled(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        with mg.no_grad():
            return mg.tensor(float(np.abs(f(x).numpy() - want).max()))


if sys.argv[1] == "fork":
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)  # a child stuck in libgomp dies instead of staying behind
        with mg.no_grad():
            os._exit(0 if np.abs(f(x).numpy() - want).max() < 1e-5 else 3)
    _, status = os.waitpid(pid, 0)
    print("signal %d" % os.WTERMSIG(status) if os.WIFSIGNALED(status) else "exit %d" % os.WEXITSTATUS(status))
else:
    errors = [float(b.max()) for b in DataLoader(Compiled(), batch_size=2, num_workers=2, timeout=60)]
    print("exit 0" if max(errors) < 1e-5 else f"wrong {errors}")
"""


@pytest.mark.parametrize("how", ["fork", "DataLoader workers"])
def test_a_child_forked_after_a_threaded_kernel_ran_runs_it_without_hanging(tmp_path, how):
    env = {"MINIGRAD_CACHE_DIR": str(tmp_path), "PATH": os.environ["PATH"],
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", FORKED, how.split()[0]], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.stdout.strip() == "exit 0", done.stdout + done.stderr[-2000:]


@pytest.mark.parametrize("policy", [None, "ACTIVE"])
def test_openmp_threads_sleep_between_kernels_unless_the_environment_says_otherwise(tmp_path, policy):
    code = ("import os; from minigrad.backend import cc; "
            f"cc.build({SOURCE!r}).twice; print(os.environ['OMP_WAIT_POLICY'])")
    env = {"MINIGRAD_CACHE_DIR": str(tmp_path), "PATH": os.environ["PATH"]} | (
        {"OMP_WAIT_POLICY": policy} if policy else {})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == (policy or "PASSIVE")


@pytest.mark.parametrize("compiler, says", [("no-such-compiler", "no C compiler found"), ("false", "false failed")])
def test_without_a_working_compiler_the_numpy_kernel_runs_after_one_warning(tmp_path, monkeypatch, compiler, says):
    monkeypatch.setenv("MINIGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", compiler)
    monkeypatch.setattr(c, "_warned", set())
    x = mg.randn(5, 3)
    compiled = mg.compile(lambda a: (a * 3).tanh() + a, backend="c")
    with mg.no_grad(), pytest.warns(c.KernelWarning, match=says):
        compiled(x)
        got = compiled(x)
    with mg.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # once: a second kernel says nothing more
        compiled(mg.randn(5, 3))
        other = mg.compile(lambda a: (a * 2).sin() - a, backend="c")
        other(x), other(x)
    np.testing.assert_allclose(got.numpy(), np.tanh(x.numpy() * 3) + x.numpy(), rtol=1e-6)
    (graph,) = compiled.graphs.values()
    kernel = next(n.fn for n in graph if n.op == "fused")
    assert isinstance(kernel, c.CKernel) and isinstance(kernel.fallback, numpy_blocks.CpuKernel)


def test_the_backend_is_chosen_by_argument_or_environment(monkeypatch):
    f = lambda a: (a * 3).tanh() + a  # noqa: E731
    with mg.no_grad():
        for backend, kind in (("c", c.CKernel), ("numpy", numpy_blocks.CpuKernel)):
            compiled = mg.compile(f, backend=backend)
            compiled(mg.randn(4, 4))
            assert isinstance(next(n.fn for n in next(iter(compiled.graphs.values())) if n.op == "fused"), kind)
        monkeypatch.setenv("MINIGRAD_KERNELS", "numpy")
        assert mg.compile(f).backend == "numpy"
    with pytest.raises(ArgumentError, match="'c', 'numpy'.*got 'fortran'"):
        mg.compile(f, backend="fortran")


@pytest.mark.parametrize("fn, x", [(lambda a: (a * 2).tanh() + 1, mg.randn(4, 3).half()),  # float16
                                   (lambda a: (a * 2) + 1, mg.arange(12).reshape(3, 4)),  # integers
                                   (lambda a: (a * 2).exp().sum(), mg.randn(4, 3))])  # a reduction of everything
def test_groups_c_does_not_write_keep_the_numpy_kernel(fn, x):
    graph = trace(fn, x).graph
    (node,) = [n for n in fuse_elementwise(graph, backend="c") if n.op == "fused"]
    assert isinstance(node.fn, numpy_blocks.CpuKernel)
    np.testing.assert_array_equal(run_graph(fuse_elementwise(graph, backend="c"), [x])[0], run_graph(graph, [x])[0])


def test_large_groups_are_shared_among_threads():
    """Past ``PARALLEL_MIN_SIZE`` elements the outer loop is an OpenMP loop, and still agrees."""
    x, y = mg.randn(1024, 1024), mg.randn(1024, 1024)
    (flat,) = check(lambda a, b: (a * b).tanh() - a, x, y)
    (rows,) = check(layer_norm, x, mg.randn(1024), mg.randn(1024))
    assert "parallel for simd schedule(simd: dynamic" in flat.source and "parallel for schedule(dynamic" in rows.source
