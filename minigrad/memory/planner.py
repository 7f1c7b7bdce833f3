"""Checkpointing to a memory budget: which activations to keep, which to recompute (chapter 03).

``checkpoint_sequential`` cuts a chain into equal segments whatever they cost. ``plan`` is given a
budget instead (bytes, or a fraction of the memory the chain's activations take when all are
kept) and chooses, layer by layer, what to keep and what to recompute, from each layer's measured
sizes and recompute cost, by dynamic programming over the chain as in Chen et al. 2016 ("Training
deep nets with sublinear memory cost") and Griewank's revolve:

- A plan for layers ``[i, j)`` is a list of pieces: a *kept* layer runs as usual and keeps what its
  backward needs; a *recomputed* range ``[i, k)`` runs under ``checkpoint`` and keeps only its
  output, and when backward reaches it, runs again under its own plan, which may recompute inside
  (recursive checkpointing, the multi-level schedule of revolve).
- A plan's peak is ``max`` over its pieces of (what the pieces before keep + that piece's peak); a
  recomputed range costs the forward time of its layers once more, plus its own plan's extra,
  less its last layer's when its plan keeps that layer and backward leaves it out (a plain
  ``nn.Linear``, whose backward reads its input, not its output: ``minigrad.memory.recompute``). Each
  layer runs once with autograd, before its backward; every other run is a recomputed range's,
  without a graph (``checkpoint_modules`` when its layers are Modules), and that is the time
  measured. While a range is recomputed, the chain's output is alive (the caller's loss reads it),
  an enclosing range's recomputed output is not (``minigrad.memory.recompute`` drops it).
  ``best[i, j](m)``, the least extra time for ``[i, j)`` within ``m`` bytes, follows from the first
  piece and ``best`` of the rest, for every ``m`` at once (an array over budgets in small units,
  sizes rounded up so that the plan's predicted peak is never below its real one).

Layers are the leaves of nested ``Sequential``s, so a block's cheap ops (ReLU, dropout, a norm)
can be recomputed alone while its matmul's output is kept: the "selective" recompute of PyTorch's
activation-memory budget, here found by the same search rather than by a list of op names. A
recomputed dropout draws the same mask: ``checkpoint`` replays the random state.
"""

from __future__ import annotations

import time
import weakref
from typing import Any, Callable, NamedTuple, Sequence

from minigrad import backend
from minigrad.autograd.grad_mode import no_grad
from minigrad.memory.checkpoint import _Layers, checkpoint, checkpoint_modules
from minigrad.memory.tracker import track
from minigrad.protocols import ModuleLike, is_module, is_plain_linear, is_sequential
from minigrad._tensor import Tensor, _wrap

__all__ = ["LayerCost", "Plan", "kept_peak", "layers_of", "measure", "owned", "plan", "predicted_peak", "rerun",
           "solve"]


class LayerCost(NamedTuple):
    """What one layer costs, measured on its own with its input alive: ``peak`` bytes of
    activations at its worst moment (its output included, its input not), ``kept`` bytes its graph
    holds once its output is dropped (what backward saves, its input included if saved),
    ``input_kept`` of those are its input and ``output_kept`` its output, ``output`` is its
    output's size (all a recomputed range keeps), ``time`` its forward time without recording a
    graph, as a recomputed range reruns it (any unit)."""

    peak: int
    kept: int
    input_kept: int
    output_kept: int
    output: int
    time: float


class Plan:
    """A chain's layers with, for each, kept or recomputed: call it on the chain's input.

    ``pieces`` is a list of ``("keep", i)`` and ``("recompute", i, k, Plan)`` for layers ``i..k-1``;
    ``peak`` and ``extra_time`` are what the search predicted (bytes above the input; time in the
    unit of ``LayerCost.time``)."""

    def __init__(self, layers: Sequence[Callable], pieces: list, peak: int, extra_time: float) -> None:
        self.layers, self.pieces, self.peak, self.extra_time = list(layers), pieces, peak, extra_time

    def __call__(self, x: Tensor) -> Tensor:
        for piece in self.pieces:
            if piece[0] == "keep":
                x = self.layers[piece[1]](x)
            else:
                segment = _Segment(self.layers, piece[1], piece[2], piece[3])
                if all(is_module(layer) for layer in segment.layers):
                    x = checkpoint_modules(segment, x, segment.layers, head=segment.head)
                else:
                    x = checkpoint(segment, x)
        return x

    def recompute_counts(self) -> list[int]:
        """How many times backward recomputes each layer's forward (0: its activations are kept)."""
        counts = [0] * len(self.layers)
        for piece in self.pieces:
            if piece[0] == "recompute":
                inner = piece[3].recompute_counts()
                for i in range(piece[1], piece[2]):
                    counts[i] += inner[i]
                for i in rerun(self.layers, piece):
                    counts[i] += 1
        return counts

    def __repr__(self) -> str:
        def text(pieces: list) -> str:
            return " ".join(str(p[1]) if p[0] == "keep" else f"[{text(p[3].pieces)}]" for p in pieces)
        return f"Plan({text(self.pieces)}; peak {self.peak} B, extra time {self.extra_time:.3g})"


