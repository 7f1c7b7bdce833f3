"""minigrad.distributed: real MPI jobs (mpiexec -n 2 and -n 4) running tests/distributed/checks.py,
plus the parts that need no job (sampler, schedules' arithmetic, error messages).

Each job runs several sections and prints "ok <section>" for each; a failed check on any rank
aborts the job with that rank's traceback, which the failing test shows. Every launch has a
timeout, so a deadlock fails a test instead of hanging the suite.
"""

import functools
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import minigrad
import minigrad.distributed as dist
from minigrad import nn
from minigrad.data import DataLoader, TensorDataset
from minigrad.distributed import launcher as launch_module

HERE = Path(__file__).resolve().parent
needs_mpi = pytest.mark.skipif(
    not dist.is_available() or launch_module.find_mpiexec() is None,
    reason="needs mpi4py and mpiexec: pip install 'minigrad[mpi]'",
)
SECTIONS = {2: ["collectives", "ring_bytes", "ddp", "bubble", "model_parallel"],
            4: ["collectives", "ring_bytes", "ddp", "pipeline", "model_parallel"]}


@functools.lru_cache(maxsize=None)
def job(nprocs: int) -> subprocess.CompletedProcess:
    """One launch per world size, shared by the tests that read its sections."""
    return dist.launch(HERE / "checks.py", nprocs, SECTIONS[nprocs], timeout=120)


