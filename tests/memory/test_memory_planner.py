"""The checkpoint planner (minigrad.memory.planner): gradients bitwise those of no checkpointing,
the tracker's activation peak within the budget and equal to the plan's prediction, and the
dynamic programme's plan as cheap as the best one found by trying them all (chapter 03)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minigrad
from minigrad import backend, memory, nn
from minigrad.memory.planner import LayerCost, Plan, kept_peak, layers_of, predicted_peak, rerun, solve

LAYERS = {
    "linear": lambda w: nn.Linear(w, w, dtype=backend.float64),
    "relu": lambda w: nn.ReLU(),
    "tanh": lambda w: nn.Tanh(),
    "dropout": lambda w: nn.Dropout(0.3),
    "layernorm": lambda w: nn.LayerNorm(w, dtype=backend.float64),
}


def chain(kinds: list[str], width: int) -> nn.Sequential:
    minigrad.manual_seed(0)
    return nn.Sequential(*[LAYERS[k](width) for k in kinds])


def run(model: nn.Module, x: minigrad.Tensor, forward) -> tuple[list[np.ndarray], int]:
    """Gradients of the parameters and the input from seed 1, and the step's activation peak."""
    model.zero_grad()
    x = x.detach().requires_grad_()
    seed = minigrad.ones(8, x.shape[1], dtype=backend.float64)
    minigrad.manual_seed(1)
    with memory.track() as mem:
        forward(x).backward(seed)
    return [p.grad.array.copy() for p in model.parameters()] + [x.grad.array.copy()], mem.activation_peak


@settings(max_examples=15, deadline=None)
@given(kinds=st.lists(st.sampled_from(sorted(LAYERS)), min_size=2, max_size=7),
       fraction=st.floats(0.1, 1.0))
def test_plan_keeps_gradients_and_budget(kinds: list[str], fraction: float) -> None:
    model = chain(kinds, 16)
    x = minigrad.randn(8, 16, dtype=backend.float64)
    expected, _ = run(model, x, model)
    costs = memory.planner.measure(layers_of(model), x)
    budget = int(fraction * kept_peak(costs))
    try:
        plan = memory.plan(model, x, budget, costs)
    except ValueError:
        assert budget < kept_peak(costs)  # else keeping everything would do
        return
    grads, peak = run(model, x, plan)
    for g, e in zip(grads, expected):
        np.testing.assert_array_equal(g, e)
    assert peak <= plan.peak <= budget  # the model rounds up: a dropout mask may be gone sooner


@pytest.mark.parametrize("fraction", [0.3, 0.35])
def test_nested_plans_keep_gradients_and_budget(fraction: float) -> None:
    """Small budgets nest recomputed ranges: an inner range's backward runs while the outer one's
    recomputed output is gone (only the chain's output, held by the caller, stays alive)."""
    model = chain(["linear", "relu"] * 10, 16)
    x = minigrad.randn(8, 16, dtype=backend.float64)
    expected, _ = run(model, x, model)
    costs = memory.planner.measure(layers_of(model), x)
    plan = memory.plan(model, x, int(fraction * kept_peak(costs)), costs)
    assert max(plan.recompute_counts()) >= 2
    grads, peak = run(model, x, plan)
    for g, e in zip(grads, expected):
        np.testing.assert_array_equal(g, e)
    assert peak <= plan.peak <= fraction * kept_peak(costs)


