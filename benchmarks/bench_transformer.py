"""A small GPT's training step: minigrad eager and compiled vs PyTorch eager and torch.compile, and its memory.

The model (chapter 02's attention, chapter 03's compile and checkpointing): a character-level GPT
on ``data/gradients.txt`` (a short public-domain text written for these benchmarks), context 64,
width 128, 4 heads, ``--layers`` pre-norm blocks (causal self-attention and a GELU MLP, each in
a residual), a final LayerNorm and a linear head. GELU is GPT-2's tanh form: the exact one calls
erf, which numpy lacks, and minigrad's float64 erf took over half of an eager step here. A step
is forward, cross-entropy on the next character, backward and AdamW, on one fixed batch of
``--batch`` windows.

(a) Tokens per second (batch x context / step time), median of interleaved repeats: minigrad
eager, ``minigrad.compile`` of the whole step (after one eager warm-up step, so that AdamW's
moments exist before the trace), PyTorch eager with the same initial weights, and PyTorch with
``torch.compile`` of the model (inductor compiles C++ on the first call; when it fails, the
reason is printed and its column left out). The first steps are checked to agree: compiled with
eager minigrad, minigrad with PyTorch. AdamW's step count is a tensor, so the compiled step
computes each step's own bias correction, as eager does.

(b) Activation memory of forward + backward (minigrad's tracker): all kept, and the checkpoint
plans ``memory.plan`` finds over the chain of blocks for 50% and 25% of the all-kept peak (the
embedding, head and loss are paid first, as in ``bench_memory.py``), with their step times.

``python benchmarks/bench_transformer.py [--steps N] [--repeats R] [--layers L] [--batch B]``.
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

from common import conditions, interleaved, torch  # first: sets BLAS threads before numpy

import numpy

import minigrad
from minigrad import memory

TEXT = Path(__file__).resolve().parent / "data" / "gradients.txt"
CONTEXT, WIDTH, HEADS = 64, 128, 4
PLAN_BUDGETS = (0.5, 0.25)


def gpt(lib, vocab: int, layers: int, width: int = WIDTH, heads: int = HEADS, context: int = CONTEXT):
    """``Sequential(embedding, Sequential(*blocks), head)`` in ``lib`` (minigrad or torch), each
    block a ``Sequential`` of its two residual halves (the planner's layers); the same module
    names in both, so a state_dict moves across as is."""
    nn, F = lib.nn, lib.nn.functional

    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)

        def forward(self, idx):
            return self.tokens(idx) + self.positions(lib.arange(idx.shape[1]))

    class Attention(nn.Module):  # x + causal self-attention of LayerNorm(x)
        def __init__(self):
            super().__init__()
            self.ln, self.qkv, self.proj = nn.LayerNorm(width), nn.Linear(width, 3 * width), nn.Linear(width, width)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = (z.reshape(b, t, heads, c // heads).transpose(1, 2)
                       for z in self.qkv(self.ln(x)).chunk(3, dim=-1))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return x + self.proj(y.transpose(1, 2).reshape(b, t, c))

    class MLP(nn.Module):  # x + a GELU MLP of LayerNorm(x)
        def __init__(self):
            super().__init__()
            self.ln, self.fc, self.out = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            return x + self.out(F.gelu(self.fc(self.ln(x)), approximate="tanh"))

    head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, vocab, bias=False))
    return nn.Sequential(Embed(), nn.Sequential(*[nn.Sequential(Attention(), MLP()) for _ in range(layers)]), head)


def batch(batch_size: int, context: int = CONTEXT, seed: int = 0) -> tuple[numpy.ndarray, numpy.ndarray, int]:
    """``batch_size`` random windows of the text as character ids, the next characters as targets,
    and the vocabulary's size."""
    text = TEXT.read_text(encoding="utf-8")
    chars = sorted(set(text))
    ids = numpy.array([chars.index(ch) for ch in text], dtype=numpy.int64)
    starts = numpy.random.default_rng(seed).integers(0, len(ids) - context - 1, batch_size)
    windows = numpy.stack([ids[s:s + context + 1] for s in starts])
    return windows[:, :-1], windows[:, 1:], len(chars)


def with_blocks(model, blocks):
    """The model's forward with ``blocks`` (a checkpoint plan over ``model[1]``) running its blocks."""
    return lambda idx: model[2](blocks(model[0](idx)))


def loss_of(lib, forward, idx, targets):
    """Cross-entropy of the next character, ``forward`` giving the logits (the model, or another
    way of running it)."""
    logits = forward(idx)
    return lib.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_step(lib, model, idx, targets, forward=None):
    """One training step with AdamW; ``forward`` replaces ``model`` in the loss (torch.compile's)."""
    opt = (minigrad.optim if lib is minigrad else torch.optim).AdamW(model.parameters(), lr=1e-3)
    forward = forward or model

    def step():
        opt.zero_grad()
        loss = loss_of(lib, forward, idx, targets)
        loss.backward()
        opt.step()
        return loss

    return step


def minigrad_steps(layers: int, idx0, targets0, vocab: int, compiled: bool):
    """A fresh model (seed 0) and its step, eager or compiled; the compiled one has run its warm-up
    and its trace, so the losses returned are those of two steps."""
    minigrad.manual_seed(0)
    model = gpt(minigrad, vocab, layers)
    step = make_step(minigrad, model, minigrad.tensor(idx0), minigrad.tensor(targets0))
    losses = [step().item()]  # the warm-up: AdamW's moments exist before the trace
    if compiled:
        step = minigrad.compile(step)
    losses.append(step().item())  # the compiled step traces here
    return model, step, losses


def contenders(layers: int, idx0, targets0, vocab: int) -> dict:
    """The steps to time, each checked against eager minigrad on its first three losses."""
    minigrad.manual_seed(0)  # the initial weights of minigrad_steps' models, for PyTorch's
    state = {k: v.numpy() for k, v in gpt(minigrad, vocab, layers).state_dict().items()}
    _, eager, losses = minigrad_steps(layers, idx0, targets0, vocab, compiled=False)
    _, compiled, compiled_losses = minigrad_steps(layers, idx0, targets0, vocab, compiled=True)
    losses.append(eager().item())
    compiled_losses.append(compiled().item())  # the first replay: the step after the trace
    numpy.testing.assert_allclose(compiled_losses, losses, rtol=1e-4)
    runs = {"minigrad": eager, "compiled": compiled}
    if torch is None:
        return runs
    for name in ("torch", "torch.compile"):
        twin = gpt(torch, vocab, layers)
        twin.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
        step = make_step(torch, twin, torch.tensor(idx0), torch.tensor(targets0),
                         torch.compile(twin) if name == "torch.compile" else None)
        start = time.perf_counter()
        try:
            twin_losses = [step().item() for _ in range(3)]
        except Exception as e:  # inductor needs a working C++ toolchain; say why and go on without it
            if name == "torch":
                raise
            print(f"{name} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        if name == "torch.compile":
            print(f"torch.compile: its first steps (compiling) took {time.perf_counter() - start:.1f} s")
        numpy.testing.assert_allclose(twin_losses, losses, rtol=1e-3)  # the same computation
        runs[name] = step
    return runs


def speed_table(ms: dict, tokens: int) -> list[str]:
    lines = [f"{'':16}{'ms per step':>14}{'tokens/s':>12}{'vs minigrad':>14}"]
    for name, t in ms.items():
        lines.append(f"{name:16}{t:14.1f}{tokens / t * 1e3:12.0f}{ms['minigrad'] / t:13.2f}x")
    if "torch" in ms:
        lines.append(f"minigrad / torch: {ms['minigrad'] / ms['torch']:.2f}x the time; compiled / torch: "
                     f"{ms['compiled'] / ms['torch']:.2f}x")
        if "torch.compile" in ms:
            lines.append(f"compiled / torch.compile: {ms['compiled'] / ms['torch.compile']:.2f}x the time")
    else:
        lines.append("torch is not installed: minigrad's figures only (make torch installs it)")
    return lines


def activation_peak(model, run) -> int:
    model.zero_grad()  # the last step's gradients go before the tracker starts
    gc.collect()
    with memory.track() as mem:
        run()
    return mem.activation_peak


def memory_rows(layers: int, idx0, targets0, vocab: int, repeats: int, steps: int) -> list[str]:
    minigrad.manual_seed(0)
    model = gpt(minigrad, vocab, layers)
    idx, targets = minigrad.tensor(idx0), minigrad.tensor(targets0)

    def backward(blocks=None):
        forward = with_blocks(model, blocks) if blocks is not None else model
        return lambda: loss_of(minigrad, forward, idx, targets).backward()

    runs = {"all kept": backward()}
    runs["all kept"]()  # warm-up
    base = activation_peak(model, runs["all kept"])
    with minigrad.no_grad():
        h = model[0](idx)
    costs = memory.planner.measure(memory.planner.layers_of(model[1]), h)
    rest = base - memory.planner.kept_peak(costs)  # embedding, head and loss
    lines = []
    for fraction in PLAN_BUDGETS:
        try:
            plan = memory.plan(model[1], h, int(fraction * base) - rest, costs)
        except ValueError as e:
            lines.append(f"plan {fraction:.0%}: no plan fits ({e})")
            continue
        runs[f"plan {fraction:.0%}"] = backward(plan)
        lines.append(f"plan {fraction:.0%}: {plan!r}, recomputes {plan.recompute_counts()}")
    ms = interleaved(runs, repeats, steps)
    table = [f"{'':16}{'activations':>21}{'ms fwd+bwd':>18}"]
    for name, run in runs.items():
        act = activation_peak(model, run)
        table.append(f"{name:16}{act / 1e6:11.1f} MB {act / base:5.2f}x"
                     f"{ms[name]:11.1f} {ms[name] / ms['all kept']:5.2f}x")
    return table + lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="steps per repeat")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (median taken)")
    parser.add_argument("--layers", type=int, default=4, help="transformer blocks (2-4)")
    parser.add_argument("--batch", type=int, default=16, help="windows of 64 characters per step")
    args = parser.parse_args()
    idx0, targets0, vocab = batch(args.batch)
    print(f"bench_transformer: GPT with {args.layers} blocks, width {WIDTH}, {HEADS} heads, context {CONTEXT}, "
          f"{vocab} characters, batch {args.batch}; AdamW step")
    print(f"median of {args.repeats} interleaved repeats x {args.steps} steps; {conditions()}")
    print()
    print("(a) training step")
    runs = contenders(args.layers, idx0, targets0, vocab)
    for line in speed_table(interleaved(runs, args.repeats, args.steps), args.batch * CONTEXT):
        print(line)
    print()
    print("(b) activation memory, forward + backward, with memory.plan over the blocks")
    for line in memory_rows(args.layers, idx0, targets0, vocab, args.repeats, args.steps):
        print(line)


if __name__ == "__main__":
    main()
