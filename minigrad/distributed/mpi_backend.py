"""The MPI backend: collectives and point-to-point messages through mpi4py, on host memory.

mpi4py's upper-case methods (``Allreduce``, ``Isend``...) hand MPI the array's buffer directly:
no pickling, no copy. The ranks are those of ``MPI.COMM_WORLD`` as ``mpiexec`` started them, on one
machine or across hosts. MPI has no average, so ``AVG`` is a sum divided by the world size.
Chapter 04 measures these against the ring all-reduce built from ``send``/``recv``.
"""

from __future__ import annotations

from typing import Any

import numpy

from minigrad.distributed.process_group import Backend, ReduceOp, Work
from minigrad.errors import DeviceError, DTypeError, ShapeError

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


def _requests(reqs: list) -> Work:
    return Work(lambda: MPI.Request.Waitall(reqs), lambda: MPI.Request.Testall(reqs))


class MPIBackend(Backend):
    name = "mpi"

    def __init__(self) -> None:
        self.comm = MPI.COMM_WORLD
        super().__init__(self.comm.Get_rank(), self.comm.Get_size())

    def _average(self, work: Work, array: Any, op: ReduceOp) -> Work:
        if op is ReduceOp.AVG:
            work.then(lambda: numpy.divide(array, self.world_size, out=array))
        return work

    def all_reduce(self, array: Any, op: ReduceOp, async_op: bool) -> Work:
        _host(array)
        mpi_op = _mpi_op(op, array.dtype)
        if async_op:
            work = _requests([self.comm.Iallreduce(MPI.IN_PLACE, array, mpi_op)])
        else:
            self.comm.Allreduce(MPI.IN_PLACE, array, mpi_op)
            work = Work()
        return self._average(work, array, op)

    def broadcast(self, array: Any, src: int, async_op: bool) -> Work:
        _host(array)
        if async_op:
            return _requests([self.comm.Ibcast(array, root=src)])
        self.comm.Bcast(array, root=src)
        return Work()

    def all_gather(self, output: Any, array: Any, async_op: bool) -> Work:
        _host(output, array)
        if async_op:
            return _requests([self.comm.Iallgather(array, output)])
        self.comm.Allgather(array, output)
        return Work()

    def reduce_scatter(self, output: Any, array: Any, op: ReduceOp, async_op: bool) -> Work:
        _host(output, array)
        mpi_op = _mpi_op(op, array.dtype)
        if async_op:
            work = _requests([self.comm.Ireduce_scatter_block(array, output, mpi_op)])
        else:
            self.comm.Reduce_scatter_block(array, output, mpi_op)
            work = Work()
        return self._average(work, output, op)

    def send(self, array: Any, dst: int, tag: int, async_op: bool) -> Work:
        _host(array)
        if async_op:
            return _requests([self.comm.Isend(array, dest=dst, tag=tag)])
        self.comm.Send(array, dest=dst, tag=tag)
        return Work()

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

        work = Work(lambda: truncated(lambda: request.Wait(status)),
                    lambda: truncated(lambda: request.Test(status))).then(check)
        if not async_op:
            work.wait()
        return work

    def barrier(self) -> None:
        self.comm.Barrier()

    def abort(self, code: int) -> None:
        self.comm.Abort(code)
