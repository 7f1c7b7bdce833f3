"""What the compiled C kernels are told about the machine: vector width and OpenMP split (chapter 03).

``-march=native`` lets gcc use every instruction the CPU has, but not how wide to vectorise: its
tuning for AMD Zen 1-3 prefers 128-bit vectors on AVX2 (256-bit ones ran the fused chain ~20%
faster there), and for Intel's first AVX-512 cores (Skylake-SP, Cascade Lake) 256-bit ones, since
512-bit instructions lower their clock. So the CPU is probed once: its flags (``/proc/cpuinfo``),
what the compiler enables for ``-march=native`` (``gcc -Q --help=target``) and the physical cores
this process may run on. ``choose`` turns that into a ``Machine``: 512-bit vectors where AVX-512
comes with the later extensions (``avx512_vbmi2``: Ice Lake and later, AMD Zen 4, which run it at
full clock), 256-bit ones on AVX2 or AVX, 128-bit otherwise; one OpenMP thread per physical core
(a second hyperthread shares the core's vector unit and memory bandwidth, which a fused loop
already fills). ``backend.cc`` caches the result beside the kernels, keyed by the compiler and
the CPU, so that a process after the first reads it back instead of running the compiler.
The width only changes which instructions a loop uses, never its arithmetic: the exact-math flags
of ``backend.cc`` hold for every width, so results equal numpy's on any machine.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import NamedTuple

__all__ = ["Machine", "choose", "compiler_extensions", "cpu_flags", "dumps", "loads", "physical_cores", "probe",
           "probe_key"]

PIECES_PER_THREAD = 16  # a parallel loop's pieces per thread: a thread the OS runs late leaves its share
_X86 = ("x86_64", "amd64", "i386", "i686")


class Machine(NamedTuple):
    """The kernel-relevant facts of one machine: ``isa`` ("avx512", "avx2", "avx", "sse2" or the
    architecture's name), the vector width in bits the compiler is asked to prefer, and the
    number of OpenMP threads a parallel loop is shared among."""

    isa: str
    vector_bits: int
    threads: int

    @property
    def flags(self) -> tuple[str, ...]:
        """The compiler flags this machine adds to ``backend.cc.FLAGS``."""
        return (f"-mprefer-vector-width={self.vector_bits}",) if self.isa in _X86_ISAS else ()

    def chunk(self, n: int, lanes: int = 1) -> int:
        """The iterations of one piece of an ``n``-iteration parallel loop: ``PIECES_PER_THREAD``
        pieces per thread, a multiple of ``lanes`` (elements per vector) so that only the last
        piece has a scalar remainder, and never under 16 vectors (a piece costs a handout)."""
        piece = math.ceil(n / (self.threads * PIECES_PER_THREAD))
        return max(16 * lanes, math.ceil(piece / lanes) * lanes) if lanes > 1 else max(1, piece)

    def to_json(self) -> dict:
        return {"isa": self.isa, "vector_bits": self.vector_bits, "threads": self.threads}

    @classmethod
    def from_json(cls, data: object) -> Machine | None:
        """The machine a cache file describes; None unless every field is one ``choose`` can give
        (the flags come from these fields, so a damaged or forged file cannot add any other)."""
        if not isinstance(data, dict):
            return None
        isa, bits, threads = data.get("isa"), data.get("vector_bits"), data.get("threads")
        if (not isinstance(isa, str) or not re.fullmatch(r"[a-z0-9_]{1,16}", isa) or bits not in (128, 256, 512)
                or type(threads) is not int or not 1 <= threads <= 4096):
            return None
        return cls(isa, bits, threads)


_X86_ISAS = ("avx512", "avx2", "avx", "sse2")


def choose(flags: set[str], compiler_enables: set[str] | None, arch: str, cores: int) -> Machine:
    """The machine for CPU ``flags`` (as ``/proc/cpuinfo`` spells them), the ISA extensions the
    compiler enables for ``-march=native`` (``{"avx512f", "avx2", ...}``; None when it cannot say,
    then the CPU's flags alone decide), the architecture (``platform.machine()``) and ``cores``."""
    threads = max(1, cores)
    if arch.lower() not in _X86:
        return Machine(re.sub(r"[^a-z0-9_]", "_", arch.lower())[:16] or "unknown", 128, threads)

    def has(ext: str) -> bool:
        return ext in flags and (compiler_enables is None or ext in compiler_enables)
    if has("avx512f") and ("avx512_vbmi2" in flags or "avx512vbmi2" in flags):
        return Machine("avx512", 512, threads)
    if has("avx512f"):  # an early AVX-512 core: it clocks down on 512-bit instructions
        return Machine("avx512", 256, threads)
    if has("avx2"):
        return Machine("avx2", 256, threads)
    if has("avx"):
        return Machine("avx", 256, threads)
    return Machine("sse2", 128, threads)


def cpu_flags(cpuinfo: str) -> set[str]:
    """The first processor's flags in ``/proc/cpuinfo``'s text (x86: ``flags``, Arm: ``Features``)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def compiler_extensions(cc: str) -> set[str] | None:
    """The ``-m`` options ``cc -march=native`` enables (gcc's ``-Q --help=target``: ``avx512f``,
    ``avx2``...); None when the compiler does not say (clang, a failure)."""
    try:
        out = subprocess.run([cc, "-march=native", "-Q", "--help=target"], capture_output=True, text=True,
                             timeout=60, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = set(re.findall(r"^\s+-m([a-z0-9_]+)\s+\[enabled\]", out, re.MULTILINE))
    return found or None


def physical_cores() -> int:
    """The physical cores among the CPUs this process may run on (hyperthreads counted once)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
    cores = set()
    for n in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{n}/topology")
        try:
            cores.add(tuple((topology / f).read_text().strip() for f in ("physical_package_id", "core_id")))
        except OSError:
            cores.add(("cpu", str(n)))  # no topology: count the CPU as a core
    return max(1, len(cores))


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


def probe_key(cc: str | None) -> str:
    """What a cached probe depends on: the compiler (its path, size and time), the CPU (model and
    flags) and the CPUs this process may use. Cheap: no process runs."""
    parts = [cc or "", platform.machine()]
    if cc:
        try:
            st = os.stat(cc)
            parts += [str(st.st_size), str(st.st_mtime_ns)]
        except OSError:
            pass
    text = _cpuinfo()
    model = next((line for line in text.splitlines() if line.startswith("model name")), "")
    parts += [model, " ".join(sorted(cpu_flags(text)))]
    try:
        parts.append(",".join(map(str, sorted(os.sched_getaffinity(0)))))
    except AttributeError:
        parts.append(str(os.cpu_count()))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def probe(cc: str | None) -> Machine:
    """Probe this machine: its CPU flags, what compiler ``cc`` enables, its physical cores."""
    extensions = compiler_extensions(cc) if cc else None
    return choose(cpu_flags(_cpuinfo()), extensions, platform.machine(), physical_cores())


def dumps(key: str, machine: Machine) -> str:
    """The cache file's text: the machine and the probe key it answers."""
    return json.dumps({"key": key, **machine.to_json()}) + "\n"


def loads(text: str, key: str) -> Machine | None:
    """The machine cached in ``text`` for ``key``; None when it is another key's, or unreadable."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return Machine.from_json(data) if isinstance(data, dict) and data.get("key") == key else None
