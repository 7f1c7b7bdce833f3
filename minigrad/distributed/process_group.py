"""Process groups: which process am I (rank), how many are we (world size), and how we talk.

``mpiexec -n N python train.py`` starts N copies of one script; ``init_process_group("mpi")``
joins them into a group in which each learns its rank. A *backend* moves contiguous arrays between
the processes: MPI through mpi4py for host memory, NCCL through cupy for GPU memory
(``init_process_group("nccl")``, one process per GPU; ``nccl_backend.py``). Collectives on tensors,
DDP and pipelines are written against that interface only. Chapter 04 starts here.
"""

from __future__ import annotations

import abc
import atexit
import datetime
import enum
import importlib
import importlib.util
import signal
import subprocess
import sys
import threading
import traceback
from typing import Any, Callable

__all__ = [
    "Backend", "ProcessGroup", "ReduceOp", "Work", "barrier", "destroy_process_group", "get_backend",
    "get_rank", "get_world_size", "init_process_group", "is_available", "is_initialized",
]


class ReduceOp(enum.Enum):
    """How a collective combines the ranks' values, element by element."""

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MAX = "max"
    MIN = "min"


def _nothing() -> None:
    return None


class Work:
    """A started operation. ``wait()`` blocks until its data is in place; ``is_completed()`` asks
    without blocking. Follow-up steps added with ``then`` (copying a result back, dividing for an
    average, bumping a version counter) run once, as the operation completes."""

    def __init__(self, wait: Callable[[], None] = _nothing, test: Callable[[], bool] = lambda: True) -> None:
        self._wait, self._test, self._then, self._done = wait, test, [], False

    def then(self, fn: Callable[[], None]) -> Work:
        if self._done:
            fn()
        else:
            self._then.append(fn)
        return self

    def wait(self) -> bool:
        if not self._done:
            self._wait()
            self._complete()
        return True

    def is_completed(self) -> bool:
        if not self._done and self._test():
            self._complete()
        return self._done

    def _complete(self) -> None:
        self._done = True
        for fn in self._then:
            fn()


class Backend(abc.ABC):
    """A transport between the ranks of a job. Every operation takes contiguous arrays of the
    backend's device, works in place, and returns a ``Work``: finished when it returns unless
    ``async_op``, in which case the arrays must stay untouched until ``wait()``."""

    name: str
    timeout: float | None = None  # seconds a rank waits in one operation before it raises

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def leave(self, cause: str) -> None:
        """Tell the other ranks that this one has left the group, and why ("rank r <cause>")."""

    @abc.abstractmethod
    def all_reduce(self, array: Any, op: ReduceOp, async_op: bool) -> Work:
        """Every rank's ``array`` becomes the element-wise ``op`` of all ranks' arrays."""

    @abc.abstractmethod
    def broadcast(self, array: Any, src: int, async_op: bool) -> Work:
        """Every rank's ``array`` becomes rank ``src``'s."""

    @abc.abstractmethod
    def all_gather(self, output: Any, array: Any, async_op: bool) -> Work:
        """``output`` (world_size times ``array``'s size) receives every rank's array, in rank order."""

    @abc.abstractmethod
    def reduce_scatter(self, output: Any, array: Any, op: ReduceOp, async_op: bool) -> Work:
        """``array`` is world_size blocks of ``output``'s size; rank r gets the reduction of block r."""

    @abc.abstractmethod
    def send(self, array: Any, dst: int, tag: int, async_op: bool) -> Work:
        """Send ``array`` to rank ``dst``."""

    @abc.abstractmethod
    def recv(self, array: Any, src: int | None, tag: int, async_op: bool) -> Work:
        """Receive into ``array`` from rank ``src`` (any rank when None); the finished Work's
        ``source`` is the sender's rank."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return once every rank has called ``barrier``."""

    @abc.abstractmethod
    def abort(self, code: int) -> None:
        """End every process of the job now, with exit status ``code``."""


# Backends by name, imported when first used so that minigrad itself needs neither mpi4py nor cupy.
BACKENDS = {"mpi": "minigrad.distributed.mpi_backend:MPIBackend",
            "nccl": "minigrad.distributed.nccl_backend:NCCLBackend"}


class ProcessGroup:
    """The ranks that take part in collectives, and the backend that carries their data."""

    def __init__(self, backend: Backend, check_shapes: bool) -> None:
        self.backend, self.check_shapes = backend, check_shapes

    def rank(self) -> int:
        return self.backend.rank

    def size(self) -> int:
        return self.backend.world_size


_default: ProcessGroup | None = None
_transport: Backend | None = None  # kept after destroy_process_group: the job still runs
_saved: dict = {}  # the excepthook and signal handlers init_process_group replaced


def is_available() -> bool:
    """Whether a backend can be started here (mpi4py is installed)."""
    return importlib.util.find_spec("mpi4py") is not None