def test_a_range_ending_on_a_linear_does_not_recompute_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linear's backward reads its input and weight, not its output: backward recomputes a range
    that ends on a kept Linear up to that Linear's input only, with gradients bitwise unchanged,
    in both bindings (the tracker makes the engine bind Tensors) and when the weight is shared."""
    from minigrad.ops import linalg

    model = chain(["linear", "relu"] * 3 + ["linear"], 16)
    model[4] = model[2]  # a weight read twice inside one range: its two gradients add up
    x = minigrad.randn(8, 16, dtype=backend.float64)
    expected, _ = run(model, x, model)
    keep = [("keep", i) for i in range(7)]
    plan = Plan(layers_of(model), [("keep", 0), ("recompute", 1, 7, Plan(layers_of(model), keep[1:], 0, 0.0))], 0, 0.0)
    calls, forward = [], linalg.Linear.forward
    monkeypatch.setattr(linalg.Linear, "forward", staticmethod(lambda ctx, *a: calls.append(1) or forward(ctx, *a)))
    grads, _ = run(model, x, plan)  # under the tracker: the Tensor binding
    assert len(calls) == 4 + 2  # the first run, then the range's two Linears before its last
    for g, e in zip(grads, expected):
        np.testing.assert_array_equal(g, e)
    model.zero_grad()
    calls.clear()
    leaf = x.detach().requires_grad_()
    minigrad.manual_seed(1)
    plan(leaf).backward(minigrad.ones(8, 16, dtype=backend.float64))  # no mode: the array binding
    assert len(calls) == 4 + 2
    for g, e in zip([p.grad.array for p in model.parameters()] + [leaf.grad.array], expected):
        np.testing.assert_array_equal(g, e)


def test_layers_that_are_plain_functions() -> None:
    """A range with a layer that is not a Module is checkpointed the general way (its first run
    records a graph to find what it reads); gradients are still those of no checkpointing."""
    model = chain(["linear", "tanh"] * 6, 16)
    layers = [layer if i % 4 else (lambda h: h.tanh() * 0.5) for i, layer in enumerate(model, 1)]
    x = minigrad.randn(8, 16, dtype=backend.float64)

    def forward(h: minigrad.Tensor) -> minigrad.Tensor:
        for layer in layers:
            h = layer(h)
        return h

    expected, _ = run(model, x, forward)
    costs = memory.planner.measure(layers, x)
    plan = memory.plan(layers, x, 0.6, costs)
    assert any(n and not isinstance(layers[i], nn.Module) for i, n in enumerate(plan.recompute_counts()))
    grads, peak = run(model, x, plan)
    for g, e in zip(grads, expected):
        np.testing.assert_array_equal(g, e)
    assert peak <= plan.peak


def test_all_kept_prediction_is_the_tracker_figure() -> None:
    model = chain(["linear", "relu", "layernorm", "tanh", "dropout", "linear"], 32)
    x = minigrad.randn(8, 32, dtype=backend.float64)
    costs = memory.planner.measure(layers_of(model), x)
    assert run(model, x, model)[1] == kept_peak(costs)
    plan = memory.plan(model, x, 1.0, costs)
    assert plan.recompute_counts() == [0] * 6 and plan.extra_time == 0


def test_measure_leaves_the_random_state() -> None:
    model = chain(["linear", "dropout", "linear", "dropout"], 8)
    x = minigrad.randn(4, 8, dtype=backend.float64)
    minigrad.manual_seed(3)
    memory.planner.measure(layers_of(model), x)
    after = minigrad.rand(5).array
    minigrad.manual_seed(3)
    np.testing.assert_array_equal(after, minigrad.rand(5).array)


def test_selective_recompute_of_cheap_layers() -> None:
    """With matmuls dear and norms, tanh and dropout cheap, a budget of 80% is met by recomputing
    cheap layers only: the matmuls' outputs are kept."""
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.Tanh(), nn.Dropout(0.1))
                            for _ in range(4)])
    layers = layers_of(model)
    x = minigrad.randn(64, 16)
    costs = [c._replace(time=1.0 if isinstance(layer, nn.Linear) else 0.01)
             for c, layer in zip(memory.planner.measure(layers, x), layers)]
    plan = memory.plan(model, x, 0.8, costs)
    recomputed = [layers[i] for i, count in enumerate(plan.recompute_counts()) if count]
    assert recomputed and not any(isinstance(layer, nn.Linear) for layer in recomputed)
    assert plan.peak <= 0.8 * kept_peak(costs) and plan.extra_time < 0.1


def brute_force(costs: list[LayerCost], budget: int, layers: list | None = None) -> float:
    """The least extra time over every plan (every nesting of recomputed ranges) within budget; a
    range reruns the layers ``rerun`` says (all, or all but a kept plain Linear at its end)."""
    n = len(costs)
    layers = list(range(n)) if layers is None else layers

    def plans(i: int, j: int, whole_allowed: bool):
        if i == j:
            yield []
            return
        for rest in plans(i + 1, j, True):
            yield [("keep", i)] + rest
        for k in range(i + 1, j + (1 if whole_allowed else 0)):
            for inner in plans(i, k, False):
                for rest in plans(k, j, True):
                    yield [("recompute", i, k, Plan(layers, inner, 0, 0.0))] + rest

    def extra(pieces: list) -> float:
        return sum(sum(costs[i].time for i in rerun(layers, p)) + extra(p[3].pieces) for p in pieces if p[0] != "keep")

    fits = [extra(p) for p in plans(0, n, False) if predicted_peak(Plan(layers, p, 0, 0.0), costs) <= budget]
    return min(fits, default=float("inf"))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 8), st.booleans(), st.integers(1, 6),
                          st.integers(1, 9), st.booleans()), min_size=1, max_size=5),
       st.integers(1, 40))
