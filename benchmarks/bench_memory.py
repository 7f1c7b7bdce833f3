"""Gradient checkpointing, measured: activation memory against recomputation time.

Three models, each a list of n identical blocks run by ``checkpoint_sequential`` with segments in
{none, 2, 4, sqrt(n), n}, and by the plans ``memory.plan`` makes for budgets of 50% and 25% of the
all-kept activations; a step is forward, a mean-square loss and backward.
(a) MLP: 32 blocks of Linear(1024, 1024) + ReLU, batch 256.
(b) CNN: 25 blocks of Conv2d(16, 16, 3, padding=1) + BatchNorm2d + ReLU on 32x32 images, batch 8.
(c) tanh MLP: 32 blocks of Linear(512, 512) + Tanh, batch 2048 (tanh keeps its output for
backward, a whole float32 array where ReLU keeps a bool mask).

Memory comes from the tracker (``minigrad.memory.track``): "activations" is its activation peak,
the most bytes held at once by tensors the forward computation made (including the ones
checkpointing recomputes during backward, not the gradients); "step peak" is the whole step's
peak above what was alive before it (weights, data), gradients included; arrays an op keeps for
backward (ReLU's bool mask, the convolution's im2col columns) count too. Targets: with sqrt(n)
segments, activations at most 25% of no checkpointing's for at most 1.35x its step time; the plan
for 25% likewise: its activation peak, as the tracker measures it, within the 25% budget, for at
most 1.35x the step time (issue 19's figure, restated by issue 28: 1.25x is out of reach by
recomputation alone, since 25% of 32 block outputs leaves room for about 10 of them, and reversing
32 steps with 10 slots recomputes at least 0.78 of a forward pass: Griewank's *revolve* bound).
Under each table, the planner's cost model: the forward passes a plan recomputes (each layer's
forward time without a graph, measured alone) and the step time that predicts; at the end, every
target with met or not met.

``make bench``, or ``python benchmarks/bench_memory.py [--repeats R] [--steps N] [--width W]
[--tanh-width W] [--tanh-batch B] [--cases abc]``.
"""

from __future__ import annotations

import argparse
import gc
import math

from common import conditions, interleaved  # first: sets BLAS threads before numpy

import minigrad
from minigrad import memory, nn

MEMORY_TARGET, TIME_TARGET = 0.25, 1.35
PLAN_BUDGETS, PLAN_TIME_TARGET = (0.5, 0.25), 1.35  # the planner's budgets, fractions of all-kept activations


def mlp(blocks: int, width: int, activation: type = nn.ReLU) -> nn.Sequential:
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), activation()) for _ in range(blocks)])


def cnn(blocks: int, channels: int) -> nn.Sequential:
    return nn.Sequential(*[nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels),
                                         nn.ReLU()) for _ in range(blocks)])


def segment_counts(n: int) -> dict[str, int | None]:
    root = round(math.sqrt(n))
    return {"none": None, "2": 2, "4": 4, f"{root} (sqrt n)": root, f"{n} (n)": n}


def make_step(model: nn.Sequential, x: minigrad.Tensor, segments: int | memory.Plan | None):
    def step() -> None:
        model.zero_grad()  # gradients set to None: the step allocates them
        if isinstance(segments, memory.Plan):
            y = segments(x)
        else:
            y = model(x) if segments is None else memory.checkpoint_sequential(model, segments, x)
        (y * y).mean().backward()

    return step


def measure(model: nn.Module, step) -> tuple[int, int]:
    model.zero_grad()  # the last step's gradients go before the tracker starts, not inside
    gc.collect()
    with memory.track() as mem:
        step()
    return mem.activation_peak, mem.peak - mem.start


