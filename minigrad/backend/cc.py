"""Compiling generated C with the system compiler into a cached shared library (chapter 03).

``build(source)`` compiles a kernel's C source once into a shared library and loads it with
ctypes. Libraries live in a cache directory (``MINIGRAD_CACHE_DIR``, else ``~/.cache/minigrad``),
named by a hash of the source, the compiler and its flags, so a second process (or a second run)
loads the library without compiling. Each compile writes a private temporary file and renames it
into place, which is atomic: processes compiling the same kernel at once never see half a library.

The flags are ``-O3 -march=native -fopenmp``, the vector width probed for this machine
(``machine()``: ``backend.machine`` says how it is chosen; cached in ``machine.json`` beside the
libraries, so only the first process runs the probe) and the parts of
``-ffast-math`` that keep eager's answers: no ``errno`` (so ``sqrtf`` vectorises), reassociation
(so a row's sum vectorises), but not ``-ffinite-math-only`` (which folds ``x != x`` to false:
``relu(nan)`` would be 0) nor ``-funsafe-math-optimizations`` (which rewrites ``pow(x, -1.5)``
through ``sqrt``, so that ``(-inf) ** -1.5`` is NaN, not 0). ``-ffp-contract=off`` keeps gcc
from fusing ``a * b + c`` into one FMA instruction, which rounds once where numpy rounds twice:
with it, ``1 - y * y`` in tanh's backward differed from eager by 4e-6 relative where ``y`` nears
1, and RMSprop, which divides each gradient by its own running size, carried such differences
into its state at 1e-4. Now each ``+ - * /`` and ``sqrt`` of a kernel rounds as numpy's does;
only the vector math functions differ from numpy's: glibc's by an ulp or two, float ``tanh``
(a rational function of the kernel's own, ``codegen.c._TANHF``) by up to 6.2. The generated source
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

The cache runs only what minigrad built. Loading a shared library runs its code (its constructors,
then whatever the kernel calls), so the cache directory must be private: it is created ``0700``,
and one owned by another user or writable by group or others is refused (``CompilerUnavailable``:
the numpy kernels run, with a ``KernelWarning``). The process that builds a library records its
SHA-256 beside it (``k....sha256``, in ``sha256sum``'s format, naming the library), and a library
is hashed and checked against that record before it is loaded: a library that is truncated,
damaged, copied over another kernel's name or planted without a record is never loaded, but
rebuilt (with a warning when it had a record it no longer matches). A record and its library are
replaced together under an exclusive ``flock`` of the directory and read under a shared one, so
processes building the same kernel at once never pair one's record with another's library. The
compiler runs with a timeout (``COMPILE_TIMEOUT`` seconds) in a process group of its own, killed
whole when it runs over; any ``OSError`` of the cache (its path a file, not writable) falls back
to the numpy kernels too.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

from minigrad.backend import machine as _machine

__all__ = ["COMPILE_TIMEOUT", "FLAGS", "CompilerUnavailable", "KernelWarning", "address", "build", "cache_dir",
           "compiler", "flags", "library_path", "machine"]

FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
         "-fassociative-math", "-ffp-contract=off", "-fPIC", "-shared")  # and machine().flags: the vector width
LIBS = ("-lmvec", "-lm")  # libmvec: the vector tanhf/expf the loops call
COMPILE_TIMEOUT = 300.0  # seconds: gcc takes about one on a kernel; a hung compiler must not hang minigrad

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}
_machines: dict[str, _machine.Machine] = {}  # probe key -> this process's answer
_machine_lock = threading.Lock()  # not _lock: build() asks for the flags while holding that
MACHINE_FILE = "machine.json"  # the cached probe, in the kernel cache


class CompilerUnavailable(RuntimeError):
    """No C compiler, it failed on a kernel, or the cache cannot be trusted: the message says which and why."""


class KernelWarning(UserWarning):
    """A compiled C kernel could not be built or loaded (the blocked numpy kernel runs instead), or
    a cached library did not match its record and was rebuilt."""


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


def machine(cc: str | None = None) -> _machine.Machine:
    """This machine as the kernels see it (``backend.machine``: vector width, OpenMP threads),
    probed once for compiler ``cc`` (default: ``compiler()``) and this CPU, then read back from
    ``machine.json`` in the kernel cache by later processes. Where the cache cannot be used the
    probe still answers; it runs again in the next process."""
    cc = cc or compiler()
    key = _machine.probe_key(cc)
    with _machine_lock:
        if key not in _machines:
            _machines[key] = _cached_machine(cc, key)
        return _machines[key]


def _cached_machine(cc: str | None, key: str) -> _machine.Machine:
    try:
        directory = _private_directory(cache_dir())
    except (OSError, CompilerUnavailable):  # build() will say why; the probe needs no cache
        return _machine.probe(cc)
    try:
        with _locked(directory, fcntl.LOCK_SH):
            found = _read_private(directory, MACHINE_FILE, cache_dir() / MACHINE_FILE, hashed=False)
        cached = _machine.loads(found[0], key) if found is not None and found[1] is None else None
        if cached is not None:
            return cached
        probed = _machine.probe(cc)
        fd, tmp = tempfile.mkstemp(suffix=".json", dir=cache_dir())
        try:
            with open(fd, "w") as f:
                f.write(_machine.dumps(key, probed))
            with _locked(directory, fcntl.LOCK_EX):  # whole for readers, as a library is
                os.replace(tmp, cache_dir() / MACHINE_FILE)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return probed
    except (OSError, CompilerUnavailable):
        return _machine.probe(cc)
    finally:
        os.close(directory)


def flags(cc: str | None = None) -> tuple[str, ...]:
    """The flags kernels are compiled with: ``FLAGS`` and this machine's (``machine().flags``)."""
    return FLAGS + machine(cc).flags


