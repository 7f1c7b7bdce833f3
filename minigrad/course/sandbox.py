"""Running untrusted code with a hard limit: ``python -m minigrad.course.sandbox LIMIT -- COMMAND...``.

The grader runs every submission through this supervisor. It makes itself the *child subreaper*
of everything it starts (Linux ``PR_SET_CHILD_SUBREAPER``), so no process the student's code
starts can escape by detaching (a Jupyter kernel starts in a session of its own, a fork bomb
orphans its children): when the command ends, or its wall-clock limit passes, every descendant
is stopped and killed and the supervisor exits. The command runs with a bound on the number of
processes: ``RLIMIT_NPROC``, which Linux ignores for root, so as root in a cgroup of its own whose
``pids.max`` is the bound (cgroup v1 or v2, where one is writable), and as user ``nobody`` in a
folder it owns (where it cannot write the instructor's files) when nobody may run this Python.
Whatever else holds, the supervisor kills the whole tree as soon as it counts more processes
than the bound.

Exit status: the command's, or 124 when the limit passed, or 125 when it started too many
processes; the last line on stderr says which.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["TIMED_OUT", "TOO_MANY_PROCESSES", "MAX_PROCESSES", "descendants", "main", "sandbox_command"]

TIMED_OUT, TOO_MANY_PROCESSES = 124, 125
MAX_PROCESSES = 256  # threads count as processes for RLIMIT_NPROC: a kernel has a dozen
_PR_SET_CHILD_SUBREAPER = 36
NOBODY = 65534


def sandbox_command(limit: float, command: list[str]) -> list[str]:
    """The command line that runs ``command`` under the supervisor with a ``limit`` in seconds.

    The supervisor runs from this file in isolated mode: a ``minigrad`` on the submission's path
    (a student's repository) cannot replace it.
    """
    return [sys.executable, "-I", str(Path(__file__).resolve()), str(limit), "--", *command]


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
                (group / "pids.max").write_text(f"{MAX_PROCESSES}\n")
                return group
            except OSError:
                if group.exists():
                    group.rmdir()
    return None


def _nobody_can_run() -> bool:
    """Whether user nobody may run this Python: every folder up to it and its prefix is world-searchable."""
    paths = [Path(sys.executable).resolve(), Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(),
             Path(__file__).resolve()]
    return all(folder.stat().st_mode & 0o001 for path in paths for folder in path.parents)


def _limits(cgroup: Path | None, drop_to_nobody: bool) -> None:
    """In the child before exec: its own session, the process bound and, as root, user nobody."""
    os.setsid()
    resource.setrlimit(resource.RLIMIT_NPROC, (MAX_PROCESSES, MAX_PROCESSES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cgroup is not None:
        (cgroup / "cgroup.procs").write_text(f"{os.getpid()}\n")
    if drop_to_nobody:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m minigrad.course.sandbox LIMIT_SECONDS -- COMMAND...", file=sys.stderr)
        return 2
    limit, command = float(argv[0]), argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    root = os.geteuid() == 0
    cgroup = _pids_cgroup() if root else None
    nobody = root and _nobody_can_run()
    if nobody:  # nobody must own the folder it runs in
        for folder, _, files in os.walk("."):
            for name in [folder, *(os.path.join(folder, f) for f in files)]:
                os.chown(name, NOBODY, NOBODY)
    proc = subprocess.Popen(command, preexec_fn=lambda: _limits(cgroup, nobody))  # noqa: PLW1509
    deadline, status, why = time.monotonic() + limit, None, ""
    while status is None:
        time.sleep(0.05)
        status = proc.poll()
        if status is None and time.monotonic() > deadline:
            status, why = TIMED_OUT, f"killed: the {limit:g} s limit passed"
        elif status is None and len(descendants(os.getpid())) > MAX_PROCESSES:
            status, why = TOO_MANY_PROCESSES, f"killed: more than {MAX_PROCESSES} processes"
    _kill_all()
    if cgroup is not None:
        cgroup.rmdir()
    if why:
        print(why, file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