class _Segment(_Layers):
    """A recomputed range run under its own plan (a ``_Layers``, so that ``checkpoint`` keeps its
    modules' buffers as they were when it reruns them)."""

    def __init__(self, layers: Sequence[Callable], start: int, stop: int, inner: Plan) -> None:
        super().__init__([layers[i] for i in range(start, stop)])
        self.inner = inner
        # its plan without the last layer, when that layer is kept: backward may then skip
        # recomputing it (a Linear, which reads its input and not its output; recompute.py)
        last_kept = bool(inner.pieces) and inner.pieces[-1] == ("keep", stop - 1)
        self.head = Plan(layers, inner.pieces[:-1], 0, 0.0) if last_kept else None

    def __call__(self, x: Tensor) -> Tensor:
        return self.inner(x)


def rerun(layers: Sequence[Callable], piece: tuple) -> range:
    """The layers backward runs again for a recomputed piece ``("recompute", start, stop, plan)``:
    all of its range, or all but the last when ``plan`` keeps that layer and backward leaves it
    out (``_skips_last``)."""
    _, start, stop, inner = piece
    last_apart = inner.pieces[-1:] == [("keep", stop - 1)] and _skips_last(layers, start, stop)
    return range(start, stop - 1 if last_apart else stop)


def _skips_last(layers: Sequence[Callable], start: int, stop: int) -> bool:
    """Whether backward leaves layer ``stop - 1`` out of recomputing the range ``[start, stop)`` when
    the range's plan keeps it (``recompute._last_apart``): a plain ``nn.Linear`` without hooks, in
    a range of Modules (``checkpoint_modules``, the one given the range's head). At run time a few
    things still make it recompute (autocast, ``create_graph``, mixed dtypes); the model assumes
    an ordinary training step."""
    last = layers[stop - 1] if stop <= len(layers) else None
    return (is_plain_linear(last) and not last._forward_hooks and not last._forward_pre_hooks
            and all(is_module(layer) for layer in layers[start:stop]))


def layers_of(model: Sequence[Callable] | ModuleLike) -> list[Callable]:
    """The chain's layers: the leaves of nested ``Sequential``s, in order."""
    layers: list[Callable] = []
    for layer in model:
        layers += layers_of(layer) if is_sequential(layer) else [layer]
    return layers


def measure(layers: Sequence[Callable], x: Tensor, repeats: int = 2) -> list[LayerCost]:
    """Run the layers one at a time, each on a copy of the last output cut from the graph (so that
    memory never holds more than one layer's activations), and measure with the memory tracker
    what each one keeps, and its forward time without a graph (the least of ``repeats`` runs). The
    random state is left as it was, so planning draws no dropout mask of the training run."""
    costs = []
    x, start = x.detach(), backend.get_rng_state(x.device)
    with track(x.device):  # one tracker around all: the inner ones need not look for live tensors
        for layer in layers:
            state = backend.get_rng_state(x.device)  # every run of a dropout draws the same mask
            best = float("inf")
            for _ in range(repeats):
                backend.set_rng_state(state, x.device)
                t0 = time.perf_counter()
                with no_grad():
                    layer(x)
                best = min(best, time.perf_counter() - t0)
            backend.set_rng_state(state, x.device)
            x.requires_grad_()
            with track(x.device) as mem:
                given = x.clone()  # made inside, so the tracker sees whether the layer keeps it, and not
                # a leaf, whose gradient node would keep it
                y = layer(given)
                peak = mem.activation_peak - given.array.nbytes
                node, output, following = y.grad_fn, y.array.nbytes, y.array.copy()
                alive = [weakref.ref(backend.storage_of(t.array)) for t in (given, y)]
                del y, given  # freed at once: a graph holds no reference cycles
                input_kept, output_kept = [a().nbytes if a() is not None else 0 for a in alive]
                costs.append(LayerCost(peak, mem.activations, input_kept, output_kept, output, best))
            del node
            x = _wrap(following, x.device)
    backend.set_rng_state(start, x.device)
    return costs


