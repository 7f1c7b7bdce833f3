"""Rank 1 raises while rank 0 waits in an all-reduce: the job must end at once, non-zero."""

import minigrad
import minigrad.distributed as dist

dist.init_process_group("mpi")
if dist.get_rank() == 1:
    raise ValueError("rank 1 fails on purpose")
dist.all_reduce(minigrad.ones(3))
