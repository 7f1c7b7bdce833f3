"""The lessons' interactive controls: each function re-runs one lesson's measurement for one value of
a slider and draws it, and ``control`` puts a slider on it (ipywidgets) that redraws when moved.

A lesson keeps its static figure, which nbval compares and a reader without a kernel sees; the
control beneath it lets a reader with a kernel ask "and with 3 segments?". The measurements are the
lessons' own, rebuilt here so that a test can call them without a notebook: the shuffle buffer
(01.3), checkpoint segments (03.2), the loss scale (03.3) and GPipe's micro-batches (04.4).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import minigrad

if TYPE_CHECKING:  # matplotlib and ipywidgets come with the course extra, not with minigrad itself
    from matplotlib.figure import Figure

__all__ = ["checkpoint_segments", "control", "loss_scale", "pipeline_microbatches", "shuffle_buffer"]


def _figure(ncols: int, width: float, height: float = 3.2) -> tuple[Figure, Any]:
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(width, height))


def shuffle_buffer(buffer_size: int, n: int = 300, seed: int = 0) -> Figure:
    """01.3: ``Pipeline.range(n).shuffle(buffer_size)``, each element's output position against its
    input index, and how far elements travel on average (a uniform shuffle moves them about n/3)."""
    from minigrad.data import Pipeline

    order = np.array(list(Pipeline.range(n).shuffle(buffer_size, seed=seed)))
    travel = np.abs(order - np.arange(n)).mean()
    fig, ax = _figure(1, 5, 3.4)
    ax.plot(range(n), order, ".", markersize=2)
    ax.set(xlabel="output position", ylabel="input index",
           title=f"buffer_size={buffer_size}: an element moves {travel:.1f} places on average\n"
                 f"(a uniform shuffle: about {n / 3:.0f})")
    fig.tight_layout()
    return fig


def _activation_timeline(model: Any, x: minigrad.Tensor, segments: int | None) -> tuple[list[int], int, int]:
    """Bytes of activations alive after every block's forward and at every block gradient, the peak,
    and how many block forwards one step made (recomputations included)."""
    import gc

    from minigrad import memory

    samples: list[int] = []
    calls = [0]
    model.zero_grad()
    gc.collect()  # activations of an earlier step must not count in this one's peak
    with memory.track() as tracker:
        def watch(module: Any, inputs: Any, output: minigrad.Tensor) -> None:
            calls[0] += 1
            samples.append(tracker.activations)
            if output.requires_grad:
                output.register_hook(lambda grad: samples.append(tracker.activations))

        handles = [block.register_forward_hook(watch) for block in model]
        try:
            out = model(x) if segments is None else memory.checkpoint_sequential(model, segments, x)
            (out * out).mean().backward()
        finally:
            for handle in handles:
                handle.remove()
    return samples, tracker.activation_peak, calls[0]


def checkpoint_segments(segments: int, n_blocks: int = 16, width: int = 256, batch: int = 128) -> Figure:
    """03.2: one training step of ``n_blocks`` blocks of ``Linear(width, width)`` + tanh, with and
    without ``checkpoint_sequential(model, segments, x)``: activations alive over the step, the
    counted peaks and the extra block forwards."""
    from minigrad import nn

    if not 1 <= segments <= n_blocks:
        raise ValueError(f"checkpoint_segments: segments must be between 1 and n_blocks={n_blocks}, got {segments}")
    minigrad.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(n_blocks)])
    x = minigrad.randn(batch, width)
    plain, plain_peak, _ = _activation_timeline(model, x, None)
    checked, peak, calls = _activation_timeline(model, x, segments)
    fig, ax = _figure(1, 6.5, 3.4)
    ax.step(range(len(plain)), np.array(plain) / 1e6, where="post", label="no checkpointing")
    ax.step(range(len(checked)), np.array(checked) / 1e6, where="post", label=f"{segments} segments")
    ax.set(xlabel="event (a block's forward, or its gradient arriving)", ylabel="activations alive (MB)",
           title=f"{segments} segments: peak {peak / plain_peak:.2f}x, "
                 f"{calls - n_blocks} extra block forwards of {n_blocks}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _output_grads(layers: list, x: minigrad.Tensor, y: minigrad.Tensor, mixed: bool, scale: float) -> list[np.ndarray]:
    """The gradient of the loss at each Linear's output (float64, divided by ``scale`` again)."""
    import minigrad.nn.functional as F

    outputs = []
    with minigrad.autocast(enabled=mixed):
        h = x
        for i, layer in enumerate(layers):
            z = layer(h)
            z.retain_grad()
            outputs.append(z)
            h = z.tanh() if i < len(layers) - 1 else z
        loss = F.cross_entropy(h, y)
    for layer in layers:
        layer.zero_grad()
    with np.errstate(over="ignore", invalid="ignore"):  # too large a scale overflows: that is the lesson
        (loss * scale).backward()
        return [z.grad.numpy().astype(np.float64) / scale for z in outputs]