def owned(costs: Sequence[LayerCost], k: int, held: bool) -> int:
    """What layer ``k`` kept adds to memory: its ``kept`` bytes, less its input when that is held
    outside, less its output when the next layer keeps that as its input (the next piece, kept or
    recomputed, counts it; else a buffer saved by both would count twice)."""
    shared = costs[k].output_kept if k + 1 < len(costs) and costs[k + 1].input_kept else 0
    return costs[k].kept - (costs[k].input_kept if held else 0) - shared


def plan(model: Sequence[Callable] | ModuleLike, x: Tensor, budget: int | float,
         costs: Sequence[LayerCost] | None = None) -> Plan:
    """The cheapest plan for running ``model`` (a Sequential or a list of layers) on inputs like
    ``x`` with its activations' peak within ``budget``: bytes when an int, a fraction of the
    all-kept peak when a float. ``costs`` defaults to ``measure(layers, x)``; pass your own (for
    instance FLOPs for time) to make the plan independent of the machine's timing noise."""
    layers = layers_of(model)
    costs = list(costs) if costs is not None else measure(layers, x)
    if len(costs) != len(layers):
        raise ValueError(f"plan: expected one LayerCost per layer ({len(layers)}), got {len(costs)}")
    if isinstance(budget, float):
        if not 0 < budget <= 1:
            raise ValueError(f"plan: a fractional budget must be in (0, 1], got {budget}")
        budget = int(budget * kept_peak(costs))
    return solve(layers, costs, budget)


def kept_peak(costs: Sequence[LayerCost]) -> int:
    """The chain's activation peak, by the cost model, when every layer keeps its activations."""
    return predicted_peak(Plan([], [("keep", i) for i in range(len(costs))], 0, 0.0), costs)


def predicted_peak(p: Plan, costs: Sequence[LayerCost], top: bool = True) -> int:
    """The activation peak in bytes that the cost model gives for plan ``p``, whose input is held
    (and counted) outside it, as the chain's input and a recomputed range's saved input are; a
    later piece's input is the output before it, which counts until no piece keeps it. ``top``: ``p``
    is the whole chain's plan, so the chain's output (held by the caller, who computes a loss from
    it) is alive whenever backward recomputes one of its ranges; an inner plan's output is not (the
    recomputation drops it, ``minigrad.memory.recompute``)."""
    held_bytes, worst = 0, 0
    alive = costs[-1].output if top else 0
    for t, piece in enumerate(p.pieces):
        first_held = t == 0
        given = 0 if first_held or piece[1] == 0 else costs[piece[1] - 1].output
        if piece[0] == "keep":
            c = costs[piece[1]]
            worst = max(worst, held_bytes + given + c.peak)
            held_bytes += owned(costs, piece[1], first_held)
        else:
            worst = max(worst, held_bytes + given + alive + predicted_peak(piece[3], costs, top=False))
            held_bytes += given  # a recomputed range keeps its input
    return worst


