"""Per-sample transforms with torchvision's names, on numpy arrays or Tensors in CHW layout.

Data augmentation is a random function applied to each sample as it is loaded: crop, flip and
rotate make the model see a slightly different image every epoch. The random draws come from
minigrad's global generator, which ``manual_seed`` seeds and each DataLoader worker reseeds with
its own seed, so augmented runs are reproducible. Chapter 01 uses them in its input pipelines.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Sequence

import numpy

from minigrad import backend
from minigrad.errors import DTypeError, ShapeError
from minigrad._tensor import Tensor, _wrap

__all__ = ["Compose", "ToTensor", "Normalize", "RandomCrop", "RandomHorizontalFlip",
           "RandomVerticalFlip", "RandomRotation", "Lambda"]


def _unwrap(x: Any, who: str):
    """(array, its array module, a function that puts a result back in x's kind of container)."""
    if isinstance(x, Tensor):
        return x.detach().array, x.device.xp, lambda a: _wrap(a, x.device)
    if isinstance(x, numpy.ndarray):
        return x, numpy, lambda a: a
    raise TypeError(f"{who}: expected a numpy array or a Tensor, got {type(x).__name__}")


def _image(x: Any, who: str):
    arr, xp, rewrap = _unwrap(x, who)
    if arr.ndim < 2:
        raise ShapeError(f"{who}: expected an image of shape (..., H, W), got shape {tuple(arr.shape)}")
    return arr, xp, rewrap


def _pair(value: Any, who: str, name: str) -> tuple[int, int]:
    if isinstance(value, numbers.Number):
        return int(value), int(value)
    if isinstance(value, Sequence) and len(value) in (1, 2):
        return (int(value[0]), int(value[-1]))
    raise ValueError(f"{who}: {name} should be an int or a sequence of 1 or 2 ints, got {value!r}")


class _Transform:
    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class Compose(_Transform):
    """Apply ``transforms`` one after another."""

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x

    def __repr__(self) -> str:
        return "Compose(\n" + "".join(f"    {t!r}\n" for t in self.transforms) + ")"


class ToTensor(_Transform):
    """An HxWxC or HxW numpy image -> a CxHxW Tensor; uint8 values are scaled to float32 in
    [0, 1], other dtypes are kept (as torchvision's ToTensor)."""

    def __call__(self, pic: Any) -> Tensor:
        arr = numpy.asarray(pic.detach().numpy() if isinstance(pic, Tensor) else pic)
        if arr.ndim == 2:
            arr = arr[None]
        elif arr.ndim == 3:
            arr = arr.transpose(2, 0, 1)
        else:
            raise ShapeError(f"ToTensor: expected an HxW or HxWxC image, got shape {tuple(arr.shape)}")
        if arr.dtype == numpy.uint8:
            arr = arr.astype(numpy.float32) / numpy.float32(255)
        elif arr.dtype.name not in backend.DTYPES:
            raise DTypeError(f"ToTensor: unsupported dtype {arr.dtype}")
        return _wrap(numpy.ascontiguousarray(arr), backend.cpu)


class Normalize(_Transform):
    """``(x - mean[c]) / std[c]`` for each channel ``c`` of a (..., C, H, W) float image."""

    def __init__(self, mean: Sequence[float] | float, std: Sequence[float] | float,
                 inplace: bool = False) -> None:
        self.mean, self.std, self.inplace = mean, std, inplace
        if numpy.any(numpy.asarray(std, dtype=numpy.float64) == 0):
            raise ValueError(f"Normalize: std {std!r} contains a zero, which would divide by zero")

    def __call__(self, x: Any) -> Any:
        arr, xp, rewrap = _image(x, "Normalize")
        if arr.ndim < 3:
            raise ShapeError(f"Normalize: expected a (..., C, H, W) image, got shape {tuple(arr.shape)}")
        if arr.dtype.kind != "f":
            raise DTypeError(f"Normalize: expected a floating image, got dtype {arr.dtype}")
        mean = xp.asarray(self.mean, dtype=arr.dtype).reshape(-1, 1, 1)
        std = xp.asarray(self.std, dtype=arr.dtype).reshape(-1, 1, 1)
        c = arr.shape[-3]
        if mean.shape[0] not in (1, c) or std.shape[0] not in (1, c):
            raise ShapeError(f"Normalize: mean/std have {mean.shape[0]}/{std.shape[0]} values for "
                             f"an image with {c} channel(s)")
        if self.inplace:
            arr -= mean
            arr /= std
            if isinstance(x, Tensor):
                x._bump_version()  # autograd's saved-tensor check must see the change
            return x
        return rewrap((arr - mean) / std)


class RandomCrop(_Transform):
    """Crop a random ``size`` window, after padding the borders by ``padding`` (an int for all
    sides, (left/right, top/bottom) or (left, top, right, bottom)). ``padding_mode`` is
    "constant" (with ``fill``), "edge", "reflect" or "symmetric"."""

    def __init__(self, size: int | Sequence[int], padding: int | Sequence[int] | None = None,
                 pad_if_needed: bool = False, fill: float = 0, padding_mode: str = "constant") -> None:
        self.size = _pair(size, "RandomCrop", "size")
        self.padding, self.pad_if_needed = padding, pad_if_needed
        self.fill, self.padding_mode = fill, padding_mode
        if padding_mode not in ("constant", "edge", "reflect", "symmetric"):
            raise ValueError(f"RandomCrop: padding_mode should be constant, edge, reflect or "
                             f"symmetric, got {padding_mode!r}")
        if padding is not None:
            p = [padding] if isinstance(padding, numbers.Number) else list(padding)
            if len(p) not in (1, 2, 4) or min(p) < 0:
                raise ValueError(f"RandomCrop: padding should be a non-negative int or a sequence "
                                 f"of 1, 2 or 4 of them, got {padding!r}")
            left, top, right, bottom = (p * 4)[:4] if len(p) == 1 else (p * 2 if len(p) == 2 else p)
            self._pad = (int(top), int(bottom), int(left), int(right))

    def _padded(self, arr, xp, top, bottom, left, right):
        if not (top or bottom or left or right):
            return arr
        widths = [(0, 0)] * (arr.ndim - 2) + [(top, bottom), (left, right)]
        if self.padding_mode == "constant":
            return xp.pad(arr, widths, mode="constant", constant_values=self.fill)
        return xp.pad(arr, widths, mode=self.padding_mode)

    def __call__(self, x: Any) -> Any:
        arr, xp, rewrap = _image(x, "RandomCrop")
        if self.padding is not None:
            arr = self._padded(arr, xp, *self._pad)
        th, tw = self.size
        h, w = arr.shape[-2:]
        if self.pad_if_needed and (h < th or w < tw):
            dh, dw = max(th - h, 0), max(tw - w, 0)
            arr = self._padded(arr, xp, dh, dh, dw, dw)
            h, w = arr.shape[-2:]
        if h < th or w < tw:
            raise ShapeError(f"RandomCrop: crop size {(th, tw)} is larger than the (padded) image "
                             f"size {(h, w)}")
        rng = backend.cpu.rng
        i, j = int(rng.integers(0, h - th + 1)), int(rng.integers(0, w - tw + 1))
        return rewrap(arr[..., i:i + th, j:j + tw].copy())


class RandomHorizontalFlip(_Transform):
    """Mirror the image left-right with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, x: Any) -> Any:
        arr, xp, rewrap = _image(x, "RandomHorizontalFlip")
        return rewrap(arr[..., ::-1].copy()) if backend.cpu.rng.random() < self.p else x


class RandomVerticalFlip(_Transform):
    """Mirror the image top-bottom with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, x: Any) -> Any:
        arr, xp, rewrap = _image(x, "RandomVerticalFlip")
        return rewrap(arr[..., ::-1, :].copy()) if backend.cpu.rng.random() < self.p else x


