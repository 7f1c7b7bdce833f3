"""All-reduce bandwidth: minigrad's ring (built from send/recv) vs MPI's own all-reduce (chapter 04).

Float32 tensors of 1 KB to 64 MB are summed across the ranks, in place, by ``ring_all_reduce``
and by ``all_reduce`` (MPI_Allreduce). Bus bandwidth is bytes x 2(N-1)/N / time, the data each
rank must move, so the figure compares across N (the NCCL tests' convention). Target: the ring
reaches at least 80% of MPI's bandwidth from 1 MB up. A last column times ``all_reduce`` with its
cross-rank shape check on, the cost of the safety net for small messages.

``python benchmarks/bench_allreduce.py [--ranks N]``: the script starts ``mpiexec -n N`` on itself.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy

import minigrad
import minigrad.distributed as dist
from mpi_timing import interleaved  # benchmarks/ is on sys.path when a script runs

SIZES = [2**k for k in range(10, 27, 2)]  # bytes: 1 KB, 4 KB, ..., 64 MB
TARGET = 0.8  # ring / MPI bandwidth from 1 MB up


def worker(repeats: int) -> None:
    dist.init_process_group("mpi", check_shapes=False)
    n, rank = dist.get_world_size(), dist.get_rank()
    pg = dist.process_group.group()
    rows = []
    for size in SIZES:
        # the ring and MPI agree on random data before anything is timed
        x = minigrad.tensor(numpy.random.default_rng(rank).standard_normal(size // 4).astype(numpy.float32))
        y = x.clone()
        dist.all_reduce(x)
        dist.ring_all_reduce(y)
        numpy.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-5, atol=1e-5)
        t = minigrad.zeros(size // 4)  # zeros: repeated sums stay finite

        def checked_all_reduce() -> None:
            pg.check_shapes = True
            dist.all_reduce(t)
            pg.check_shapes = False

        steps = max(1, min(50, 2**20 // size))
        ms = interleaved({"mpi": lambda: dist.all_reduce(t), "ring": lambda: dist.ring_all_reduce(t),
                          "checked": checked_all_reduce}, repeats, steps)
        rows.append({"bytes": size, **ms})
    if rank == 0:
        print(json.dumps({"ranks": n, "rows": rows}))
    dist.destroy_process_group()


def report(result: dict) -> None:
    n = result["ranks"]
    bus = 2 * (n - 1) / n
    print(f"{'size':>8} {'MPI ms':>9} {'ring ms':>9} {'MPI GB/s':>9} {'ring GB/s':>10} {'ring/MPI':>9}"
          f" {'checked ms':>11}   target")
    for row in result["rows"]:
        size = row["bytes"]
        gbs = {k: size * bus / (row[k] * 1e-3) / 1e9 for k in ("mpi", "ring")}
        ratio = gbs["ring"] / gbs["mpi"]
        label = f"{size // 2**20} MB" if size >= 2**20 else f"{size // 2**10} KB"
        target = (f"ring >= {TARGET:.0%} of MPI ({'met' if ratio >= TARGET else 'not met'})"
                  if size >= 2**20 else "")
        print(f"{label:>8} {row['mpi']:9.3f} {row['ring']:9.3f} {gbs['mpi']:9.2f} {gbs['ring']:10.2f}"
              f" {ratio:8.2f}x {row['checked']:11.3f}   {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="MPI processes (default 2)")
    parser.add_argument("--repeats", type=int, default=9, help="interleaved repeats (median taken)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.repeats)
        return
    if not dist.is_available() or dist.launcher.find_mpiexec() is None:
        print("bench_allreduce: needs mpi4py and mpiexec (pip install 'minigrad[mpi]'); skipped")
        return
    result = dist.launch(__file__, args.ranks, ["--worker", "--repeats", str(args.repeats)], timeout=600)
    if result.returncode != 0:
        sys.exit(f"bench_allreduce: the MPI job failed:\n{result.stdout}\n{result.stderr}")
    print(f"bench_allreduce: float32 sum over {args.ranks} ranks, in place; median of {args.repeats} "
          "interleaved repeats; bus bandwidth = bytes x 2(N-1)/N / time")
    print()
    report(json.loads(result.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    main()
