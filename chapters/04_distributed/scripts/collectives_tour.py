"""The collectives, one line each, on every rank: ``mpiexec -n 2 python collectives_tour.py``.

Each rank starts with different values; rank 0 collects what every rank ends up with and prints
it in rank order (prints from several processes would interleave at random).
"""

import minigrad
import minigrad.distributed as dist

dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()


def report(title, t):
    """Gather every rank's copy of ``t`` to rank 0 and print them there, one line per rank."""
    every = minigrad.zeros((world,) + tuple(t.shape), dtype=t.dtype)
    dist.all_gather_into_tensor(every, t)
    if rank == 0:
        print(title)
        for r in range(world):
            print(f"  rank {r}: {every[r].numpy()}")


x = minigrad.tensor([1.0, 2.0, 3.0]) * (rank + 1)  # rank r holds (r + 1) * [1, 2, 3]
report(f"before: {world} ranks, each with its own tensor", x)

t = x.clone()
dist.all_reduce(t)  # every rank: the sum over ranks
report("all_reduce (SUM): every rank holds the sum", t)

t = x.clone()
dist.all_reduce(t, dist.ReduceOp.AVG)
report("all_reduce (AVG): every rank holds the average", t)

t = x.clone()
dist.broadcast(t, src=0)
report("broadcast from rank 0: every rank holds rank 0's tensor", t)

t = x.clone()
sent = dist.ring_all_reduce(t)  # the same sum, built from send/recv around a ring
report(f"ring_all_reduce: the same sum (rank {rank} sent {sent} bytes)", t)
dist.destroy_process_group()
