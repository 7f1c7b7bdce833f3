"""Start an MPI job from Python: ``launch("train.py", nprocs=4)`` runs
``mpiexec -n 4 python train.py`` and returns its exit status and output (chapter 04's notebooks and
the tests run their jobs this way).

A job that outlives its ``timeout`` is killed, every rank with it (they share a process group),
so a deadlocked collective cannot hang the caller. The ranks find this copy of minigrad (it is put
first on their ``PYTHONPATH``) and use one BLAS thread each unless told otherwise, since N ranks
already share the machine's cores.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

__all__ = ["find_mpiexec", "launch"]


def find_mpiexec() -> str | None:
    """The ``mpiexec`` next to this Python (a virtual environment's, from the mpich wheel), else
    the first one on PATH; None when there is none."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def launch(script: str | os.PathLike, nprocs: int = 2, args: Sequence[str] = (), timeout: float = 60.0,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``mpiexec -n nprocs python script *args`` and wait for it; returns the CompletedProcess
    (``returncode``, ``stdout``, ``stderr`` as text). Raises ``subprocess.TimeoutExpired`` after
    killing the job when it runs longer than ``timeout`` seconds."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise FileNotFoundError("launch: no mpiexec found; pip install 'minigrad[mpi]' installs one")
    package_root = str(Path(__file__).resolve().parents[2])
    run_env = dict(os.environ if env is None else env)
    run_env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, run_env.get("PYTHONPATH")) if p)
    run_env.setdefault("OPENBLAS_NUM_THREADS", "1")
    run_env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [mpiexec, "-n", str(nprocs), sys.executable, str(script), *map(str, args)]
    # a session of its own: on timeout, one killpg reaches mpiexec and every rank it started
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=run_env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill(proc: subprocess.Popen) -> None:
    # SIGTERM lets mpiexec tear its ranks down; SIGKILL then reaches any rank that did not go
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
