"""The NCCL backend: collectives between GPUs through ``cupy.cuda.nccl``, one process per GPU.

NCCL runs a collective as CUDA kernels that move data GPU to GPU (NVLink, PCIe, InfiniBand), never
through host memory. The processes start as for ``backend="mpi"`` (``mpiexec -n N python
train.py``): MPI tells each its rank, rank 0 makes NCCL's unique id and MPI broadcasts it so the
ranks can find each other, and each rank takes the GPU of its rank on its host (``backend.device``).
Every operation is queued on a communication stream after the work already queued on the compute
stream; ``Work.wait()`` makes the compute stream wait for it on the GPU (the CPU does not block),
as in torch, so gradients can be all-reduced while backward goes on. Chapter 04.
"""

from __future__ import annotations

from typing import Any, Callable

from minigrad import backend as _backend
from minigrad.distributed.process_group import Backend, ReduceOp, Work
from minigrad.errors import DeviceError, DTypeError

__all__ = ["NCCLBackend"]

_INSTALL = ("install the 'cuda' extra (pip install 'minigrad[cuda]': CuPy and NCCL) on a machine with "
            "an NVIDIA GPU, or use backend='mpi' for CPU tensors")
# numpy dtype name -> NCCL data type; bool travels as uint8 (see _op)
_DTYPES = {"float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
           "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "int64": "NCCL_INT64",
           "bool": "NCCL_UINT8"}
_OPS = {ReduceOp.SUM: "NCCL_SUM", ReduceOp.AVG: "NCCL_AVG", ReduceOp.PRODUCT: "NCCL_PROD",
        ReduceOp.MAX: "NCCL_MAX", ReduceOp.MIN: "NCCL_MIN"}


def _load() -> tuple[Any, Any]:
    """cupy and its NCCL module, or a DeviceError that says what is missing."""
    try:
        import cupy
    except ImportError:
        raise DeviceError(f"init_process_group('nccl'): cupy is not installed; {_INSTALL}") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # the CUDA runtime raises its own error types when there is no driver
        raise DeviceError(f"init_process_group('nccl'): no CUDA GPU is usable ({e}); {_INSTALL}") from None
    if count == 0:
        raise DeviceError(f"init_process_group('nccl'): no CUDA GPU found; {_INSTALL}")
    from cupy.cuda import nccl

    if not nccl.available:
        raise DeviceError("init_process_group('nccl'): cupy cannot load the NCCL library; "
                          "pip install nvidia-nccl-cu12 (part of the 'cuda' extra)")
    return cupy, nccl


def _mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError:
        raise ImportError("init_process_group('nccl') starts through MPI, which tells each process its "
                          "rank: pip install 'minigrad[mpi]' and run mpiexec -n N python script.py") from None
    return MPI


class _Group:
    """The point-to-point operations posted since the last launch; launched together."""

    def __init__(self) -> None:
        self.calls: list[Callable[[int], None]] = []
        self.arrays: list[Any] = []
        self.done: Any = None  # the event recorded after the launch