def passed(nprocs: int, section: str) -> None:
    result = job(nprocs)
    if f"ok {section}\n" not in result.stdout:
        pytest.fail(f"section {section} failed on {nprocs} ranks (exit {result.returncode}):\n"
                    f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")


@needs_mpi
@pytest.mark.parametrize("nprocs", [2, 4])
def test_collectives_equal_numpy_on_every_rank(nprocs):
    # all_reduce (every op) and ring_all_reduce on odd sizes and dtypes, broadcast, all_gather,
    # reduce_scatter, send/recv and their async forms; mismatched shapes raise a ShapeError
    passed(nprocs, "collectives")


@needs_mpi
@pytest.mark.parametrize("nprocs", [2, 4])
def test_ring_sends_2_n_minus_1_over_n_of_the_tensor(nprocs):
    passed(nprocs, "ring_bytes")


@needs_mpi
@pytest.mark.parametrize("nprocs", [2, 4])
def test_ddp_matches_one_process_with_the_full_batch(nprocs):
    # one bucket and one bucket per parameter, with and without no_sync accumulation; the
    # parameters agree across ranks after every step; an unused parameter is reported
    passed(nprocs, "ddp")


@needs_mpi
def test_gpipe_gradients_equal_sequential_gradients():
    passed(4, "pipeline")


@needs_mpi
def test_gpipe_bubble_falls_as_microbatches_grow():
    passed(2, "bubble")  # also checks the gradients, on 2 stages
    print(job(2).stdout)


@needs_mpi
@pytest.mark.parametrize("nprocs", [2, 4])
def test_column_and_row_parallel_linear_equal_the_full_layer(nprocs):
    passed(nprocs, "model_parallel")


@needs_mpi
def test_a_rank_that_raises_ends_the_job_nonzero():
    start = time.perf_counter()
    result = dist.launch(HERE / "fail.py", 2, timeout=60)
    assert result.returncode != 0
    assert "rank 1 fails on purpose" in result.stderr and "[rank 1]" in result.stderr
    assert time.perf_counter() - start < 60


ABRUPT = r"rank 1.* ended .*\(os\._exit, a signal or a crash\)"
EXITED = r"\[rank 0\] rank 1 exited \(sys.exit or the end of its script\) without destroy_process_group\(\)"


@needs_mpi
@pytest.mark.parametrize("how, message", [
    ("raise", r"\[rank 1\] uncaught ValueError: rank 1 fails on purpose; ending the job"),
    ("exit0", EXITED), ("exit1", EXITED), ("end", EXITED), ("os_exit", ABRUPT), ("SIGKILL", ABRUPT),
    ("SIGTERM", r"\[rank 1\] received SIGTERM; ending the job"),
    ("SIGINT", r"\[rank 1\] received SIGINT; ending the job"),
    ("finally_destroy", r"\[rank 1\] ValueError raised, passing through destroy_process_group\(\)"),
    ("finally_barrier", r"\[rank 1\] ValueError raised, passing through barrier\(\)"),
    ("leave_loop", r"\[rank 0\] rank 1 left the process group \(destroy_process_group\(\)\) while rank 0 waits"),
], ids=lambda v: v if v.isidentifier() else "")
def test_a_rank_that_leaves_early_ends_the_job_naming_it(how, message):
    result = dist.launch(HERE / "leave.py", 2, [how], timeout=60)  # a hang fails here, after 60 s
    assert result.returncode != 0
    assert re.search(message, result.stderr), result.stderr


@needs_mpi
def test_both_ranks_ending_with_the_group_up_is_a_normal_exit():
    result = dist.launch(HERE / "leave.py", 2, ["normal"], timeout=60)
    assert result.returncode == 0, result.stderr


@needs_mpi
def test_collectives_time_out_and_wait_without_spinning():
    result = dist.launch(HERE / "leave.py", 2, ["sleep", "2"], timeout=60)
    assert result.returncode != 0
    assert re.search(r"DistributedError: all_\w+: rank 0 timed out after 2 s", result.stderr), result.stderr
    waited, cpu = map(float, re.search(r"rank 0 waited ([\d.]+) s using ([\d.]+) s of CPU", result.stdout).groups())
    assert waited >= 2 and cpu < 0.5 * waited  # a spinning wait uses a whole core


def test_launch_kills_a_job_that_runs_past_its_timeout(tmp_path, monkeypatch):
    script = tmp_path / "sleepy.py"
    script.write_text("import time\ntime.sleep(60)\n")
    # the launcher's process-group kill does not depend on MPI: stand a plain shell in for mpiexec
    fake = tmp_path / "mpiexec"
    fake.write_text('#!/bin/sh\nshift 2\nexec "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setattr(launch_module, "find_mpiexec", lambda: str(fake))
    with pytest.raises(subprocess.TimeoutExpired):
        dist.launch(script, 1, timeout=1)


def test_launch_without_mpiexec_says_how_to_install(monkeypatch):
    monkeypatch.setattr(launch_module, "find_mpiexec", lambda: None)
    with pytest.raises(FileNotFoundError, match=r"minigrad\[mpi\]"):
        dist.launch("train.py", 2)


def test_init_without_mpi4py_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    monkeypatch.delitem(sys.modules, "minigrad.distributed.mpi_backend", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'minigrad\[mpi\]'"):
        dist.init_process_group("mpi")
    assert not dist.is_initialized()


def test_calls_before_init_raise():
    with pytest.raises(RuntimeError, match="init_process_group"):
        dist.get_rank()
    with pytest.raises(RuntimeError, match="init_process_group"):
        dist.all_reduce(minigrad.ones(2))
    with pytest.raises(ValueError, match="unknown backend"):
        dist.init_process_group("carrier-pigeon")


# -- DistributedSampler ---------------------------------------------------------------------------
@pytest.mark.parametrize("n, replicas", [(10, 3), (12, 4), (2, 4), (7, 2)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_matches_torch_without_shuffle(n, replicas, drop_last):
    pytest.importorskip("torch")
    from torch.utils.data import DistributedSampler as TorchSampler

    for rank in range(replicas):
        ours = dist.DistributedSampler(range(n), replicas, rank, shuffle=False, drop_last=drop_last)
        theirs = TorchSampler(range(n), replicas, rank, shuffle=False, drop_last=drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)


@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_shards_one_permutation_per_epoch(drop_last):
    n, replicas = 11, 4
    def shards(epoch):
        out = []
        for r in range(replicas):
            s = dist.DistributedSampler(range(n), replicas, r, seed=5, drop_last=drop_last)
            s.set_epoch(epoch)
            out.append(list(s))
        return out

    first = shards(0)
    assert len({len(s) for s in first}) == 1  # every rank takes as many steps
    every = [i for s in first for i in s]
    if drop_last:
        assert len(every) == 8 and len(set(every)) == 8
    else:
        assert len(every) == 12 and set(every) == set(range(n))  # padded with a repeated index
    assert shards(0) == first and shards(1) != first


def test_sampler_feeds_a_dataloader():
    data = TensorDataset(np.arange(10, dtype=np.float32))
    loader = DataLoader(data, batch_size=2, sampler=dist.DistributedSampler(data, 2, 1, shuffle=False))
    assert [b[0].tolist() for b in loader] == [[1.0, 3.0], [5.0, 7.0], [9.0]]


def test_sampler_rejects_a_bad_rank():
    with pytest.raises(ValueError, match=r"rank 3.*\[0, 2\]"):
        dist.DistributedSampler(range(5), 3, 3)


# -- pipeline helpers -----------------------------------------------------------------------------
def test_gpipe_bubble_theory():
    assert dist.gpipe_bubble(1, 1) == 0
    assert dist.gpipe_bubble(4, 1) == pytest.approx(3 / 4)
    assert dist.gpipe_bubble(4, 13) == pytest.approx(3 / 16)


def test_split_sequential():
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(5)])
    stages = dist.split_sequential(model, 2)
    assert [len(s) for s in stages] == [3, 2]
    assert stages[1][0] is model[3]
    assert [len(s) for s in dist.split_sequential(model, 2, balance=[1, 4])] == [1, 4]
    with pytest.raises(ValueError, match="balance"):
        dist.split_sequential(model, 2, balance=[1, 1])