def solve(layers: Sequence[Callable], costs: Sequence[LayerCost], budget: int, units: int = 256) -> Plan:
    """The dynamic programme of the module docstring, over budgets in steps of ``budget / units``;
    ``ValueError`` when no plan fits ``budget``.

    As in ``predicted_peak``: ``best[held][i, j]`` for a range whose input is counted outside it (a
    recomputed range) or not (the rest of a range after its first piece, whose input is the output
    before it); ``top[held][i]`` for the rest ``[i, n)`` of the chain itself, whose recomputed
    ranges run while the chain's output is alive. ``ends[held][i, j]`` is ``best`` over the plans
    that keep their last layer: a range whose last layer backward leaves out (``_skips_last``)
    costs, as a recomputed range, the better of the two (``ranged``)."""
    n, xp = len(costs), backend.numpy
    if budget >= kept_peak(costs):  # (the search's rounding up might not see that keeping all fits)
        return Plan(layers, [("keep", i) for i in range(n)], kept_peak(costs), 0.0)
    unit = max(budget, 1) / units

    def size(nbytes: int) -> int:
        return int(-(-nbytes // unit))  # rounded up: the predicted peak is never too low

    given = [0] + [size(c.output) for c in costs]  # given[i]: the input of layer i
    peak = {True: [size(c.peak) for c in costs],
            False: [size(c.peak + (costs[i - 1].output if i else 0)) for i, c in enumerate(costs)]}
    adds = {h: [size(owned(costs, k, h)) for k in range(n)] for h in (True, False)}
    alive = size(costs[-1].output)
    clock = xp.concatenate([[0.0], xp.cumsum([c.time for c in costs])])
    budgets = xp.arange(units + 1)

    def shifted(values: Any, by: int) -> Any:  # values[..., m - by], inf where m < by
        result = xp.full(values.shape, xp.inf)
        if by <= units:
            result[..., by:] = values[..., :units + 1 - by]
        return result

    def options(i: int, j: int, held: bool, rest: Any, beside: int) -> Any:
        """Extra time of each first piece of [i, j) followed by the best plan of the rest (``rest[k]``
        for [k, j)) for every budget: 0 keeps layer i, c > 0 recomputes [i, i + c) while ``beside``
        units are alive elsewhere; a range reaching j would take the memory of running its plan inline."""
        g = 0 if held else given[i]
        keep = xp.where(budgets >= peak[held][i], shifted(rest[i + 1], adds[held][i]), xp.inf)
        ks = slice(i + 1, j)
        return xp.concatenate([keep[None], shifted(first[held][i, ks], beside) + shifted(rest[ks], g)])

    # ranged[i, k]: [i, k) as a recomputed range, its rerun included (ends_kept[i, k]: by a plan that
    # keeps its last layer); first[held][i, k]: that as the first piece of a range, shifted by its held input
    tables = {name: {h: xp.full((n + 1, n + 1, units + 1), xp.inf) for h in (True, False)}
              for name in ("best", "ends", "first")}
    best, ends, first = tables["best"], tables["ends"], tables["first"]
    choice = {name: {h: xp.zeros((n + 1, n + 1, units + 1), dtype=int) for h in (True, False)}
              for name in ("best", "ends")}
    ranged, ends_kept = xp.full((n + 1, n + 1, units + 1), xp.inf), xp.zeros((n + 1, n + 1, units + 1), dtype=bool)
    for h in (True, False):
        best[h][range(n + 1), range(n + 1)] = ends[h][range(n + 1), range(n + 1)] = 0.0
    for length in range(1, n + 1):
        for i in range(n - length + 1):
            j = i + length
            for held in (True, False):  # (ends[.., j] serves only ranges whose last layer may be left out)
                for name in ("best", "ends") if _skips_last(layers, j - 1, j) else ("best",):
                    found = options(i, j, held, tables[name][False][:, j], 0)
                    choice[name][held][i, j] = xp.argmin(found, axis=0)
                    tables[name][held][i, j] = found[choice[name][held][i, j], budgets]
            ranged[i, j] = clock[j] - clock[i] + best[True][i, j]
            if _skips_last(layers, i, j):
                apart = clock[j - 1] - clock[i] + ends[True][i, j]
                ends_kept[i, j] = apart < ranged[i, j]
                ranged[i, j] = xp.minimum(ranged[i, j], apart)
            for held in (True, False):
                first[held][i, j] = shifted(ranged[i, j], 0 if held else given[i])
    top = {h: xp.full((n + 1, units + 1), xp.inf) for h in (True, False)}
    top_choice = {h: xp.zeros((n + 1, units + 1), dtype=int) for h in (True, False)}
    for h in (True, False):
        top[h][n] = 0.0
    for i in reversed(range(n)):
        for held in (True, False):
            found = options(i, n, held, top[False], alive)
            top_choice[held][i] = xp.argmin(found, axis=0)
            top[held][i] = found[top_choice[held][i], budgets]
    if not xp.isfinite(top[True][0, units]):
        raise ValueError(f"plan: no plan keeps the activations of these {n} layers within {budget} bytes "
                         f"(its last layer alone needs {costs[-1].peak})")

    def build(i: int, j: int, m: int, held: bool, is_top: bool, table: str = "best") -> Plan:
        pieces, extra = [], 0.0
        while i < j:
            option = int(top_choice[held][i, m] if is_top else choice[table][held][i, j, m])
            if option == 0:
                pieces.append(("keep", i))
                m -= adds[held][i]
                i += 1
            else:
                g, k = 0 if held else given[i], i + option
                inside = m - g - (alive if is_top else 0)
                inner = build(i, k, inside, True, False, "ends" if ends_kept[i, k, inside] else "best")
                pieces.append(("recompute", i, k, inner))
                again = rerun(layers, pieces[-1])
                extra += clock[again.stop] - clock[again.start] + inner.extra_time
                m -= g
                i = k
            held = False
        result = Plan(layers, pieces, 0, extra)
        result.peak = predicted_peak(result, costs, top=is_top)
        return result

    return build(0, n, units, True, True)
