"""Several algorithms behind one conv2d, chosen per shape by timing them once (chapter 03).

The same convolution can be computed in different ways, and which is fastest depends on the
shape: ``im2col`` copies every window into a matrix and makes the convolution one product (the
default); ``im2col_nhwc`` lays the windows out channels-last, so the product writes a
channels-last output with no transpose; ``winograd`` (F(2x2, 3x3), Lavin and Gray 2015) computes
each 2x2 block of output from a 4x4 tile of input with 16 products where im2col needs 36, for
3x3 kernels at stride 1. With ``minigrad.backends.autotune = True`` (or PyTorch's
``backends.cudnn.benchmark = True``) the first call of each shape runs every algorithm that
applies, keeps the fastest in a cache, and later calls use it, as cuDNN's autotuner does;
``autotune_cache()`` lists what was chosen and the times. Without it, conv2d is im2col. This
module sits below ``ops/conv.py`` in the imports, so conv hands in its ``_im2col`` (``columns``).
"""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

from minigrad.ops.layout import is_channels_last

__all__ = ["ALGORITHMS", "MARGIN", "TunedConv", "autotune_cache", "clear_autotune_cache", "conv2d", "measure", "remember"]

Key = tuple  # (device, dtype, x shape, w shape, geometry, groups, channels last, keeps im2col's columns)


class TunedConv(NamedTuple):
    """One cached choice: the convolution's shapes and arguments, the algorithm, and each
    algorithm's time in milliseconds (``inf`` for one that does not apply)."""

    input: tuple
    weight: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int
    channels_last: bool
    with_grad: bool
    algorithm: str
    times_ms: dict


# -- the algorithms: each returns (y, im2col's columns or None); ``columns`` is conv's im2col --------
def _finish(xp, y_nchw_t, b, x, o):
    """(O, N, OH, OW) plus bias, in the input's layout (channels_last in, channels_last out)."""
    if b is not None:
        y_nchw_t += b.reshape(o, 1, 1, 1)
    if is_channels_last(x):
        return xp.ascontiguousarray(y_nchw_t.transpose(1, 2, 3, 0)).transpose(0, 3, 1, 2)
    return xp.ascontiguousarray(y_nchw_t.transpose(1, 0, 2, 3))


