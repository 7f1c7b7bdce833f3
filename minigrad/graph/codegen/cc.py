"""Compiling generated C with the system compiler into a cached shared library (chapter 03).

``build(source)`` compiles a kernel's C source once into a shared library and loads it with
ctypes. Libraries live in a cache directory (``MINIGRAD_CACHE_DIR``, else ``~/.cache/minigrad``),
named by a hash of the source, the compiler and its flags, so a second process (or a second run)
loads the library without compiling. Each compile writes a private temporary file and renames it
into place, which is atomic: processes compiling the same kernel at once never see half a library.

The flags are ``-O3 -march=native -fopenmp`` (256-bit vectors preferred on x86) and the parts of
``-ffast-math`` that keep eager's answers: no ``errno`` (so ``sqrtf`` vectorises), reassociation
(so a row's sum vectorises), but not ``-ffinite-math-only`` (which folds ``x != x`` to false:
``relu(nan)`` would be 0) nor ``-funsafe-math-optimizations`` (which rewrites ``pow(x, -1.5)``
through ``sqrt``, so that ``(-inf) ** -1.5`` is NaN, not 0). ``-ffp-contract=off`` keeps gcc
from fusing ``a * b + c`` into one FMA instruction, which rounds once where numpy rounds twice:
with it, ``1 - y * y`` in tanh's backward differed from eager by 4e-6 relative where ``y`` nears
1, and RMSprop, which divides each gradient by its own running size, carried such differences
into its state at 1e-4. Now each ``+ - * /`` and ``sqrt`` of a kernel rounds as numpy's does;
only the vector math functions differ from numpy's by an ulp or two. The generated source
declares glibc's vector math functions (``libmvec``: ``tanhf``, ``expf``...) itself, as
``-ffast-math`` would.
When no compiler is found, or it fails, ``build`` raises ``CompilerUnavailable`` saying why; the
caller then runs the blocked numpy kernel and warns once (``minigrad.graph.codegen.c``).

Before the first library loads (and with it OpenMP, which reads its settings then), ``build`` sets
``OMP_WAIT_POLICY=PASSIVE`` unless the environment says otherwise: by default OpenMP's threads
spin after each parallel loop, waiting for the next one, and between kernels the main thread runs
numpy's matrix products, which a spinning thread slows down by taking a core. On 2 busy cores a
compiled MLP training step ran 2.5x slower than eager that way (70 ms against 28 ms), and 1.15x
faster with sleeping threads, which wake in microseconds.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

__all__ = ["FLAGS", "CompilerUnavailable", "build", "cache_dir", "compiler", "library_path"]

FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
         "-fassociative-math", "-ffp-contract=off", "-fPIC", "-shared")
if platform.machine().lower() in ("x86_64", "amd64"):  # gcc tunes some AVX2 CPUs (AMD Zen 1) to 128-bit
    FLAGS += ("-mprefer-vector-width=256",)            # vectors; 256-bit ones ran the chain ~20% faster
LIBS = ("-lmvec", "-lm")  # libmvec: the vector tanhf/expf the loops call

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}


class CompilerUnavailable(RuntimeError):
    """No C compiler, or it failed on a kernel: the message says which and why."""


def compiler() -> str | None:
    """The C compiler to use: ``$CC`` if set, else ``gcc`` or ``cc`` on the PATH; None if none."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    return shutil.which("gcc") or shutil.which("cc")


def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$MINIGRAD_CACHE_DIR`` or ``~/.cache/minigrad``, then ``kernels``."""
    root = os.environ.get("MINIGRAD_CACHE_DIR") or Path.home() / ".cache" / "minigrad"
    return Path(root) / "kernels"


def library_path(source: str, cc: str | None = None) -> Path:
    """Where the library built from ``source`` by compiler ``cc`` (default: ``compiler()``) with
    these flags is cached."""
    key = hashlib.sha256("\0".join([source, cc or compiler() or "", *FLAGS, *LIBS]).encode()).hexdigest()[:24]
    return cache_dir() / f"k{key}.so"


def build(source: str) -> ctypes.CDLL:
    """Compile ``source`` (once per source, compiler and flags) and load it."""
    cc = compiler()
    if cc is None:
        raise CompilerUnavailable("no C compiler found ($CC, gcc or cc on the PATH)")
    library = library_path(source, cc)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with _lock:
        if str(library) in _loaded:
            return _loaded[str(library)]
        if not library.exists():
            _compile(cc, source, library.parent, library)
        try:
            _loaded[str(library)] = ctypes.CDLL(str(library))
        except OSError as e:
            raise CompilerUnavailable(f"{cc} built {library.name}, but it does not load: {e}") from e
        return _loaded[str(library)]


def _compile(cc: str, source: str, directory: Path, library: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=directory)
    os.close(fd)
    c_file = tmp[:-3] + ".c"
    try:
        Path(c_file).write_text(source)
        run = subprocess.run([cc, *FLAGS, "-o", tmp, c_file, *LIBS], capture_output=True, text=True)
        if run.returncode != 0:
            tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
            raise CompilerUnavailable(f"{Path(cc).name} failed ({run.returncode}): " + " / ".join(tail))
        os.replace(tmp, library)  # atomic: another process sees no library or a whole one
    except OSError as e:
        raise CompilerUnavailable(f"{Path(cc).name} could not run: {e}") from e
    finally:
        for path in (tmp, c_file):
            if os.path.exists(path):
                os.unlink(path)
