"""backend='nccl'. Without a GPU: init_process_group raises a DeviceError that says what to install,
and the backend's launching logic runs against a recording stand-in for cupy, NCCL and MPI (which
calls reach NCCL, on which stream, in which order). With a GPU: tests/distributed/nccl_checks.py
runs the collectives and DDP on one process per GPU."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import minigrad.distributed as dist
from minigrad import cuda
from minigrad.distributed import ReduceOp, launcher, nccl_backend, process_group
from minigrad.errors import DeviceError, DTypeError

SCRIPT = Path(__file__).resolve().parent / "nccl_checks.py"
# A real GPU: MINIGRAD_SIMULATE_CUDA=1 (conftest.py) stands in an imitation of cupy, without NCCL.
GPU = cuda.is_available() and os.environ.get("MINIGRAD_SIMULATE_CUDA") != "1"


def test_nccl_is_a_registered_backend():
    assert process_group.BACKENDS["nccl"] == "minigrad.distributed.nccl_backend:NCCLBackend"


@pytest.mark.skipif(cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_init_process_group_nccl_without_a_gpu_says_what_is_missing():
    with pytest.raises(DeviceError, match=r"init_process_group\('nccl'\).*minigrad\[cuda\]"):
        dist.init_process_group("nccl")
    assert not dist.is_initialized()


# -- a recording stand-in for cupy, cupy.cuda.nccl and mpi4py's MPI --------------------------------
class Log(list):
    def __call__(self, *entry):
        self.append(entry)


class Event:
    def __init__(self, name):
        self.name, self.done = name, False


class Stream:
    def __init__(self, name, log):
        self.name, self.ptr, self.log, self.count = name, id(self), log, 0

    def record(self):
        self.count += 1
        event = Event(f"{self.name}#{self.count}")
        self.log("record", event.name)
        return event

    def wait_event(self, event):
        self.log("wait", self.name, event.name)

    def synchronize(self):
        self.log("synchronize", self.name)


class GPUArray(np.ndarray):
    """A numpy array that answers as a cupy array does: ``.data.ptr`` and ``.device.id``."""

    @property
    def data(self):
        return SimpleNamespace(ptr=self.ctypes.data)

    @property
    def device(self):
        return SimpleNamespace(id=0)


class Comm:
    def __init__(self, log):
        self.log = log

    def __getattr__(self, name):  # allReduce, broadcast, send, ...: recorded, arguments and all
        return lambda *args: self.log(name, *args)


class FakeDevice:
    def __init__(self, spec):
        self.spec, self.index = spec, int(spec.split(":")[1])

    def __str__(self):
        return self.spec


def fake_gpu(monkeypatch):
    log = Log()
    compute = Stream("compute", log)
    cupy = SimpleNamespace(ndarray=GPUArray, cuda=SimpleNamespace(
        runtime=SimpleNamespace(getDeviceCount=lambda: 1),
        Device=lambda i: SimpleNamespace(use=lambda: None),
        Stream=lambda non_blocking: Stream("comm", log) if non_blocking else pytest.fail("blocking stream"),
        get_current_stream=lambda: compute))
    nccl = SimpleNamespace(NCCL_SUM=0, NCCL_PROD=1, NCCL_MAX=2, NCCL_MIN=3, NCCL_AVG=4, NCCL_INT8=0,
                           NCCL_UINT8=1, NCCL_INT32=2, NCCL_INT64=4, NCCL_FLOAT16=6, NCCL_FLOAT32=7,
                           NCCL_FLOAT64=8, get_unique_id=lambda: (0,) * 128,
                           groupStart=lambda: log("groupStart"), groupEnd=lambda: log("groupEnd"),
                           NcclCommunicator=lambda n, uid, rank: Comm(log))
    world = SimpleNamespace(Get_rank=lambda: 0, Get_size=lambda: 1, bcast=lambda obj, root: obj,
                            Split_type=lambda kind: SimpleNamespace(Get_rank=lambda: 0),
                            Barrier=lambda: log("Barrier"))
    monkeypatch.setattr(nccl_backend, "_load", lambda: (cupy, nccl))
    # not minigrad's Device("cuda:0"), which would ask the real cupy and stay in the device cache
    monkeypatch.setattr(nccl_backend, "_backend", SimpleNamespace(Device=FakeDevice))
    monkeypatch.setattr(nccl_backend, "_mpi", lambda: SimpleNamespace(COMM_WORLD=world, COMM_TYPE_SHARED=1))
    return log


def gpu(values, dtype="float32"):
    return np.asarray(values, dtype=dtype).view(GPUArray)


def test_a_collective_runs_on_the_comm_stream_between_two_waits(monkeypatch):
    log = fake_gpu(monkeypatch)
    be = nccl_backend.NCCLBackend()
    assert (be.name, be.rank, be.world_size, str(be.device)) == ("nccl", 0, 1, "cuda:0")
    x = gpu([1, 2, 3])
    log.clear()
    be.all_reduce(x, ReduceOp.SUM, async_op=False)
    ptr, comm = x.ctypes.data, be.stream.ptr
    assert log == [("record", "compute#1"), ("wait", "comm", "compute#1"),  # after the inputs' kernels
                   ("allReduce", ptr, ptr, 3, 7, 0, comm), ("record", "comm#1"),
                   ("wait", "compute", "comm#1")]  # the compute stream waits on the GPU, not the CPU


def test_async_work_is_waited_for_once_and_reports_its_event(monkeypatch):
    log = fake_gpu(monkeypatch)
    be = nccl_backend.NCCLBackend()
    out, x = gpu(np.zeros(4), "int64"), gpu([5, 6], "int64")
    work = be.all_gather(out, x, async_op=True)
    assert log[-1] == ("record", "comm#1") and log[-2] == ("allGather", x.ctypes.data, out.ctypes.data, 2, 4,
                                                           be.stream.ptr)
    assert not work.is_completed()
    log.clear()
    work.wait()
    work.wait()
    assert log == [("wait", "compute", "comm#1")]


def test_point_to_point_messages_are_launched_together_at_the_first_wait(monkeypatch):
    log = fake_gpu(monkeypatch)
    be = nccl_backend.NCCLBackend()
    a, b = gpu([1.0, 2.0]), gpu([0.0, 0.0])
    log.clear()
    receiving = be.recv(b, 0, 7, async_op=True)
    sending = be.send(a, 0, 7, async_op=True)
    assert log == [] and receiving.source == 0  # nothing launched yet: a lone recv would block the send
    receiving.wait()
    calls = [entry[0] for entry in log]
    assert calls == ["record", "wait", "groupStart", "recv", "send", "groupEnd", "record", "wait"]
    log.clear()
    sending.wait()  # the same group: only the compute stream's wait is new
    assert log == [("wait", "compute", "comm#1")]


def test_a_collective_launches_the_messages_posted_before_it_first(monkeypatch):
    log = fake_gpu(monkeypatch)
    be = nccl_backend.NCCLBackend()
    be.send(gpu([1.0]), 0, 0, async_op=True)
    log.clear()
    be.broadcast(gpu([3.0]), 0, async_op=False)
    calls = [entry[0] for entry in log]
    assert calls.index("groupEnd") < calls.index("broadcast")
    log.clear()
    be.barrier()  # nothing posted is left to launch; the streams are drained before the ranks meet
    assert log == [("synchronize", "compute"), ("synchronize", "comm"), ("Barrier",)]


def test_barrier_waits_for_the_queued_gpu_work_before_meeting_the_other_ranks(monkeypatch):
    log = fake_gpu(monkeypatch)
    be = nccl_backend.NCCLBackend()
    x = gpu([1, 2])
    be.all_reduce(x, ReduceOp.SUM, async_op=True)  # queued on the GPU, not finished
    log.clear()
    be.barrier()
    assert log == [("synchronize", "compute"), ("synchronize", "comm"), ("Barrier",)]


def test_dtypes_and_ops_map_to_nccls(monkeypatch):
    log = fake_gpu(monkeypatch)
    be = nccl_backend.NCCLBackend()
    flags = gpu([True, False], "bool")
    for op, nccl_op in [(ReduceOp.SUM, 2), (ReduceOp.MAX, 2), (ReduceOp.PRODUCT, 3), (ReduceOp.MIN, 3)]:
        be.all_reduce(flags, op, async_op=False)
        assert log[-3][0] == "allReduce" and log[-3][4:6] == (1, nccl_op)  # uint8: any / all
    be.all_reduce(gpu([1.0], "float16"), ReduceOp.AVG, async_op=False)
    assert log[-3][4:6] == (6, 4)
    with pytest.raises(DTypeError, match="AVG needs a floating tensor"):
        be.all_reduce(gpu([1], "int32"), ReduceOp.AVG, async_op=False)
    with pytest.raises(DTypeError, match="cannot move int16"):
        be.broadcast(gpu([1], "int16"), 0, async_op=False)


def test_host_arrays_and_receive_from_any_rank_are_refused(monkeypatch):
    fake_gpu(monkeypatch)
    be = nccl_backend.NCCLBackend()
    with pytest.raises(DeviceError, match="numpy.ndarray.*backend='mpi'"):
        be.all_reduce(np.ones(3, np.float32), ReduceOp.SUM, async_op=False)
    with pytest.raises(ValueError, match="needs the sender's rank"):
        be.recv(gpu([0.0]), None, 0, async_op=False)


def test_init_process_group_starts_the_nccl_backend(monkeypatch):
    fake_gpu(monkeypatch)
    dist.init_process_group("nccl")
    try:
        assert (dist.get_backend(), dist.get_rank(), dist.get_world_size()) == ("nccl", 0, 1)
    finally:
        dist.destroy_process_group()


# -- on a GPU ----------------------------------------------------------------------------------------
@pytest.mark.skipif(not GPU or not dist.is_available(), reason="needs a CUDA GPU, cupy with NCCL and mpi4py")
def test_collectives_and_ddp_on_one_process_per_gpu():
    loads = subprocess.run([sys.executable, "-c", "from mpi4py import MPI"], capture_output=True, text=True)
    if loads.returncode != 0:
        pytest.skip(f"mpi4py cannot load an MPI library here: {loads.stderr.strip().splitlines()[-1:]}")
    nprocs = cuda.device_count()
    if launcher.find_mpiexec() is not None:
        result = dist.launch(SCRIPT, nprocs, timeout=300)
    else:  # one rank: MPI starts as a singleton without mpiexec
        env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[2])}
        result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                                timeout=300, env=env)
    assert "ok nccl" in result.stdout, (f"exit {result.returncode}\n{result.stdout[-2000:]}\n"
                                        f"{result.stderr[-4000:]}")
