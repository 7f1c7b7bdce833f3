"""DistributedDataParallel: training-step time on 1 and 2 ranks, and the overlap of the gradient
all-reduce with backward (chapter 04).

An MLP 784-1024-1024-1024-10 (3 M parameters, 12 MB of float32 gradients) takes SGD steps on a
global batch of 128, split across the ranks. Per world size, interleaved: the step with no
communication (``no_sync``: what the compute costs), DDP with 2 MB buckets (all-reduces start
during backward), and DDP with one bucket (a single all-reduce once backward is done). Speed-up is
the 1-rank step without DDP over the N-rank bucketed step. The timeline of one bucketed backward
shows when each bucket's all-reduce started and when it was found finished.

``python benchmarks/bench_ddp.py``: the script starts ``mpiexec -n 1`` and ``-n 2`` on itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy

import minigrad
import minigrad.distributed as dist
from mpi_timing import interleaved  # benchmarks/ is on sys.path when a script runs
from minigrad import nn, optim

BATCH, BUCKET_MB = 128, 2.0


def mlp() -> nn.Module:
    minigrad.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def worker(repeats: int, steps: int) -> None:
    dist.init_process_group("mpi")
    n, rank = dist.get_world_size(), dist.get_rank()
    rng = numpy.random.default_rng(rank)
    x = minigrad.tensor(rng.standard_normal((BATCH // n, 784)).astype(numpy.float32))
    y = minigrad.tensor(rng.integers(0, 10, BATCH // n))
    loss_fn = nn.CrossEntropyLoss()
    marks: dict[str, float] = {}

    def make_step(model: nn.Module, sync: bool = True):
        opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step() -> None:
            opt.zero_grad()
            if sync:
                loss = loss_fn(model(x), y)
                marks["backward"] = time.perf_counter()
                loss.backward()
                marks["end"] = time.perf_counter()
            else:
                with model.no_sync():
                    loss_fn(model(x), y).backward()
            opt.step()

        return step

    bucketed = dist.DistributedDataParallel(mlp(), bucket_cap_mb=BUCKET_MB)
    runs = {"compute only": make_step(dist.DistributedDataParallel(mlp()), sync=False),
            "bucketed": make_step(bucketed),
            "one bucket": make_step(dist.DistributedDataParallel(mlp(), bucket_cap_mb=1e6))}
    if n == 1:
        runs["no DDP"] = make_step(mlp())
    ms = interleaved(runs, repeats, steps)
    runs["bucketed"]()  # one more, for its timeline
    start = marks["backward"]
    timeline = [(event, bucket, (t - start) * 1e3) for event, bucket, t in bucketed.timeline]
    if rank == 0:
        print(json.dumps({"ranks": n, "ms": ms, "buckets": len(bucketed.bucket_names()),
                          "timeline": timeline, "backward_ms": (marks["end"] - start) * 1e3}))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (median taken)")
    parser.add_argument("--steps", type=int, default=3, help="steps per repeat")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.repeats, args.steps)
        return
    if not dist.is_available() or dist.launcher.find_mpiexec() is None:
        print("bench_ddp: needs mpi4py and mpiexec (pip install 'minigrad[mpi]'); skipped")
        return
    results = {}
    for ranks in (1, 2):
        job = dist.launch(__file__, ranks, ["--worker", "--repeats", str(args.repeats), "--steps", str(args.steps)],
                          timeout=600)
        if job.returncode != 0:
            sys.exit(f"bench_ddp: the {ranks}-rank job failed:\n{job.stdout}\n{job.stderr}")
        results[ranks] = json.loads(job.stdout.strip().splitlines()[-1])

    base = results[1]["ms"]["no DDP"]
    print(f"bench_ddp: MLP 784-1024x3-10, SGD step on a global batch of {BATCH}; median of "
          f"{args.repeats} interleaved repeats x {args.steps} steps, ms per step")
    print()
    print(f"{'ranks':>5} {'batch/rank':>10} {'no DDP':>9} {'compute only':>13} {f'{BUCKET_MB:g} MB buckets':>13}"
          f" {'one bucket':>11} {'speed-up':>9}")
    for ranks, r in results.items():
        ms = r["ms"]
        no_ddp = f"{ms['no DDP']:9.1f}" if "no DDP" in ms else f"{'':9}"
        print(f"{ranks:5d} {BATCH // ranks:10d} {no_ddp} {ms['compute only']:13.1f} {ms['bucketed']:13.1f}"
              f" {ms['one bucket']:11.1f} {base / ms['bucketed']:8.2f}x")
    r = results[2]
    print()
    print(f"one bucketed backward on rank 0 of 2 ({r['buckets']} buckets), ms from the start of "
          f"backward (which took {r['backward_ms']:.1f} ms):")
    for event, bucket, t in r["timeline"]:
        if event != "start":
            print(f"  bucket {bucket}: {event:6} at {t:7.1f}")


if __name__ == "__main__":
    main()