def test_dynamic_programme_matches_brute_force(layers: list[tuple], budget: int) -> None:
    """Layers are Linears or not: a range ending on a kept Linear does not rerun it."""
    unit = 1024  # sizes in whole units of the search, so that its rounding loses nothing
    costs, modules = [], []
    for peak, kept, keeps_input, output, time, linear in layers:
        inp = (costs[-1].output if costs else 4 * unit) if keeps_input else 0
        kept_bytes = kept * unit + inp
        costs.append(LayerCost(max(peak * unit, output * unit, kept_bytes - inp), kept_bytes, inp, 0,
                               output * unit, float(time)))
        modules.append(nn.Linear(1, 1) if linear else nn.Tanh())
    budget *= unit
    best = brute_force(costs, budget, modules)
    try:
        plan = solve(modules, costs, budget, units=budget // unit)
    except ValueError:
        assert best == float("inf")
        return
    assert predicted_peak(plan, costs) <= budget
    assert plan.extra_time == pytest.approx(best)
    assert plan.extra_time == pytest.approx(sum(n * c.time for n, c in zip(plan.recompute_counts(), costs)))


def test_the_estimate_is_what_backward_recomputes() -> None:
    """A range ending on a kept Linear reruns all but that Linear: the plan's recompute counts and
    extra time say so, and match the forward runs counted while backward runs. The search sees the
    saving too: with Linears dear, it ends its ranges on them."""
    model = chain(["linear", "tanh"] * 5 + ["linear"], 16)
    layers = layers_of(model)
    x = minigrad.randn(8, 16, dtype=backend.float64)
    costs = [c._replace(time=10.0 if isinstance(layer, nn.Linear) else 1.0)
             for c, layer in zip(memory.planner.measure(layers, x), layers)]
    plan = memory.plan(model, x, 0.6, costs)  # ranges in ranges: [[[0 1 2] 3 4] 5 6] 7 8 9 10
    counts = plan.recompute_counts()
    assert plan.extra_time == pytest.approx(sum(n * c.time for n, c in zip(counts, costs)))
    ends = [p[2] - 1 for p in plan.pieces if p[0] == "recompute" and rerun(layers, p).stop == p[2] - 1]
    assert ends and all(isinstance(layers[k], nn.Linear) for k in ends)  # it used the saving
    assert max(counts) >= 2 and counts[ends[0]] < counts[ends[0] - 1]
    runs = [0] * len(layers)
    for i, layer in enumerate(layers):
        layer.forward = (lambda f, i: lambda h: runs.__setitem__(i, runs[i] + 1) or f(h))(layer.forward, i)
    y = plan(x.detach().requires_grad_())
    assert runs == [1] * len(layers)
    y.backward(minigrad.ones(8, 16, dtype=backend.float64))
    assert [r - 1 for r in runs] == counts


def test_errors_name_the_budget() -> None:
    model = chain(["linear", "relu"], 8)
    x = minigrad.randn(4, 8, dtype=backend.float64)
    with pytest.raises(ValueError, match="within 10 bytes"):
        memory.plan(model, x, 10)
    with pytest.raises(ValueError, match=r"\(0, 1\], got 1.5"):
        memory.plan(model, x, 1.5)
    with pytest.raises(ValueError, match="one LayerCost per layer"):
        memory.plan(model, x, 0.5, [])


def test_draw_plan_is_deterministic() -> None:
    from minigrad.graph.viz import draw_plan

    model = chain(["linear", "relu", "linear", "relu", "linear", "relu", "linear"], 8)
    x = minigrad.randn(32, 8, dtype=backend.float64)
    costs = memory.planner.measure(layers_of(model), x)
    plan = memory.plan(model, x, 0.8, costs)
    source = draw_plan(plan).source
    assert source == draw_plan(memory.plan(model, x, 0.8, costs)).source
    assert source.count("cluster_") == str(plan).count("[") > 0
    assert all(f"L{i} " in source for i in range(7))
