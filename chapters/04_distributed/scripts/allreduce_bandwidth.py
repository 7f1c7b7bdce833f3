"""Time three all-reduces on float32 tensors of 1 KB to 4 MB: ``mpiexec -n 2 python allreduce_bandwidth.py``.

naive: every rank sends its tensor to rank 0, which adds them up and sends the sum back (a
parameter server). ring: ``ring_all_reduce``, reduce-scatter then all-gather around the ring.
mpi: MPI's own ``MPI_Allreduce``. Rank 0 prints one JSON line: the median milliseconds per call
of each, and the bytes each rank sent in one ring all-reduce.
"""

import json
import statistics
import time

import minigrad
import minigrad.distributed as dist

SIZES = [2**k for k in range(10, 23, 2)]  # bytes: 1 KB, 4 KB, ..., 4 MB
REPEATS = 5

dist.init_process_group("mpi", check_shapes=False)  # no shape check: it would add a round trip
rank, world = dist.get_rank(), dist.get_world_size()


def naive_all_reduce(t):
    if rank == 0:
        incoming = minigrad.empty(t.shape)
        for src in range(1, world):
            dist.recv(incoming, src)
            t.add_(incoming)
        for dst in range(1, world):
            dist.send(t, dst)
    else:
        dist.send(t, 0)
        dist.recv(t, 0)


def median_ms(fn, t, calls):
    times = []
    for _ in range(REPEATS):
        dist.barrier()  # start together
        start = time.perf_counter()
        for _ in range(calls):
            fn(t)
        times.append((time.perf_counter() - start) * 1e3 / calls)
    return statistics.median(times)


rows, ring_bytes = [], {}
for size in SIZES:
    t = minigrad.zeros(size // 4)  # zeros: repeated sums stay finite
    calls = max(1, min(20, 2**20 // size))
    row = {"bytes": size}
    for name, fn in [("naive", naive_all_reduce), ("ring", dist.ring_all_reduce), ("mpi", dist.all_reduce)]:
        fn(t)  # warm-up: the first message between two ranks sets up the connection
        row[name] = median_ms(fn, t, calls)
    rows.append(row)
    ring_bytes[size] = dist.ring_all_reduce(t)
if rank == 0:
    print(json.dumps({"ranks": world, "rows": rows, "ring_bytes_sent": ring_bytes}))
dist.destroy_process_group()
