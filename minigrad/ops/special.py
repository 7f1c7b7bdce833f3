"""Special functions on raw arrays: ``erf``, the error function behind exact GELU.

numpy has no erf, and ``vectorize(math.erf)`` is a Python loop. Instead we evaluate the
published rational approximations of the Cephes library (S. L. Moshier, ``ndtr.c``) with array
operations: ``erf(x) = x T(x^2) / U(x^2)`` for ``|x| < 1`` and ``erf(x) = 1 - exp(-x^2) P(|x|) /
Q(|x|)`` above, each accurate to float64 rounding. Chapter 02 uses it for GELU's forward pass.
"""

from __future__ import annotations

from typing import Any

__all__ = ["erf"]

# Cephes ndtr.c: erf(x) = x * T(x^2) / U(x^2) on [0, 1] (U's leading coefficient is 1)
_T = (9.60497373987051638749e0, 9.00260197203842689217e1, 2.23200534594684319226e3,
      7.00332514112805075473e3, 5.55923013010394962768e4)
_U = (1.0, 3.35617141647503099647e1, 5.21357949780152679795e2, 4.59432382970980127987e3,
      2.26290000613890934246e4, 4.92673942608635921086e4)
# erfc(x) = exp(-x^2) * P(x) / Q(x) on [1, 8] (Q's leading coefficient is 1)
_P = (2.46196981473530512524e-10, 5.64189564831068821977e-1, 7.46321056442269912687e0,
      4.86371970985681366614e1, 1.96520832956077098242e2, 5.26445194995477358631e2,
      9.34528527171957607540e2, 1.02755188689515710272e3, 5.57535335369399327526e2)
_Q = (1.0, 1.32281951154744992508e1, 8.67072140885989742329e1, 3.54937778887819891062e2,
      9.75708501743205489753e2, 1.82390916687909736289e3, 2.24633760818710981792e3,
      1.65666309194161350182e3, 5.57535340817727675546e2)

# erfc(6) < 2e-17, below half a float64 ulp of 1, so erf is exactly +-1 from here on
_SATURATE = 6.0


def _polyval(coefs: tuple, x: Any) -> Any:
    """Horner's rule, highest power first (in place: one temporary array in all)."""
    out = x * coefs[0]
    out += coefs[1]
    for c in coefs[2:]:
        out *= x
        out += c
    return out


def erf(xp: Any, a: Any) -> Any:
    """The error function of every element of ``a`` (float16, float32 or float64), computed in
    float64 and returned in ``a``'s dtype. Max absolute error about 1e-16 in float64."""
    x = xp.abs(a.astype("float64"))
    # both branches are evaluated everywhere; clipping keeps the unused one finite
    s = xp.minimum(x, 1.0)
    z = s * s
    small = _polyval(_T, z)
    small *= s
    small /= _polyval(_U, z)
    t = xp.clip(x, 1.0, _SATURATE)
    large = xp.exp(-t * t)
    large *= _polyval(_P, t)
    large /= _polyval(_Q, t)
    large = 1.0 - large  # x >= _SATURATE gives 1 - ~1e-17, which rounds to exactly 1
    y = xp.where(x < 1.0, small, large)
    y = xp.where(xp.isnan(x), x, y)
    return xp.copysign(y, a).astype(a.dtype, copy=False)
