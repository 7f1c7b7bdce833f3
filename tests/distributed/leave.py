"""Rank 1 leaves early in the way named by argv[1] while rank 0 waits in an all-reduce; the job
must end within seconds with a message naming rank 1 and the cause (test_distributed.py).

Rank 0 prints the CPU time it spent waiting, so the test can tell a sleeping wait from a spinning one.
"""

import os
import signal
import sys
import time

import minigrad
import minigrad.distributed as dist

how = sys.argv[1]
dist.init_process_group("mpi", **({"timeout": float(sys.argv[2])} if len(sys.argv) > 2 else {}))
rank = dist.get_rank()
dist.all_reduce(minigrad.ones(3))  # both ranks are up and talking
if how == "normal":  # both ranks end their script with the group up: the job succeeds
    sys.exit(0)
if rank == 0:
    start, cpu = time.perf_counter(), time.process_time()
    try:
        dist.all_reduce(minigrad.ones(3))
    finally:
        print(f"rank 0 waited {time.perf_counter() - start:.2f} s using {time.process_time() - cpu:.2f} s of CPU",
              flush=True)
    sys.exit(0)

time.sleep(0.5)  # rank 0 is waiting in its all-reduce by now
if how == "raise":
    raise ValueError("rank 1 fails on purpose")
if how == "exit0":
    sys.exit(0)
if how == "exit1":
    sys.exit(1)
if how == "os_exit":
    os._exit(3)
if how in ("SIGTERM", "SIGKILL", "SIGINT"):
    os.kill(os.getpid(), getattr(signal, how))
    time.sleep(10)
if how == "finally_destroy":
    try:
        raise ValueError("rank 1 fails inside try/finally")
    finally:
        dist.destroy_process_group()
if how == "finally_barrier":
    try:
        raise ValueError("rank 1 fails inside try/finally")
    finally:
        dist.barrier()
if how == "leave_loop":
    dist.destroy_process_group()
if how == "sleep":  # rank 0's collective times out (init_process_group(timeout=...)) first
    time.sleep(30)
# "end": the script just ends, the group still up