def case(title: str, model: nn.Sequential, x: minigrad.Tensor, repeats: int, steps: int,
         verdicts: list[str]) -> list[str]:
    """The table of one model; each target's line is also appended to ``verdicts``."""
    counts = segment_counts(len(model))
    runs = {name: make_step(model, x, s) for name, s in counts.items()}
    for run in runs.values():  # warm-up
        run()
    # The planner gets what a budget leaves once the loss's own activations are paid for.
    base_act = measure(model, runs["none"])[0]
    costs = memory.planner.measure(memory.planner.layers_of(model), x)
    loss_bytes = base_act - memory.planner.kept_peak(costs)
    plans = {f"plan {fraction:.0%}": memory.plan(model, x, int(fraction * base_act) - loss_bytes, costs)
             for fraction in PLAN_BUDGETS}
    for name, plan in plans.items():
        runs[name] = make_step(model, x, plan)
    ms = interleaved(runs, repeats, steps)
    mem = {name: measure(model, run) for name, run in runs.items()}
    base_act, base_peak = mem["none"]
    lines = [title, f"{'segments':14}{'activations':>22}{'step peak':>22}{'ms per step':>22}"]
    for name in runs:
        act, peak = mem[name]
        lines.append(f"{name:14}{act / 1e6:12.1f} MB {act / base_act:5.2f}x{peak / 1e6:12.1f} MB "
                     f"{peak / base_peak:5.2f}x{ms[name]:14.0f} {ms[name] / ms['none']:5.2f}x")
    forward = sum(c.time for c in costs)
    for name, plan in plans.items():
        lines.append(f"cost model, {name}: recomputes {plan.extra_time / forward:.2f} forward passes "
                     f"(layers up to {max(plan.recompute_counts())} times), {plan.extra_time * 1e3:.0f} ms: "
                     f"predicted {1 + plan.extra_time * 1e3 / ms['none']:.2f}x the step time")
    for name, time_target in ((next(name for name in runs if "sqrt" in name), TIME_TARGET),
                              (f"plan {MEMORY_TARGET:.0%}", PLAN_TIME_TARGET)):
        act_ratio, time_ratio = mem[name][0] / base_act, ms[name] / ms["none"]
        met = act_ratio <= MEMORY_TARGET and time_ratio <= time_target
        lines.append(f"target, {name}: activations <= {MEMORY_TARGET:.0%} for <= {time_target}x the time: "
                     f"{act_ratio:.1%} for {time_ratio:.3f}x ({'met' if met else 'not met'})")
        verdicts.append(f"{title.split(':')[0]} {lines[-1]}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (median taken)")
    parser.add_argument("--steps", type=int, default=2, help="steps per repeat")
    parser.add_argument("--width", type=int, default=1024, help="MLP width (batch 256)")
    parser.add_argument("--tanh-width", type=int, default=512, help="tanh MLP width")
    parser.add_argument("--tanh-batch", type=int, default=2048, help="tanh MLP batch")
    parser.add_argument("--cases", default="abc", help="which models to run, by letter (default abc: all)")
    args = parser.parse_args()
    minigrad.manual_seed(0)
    mlp_x = minigrad.randn(256, args.width)
    cnn_x = minigrad.randn(8, 16, 32, 32)
    tanh_x = minigrad.randn(args.tanh_batch, args.tanh_width)
    print("bench_memory: gradient checkpointing (checkpoint_sequential, and memory.plan to a budget), "
          "forward + backward")
    print(f"median of {args.repeats} interleaved repeats x {args.steps} steps; {conditions()}")
    verdicts: list[str] = []
    cases = [(f"(a) MLP: 32 x (Linear({args.width}, {args.width}) + ReLU), batch 256", mlp(32, args.width), mlp_x),
             ("(b) CNN: 25 x (Conv2d(16, 16, 3, padding=1) + BatchNorm2d + ReLU), 32x32, batch 8", cnn(25, 16), cnn_x),
             (f"(c) tanh MLP: 32 x (Linear({args.tanh_width}, {args.tanh_width}) + Tanh), batch {args.tanh_batch}",
              mlp(32, args.tanh_width, nn.Tanh), tanh_x)]
    cases = [c for c in cases if c[0][1] in args.cases]
    for k, (title, model, x) in enumerate(cases):
        if k:
            print()
        for line in case(title, model, x, args.repeats, args.steps, verdicts):
            print(line)
    print()
    print("targets (issue 19; the plan's time restated by issue 28):")
    for line in verdicts:
        print("  " + line)


if __name__ == "__main__":
    main()