def im2col(xp, x, w, b, g, groups, columns):
    """Every window as a column, then one (grouped) matrix product; wide columns (``ops.conv``'s
    ``_conv_columns``) give wrapped output columns past OW, which ``_finish``'s copy leaves behind."""
    cols = columns(xp, x, g, groups)
    n, o, (oh, ow) = x.shape[0], w.shape[0], g.out_size(*x.shape[2:])
    wq = cols.shape[2] // (n * oh) if n * oh else ow
    y = (w.reshape(groups, o // groups, -1) @ cols).reshape(o, n, oh, wq)[..., :ow]
    return _finish(xp, y, b, x, o), cols


def im2col_nhwc(xp, x, w, b, g, groups, columns):
    """Windows channels-last: rows (N*OH*OW) of (KH*KW*C) numbers, times the weight (KH*KW*C, O),
    gives the output channels-last, which a channels_last input keeps with no copy."""
    n, c, h, wd = x.shape
    o, (oh, ow) = w.shape[0], g.out_size(h, wd)
    pt, pb, pl, pr = g.padding
    xl = x.transpose(0, 2, 3, 1)  # a free view when x is channels_last
    if pt or pb or pl or pr:
        padded = xp.zeros((n, h + pt + pb, wd + pl + pr, c), dtype=x.dtype)
        padded[:, pt:pt + h, pl:pl + wd] = xl
        xl = padded
    s_n, s_h, s_w, s_c = xl.strides
    (kh, kw), (sh, sw), (dh, dw) = g.kernel, g.stride, g.dilation
    win = xp.lib.stride_tricks.as_strided(xl, (n, oh, ow, kh, kw, c),
                                          (s_n, s_h * sh, s_w * sw, s_h * dh, s_w * dw, s_c))
    rows = xp.ascontiguousarray(win).reshape(n * oh * ow, kh * kw * c)
    y = rows @ w.transpose(2, 3, 1, 0).reshape(kh * kw * c, o)
    if b is not None:
        y += b
    y = y.reshape(n, oh, ow, o).transpose(0, 3, 1, 2)
    return (y if is_channels_last(x) else xp.ascontiguousarray(y)), None


def winograd(xp, x, w, b, g, groups, columns):
    """F(2x2, 3x3): output = A^T [(G w G^T) * (B^T d B)] A over 4x4 input tiles d taken every 2
    pixels, the elementwise products summed over channels as 16 matrix products. The image is
    first laid out (H, W, N, C), so every transform is an add of whole (N, C) planes of strided
    rows and columns: no Python loop visits a tile, and numpy's inner loops run N*C long."""
    n, c, h, wd = x.shape
    o, (oh, ow) = w.shape[0], g.out_size(h, wd)
    th, tw = -(-oh // 2), -(-ow // 2)
    pt, _, pl, _ = g.padding
    xh = xp.zeros((2 * th + 2, 2 * tw + 2, n, c), dtype=x.dtype)  # padded, and whole tiles at the far edges
    xh[pt:pt + h, pl:pl + wd] = x.transpose(2, 3, 0, 1)  # 2*th + 2 >= oh + 2 = h + pt + pb: the image fits
    v = xp.empty((4, 4, th, tw, n, c), dtype=x.dtype)  # B^T d B
    rows = [xh[k:k + 2 * th:2] for k in range(4)]  # row k of every tile
    for i, r in enumerate((rows[0] - rows[2], rows[1] + rows[2], rows[2] - rows[1], rows[1] - rows[3])):
        col = [r[:, k:k + 2 * tw:2] for k in range(4)]
        xp.subtract(col[0], col[2], out=v[i, 0])
        xp.add(col[1], col[2], out=v[i, 1])
        xp.subtract(col[2], col[1], out=v[i, 2])
        xp.subtract(col[1], col[3], out=v[i, 3])
    gm = xp.asarray([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=x.dtype)
    gw = (gm @ w.transpose(2, 3, 1, 0).reshape(3, 3 * c * o)).reshape(4, 3, c * o)  # G w, kernel rows
    u = gm @ gw  # ... G^T, every (C, O) pair at once: (4, 4, C*O)
    m = (v.reshape(16, th * tw * n, c) @ u.reshape(16, c, o)).reshape(4, 4, th, tw, n, o)
    y = xp.empty((th, 2, tw, 2, n, o), dtype=x.dtype)
    for a, t in enumerate((m[0] + m[1] + m[2], m[1] - m[2] - m[3])):  # A^T m A, into every other pixel
        xp.add(t[0] + t[1], t[2], out=y[:, a, :, 0])
        xp.subtract(t[1] - t[2], t[3], out=y[:, a, :, 1])
    y = y.reshape(2 * th, 2 * tw, n, o)[:oh, :ow]
    if b is not None:
        y += b
    if is_channels_last(x):
        return xp.ascontiguousarray(y.transpose(2, 0, 1, 3)).transpose(0, 3, 1, 2), None
    return xp.ascontiguousarray(y.transpose(2, 3, 0, 1)), None


def _winograd_applies(x, w, g, groups) -> bool:
    return (g.kernel == (3, 3) and g.stride == (1, 1) and g.dilation == (1, 1) and groups == 1
            and x.dtype.kind == "f" and x.dtype.itemsize >= 4)  # half precision loses too much in the transforms


# name -> (algorithm, whether it applies); ties in time go to the earlier one
ALGORITHMS: dict[str, tuple[Callable, Callable[..., bool]]] = {
    "im2col": (im2col, lambda x, w, g, groups: True),
    "im2col_nhwc": (im2col_nhwc, lambda x, w, g, groups: groups == 1),
    "winograd": (winograd, _winograd_applies),
}
_cache: dict[Key, TunedConv] = {}
# The switches, process-wide as torch's cudnn.benchmark is. A program sets them by torch's names,
# minigrad.backends.autotune and minigrad.backends.cudnn.benchmark (minigrad/compat/backends.py),
# which call set_autotune: the setting lives here, with the op that reads it.
_autotune = False
_cudnn_benchmark = False
# another algorithm replaces im2col only when at least this much faster: on a busy machine two
# timings of the same work differ by a few percent, and a choice made on noise helps nobody
MARGIN = 0.9


def set_autotune(on: bool, switch: str = "autotune") -> None:
    """Turn conv2d autotuning on or off for the process; ``switch`` names which of torch's two
    spellings says so (``"autotune"`` or ``"cudnn.benchmark"``): tuning runs while either is on."""
    global _autotune, _cudnn_benchmark
    if switch == "autotune":
        _autotune = bool(on)
    elif switch == "cudnn.benchmark":
        _cudnn_benchmark = bool(on)
    else:
        raise ValueError(f"set_autotune: expected switch 'autotune' or 'cudnn.benchmark', got {switch!r}")


def autotune_switch(switch: str = "autotune") -> bool:
    """The setting of one switch (``"autotune"`` or ``"cudnn.benchmark"``)."""
    if switch not in ("autotune", "cudnn.benchmark"):
        raise ValueError(f"autotune_switch: expected switch 'autotune' or 'cudnn.benchmark', got {switch!r}")
    return _autotune if switch == "autotune" else _cudnn_benchmark


def conv2d(xp, x, w, b, g, groups, keep_cols: bool, columns: Callable) -> tuple[Any, Any]:
    """Conv2d's forward on arrays: (y, im2col's columns when ``keep_cols``, for the weight
    gradient). im2col unless autotuning is on, then the algorithm cached for this shape, timed
    here on first use."""
    name = "im2col"
    if _autotune or _cudnn_benchmark:
        entry = _cache.get(_key(x, w, g, groups, keep_cols))
        if entry is None:
            entry = _tune(xp, x, w, b, g, groups, keep_cols, columns)
        name = entry.algorithm
    return _run(name, xp, x, w, b, g, groups, keep_cols, columns)


def measure(runs: dict[str, Callable[[], Any]], repeats: int = 5) -> dict[str, float]:
    """Seconds of the fastest call of each run, the runs timed in turn ``repeats`` times so that a
    busy spell of the machine hits them all alike (tests replace it to inject timings)."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def remember(x, w, g, groups: int, keep_cols: bool, times_ms: dict[str, float]) -> TunedConv:
    """Put timings for a shape in the cache (as if measured): the fastest applicable algorithm is
    chosen, ties going to the one listed first in ``ALGORITHMS``, and im2col (the default) is kept
    unless the fastest takes under ``MARGIN`` of its time."""
    key = _key(x, w, g, groups, keep_cols)
    usable = {k: ALGORITHMS[k][1](x, w, g, groups) for k in ALGORITHMS}
    times = {k: (times_ms.get(k, float("inf")) if usable[k] else float("inf")) for k in ALGORITHMS}
    best = min(ALGORITHMS, key=lambda k: (times[k], list(ALGORITHMS).index(k)))
    if not times[best] < MARGIN * times["im2col"]:
        best = "im2col"
    entry = _cache[key] = TunedConv(tuple(x.shape), tuple(w.shape), g.stride, g.padding, g.dilation, groups,
                                    key[6], keep_cols, best, times)
    return entry


def autotune_cache() -> list[TunedConv]:
    """Every shape tuned so far: its arguments, the algorithm chosen and each algorithm's ms."""
    return list(_cache.values())


def clear_autotune_cache() -> None:
    _cache.clear()


def _key(x, w, g, groups, keep_cols) -> Key:
    device = type(x).__module__.split(".")[0]  # numpy or cupy
    return (device, str(x.dtype), tuple(x.shape), tuple(w.shape), tuple(g), groups, is_channels_last(x), keep_cols)


def _run(name: str, xp, x, w, b, g, groups, keep_cols, columns):
    y, cols = ALGORITHMS[name][0](xp, x, w, b, g, groups, columns)
    if keep_cols and cols is None:  # the weight gradient reads im2col's columns: making them is part of the cost
        cols = columns(xp, x, g, groups)
    return y, cols


def _tune(xp, x, w, b, g, groups, keep_cols, columns) -> TunedConv:
    def timed(name: str) -> Callable[[], None]:
        def run() -> None:
            _run(name, xp, x, w, b, g, groups, keep_cols, columns)
            if hasattr(xp, "cuda"):  # cupy launches kernels and returns: time them to their end
                xp.cuda.get_current_stream().synchronize()
        return run

    runs = {name: timed(name) for name, (_, applies) in ALGORITHMS.items() if applies(x, w, g, groups)}
    for run in runs.values():  # a first call warms caches and the allocator
        run()
    return remember(x, w, g, groups, keep_cols, {name: s * 1e3 for name, s in measure(runs).items()})