class NCCLBackend(Backend):
    """Collectives on cupy arrays of this rank's GPU.

    ``send``/``recv`` posted with ``async_op=True`` are launched together at the first ``wait()``
    (or the next collective or synchronous operation), as torch's ``batch_isend_irecv``: NCCL runs a
    communicator's operations one after another, so a receive launched alone would hold up the
    send queued behind it on every rank of a ring. Tags are not sent: NCCL matches the messages
    between two ranks in the order they were posted. ``recv`` needs an explicit ``src``.
    """

    name = "nccl"

    def __init__(self) -> None:
        cupy, self._nccl = _load()
        mpi = _mpi()
        self._world = mpi.COMM_WORLD
        super().__init__(self._world.Get_rank(), self._world.Get_size())
        local = self._world.Split_type(mpi.COMM_TYPE_SHARED).Get_rank()
        count = cupy.cuda.runtime.getDeviceCount()
        if local >= count:
            raise DeviceError(f"init_process_group('nccl'): rank {self.rank} is process {local} on its "
                              f"host, which has {count} GPU(s); start one process per GPU")
        self.device = _backend.Device(f"cuda:{local}")
        cupy.cuda.Device(local).use()  # the GPU cupy allocates on in this process from now on
        unique_id = self._world.bcast(self._nccl.get_unique_id() if self.rank == 0 else None, root=0)
        self.comm = self._nccl.NcclCommunicator(self.world_size, unique_id, self.rank)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._cupy, self._group = cupy, _Group()

    # -- launching ------------------------------------------------------------------------------
    def _check(self, *arrays: Any) -> None:
        for a in arrays:
            if not isinstance(a, self._cupy.ndarray) or a.device.id != self.device.index:
                where = (f"a {type(a).__module__}.{type(a).__name__}" if not isinstance(a, self._cupy.ndarray)
                         else f"an array on cuda:{a.device.id}")
                raise DeviceError(f"the nccl backend of rank {self.rank} moves memory of {self.device}, got "
                                  f"{where}; CPU tensors need backend='mpi'")

    def _dtype(self, array: Any) -> int:
        name = _DTYPES.get(array.dtype.name)
        if name is None:
            raise DTypeError(f"the nccl backend cannot move {array.dtype} tensors; expected one of "
                             f"{sorted(_DTYPES)}")
        return getattr(self._nccl, name)

    def _op(self, op: ReduceOp, dtype: Any) -> int:
        if dtype.kind == "b":  # as uint8 0/1: sum and max are "any", product and min are "all"
            op = ReduceOp.MIN if op in (ReduceOp.MIN, ReduceOp.PRODUCT) else ReduceOp.MAX
        elif op is ReduceOp.AVG and dtype.kind != "f":
            raise DTypeError(f"all_reduce: ReduceOp.AVG needs a floating tensor, got {dtype}")
        return getattr(self._nccl, _OPS[op])

    def _launch(self, enqueue: Callable[[int], None]) -> Any:
        """Queue NCCL calls on the communication stream after the compute stream's queued work
        (which wrote their inputs); returns the event recorded after them."""
        self.stream.wait_event(self._cupy.cuda.get_current_stream().record())
        enqueue(self.stream.ptr)
        return self.stream.record()

    def _work(self, event: Any, arrays: Any) -> Work:
        return Work(lambda: self._join(event, arrays), lambda: event.done)

    def _join(self, event: Any, arrays: Any) -> None:
        """The compute stream waits for ``event`` on the GPU. ``arrays`` is what the operation
        reads and writes: the Work's closure holds it, because freed earlier, its memory could be
        handed out again by the compute stream's pool while NCCL still uses it."""
        self._cupy.cuda.get_current_stream().wait_event(event)

    def _collective(self, arrays: tuple, call: Callable[[int], None], async_op: bool) -> Work:
        self._check(*arrays)
        self._flush(self._group)  # posted point-to-point messages go first, in the order posted
        work = self._work(self._launch(call), arrays)
        if not async_op:
            work.wait()
        return work

    def _flush(self, group: _Group) -> Any:
        if group.done is None and group.calls:
            nccl = self._nccl

            def grouped(stream: int) -> None:
                nccl.groupStart()
                for call in group.calls:
                    call(stream)
                nccl.groupEnd()

            group.done = self._launch(grouped)
            self._group = _Group()
        return group.done

    def _p2p(self, array: Any, call: Callable[[int], None], async_op: bool) -> Work:
        self._check(array)
        group = self._group
        group.calls.append(call)
        group.arrays.append(array)
        work = Work(lambda: self._join(self._flush(group), group), lambda: self._flush(group).done)
        if not async_op:
            work.wait()
        return work

    # -- the Backend interface ------------------------------------------------------------------
    def all_reduce(self, array: Any, op: ReduceOp, async_op: bool) -> Work:
        dtype, nccl_op = self._dtype(array), self._op(op, array.dtype)
        return self._collective((array,), lambda s: self.comm.allReduce(
            array.data.ptr, array.data.ptr, array.size, dtype, nccl_op, s), async_op)

    def broadcast(self, array: Any, src: int, async_op: bool) -> Work:
        dtype = self._dtype(array)
        return self._collective((array,), lambda s: self.comm.broadcast(
            array.data.ptr, array.data.ptr, array.size, dtype, src, s), async_op)

    def all_gather(self, output: Any, array: Any, async_op: bool) -> Work:
        dtype = self._dtype(array)
        return self._collective((output, array), lambda s: self.comm.allGather(
            array.data.ptr, output.data.ptr, array.size, dtype, s), async_op)

    def reduce_scatter(self, output: Any, array: Any, op: ReduceOp, async_op: bool) -> Work:
        dtype, nccl_op = self._dtype(array), self._op(op, array.dtype)
        return self._collective((output, array), lambda s: self.comm.reduceScatter(
            array.data.ptr, output.data.ptr, output.size, dtype, nccl_op, s), async_op)

    def send(self, array: Any, dst: int, tag: int, async_op: bool) -> Work:
        dtype = self._dtype(array)
        return self._p2p(array, lambda s: self.comm.send(array.data.ptr, array.size, dtype, dst, s), async_op)

    def recv(self, array: Any, src: int | None, tag: int, async_op: bool) -> Work:
        if src is None:
            raise ValueError("recv: the nccl backend needs the sender's rank (src); NCCL has no "
                             "receive-from-any-rank")
        dtype = self._dtype(array)
        work = self._p2p(array, lambda s: self.comm.recv(array.data.ptr, array.size, dtype, src, s), async_op)
        work.source = src
        return work

    def barrier(self) -> None:
        """Every rank gets here with its GPU work done: an MPI barrier alone meets the processes
        while their kernels and collectives may still be queued, so this rank's streams are
        drained first (the compute stream, then NCCL's, which waits on it)."""
        self._flush(self._group)
        self._cupy.cuda.get_current_stream().synchronize()
        self.stream.synchronize()
        self._world.Barrier()

    def abort(self, code: int) -> None:
        self.comm.abort()
        self._world.Abort(code)
