"""Automatic pipeline partitioning (minigrad.graph.partition): the cut is the best one for the
costs it is given, the stages run one after another equal the model (values and gradients), the
DOT drawing is deterministic, and under MPI (mpiexec -n 2 and -n 4) the GPipe step on the
automatic stages equals one process's full-batch step to 1e-5."""

import itertools
from pathlib import Path

import numpy as np
import pytest

import minigrad
import minigrad.distributed as dist
from minigrad import nn
from minigrad.distributed import launcher
from minigrad.graph import trace
from minigrad.graph.partition import BACKWARD_FACTOR, PartitionError, node_costs, partition

HERE = Path(__file__).resolve().parent / "distributed"


class Residual(nn.Module):
    """A skip connection and the input read again at the end: values that pass through stages."""

    def __init__(self):
        super().__init__()
        self.inp, self.a, self.b = nn.Linear(6, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        h = self.inp(x).tanh()
        h = self.b(self.a(h).relu()) + h
        return self.out(h) + x[:, :3]


def model_and_input(seed=0):
    minigrad.manual_seed(seed)
    return Residual(), minigrad.randn(4, 6)


def run_stages(plan, x):
    """The stages one after another as GPipe runs them: each gets a detached copy of what the
    previous one sent, and backward hands each input's gradient back to the stage before."""
    ins, outs, h = [], [], x
    for s in range(plan.num_stages):
        h = h.detach().requires_grad_(s > 0)
        out = plan.stage_module(s)(h)
        ins.append(h)
        outs.append(out)
        h = out
    outs[-1].sum().backward()
    for s in range(plan.num_stages - 2, -1, -1):
        outs[s].backward(ins[s + 1].grad)
    return outs[-1]


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("measured", [False, True])
def test_stages_run_in_turn_equal_the_model(stages, measured):
    model, x = model_and_input()
    plan = partition(trace(model, x), stages, [x] if measured else None)
    got = run_stages(plan, x)
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    model.zero_grad()
    want = model(x)
    want.sum().backward()
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-6, atol=1e-6)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_the_cut_minimises_the_slowest_stage():
    model, x = model_and_input()
    graph = trace(model, x).graph
    rng = np.random.default_rng(1)
    for trial in range(5):
        ops = [n for n in graph.topological_order() if n.fn is not None]
        costs = dict(zip(ops, rng.uniform(1e-4, 1e-3, len(ops))))
        for stages in (2, 3):
            plan = partition(graph, stages, costs=costs)
            worst = max(s.total_s for s in plan.stages)
            every = [max(s.total_s for s in partition(graph, stages, costs=costs, cuts=list(c)).stages)
                     for c in itertools.combinations(range(1, len(plan.order)), stages - 1)]
            assert worst == pytest.approx(min(every)), (trial, stages)
            # a cut by equal node counts is never better
            even = [len(plan.order) * k // stages for k in range(1, stages)]
            assert worst <= max(s.total_s for s in partition(graph, stages, costs=costs, cuts=even).stages)


def test_costs_bytes_and_what_crosses_a_cut():
    model, x = model_and_input()
    graph = trace(model, x).graph
    costs = node_costs(graph)  # estimated: every op node, positive
    assert costs and all(c > 0 for c in costs.values())
    plan = partition(graph, 2, costs=costs, cuts=[2])  # after inp's tanh: the hidden value and the input
    assert [n.op for n in plan.live[1]] == ["placeholder", "Tanh"]
    assert plan.stages[0].send_bytes == plan.stages[1].recv_bytes == 4 * (4 * 6 + 4 * 16)
    assert plan.stages[0].recv_bytes == 0 == plan.stages[1].send_bytes
    total = sum(costs.values()) * BACKWARD_FACTOR
    assert sum(s.compute_s for s in plan.stages) == pytest.approx(total)


def test_the_bubble_of_equal_stages_is_gpipes():
    model, x = model_and_input()
    plan = partition(trace(model, x), 3)
    for s in plan.stages:
        s.compute_s, s.link_s = 1.0, 0.0
    for m in (1, 4, 8):
        assert plan.bubble(m) == pytest.approx(dist.gpipe_bubble(3, m))
    plan.stages[1].compute_s = 2.0  # a slow middle stage sets the pace: the others wait more
    assert plan.bubbles(4)[1] < plan.bubbles(4)[0] and plan.bubble(4) > dist.gpipe_bubble(3, 4)
    assert "bubble with M=4" in plan.report(4)


def test_the_drawing_is_deterministic_and_coloured_by_stage():
    texts = []
    for _ in range(2):
        model, x = model_and_input()
        plan = partition(trace(model, x), 2, cuts=[3])
        texts.append(plan.to_dot())
    assert texts[0] == texts[1] and "0x" not in texts[0]
    assert "cluster_stage0" in texts[0] and "cluster_stage1" in texts[0]
    crossing = sum(1 for n in plan.live[1] for u in n.users if plan.stage_of(u) == 1)
    assert crossing >= 2 and texts[0].count('color="#d7301f"') == crossing  # red: the edges that send/recv
    assert '"#9ecae1"' in texts[0] and '"#fdd49e"' in texts[0]


def test_graphs_a_pipeline_cannot_run_are_refused():
    model, x = model_and_input()
    graph = trace(model, x).graph
    with pytest.raises(PartitionError, match=r"1 to \d+ stages are possible, got num_stages=99"):
        partition(graph, 99)
    with pytest.raises(PartitionError, match=r"cuts \[3, 2\] must be 2 increasing positions"):
        partition(graph, 3, cuts=[3, 2])
    with pytest.raises(PartitionError, match="one input and one output, got 2 inputs"):
        partition(trace(lambda a, b: a * b, x, x.clone()), 2)
    bn = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4))
    with pytest.raises(PartitionError, match="in eval mode"):
        partition(trace(bn, x), 2)
    lin = nn.Linear(6, 6)
    tied = trace(lambda v: lin(lin(v).tanh()), x)
    with pytest.raises(PartitionError, match=r"parameter .* is read by stages \[0, 1\]"):
        partition(tied, 2, cuts=[2])
    ids = trace(lambda v: (v * 2).long().float() + v, x)
    with pytest.raises(PartitionError, match="floating point values only"):
        partition(ids, 2, cuts=[2])
    assert partition(ids, 2).cuts != [2]  # chosen, the cut goes where only floats are alive
    with pytest.raises(PartitionError, match="no cut into 4 stages sends floating point values only"):
        partition(ids, 4)  # 4 nodes: every cut needed, one of them through the integers


needs_mpi = pytest.mark.skipif(not dist.is_available() or launcher.find_mpiexec() is None,
                               reason="needs mpi4py and mpiexec: pip install 'minigrad[mpi]'")


@needs_mpi
@pytest.mark.parametrize("nprocs", [2, 4])
def test_automatic_stages_under_mpi_equal_one_process(nprocs):
    result = dist.launch(HERE / "autopipe_checks.py", nprocs, timeout=180)
    assert result.returncode == 0 and "ok autopipe\n" in result.stdout, result.stdout + result.stderr[-3000:]