def loss_scale(log2_scale: int, n: int = 1024) -> Figure:
    """03.3: a 6-layer tanh MLP on ``n`` digits, its gradients at each Linear's output under autocast
    with the loss multiplied by ``2**log2_scale``, against float32's: where the first layer's land
    in float16, and per layer the share flushed to zero, overflowed, or off by more than 1%."""
    from minigrad import nn
    from minigrad.data import Digits

    digits = Digits(train=True)
    x = minigrad.tensor(digits.data.reshape(len(digits), -1)[:n])
    y = minigrad.tensor(digits.targets[:n])
    minigrad.manual_seed(0)
    layers = [nn.Linear(64, 64) for _ in range(5)] + [nn.Linear(64, 10)]
    scale = 2.0 ** log2_scale
    reference = _output_grads(layers, x, y, False, 1.0)
    grads = _output_grads(layers, x, y, True, scale)
    fi = np.finfo(np.float16)
    fig, (ax1, ax2) = _figure(2, 11, 3.4)
    scaled = np.abs(reference[0]) * scale
    bins = np.arange(-36, 22, 0.5)
    ax1.hist(np.log2(scaled[scaled > 0]), bins=bins, color="tab:blue")
    for lo, hi, color, label in ((bins[0], np.log2(float(fi.smallest_subnormal)), "tab:red", "rounds to 0"),
                                 (np.log2(float(fi.smallest_subnormal)), np.log2(float(fi.smallest_normal)),
                                  "tab:orange", "subnormal"),
                                 (np.log2(float(fi.max)), bins[-1], "tab:purple", "overflows to inf")):
        ax1.axvspan(lo, hi, color=color, alpha=0.15, label=label)
    ax1.set(xlabel=f"log2 |dL/dz_1| x 2**{log2_scale}", ylabel="entries", title=f"loss x 2**{log2_scale}")
    ax1.legend(fontsize=7, loc="upper left")
    layer_ids = np.arange(1, len(layers) + 1)
    zero = [np.mean((g == 0) & (r != 0)) for g, r in zip(grads, reference)]
    inf = [np.mean(~np.isfinite(g)) for g in grads]
    with np.errstate(invalid="ignore"):
        off = [np.mean(~(np.abs(g - r) <= 0.01 * np.abs(r))) for g, r in zip(grads, reference)]
    ax2.plot(layer_ids, off, "o-", label="off by > 1% (or not finite)")
    ax2.plot(layer_ids, zero, "s--", label="flushed to zero")
    ax2.plot(layer_ids, inf, "x:", label="inf or nan")
    ax2.set(xlabel="layer", ylabel="share of the gradient's entries", ylim=(-0.05, 1.05), xticks=layer_ids,
            title=f"layer 1: {off[0]:.0%} off by > 1%, {zero[0]:.0%} zero, {inf[0]:.0%} not finite")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    return fig


def pipeline_microbatches(microbatches: int, script: str | os.PathLike, timeout: float = 120.0) -> Figure:
    """04.4: one GPipe step on two MPI ranks with ``microbatches`` micro-batches, run by ``script``
    (chapter 04's ``scripts/parallel_model.py``, which takes the values of M as arguments), drawn as
    the measured schedule with its bubble beside the formula's (P-1)/(M+P-1)."""
    from minigrad.distributed import gpipe_bubble, launch

    job = launch(script, nprocs=2, args=[str(microbatches)], timeout=timeout)
    if job.returncode != 0:
        raise ChildProcessError(f"pipeline_microbatches: {script} with M={microbatches} exited with "
                                f"{job.returncode}, expected 0; its stderr ends:\n{job.stderr[-2000:]}")
    record = json.loads(job.stdout.splitlines()[-1].removeprefix("JSON "))
    events, bubble = record["events"][str(microbatches)], record["bubble"][str(microbatches)]
    stages = record["stages"]
    fig, ax = _figure(1, 11, 1.2 + 0.6 * stages)
    for s, stage in enumerate(events):
        for kind, i, start, end in stage:
            ax.broken_barh([(start, end - start)], (s - 0.4, 0.8), edgecolor="white",
                           facecolor="tab:blue" if kind == "F" else "tab:orange")
    ax.set_yticks(range(stages), [f"stage {s}" for s in range(stages)])
    ax.set_ylim(stages - 0.5, -0.5)
    ax.set(xlabel="time (ms)", title=f"measured, P = {stages}, M = {microbatches}: bubble {bubble:.3f}, "
                                     f"theory (P-1)/(M+P-1) = {gpipe_bubble(stages, microbatches):.3f}")
    fig.tight_layout()
    return fig


def control(draw: Callable[[int], Figure], label: str, values: Sequence[int], value: int) -> Any:
    """A slider over ``values`` (starting at ``value``) above ``draw``'s figure: moving it and letting
    go re-runs ``draw`` with the new value and shows its figure (``ipywidgets.interactive_output``)."""
    import ipywidgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    if value not in values:
        raise ValueError(f"control: the starting value must be one of {list(values)}, got {value}")
    slider = ipywidgets.SelectionSlider(options=list(values), value=value, description=label,
                                        continuous_update=False, style={"description_width": "initial"})

    def show(value: int) -> None:
        fig = draw(value)
        display(fig)
        plt.close(fig)  # shown once, by display: the inline backend would show it again at the cell's end

    return ipywidgets.VBox([slider, ipywidgets.interactive_output(show, {"value": slider})])
