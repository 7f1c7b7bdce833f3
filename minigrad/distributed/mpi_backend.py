"""The MPI backend: collectives and point-to-point messages through mpi4py, on host memory.

mpi4py's upper-case methods (``Allreduce``, ``Isend``...) hand MPI the array's buffer directly:
no pickling, no copy. The ranks are those of ``MPI.COMM_WORLD`` as ``mpiexec`` started them, on one
machine or across hosts. MPI has no average, so ``AVG`` is a sum divided by the world size.
Chapter 04 measures these against the ring all-reduce built from ``send``/``recv``.

Every operation is started non-blocking and waited for by ``_wait``, which sleeps between polls
(a waiting rank uses almost no CPU), raises ``DistributedError`` after the group's ``timeout``,
and ends the job, naming the rank and the cause, when a peer leaves early: a rank that leaves
(``destroy_process_group``, or exiting with the group still up) posts a notice to every other
rank on a communicator of its own, and a peer process on this host that is gone without one
(``os._exit``, a signal) is noticed by its pid.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any

import numpy

from minigrad.distributed.process_group import Backend, ReduceOp, Work
from minigrad.errors import DeviceError, DistributedError, DTypeError, ShapeError

try:
    from mpi4py import MPI
except ImportError:
    raise ImportError("minigrad.distributed's mpi backend needs mpi4py and an MPI library: "
                      "pip install 'minigrad[mpi]'") from None

__all__ = ["MPIBackend"]


def _mpi_op(op: ReduceOp, dtype: numpy.dtype) -> Any:
    if dtype.kind == "b":  # MPI defines only logical ops on booleans: sum and max are "any"
        return MPI.LAND if op in (ReduceOp.MIN, ReduceOp.PRODUCT) else MPI.LOR
    if op is ReduceOp.AVG and dtype.kind != "f":
        raise DTypeError(f"all_reduce: ReduceOp.AVG needs a floating tensor, got {dtype}")
    return {ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM, ReduceOp.PRODUCT: MPI.PROD,
            ReduceOp.MAX: MPI.MAX, ReduceOp.MIN: MPI.MIN}[op]


def _host(*arrays: Any) -> None:
    for a in arrays:
        if not isinstance(a, numpy.ndarray):
            raise DeviceError(f"the mpi backend moves host memory, got a {type(a).__module__}."
                              f"{type(a).__name__}; cuda tensors need backend='nccl'")


_NOTICE_BYTES = 512
_GRACE_S = 1.0  # a notice can overtake the last messages of a collective that is completing
_PEER_CHECK_S = 0.2
_FORWARD_S = 0.2  # before MPI_Abort: time for mpiexec to forward this rank's last output


class MPIBackend(Backend):
    name = "mpi"

    def __init__(self) -> None:
        self.comm = MPI.COMM_WORLD
        super().__init__(self.comm.Get_rank(), self.comm.Get_size())
        self.host, self.peers = socket.gethostname(), self.comm.allgather((socket.gethostname(), os.getpid()))
        self.notices = self.comm.Dup()  # "rank r left": never mixed up with the job's own messages
        self.notice = bytearray(_NOTICE_BYTES)
        self.notice_request = self.notices.Irecv(self.notice, source=MPI.ANY_SOURCE)
        self.sent: list = []

    def _requests(self, reqs: list, op: str) -> Work:
        return Work(lambda: self._wait(reqs, op), lambda: MPI.Request.Testall(reqs))

    def _wait(self, reqs: list, op: str, statuses: list | None = None) -> None:
        """Wait for ``reqs`` (filling ``statuses``): polls that back off to a millisecond's sleep,
        the group's timeout, and the job ended (naming who and why) when a peer has left."""
        start = last_check = time.monotonic()
        left_at, delay = None, 0.0
        while not MPI.Request.Testall(reqs, statuses):
            now = time.monotonic()
            if left_at is None and self.notice_request.Test():
                left_at = now
            if left_at is not None and now - left_at > _GRACE_S:
                self.fail(f"{self.notice.rstrip(bytes(1)).decode(errors='replace')} while rank {self.rank} "
                          f"waits in {op}")
            if now - last_check > _PEER_CHECK_S:
                last_check = now
                gone = self.gone_peers()
                if gone:
                    self.fail(f"{gone} while rank {self.rank} waits in {op}")
            if self.timeout is not None and now - start > self.timeout:
                raise DistributedError(f"{op}: rank {self.rank} timed out after {self.timeout:g} s waiting "
                                       "for the other ranks (init_process_group(timeout=...))")
            time.sleep(delay)
            delay = min(delay * 2 or 1e-5, 1e-3)

    def gone_peers(self) -> str:
        """A sentence naming the peers on this host whose process is gone, or ''."""
        gone = [f"rank {r} (pid {pid})" for r, (host, pid) in enumerate(self.peers)
                if host == self.host and r != self.rank and not _alive(pid)]
        return (f"{', '.join(gone)} ended without leaving the process group (os._exit, a signal "
                "or a crash)") if gone else ""

    def fail(self, why: str) -> None:
        sys.stderr.write(f"[rank {self.rank}] {why}; ending the job\n")
        sys.stderr.flush()
        self.abort(1)

    def leave(self, cause: str) -> None:
        """Tell every other rank that this one has left, and why (a rank still waiting for it in
        a collective ends the job)."""
        text = f"rank {self.rank} {cause}".encode()[:_NOTICE_BYTES - 1]
        self.sent = [self.notices.Isend(text, dest=r) for r in range(self.world_size) if r != self.rank]
        if self.notice_request:  # a notice that came during the last wait completed it (Test made it null)
            self.notice_request.Cancel()

    def _average(self, work: Work, array: Any, op: ReduceOp) -> Work:
        if op is ReduceOp.AVG:
            work.then(lambda: numpy.divide(array, self.world_size, out=array))
        return work

    def all_reduce(self, array: Any, op: ReduceOp, async_op: bool) -> Work:
        _host(array)
        mpi_op = _mpi_op(op, array.dtype)
        work = self._requests([self.comm.Iallreduce(MPI.IN_PLACE, array, mpi_op)], "all_reduce")
        return self._average(_done(work, async_op), array, op)

    def broadcast(self, array: Any, src: int, async_op: bool) -> Work:
        _host(array)
        return _done(self._requests([self.comm.Ibcast(array, root=src)], "broadcast"), async_op)

    def all_gather(self, output: Any, array: Any, async_op: bool) -> Work:
        _host(output, array)
        return _done(self._requests([self.comm.Iallgather(array, output)], "all_gather"), async_op)

    def reduce_scatter(self, output: Any, array: Any, op: ReduceOp, async_op: bool) -> Work:
        _host(output, array)
        mpi_op = _mpi_op(op, array.dtype)
        work = self._requests([self.comm.Ireduce_scatter_block(array, output, mpi_op)], "reduce_scatter")
        return self._average(_done(work, async_op), output, op)

    def send(self, array: Any, dst: int, tag: int, async_op: bool) -> Work:
        _host(array)
        return _done(self._requests([self.comm.Isend(array, dest=dst, tag=tag)], "send"), async_op)

    def recv(self, array: Any, src: int | None, tag: int, async_op: bool) -> Work:
        _host(array)
        status = MPI.Status()
        request = self.comm.Irecv(array, source=MPI.ANY_SOURCE if src is None else src, tag=tag)

        def truncated(step: Any) -> Any:
            try:
                return step()
            except MPI.Exception as e:
                if e.Get_error_class() != MPI.ERR_TRUNCATE:
                    raise
                raise ShapeError(f"recv: the message from rank {status.Get_source()} is larger than "
                                 f"the receiving tensor ({array.nbytes} bytes)") from None

        def check() -> None:
            work.source = status.Get_source()
            got = status.Get_count(MPI.BYTE)
            if got != array.nbytes:
                raise ShapeError(f"recv: expected {array.nbytes} bytes ({array.size} elements of "
                                 f"{array.dtype}) from rank {work.source}, got {got}")

        work = Work(lambda: truncated(lambda: self._wait([request], "recv", [status])),
                    lambda: truncated(lambda: request.Test(status))).then(check)
        if not async_op:
            work.wait()
        return work

    def barrier(self) -> None:
        self._wait([self.comm.Ibarrier()], "barrier")

    def abort(self, code: int) -> None:
        # MPI_Abort takes the job down at once, and mpiexec may drop output it has not yet
        # forwarded: give it a moment to pass on the message that says why.
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(_FORWARD_S)
        self.comm.Abort(code)


def _done(work: Work, async_op: bool) -> Work:
    """``work`` waited for unless ``async_op``."""
    if not async_op:
        work.wait()
    return work


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: cannot tell, so assume it is alive
        return True