class RandomRotation(_Transform):
    """Rotate by an angle drawn uniformly from ``degrees`` (d means (-d, d)); positive angles
    turn counter-clockwise, about the image centre or ``center`` = (x, y) measured from the
    top-left corner. Each output pixel samples the input where the inverse rotation lands it,
    with "nearest" or "bilinear" interpolation; pixels from outside the image get ``fill``."""

    def __init__(self, degrees: float | Sequence[float], interpolation: str = "nearest", *,
                 center: Sequence[float] | None = None, fill: float = 0) -> None:
        if isinstance(degrees, numbers.Number):
            if degrees < 0:
                raise ValueError(f"RandomRotation: a single degrees value must be non-negative, "
                                 f"got {degrees}")
            degrees = (-degrees, degrees)
        if len(degrees) != 2:
            raise ValueError(f"RandomRotation: degrees should be a number or a (min, max) pair, "
                             f"got {degrees!r}")
        if interpolation not in ("nearest", "bilinear"):
            raise ValueError(f"RandomRotation: interpolation should be 'nearest' or 'bilinear', "
                             f"got {interpolation!r}")
        self.degrees = (float(degrees[0]), float(degrees[1]))
        self.interpolation, self.center, self.fill = interpolation, center, fill

    def __call__(self, x: Any) -> Any:
        arr, xp, rewrap = _image(x, "RandomRotation")
        angle = float(backend.cpu.rng.uniform(*self.degrees))
        return rewrap(self.rotate(arr, xp, angle))

    def rotate(self, arr: Any, xp: Any, angle: float) -> Any:
        h, w = arr.shape[-2:]
        # Pixel (row, col) has its centre at (col + 0.5, row + 0.5) in torchvision's coordinates.
        if self.center is None:
            cx, cy = (w - 1) / 2, (h - 1) / 2
        else:
            cx, cy = self.center[0] - 0.5, self.center[1] - 0.5
        cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
        dy, dx = xp.meshgrid(xp.arange(h) - cy, xp.arange(w) - cx, indexing="ij")
        # Inverse rotation (rows point down, so counter-clockwise on screen flips sin's signs).
        src_x, src_y = cos * dx - sin * dy + cx, sin * dx + cos * dy + cy

        def sample(rows, cols):
            inside = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)
            values = arr[..., xp.clip(rows, 0, h - 1), xp.clip(cols, 0, w - 1)]
            return xp.where(inside, values, self.fill)

        if self.interpolation == "nearest":
            out = sample(xp.rint(src_y).astype(xp.int64), xp.rint(src_x).astype(xp.int64))
        else:
            x0, y0 = xp.floor(src_x), xp.floor(src_y)
            wx, wy = src_x - x0, src_y - y0
            x0, y0 = x0.astype(xp.int64), y0.astype(xp.int64)
            out = (sample(y0, x0) * ((1 - wy) * (1 - wx)) + sample(y0, x0 + 1) * ((1 - wy) * wx)
                   + sample(y0 + 1, x0) * (wy * (1 - wx)) + sample(y0 + 1, x0 + 1) * (wy * wx))
        if arr.dtype.kind in "iub":
            out = xp.rint(out)
        return out.astype(arr.dtype)


class Lambda(_Transform):
    """Use any function as a transform."""

    def __init__(self, lambd: Callable) -> None:
        if not callable(lambd):
            raise TypeError(f"Lambda: argument should be callable, got {type(lambd).__name__}")
        self.lambd = lambd

    def __call__(self, x: Any) -> Any:
        return self.lambd(x)
