"""Observers: watch a tensor's values on calibration batches and choose its int8 grid (chapter 03).

Affine quantization stores a real number ``x`` as an integer ``q = clamp(round(x / scale) + zero_point,
qmin, qmax)`` and reads it back as ``(q - zero_point) * scale``. The grid's ends come from the range
an observer saw: ``MinMaxObserver`` keeps the extremes, ``MovingAverageMinMaxObserver`` an
exponential average of them (quantization-aware training, where the weights move),
``PerChannelMinMaxObserver`` one range per output channel of a weight, and ``HistogramObserver``
a histogram from which it picks the range that minimises the expected squared error, trading a
few clipped outliers for a finer grid. Activations use ``quint8`` (0..255, any zero point),
weights ``qint8`` symmetric (zero point 0) in -63..63 by default (``reduce_range``): x86 CPUs without
VNNI add pairs of uint8 x int8 products in int16, which saturates with full-range weights, so
onnxruntime's own quantizer makes the same choice there.

A grid is only as good as its range: one ``inf`` seen in calibration makes the scale infinite and
every output NaN, and a NaN makes the range NaN. So observers refuse non-finite values as they
see them (``ArgumentError`` naming the first one and where it is), and an integer range whose
``quant_min`` is not below ``quant_max`` (one integer holds no range) when they are made.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from minigrad import backend
from minigrad.autograd.grad_mode import no_grad
from minigrad.errors import ArgumentError
from minigrad.nn.module import Module
from minigrad._tensor import Tensor

__all__ = ["HistogramObserver", "MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver",
           "QParams", "calculate_qparams", "check_finite", "check_range"]

RANGES = {"quint8": (0, 255), "qint8": (-127, 127)}


class QParams(NamedTuple):
    """A grid: ``scale`` (float32) and ``zero_point`` (uint8 or int8) arrays, 0-D per tensor or one
    entry per channel along ``axis``; ``qmin``/``qmax`` bound the integers."""

    scale: Any
    zero_point: Any
    qmin: int
    qmax: int
    axis: int | None
    dtype: str


def check_finite(who: str, what: str, a: Any, xp: Any) -> None:
    """Raise ArgumentError naming the first NaN or infinity in array ``a`` (``what`` of ``who``), if any."""
    finite = xp.isfinite(a)
    if not bool(finite.all()):
        where = tuple(int(i) for i in xp.argwhere(~finite)[0]) if a.ndim else ()
        value = float(a[where])
        raise ArgumentError(f"{who}: {what} holds {value} at index {where}; a quantization grid needs finite values")


def check_range(who: str, quant_min: int, quant_max: int, strict: bool = True) -> None:
    """Raise ArgumentError unless ``quant_min < quant_max`` (``<=`` when not ``strict``)."""
    if not (quant_min < quant_max if strict else quant_min <= quant_max):
        raise ArgumentError(f"{who}: expected quant_min {'<' if strict else '<='} quant_max, got "
                            f"quant_min={quant_min}, quant_max={quant_max}")


def calculate_qparams(xp: Any, lo: Any, hi: Any, dtype: str = "quint8", symmetric: bool = False,
                      axis: int | None = None, quant_min: int | None = None, quant_max: int | None = None) -> QParams:
    """The grid that covers ``[lo, hi]`` (widened to hold 0, so zero padding and ReLU's zeros are exact)."""
    qmin, qmax = RANGES[dtype]
    qmin, qmax = (qmin if quant_min is None else quant_min), (qmax if quant_max is None else quant_max)
    check_range("calculate_qparams", qmin, qmax)
    check_finite("calculate_qparams", "the range's low end", xp.asarray(lo), xp)
    check_finite("calculate_qparams", "the range's high end", xp.asarray(hi), xp)
    lo = xp.minimum(xp.asarray(lo, dtype="float64"), 0.0)
    hi = xp.maximum(xp.asarray(hi, dtype="float64"), 0.0)
    tiny = float(backend.numpy.finfo("float32").eps)
    if symmetric:
        scale = xp.maximum(xp.maximum(-lo, hi) / ((qmax - qmin) / 2), tiny)
        zero = xp.zeros_like(scale) + (qmin + qmax + 1) // 2
    else:
        scale = xp.maximum((hi - lo) / (qmax - qmin), tiny)
        zero = xp.clip(qmin - xp.rint(lo / scale), qmin, qmax)
    return QParams(scale.astype("float32"), zero.astype(dtype[1:]), qmin, qmax, axis, dtype)


class _Observer(Module):
    """Records ranges in ``forward`` (which returns its input) and turns them into ``QParams``."""

    def __init__(self, dtype: str = "quint8", symmetric: bool = False, reduce_range: bool = False,
                 quant_min: int | None = None, quant_max: int | None = None) -> None:
        super().__init__()
        if dtype not in RANGES:
            raise ValueError(f"{type(self).__name__}: dtype must be one of {sorted(RANGES)}, got {dtype!r}")
        lo, hi = RANGES[dtype]
        if reduce_range:  # one bit less: u8 x s8 pair sums then fit int16 (x86 without VNNI, onnxruntime)
            lo, hi = -(-lo // 2), hi // 2
        self.dtype, self.symmetric = dtype, symmetric
        self.quant_min = lo if quant_min is None else quant_min
        self.quant_max = hi if quant_max is None else quant_max
        check_range(type(self).__name__, self.quant_min, self.quant_max)
        self.register_buffer("min_val", Tensor(backend.numpy.asarray(math.inf, "float32")))
        self.register_buffer("max_val", Tensor(backend.numpy.asarray(-math.inf, "float32")))

    def forward(self, x: Tensor) -> Tensor:
        if self.min_val.device != x.device:  # made on the cpu by prepare(); the model may be elsewhere
            self.to(x.device)
        with no_grad():
            values = x.array.astype("float32")
            check_finite(type(self).__name__, "the tensor observed", values, x.device.xp)
            self._observe(values, x.device.xp)
        return x

    def _observe(self, x: Any, xp: Any) -> None:
        self._set(xp.minimum(self.min_val.array, x.min()), xp.maximum(self.max_val.array, x.max()))

    def _set(self, lo: Any, hi: Any) -> None:
        xp = self.min_val.device.xp  # asarray: a reduction of 0-d arrays gives a numpy scalar, not an array
        self.min_val.array, self.max_val.array = xp.asarray(lo, dtype="float32"), xp.asarray(hi, dtype="float32")

    def calculate_qparams(self, axis: int | None = None) -> QParams:
        xp = self.min_val.device.xp
        for name in ("min_val", "max_val"):  # a state loaded from a file, say: forward never lets NaN in
            if bool(xp.isnan(getattr(self, name).array).any()):
                check_finite(type(self).__name__, name, getattr(self, name).array, xp)
        if not bool((self.min_val.array <= self.max_val.array).all()):
            raise RuntimeError(f"{type(self).__name__}: no values observed yet; run calibration batches first")
        return calculate_qparams(self.min_val.device.xp, *self._range(), self.dtype, self.symmetric, axis,
                                 self.quant_min, self.quant_max)

    def _range(self) -> tuple[Any, Any]:
        return self.min_val.array, self.max_val.array

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}, min_val={self.min_val.array}, max_val={self.max_val.array}"


class MinMaxObserver(_Observer):
    """The smallest and largest value seen: every value fits, one outlier stretches the grid."""


class MovingAverageMinMaxObserver(_Observer):
    """``min, max <- min, max + c * (batch min, max - min, max)``: follows ranges that drift in training."""

    def __init__(self, averaging_constant: float = 0.01, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.averaging_constant = averaging_constant

    def _observe(self, x: Any, xp: Any) -> None:
        if not bool(self.min_val.array <= self.max_val.array):
            return super()._observe(x, xp)
        c = self.averaging_constant
        self._set(self.min_val.array + c * (x.min() - self.min_val.array),
                  self.max_val.array + c * (x.max() - self.max_val.array))


class PerChannelMinMaxObserver(_Observer):
    """A range per slice along ``ch_axis`` of the last tensor seen: a weight's output channels, whose
    current values are the ones to quantize. Symmetric qint8 in -63..63 by default (``reduce_range``)."""

    def __init__(self, ch_axis: int = 0, dtype: str = "qint8", symmetric: bool = True, reduce_range: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(dtype=dtype, symmetric=symmetric, reduce_range=reduce_range, **kwargs)
        self.ch_axis = ch_axis

    def _observe(self, x: Any, xp: Any) -> None:
        rows = xp.moveaxis(x, self.ch_axis, 0).reshape(x.shape[self.ch_axis], -1)
        self._set(rows.min(axis=1), rows.max(axis=1))

    def calculate_qparams(self, axis: int | None = None) -> QParams:
        return super().calculate_qparams(self.ch_axis)


class HistogramObserver(_Observer):
    """A ``bins``-bin histogram of every value seen; the range kept is the one, along a path that
    trims the histogram's tails 0.1% of the mass at a time, with the least expected squared error:
    values outside it are clipped (error: their distance to the end), values inside are rounded
    (error: step^2 / 12). Heavy tails get clipped for a finer grid where most values are."""

    def __init__(self, bins: int = 2048, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bins = bins
        self.register_buffer("histogram", Tensor(backend.numpy.zeros(bins, "float64")))

    def _observe(self, x: Any, xp: Any) -> None:
        old_lo, old_hi = self.min_val.array, self.max_val.array
        lo, hi = float(xp.minimum(old_lo, x.min())), float(xp.maximum(old_hi, x.max()))
        if hi == lo:  # one value seen: a range around it, wide enough for float64 bins (float32 ones were not)
            hi = lo + max(1e-6, abs(lo) * 1e-6)
        hist = xp.histogram(x.astype("float64"), bins=self.bins, range=(lo, hi))[0].astype("float64")
        if bool(old_lo <= old_hi):  # move the old counts to the new bins, by their centres
            step = (old_hi - old_lo) / self.bins
            centres = old_lo + (xp.arange(self.bins) + 0.5) * step
            where = xp.clip(((centres - lo) / (hi - lo) * self.bins).astype("int64"), 0, self.bins - 1)
            hist += xp.bincount(where, weights=self.histogram.array, minlength=self.bins)
        self.histogram.array = hist
        self._set(lo, hi)

    def _range(self) -> tuple[Any, Any]:
        hist = backend.to_device(self.histogram.array, backend.cpu)
        np, lo, hi = backend.numpy, float(self.min_val.array), float(self.max_val.array)
        qmin, qmax = self.quant_min, self.quant_max
        edges = np.linspace(lo, hi, self.bins + 1)
        centres = (edges[:-1] + edges[1:]) / 2

        def error(a: int, b: int) -> float:  # keep bins a..b-1
            left, right = edges[a], edges[b]
            step = (right - left) / (qmax - qmin)
            clipped = np.clip(centres, left, right) - centres
            return float((hist * clipped ** 2).sum() + hist[a:b].sum() * step ** 2 / 12)

        cdf, total = np.cumsum(hist), hist.sum()
        a, b = 0, self.bins
        best, kept = error(a, b), (a, b)
        for mass in np.arange(0.001, 0.5, 0.001) * total:  # trim the cheaper tail a little more each time
            na = int(np.searchsorted(cdf, mass))
            nb = int(np.searchsorted(cdf, total - mass)) + 1
            candidates = [(error(*ab) if ab[0] < ab[1] else math.inf, ab) for ab in ((na, b), (a, nb))]
            e, (a, b) = min(candidates, key=lambda c: c[0])  # each error computed once
            if a >= b:
                break
            if e < best:
                best, kept = e, (a, b)
        a, b = kept
        return np.asarray(edges[a]), np.asarray(edges[b])
