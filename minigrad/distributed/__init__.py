"""minigrad.distributed: training on several processes, as ``torch.distributed`` (chapter 04).

Start N copies of a script with ``mpiexec -n N python train.py`` (or ``launch`` from Python); in
it, ``init_process_group("mpi")`` (or ``"nccl"`` for tensors on GPUs, one process per GPU) joins
them, collectives move tensors between them, and ``DistributedDataParallel`` with
``DistributedSampler`` trains one model on N shares of each batch.
Pipeline (``ScheduleGPipe``, its stages cut by hand or by ``auto_pipeline_stage``) and model
parallelism (``ColumnParallelLinear``) split the model instead. Importing this package needs no MPI; ``init_process_group`` needs mpi4py
(``pip install 'minigrad[mpi]'``), and ``"nccl"`` also cupy and NCCL (``minigrad[cuda]``).
"""

from minigrad.distributed.process_group import (
    Backend, ProcessGroup, ReduceOp, Work, barrier, destroy_process_group, get_backend, get_rank,
    get_world_size, init_process_group, is_available, is_initialized,
)
from minigrad.distributed.collectives import (
    all_gather, all_gather_into_tensor, all_reduce, broadcast, irecv, isend, recv, reduce_scatter,
    reduce_scatter_tensor, send,
)
from minigrad.distributed.ring import ring_all_reduce
from minigrad.distributed.ddp import DistributedDataParallel
from minigrad.distributed.sampler import DistributedSampler
from minigrad.distributed.pipeline import PipelineStage, ScheduleGPipe, gpipe_bubble, split_sequential
from minigrad.distributed.autopipe import auto_pipeline_stage
from minigrad.distributed.model_parallel import ColumnParallelLinear, RowParallelLinear
from minigrad.distributed.launcher import launch
from minigrad.unsupported import module_getattr as _module_getattr

__all__ = [
    "Backend", "ColumnParallelLinear", "DistributedDataParallel", "DistributedSampler", "PipelineStage",
    "ProcessGroup", "ReduceOp", "RowParallelLinear", "ScheduleGPipe", "Work", "all_gather",
    "all_gather_into_tensor", "all_reduce", "auto_pipeline_stage", "barrier", "broadcast", "destroy_process_group",
    "get_backend", "get_rank", "get_world_size", "gpipe_bubble", "init_process_group", "irecv",
    "is_available", "is_initialized", "isend", "launch", "recv", "reduce_scatter",
    "reduce_scatter_tensor", "ring_all_reduce", "send", "split_sequential",
]


__getattr__ = _module_getattr(__name__)  # a PyTorch feature minigrad does not follow raises NotImplementedError