def library_path(source: str, cc: str | None = None) -> Path:
    """Where the library built from ``source`` by compiler ``cc`` (default: ``compiler()``) with
    these flags is cached."""
    cc = cc or compiler()
    key = hashlib.sha256("\0".join([source, cc or "", *flags(cc), *LIBS]).encode()).hexdigest()[:24]
    return cache_dir() / f"k{key}.so"


def address(a: Any) -> int:
    """Where a contiguous array's data starts, to hand a built function. ``a.ctypes.data`` builds a
    helper object on every call (3 us, several per kernel call); a writable array's buffer tells
    it in a third of that (an empty one has no buffer to ask)."""
    if a.flags.writeable and a.size:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    return a.ctypes.data


def build(source: str) -> ctypes.CDLL:
    """Compile ``source`` (once per source, compiler and flags) and load it, from a private cache
    directory, after checking the library against the hash recorded when it was built."""
    cc = compiler()
    if cc is None:
        raise CompilerUnavailable("no C compiler found ($CC, gcc or cc on the PATH)")
    library = library_path(source, cc)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with _lock:
        if str(library) in _loaded:
            return _loaded[str(library)]
        try:
            _loaded[str(library)] = _load_or_build(cc, source, library)
        except OSError as e:  # the cache's path is a file, not writable, gone...
            raise CompilerUnavailable(f"the kernel cache {library.parent} cannot be used ({e})") from e
        return _loaded[str(library)]


def _load_or_build(cc: str, source: str, library: Path) -> ctypes.CDLL:
    directory = _private_directory(library.parent)
    try:
        with _locked(directory, fcntl.LOCK_SH):
            lib = _verified_load(directory, library)
        if lib is None:
            _compile(cc, source, directory, library)
            with _locked(directory, fcntl.LOCK_SH):
                lib = _verified_load(directory, library, built=True)
        return lib
    finally:
        os.close(directory)


