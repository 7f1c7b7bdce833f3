"""Running a student's code confined: ``python -I sandbox.py CONFIG_JSON``, a supervisor over one process tree.

The grader starts this supervisor for each exercise. It makes itself the *child subreaper* of
everything it starts (Linux ``PR_SET_CHILD_SUBREAPER``), so nothing the student's code starts can
escape by detaching; it starts the command in a session of its own, with

- a bound on processes (``RLIMIT_NPROC``, a pids cgroup where one can be made, and its own count
  of the tree: past the bound everything is killed and the run reported "killed: more than 256
  processes"), on address space (``RLIMIT_AS``) and on the size of any file written, its output
  included (``RLIMIT_FSIZE``);
- as root, user ``nobody`` (or, where nobody cannot run this Python, uid 0 without a single
  capability), never silently root;
- Landlock (Linux 5.13+): the command may read the interpreter, the system's libraries and the
  folders it is given, write only its scratch folder, open no TCP connection, and signal or
  trace no process outside its own tree. The instructor's checkout, solutions and hidden checks
  are simply not there for it.

When the command ends, or its wall-clock limit passes, every descendant is stopped and killed.
The last line on stderr says how the command ended; the exit status is the command's, or 124
(time), 125 (processes), 126 (killed by a signal). ``confinement`` tells the grader, before it
starts anything, what this machine allows, and refuses when the student could read what they
must not.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MAX_PROCESSES", "MEMORY", "OUTPUT", "TIMED_OUT", "TOO_MANY_PROCESSES", "KILLED", "Confinement",
           "ConfinementError", "SYSTEM_PATHS", "confinement", "descendants", "landlock_abi", "main", "sandbox_command"]

TIMED_OUT, TOO_MANY_PROCESSES, KILLED = 124, 125, 126
MAX_PROCESSES = 256          # threads count as processes for RLIMIT_NPROC: a Python with numpy has a few
MEMORY = 1536 * 2**20        # address space of each process of the student's
OUTPUT = 16 * 2**20          # the largest file (its printed output included) it may write
NOBODY = 65534
_PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP, _PR_SET_SECUREBITS = 36, 38, 24, 28
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_SECBITS = 0b100011  # NOROOT, NOROOT_LOCKED, KEEP_CAPS_LOCKED: uid 0 gains no capability at exec
_LANDLOCK_CREATE, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT = 444, 445, 446
_READ = 1 | 4 | 8            # LANDLOCK_ACCESS_FS_EXECUTE | READ_FILE | READ_DIR
_FILE_RIGHTS = 1 | 2 | 4 | (1 << 14) | (1 << 15)  # the rights a rule on a file (not a folder) may carry
# What any Python needs to start and run numpy, besides its own prefix (read only).
SYSTEM_PATHS = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/ld.so.conf",
           "/etc/ld.so.conf.d", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf",
           "/proc", "/sys", "/dev/urandom", "/dev/random", "/dev/zero"]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class ConfinementError(RuntimeError):
    """This machine cannot run the student's code confined as grading requires; the message says how to fix it."""


def landlock_abi() -> int:
    """The Landlock ABI version of this kernel, 0 without Landlock."""
    if sys.platform != "linux":
        return 0
    version = _libc.syscall(_LANDLOCK_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(version), 0)


@dataclass
class Confinement:
    """How the student's code will run: as whom, and whether Landlock confines its files."""

    user: str        # "nobody", "root without capabilities", or the grader's own user name
    uid: int | None  # the uid to switch to, None to keep the grader's
    drop_capabilities: bool
    landlock: int    # Landlock ABI used, 0 for none

    def describe(self) -> str:
        files = (f"Landlock ABI {self.landlock}: reads the interpreter and its scratch folder, writes only that "
                 "folder" if self.landlock else "no Landlock: file permissions only")
        return f"student code ran as {self.user}; {files}"


def _blocking_folder(paths: list[Path]) -> Path | None:
    """The first folder on the way to one of ``paths`` that others may not enter."""
    for path in paths:
        for folder in reversed(path.parents):
            if not folder.stat().st_mode & 0o001:
                return folder
    return None


def _interpreter_paths() -> list[Path]:
    return [Path(p).resolve() for p in (sys.executable, sys.prefix, sys.base_prefix, __file__)]