def init_process_group(backend: str = "mpi", *, check_shapes: bool = True,
                       timeout: float | datetime.timedelta | None = None) -> None:
    """Join the job this process was started in (``mpiexec -n N python script.py``).

    ``check_shapes``: before each collective, the ranks compare their tensors' shapes and dtypes
    (one small all-gather) and raise a ``ShapeError`` naming them when they differ, instead of
    computing garbage or waiting forever. Switch it off to save that round trip on tiny messages.
    ``timeout`` (seconds or a timedelta, as in PyTorch): a rank that waits longer than this in one
    collective raises ``DistributedError``; None waits as long as the other ranks are alive.

    From here on no rank can leave the others waiting: an exception that nobody catches (also one
    passing through ``finally: destroy_process_group()`` or ``barrier()``), SIGTERM, SIGINT or
    SIGHUP ends the whole job with a message naming the rank and the cause; a rank that exits, or
    leaves the group, while others still wait for it in a collective ends the job from there.
    """
    global _default, _transport
    if _default is not None:
        raise RuntimeError("init_process_group: the default process group is already initialized")
    if backend not in BACKENDS:
        raise ValueError(f"init_process_group: unknown backend {backend!r}; expected one of {sorted(BACKENDS)}")
    module, cls = BACKENDS[backend].split(":")
    transport = getattr(importlib.import_module(module), cls)()
    if timeout is not None:
        transport.timeout = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    _default, _transport = ProcessGroup(transport, check_shapes), transport
    if transport.world_size > 1:
        _guard_the_job()


def _guard_the_job() -> None:
    """Install what ends the job when this rank leaves early; ``destroy_process_group`` undoes it."""
    atexit.unregister(_at_exit)  # once, however often the group is made
    atexit.register(_at_exit)
    _saved["excepthook"], sys.excepthook = sys.excepthook, _abort_on_exception
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
                _saved[sig] = signal.signal(sig, _abort_on_signal)
    _watch_for_abrupt_exit(_transport.rank)


def _end_job(why: str, code: int) -> None:
    """Print why this rank ends the job, then end every rank of it."""
    sys.stdout.flush()
    sys.stderr.write(f"[rank {_transport.rank}] {why}; ending the job\n")
    sys.stderr.flush()
    _quiet_watcher()  # said already
    _transport.abort(code)


def _abort_on_exception(kind: type, value: BaseException, tb: Any) -> None:
    # A rank that dies alone would leave the others blocked in their next collective: print this
    # rank's error, then take the whole job down so that mpiexec exits non-zero at once.
    sys.stderr.write(f"[rank {_transport.rank}] uncaught exception, aborting the job:\n")
    traceback.print_exception(kind, value, tb)
    _end_job(f"uncaught {kind.__name__}: {value}", 1)


def _abort_on_signal(signum: int, frame: Any) -> None:
    gone = getattr(_transport, "gone_peers", lambda: "")()  # mpiexec passes on a peer's death this way
    _end_job(gone or f"received {signal.Signals(signum).name}", 128 + signum)


def _at_exit() -> None:
    if _default is not None:  # exiting with the group up: a rank still waiting for this one ends the job
        _transport.leave("exited (sys.exit or the end of its script) without destroy_process_group()")
    _quiet_watcher()  # an orderly exit


# A process that outlives this rank: when the rank's end of the pipe closes without the byte an
# orderly exit writes (os._exit, SIGKILL, a crash), it says so, since the rank itself cannot.
_WATCHER = ("import sys; sys.stderr.write('' if sys.stdin.buffer.read(1) else "
            "'[rank %s] ended abruptly (os._exit, a signal or a crash) with the process group up; "
            "the job ends\\n')")
_watcher: Any = None


def _watch_for_abrupt_exit(rank: int) -> None:
    global _watcher
    _watcher = subprocess.Popen([sys.executable, "-c", _WATCHER % rank], stdin=subprocess.PIPE,
                                start_new_session=True)


def _quiet_watcher() -> None:
    global _watcher
    if _watcher is not None:
        try:
            _watcher.stdin.write(b"x")
            _watcher.stdin.close()
        except OSError:  # the watcher is gone already
            pass
        _watcher = None


def _leaving_by_exception(where: str) -> None:
    """Called in ``finally:`` blocks as an exception passes: the rank is failing, so end the job
    now, rather than wait for ranks that are in another collective."""
    kind, value, tb = sys.exc_info()
    if "excepthook" in _saved and kind is not None and not issubclass(kind, (StopIteration, GeneratorExit)):
        sys.stderr.write(f"[rank {_transport.rank}] {kind.__name__} raised, passing through {where}:\n")
        traceback.print_exception(kind, value, tb)
        _end_job(f"{kind.__name__}: {value}", 1)


def destroy_process_group() -> None:
    """Leave the group. The other ranks are told: one still waiting for this rank in a collective
    ends the job (the transport itself shuts down when the process exits)."""
    global _default
    group()
    _leaving_by_exception("destroy_process_group()")
    _transport.leave("left the process group (destroy_process_group())")
    _default = None
    if "excepthook" in _saved:
        sys.excepthook = _saved.pop("excepthook")
        for sig in [k for k in _saved if isinstance(k, signal.Signals)]:
            signal.signal(sig, _saved.pop(sig))
        _quiet_watcher()


def is_initialized() -> bool:
    return _default is not None


def group() -> ProcessGroup:
    """The default process group; raises if ``init_process_group`` has not been called."""
    if _default is None:
        raise RuntimeError("the default process group has not been initialized; call "
                           "minigrad.distributed.init_process_group() first (and start the script "
                           "with mpiexec -n N python script.py)")
    return _default


def get_rank() -> int:
    return group().rank()


def get_world_size() -> int:
    return group().size()


def get_backend() -> str:
    return group().backend.name


def barrier() -> None:
    pg = group()
    _leaving_by_exception("barrier()")
    pg.backend.barrier()