def _private_directory(path: Path) -> int:
    """An open descriptor of the cache directory ``path`` (created ``0700``), refused unless it is
    the user's own and nobody else may write into it or replace it."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st, parent = os.fstat(fd), os.stat(path.parent)
    why = _not_private(st, "directory") or (
        f"its parent {path.parent} is writable by everyone without the sticky bit, so anyone can replace it"
        if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX else None)
    if why:
        os.close(fd)
        raise CompilerUnavailable(f"refusing the kernel cache {path}: {why} (libraries in it run as your code; "
                                  "chmod 700 it, or set MINIGRAD_CACHE_DIR to a directory of your own)")
    return fd


def _not_private(st: os.stat_result, what: str) -> str | None:
    """Why a file or directory with status ``st`` is not the user's alone (None if it is)."""
    if st.st_uid != os.getuid():
        return f"the {what} belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"the {what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


class _locked:
    """``flock`` of the cache directory: shared to read a library and its record, exclusive to replace them."""

    def __init__(self, fd: int, how: int) -> None:
        self.fd, self.how = fd, how

    def __enter__(self) -> None:
        fcntl.flock(self.fd, self.how)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


def _record_name(library: Path) -> str:
    return library.name[:-3] + ".sha256"


def _record(digest: str, library: Path) -> bytes:
    return f"{digest}  {library.name}\n".encode()  # sha256sum's format: `sha256sum -c` checks it too


def _verified_load(directory: int, library: Path, built: bool = False) -> ctypes.CDLL | None:
    """The library, loaded once its bytes match the record beside it; None when it must be
    (re)built: absent, no record, or damaged (with a warning, since a record says it was whole).
    A library or record owned by another user is refused (CompilerUnavailable)."""
    found = _read_private(directory, library.name, library, hashed=True)
    if found is None:
        return None
    digest, why = found
    recorded = _read_private(directory, _record_name(library), library, hashed=False)
    if recorded is None and not built:
        return None  # a library without a record: not built by minigrad (or by one from before records)
    why = why or (recorded[1] if recorded else "its record is gone")
    if why:
        return _damaged(library, why, built)
    if recorded[0] != _record(digest, library).decode():
        return _damaged(library, "it does not match the SHA-256 recorded when it was built (truncated, damaged "
                                 "or replaced)", built)
    try:  # hashed and loaded under the shared lock: nobody replaces it in between
        return ctypes.CDLL(str(library))
    except OSError as e:
        raise CompilerUnavailable(f"{library.name} matches its record but does not load: {e}") from None


def _read_private(directory: int, name: str, library: Path, hashed: bool) -> tuple[str, str | None] | None:
    """The SHA-256 (``hashed``) or the text of file ``name`` in the cache, with why it cannot be
    trusted (None when it can); None when there is no such file. Opened without following a link
    or blocking on a FIFO, and checked as opened: a regular file of the user's, written by no one else."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
    except FileNotFoundError:
        return None
    except OSError:  # a symbolic link (ELOOP): not what _compile writes, so rebuilt over
        return "", f"{name} is a symbolic link"
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise CompilerUnavailable(f"refusing {library}: {_not_private(st, name)}")
        if not stat.S_ISREG(st.st_mode):
            return "", f"{name} is not a regular file"
        text = hashlib.file_digest(f, "sha256").hexdigest() if hashed else f.read(4096).decode("utf-8", "replace")
    return text, _not_private(st, name)


def _damaged(library: Path, why: str, built: bool) -> None:
    if built:  # what this process has just built fails its own check: something else writes there
        raise CompilerUnavailable(f"refusing {library}, just built: {why}")
    warnings.warn(f"the cached kernel {library} is not loaded: {why}; rebuilding it", KernelWarning, stacklevel=5)
    return None


def _compile(cc: str, source: str, directory: int, library: Path) -> None:
    """Build ``library`` into a private temporary file, record its hash, and rename both into
    place at once (atomic: another process sees the old pair, none, or the new pair)."""
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=library.parent)
    os.close(fd)
    c_file, record = tmp[:-3] + ".c", tmp[:-3] + ".sha256"
    try:
        Path(c_file).write_text(source)
        try:  # a session of its own: when it runs over, the compiler, cc1, as and ld are killed together
            run = subprocess.Popen([cc, *flags(cc), "-o", tmp, c_file, *LIBS], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        except OSError as e:
            raise CompilerUnavailable(f"{Path(cc).name} could not run: {e}") from e
        try:
            out, err = run.communicate(timeout=COMPILE_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.communicate()
            raise CompilerUnavailable(f"{Path(cc).name} did not finish within {COMPILE_TIMEOUT:g} s "
                                      "(COMPILE_TIMEOUT), and was killed") from None
        if run.returncode != 0:
            tail = (err or out).strip().splitlines()[-3:]
            raise CompilerUnavailable(f"{Path(cc).name} failed ({run.returncode}): " + " / ".join(tail))
        os.chmod(tmp, 0o700)  # the linker made it with the umask's mode; a group-writable one is refused
        with open(tmp, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        rfd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with open(rfd, "wb") as f:
            f.write(_record(digest, library))
        with _locked(directory, fcntl.LOCK_EX):  # the pair changes at once for readers holding LOCK_SH
            os.replace(tmp, library)
            os.replace(record, library.parent / _record_name(library))
    finally:
        for path in (tmp, c_file, record):
            if os.path.exists(path):
                os.unlink(path)