def _nobody_can_read(path: Path) -> bool:
    """Whether user nobody could open ``path`` (checked in a child that becomes nobody)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with open(path, "rb"):
                os._exit(0)
        except BaseException:  # noqa: BLE001 - any failure means: cannot read
            os._exit(1)
    return os.waitpid(pid, 0)[1] == 0


def confinement(secrets: list[Path]) -> Confinement:
    """What this machine allows; raises ``ConfinementError`` where the student could read ``secrets``.

    ``secrets`` are the instructor's files the student's code must not read (the solutions
    notebook); empty when a student grades their own notebook against the public checks.
    """
    abi = landlock_abi()
    if os.geteuid() != 0:
        if secrets and not abi:
            raise ConfinementError(
                "this kernel has no Landlock (Linux 5.13 or later), so the student's code, running as you, could "
                f"read {secrets[0]}: grade on a Linux 5.13+ machine, or as root (the student's code then runs "
                "as user nobody) with the solutions unreadable by others (chmod -R o-rwx chapters/*/solutions)")
        import getpass

        return Confinement(getpass.getuser(), None, False, abi)
    blocked = _blocking_folder(_interpreter_paths())
    if blocked is None:
        if secrets and not abi:
            readable = [path for path in secrets if _nobody_can_read(path)]
            if readable:
                raise ConfinementError(
                    f"this kernel has no Landlock, and user nobody, who runs the student's code, could read "
                    f"{readable[0]}: make it unreadable by others (chmod -R o-rwx {readable[0].parent}) and grade again")
        return Confinement("nobody", NOBODY, False, abi)
    if abi >= 6:  # Landlock scopes signals from ABI 6 on: a capability-less root cannot touch the grader
        return Confinement("root without capabilities", None, True, abi)
    raise ConfinementError(
        f"grading as root runs the student's code as user nobody, who cannot run {sys.executable} ({blocked} "
        f"is not searchable by others), and this kernel's Landlock (ABI {abi}) cannot confine root: make the "
        f"interpreter usable (chmod o+x {blocked}, or a virtual environment outside it: python3 -m venv "
        f"/opt/minigrad-venv && /opt/minigrad-venv/bin/pip install -e '.[dev]'), or grade as an unprivileged user")


def sandbox_command(config: dict[str, Any]) -> list[str]:
    """The command line of a supervisor for ``config`` (see ``main``), run from this file in isolated mode."""
    return [sys.executable, "-I", str(Path(__file__).resolve()), json.dumps(config)]


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc), parents before children."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop(0)
        found.append(child)
        todo += children.get(child, [])
    return found


def _kill_all() -> None:
    """Stop, kill and reap every descendant until none is left (a fork bomb races the first pass)."""
    me = os.getpid()
    while tasks := descendants(me):
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in tasks:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        _reap()
        time.sleep(0.01)
    _reap()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _pids_cgroup() -> Path | None:
    """A new cgroup whose ``pids.max`` is the bound, or ``None`` where none can be made."""
    for base in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        if (base / "cgroup.procs").exists() and os.access(base, os.W_OK):
            group = base / f"minigrad-grade-{os.getpid()}"
            try:
                group.mkdir()
                (group / "pids.max").write_text(f"{MAX_PROCESSES + 32}\n")
                return group
            except OSError:
                if group.exists():
                    group.rmdir()
    return None


def _check(result: int, what: str) -> None:
    if result < 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def _landlock_ruleset(abi: int, read: list[str], write: list[str], tcp: bool = False) -> int:
    """A Landlock ruleset (its fd) that allows reading ``read``, everything in ``write``, and nothing else.

    Nor TCP, unless ``tcp``; nor, from ABI 6, signals to processes or abstract sockets outside the sandbox.
    """
    handled = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0) | (1 << 15 if abi >= 5 else 0)
    attr = struct.pack("=QQQ", handled, 3 if abi >= 4 and not tcp else 0, 3 if abi >= 6 else 0)  # TCP; scoped signals
    attr = attr[: 8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = _libc.syscall(_LANDLOCK_CREATE, attr, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    _check(ruleset, "landlock_create_ruleset")
    for paths, access in ((read, _READ), (write, handled), (["/dev/null"], 2 | 4)):
        for path in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a system folder this machine does not have
            rights = access if os.path.isdir(path) else access & _FILE_RIGHTS
            rule = struct.pack("=Qi", rights, fd)
            _check(_libc.syscall(_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), rule,
                                 ctypes.c_uint32(0)), f"landlock_add_rule {path}")
            os.close(fd)
    return int(ruleset)


def _drop_capabilities() -> None:
    """Uid 0 keeps its uid and loses every capability, for good (exec gives none back)."""
    for cap in range(64):
        _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # past the last capability: EINVAL, ignored
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    _check(_libc.prctl(_PR_SET_SECUREBITS, _SECBITS, 0, 0, 0), "prctl(PR_SET_SECUREBITS)")
    header = struct.pack("=Ii", 0x20080522, 0)
    _check(_libc.capset(header, bytes(24)), "capset")


def _confine(config: dict[str, Any], cgroup: Path | None, ruleset: int | None) -> None:
    """In the child before exec: session, limits, cgroup, user, Landlock; any failure stops the exec."""
    os.setsid()
    # The kernel's bounds sit a little above the one reported, so that a fork bomb is seen crossing it.
    for limit, value in ((resource.RLIMIT_NPROC, MAX_PROCESSES + 32), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_AS, config["memory"]), (resource.RLIMIT_FSIZE, config["output"])):
        resource.setrlimit(limit, (value, value))
    if cgroup is not None:
        (cgroup / "cgroup.procs").write_text(f"{os.getpid()}\n")
    if config["uid"] is not None:
        os.setgroups([])
        os.setgid(config["uid"])
        os.setuid(config["uid"])
    if config["drop_capabilities"]:
        _drop_capabilities()
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    if ruleset is not None:
        _check(_libc.syscall(_LANDLOCK_RESTRICT, ctypes.c_int(ruleset), ctypes.c_uint32(0)), "landlock_restrict_self")


def _ended(status: int, config: dict[str, Any]) -> tuple[int, str]:
    if status >= 0:
        return status, "" if status == 0 else f"exited with status {status}"
    sig = -status
    if sig == signal.SIGXFSZ:
        return KILLED, f"killed: more than {config['output'] // 2**20} MiB written (output or files)"
    name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
    return KILLED, f"killed by {name}"


def main(argv: list[str] | None = None) -> int:
    """Run ``config["command"]`` confined (``config`` is the JSON in ``argv[0]``) and report how it ended.

    Keys: ``command``, ``cwd``, ``env``, ``limit`` (s), ``memory`` and ``output`` (bytes), ``uid``,
    ``drop_capabilities``, ``landlock`` (ABI or 0), ``read`` and ``write`` (folders), ``tcp``, ``log``
    (the file the command's stdout and stderr go to) and ``pass_fds``.
    """
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -I sandbox.py CONFIG_JSON", file=sys.stderr)
        return 2
    config = json.loads(argv[0])
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    cgroup = _pids_cgroup() if os.geteuid() == 0 else None
    ruleset = _landlock_ruleset(config["landlock"], config["read"], config["write"], config.get("tcp", False)) \
        if config["landlock"] else None
    with open(config["log"], "wb") as log:
        proc = subprocess.Popen(config["command"], cwd=config["cwd"], env=config["env"], stdout=log, stderr=log,
                                pass_fds=config["pass_fds"], preexec_fn=lambda: _confine(config, cgroup, ruleset))  # noqa: PLW1509
    for fd in config["pass_fds"]:
        os.close(fd)  # the grader sees the end of the answers when the student's side lets go
    deadline, status, why = time.monotonic() + config["limit"], None, ""
    while status is None:
        time.sleep(0.05)
        status = proc.poll()
        if status is None and time.monotonic() > deadline:
            status, why = TIMED_OUT, f"killed: the {config['limit']:g} s limit passed"
        elif status is None and len(descendants(os.getpid())) > MAX_PROCESSES:
            status, why = TOO_MANY_PROCESSES, f"killed: more than {MAX_PROCESSES} processes"
    if not why:
        status, why = _ended(status, config)
    _kill_all()
    if cgroup is not None:
        cgroup.rmdir()
    print(why or "finished", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
