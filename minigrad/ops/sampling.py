"""``multinomial``: draw category indices from weights, as ``torch.multinomial`` (chapter 02 samples
text from a trained language model with it).

Sampling has no gradient; it draws from the device's generator, or from a ``minigrad.Generator``
given as ``generator=`` (``minigrad.backend``); inside ``vmap`` it follows the vmap's ``randomness``.
"""

from __future__ import annotations

from minigrad import backend
from minigrad.backend import value_checks
from minigrad.autograd.mode import random_call
from minigrad.errors import DTypeError, ShapeError
from minigrad._tensor import Tensor, _wrap

__all__ = ["multinomial"]


def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *,
                generator: backend.Generator | None = None) -> Tensor:
    """Draw ``num_samples`` category indices from each row of non-negative ``weights`` (1-D or
    2-D, need not sum to 1), as ``torch.multinomial``. With replacement each draw inverts the
    cumulative distribution; without, the ``num_samples`` smallest of the exponential arrival
    times ``E_i / w_i`` are an ordered weighted draw without replacement. Inside ``vmap`` it
    follows the vmap's ``randomness`` (``minigrad.autograd.mode.random_call``)."""
    return random_call("multinomial", lambda w: _draw(w, num_samples, replacement, generator), (input,))


def _draw(input: Tensor, num_samples: int, replacement: bool, generator: backend.Generator | None) -> Tensor:
    if input.dtype.kind != "f":
        raise DTypeError(f"multinomial: expected a floating tensor of weights, got {input.dtype}")
    if input.ndim not in (1, 2):
        raise ShapeError(f"multinomial: expected a 1-D or 2-D tensor of weights, got shape {tuple(input.shape)}")
    xp, dev = input.device.xp, input.device
    w = input.array.reshape(-1, input.shape[-1]).astype("float64")
    # Checked where the weights are: on a GPU read at the next host read (minigrad.backend.value_checks).
    value_checks.check(xp, (w < 0).any() | ~xp.isfinite(w).all() | (w.sum(-1) <= 0).any(), ValueError,
                       lambda: "multinomial: weights must be finite, non-negative and have a positive sum in every row")
    if not replacement:
        value_checks.check(xp, (w > 0).sum(-1).min() < num_samples, ValueError, lambda: (
            f"multinomial: cannot draw {num_samples} samples without replacement from a row "
            f"with fewer categories of non-zero weight"))
    rng = backend.rng_of(dev, generator)
    with backend.selected(dev):
        if replacement:
            cdf = xp.cumsum(w, -1)
            u = rng.random((w.shape[0], num_samples)) * cdf[:, -1:]
            out = xp.stack([xp.searchsorted(c, r, side="right") for c, r in zip(cdf, u)])
            out = xp.minimum(out, w.shape[1] - 1)
        else:
            with backend.numpy.errstate(divide="ignore"):
                arrival = rng.standard_exponential(w.shape) / w
            out = xp.argsort(arrival, -1, kind="stable")[:, :num_samples]
    out = out.astype("int64")
    return _wrap(out.reshape(num_samples) if input.ndim == 1 else out, dev)
