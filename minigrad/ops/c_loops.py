"""Ops whose numpy lines take many passes, as one C loop each: LSTM and GRU steps, log-softmax rows,
the col2im of a convolution's backward (chapters 02 and 03).

``LSTMGates`` is one graph node, but in numpy its forward is still about twenty ufunc calls over
(N, H) slices (sums, exps, reciprocals, products) and its backward op a dozen more: each call
walks memory once and pays numpy's own dispatch, about 150 us a step at batch 64 and width 64,
most of an LSTM's time. A log-softmax over a word model's 2000 classes is five passes over the
logits, and numpy's float32 ``exp`` alone took 1 ms of them for (320, 2000), where glibc's vector
``expf`` takes 0.3 ms. col2im (``ops.conv``) adds 16 windows back per pixel of a 4x4 kernel, as
numpy adds of short strided blocks into a buffer per stride phase: 0.8 ms for a DCGAN layer that
a loop over the batch, contiguous in the columns, does in 0.4. Written as one C loop, each element goes through the whole chain in
registers and the compiler vectorises it (``expf`` through glibc's vector math library), as the
fused groups of ``minigrad.graph.codegen.c`` do: here the loops are written by hand, once, since
these ops are fixed. They are built by ``minigrad.backend.cc`` (once per machine, cached and
hashed), with its exact-math flags, and compute the numpy lines' formulas operation for operation
(sigmoid as ``1 / (1 + exp(-a))``, tanh as ``2 sigmoid(2a) - 1``, ``(x - max) - log(sum(exp))``),
so the two agree but for the last bits of ``exp`` and the order of a row's sum. Where no compiler
builds them, for other dtypes than float32/float64, on other devices, or with
``MINIGRAD_KERNELS=numpy``, each function here returns ``None`` and the op runs its numpy lines.
"""

from __future__ import annotations

import ctypes
import os
import warnings
from typing import Any

from minigrad.backend import allocator, numpy
from minigrad.backend.cc import address as _address

_addressof, _from_buffer = ctypes.addressof, ctypes.c_char.from_buffer

__all__ = ["batch_norm", "batch_norm_backward", "col2im", "enabled", "gru_backward", "gru_forward", "leaky_relu", "log_softmax", "lstm_backward",
           "lstm_forward"]

# One macro per loop, instantiated for float and double; T is the type, E its exp. Each line is
# the numpy path's expression in the same order of operations (ops.recurrent).
_SOURCE = r"""/* minigrad.ops.c_loops: the LSTM and GRU gate arithmetic, log-softmax rows */
/* backend.cc's flags let a sum be reassociated (so a row's sum vectorises): here each expression
   keeps numpy's order instead (x - max, then - log(sum): folded into x - (max + log(sum)) a logit
   of 1e4 loses its last digits), and the one reduction, declared below, still vectorises */
#pragma GCC optimize ("no-associative-math")
#include <math.h>
#define SIMD __attribute__((__simd__("notinbranch")))  /* glibc has vector versions */
SIMD float expf(float); SIMD double exp(double);
#define SIG(T, E, a) ((T)1 / ((T)1 + E(-(a))))
#define TANH(T, E, a) ((T)2 * ((T)1 / ((T)1 + E((a) * (T)-2))) - (T)1)

#define LSTM_FORWARD(NAME, T, E) \
void NAME(long rows, long n, const T *xg, const T *hg, const T *c, T *h, T *cn, T *s, T *t) \
{ \
    for (long r = 0; r < rows; r++) { \
        const T *x = xg + r * 4 * n, *y = hg + r * 4 * n, *cr = c + r * n; \
        T *sr = s + r * 4 * n, *hr = h + r * n, *cnr = cn + r * n, *tr = t + r * n; \
        /* the gates first, one exp per element in loops of their own (a loop of several vector \
           calls keeps less in registers), then the cell update reading them back */ \
        _Pragma("omp simd") \
        for (long k = 0; k < 2 * n; k++) sr[k] = SIG(T, E, x[k] + y[k]); \
        _Pragma("omp simd") \
        for (long k = 2 * n; k < 3 * n; k++) sr[k] = TANH(T, E, x[k] + y[k]); \
        _Pragma("omp simd") \
        for (long k = 3 * n; k < 4 * n; k++) sr[k] = SIG(T, E, x[k] + y[k]); \
        _Pragma("omp simd") \
        for (long j = 0; j < n; j++) { \
            T cnew = sr[n + j] * cr[j] + sr[j] * sr[2 * n + j]; \
            T tc = TANH(T, E, cnew); \
            cnr[j] = cnew; tr[j] = tc; hr[j] = tc * sr[3 * n + j]; \
        } \
    } \
}

#define LSTM_BACKWARD(NAME, T) \
void NAME(long rows, long n, const T *dh, const T *dc, const T *c, const T *s, const T *t, T *d, T *dcp) \
{ \
    for (long r = 0; r < rows; r++) { \
        const T *sr = s + r * 4 * n, *dhr = dh + r * n, *dcr = dc + r * n, *cr = c + r * n, *tr = t + r * n; \
        T *dr = d + r * 4 * n, *dcpr = dcp + r * n; \
        _Pragma("omp simd") \
        for (long j = 0; j < n; j++) { \
            T i = sr[j], f = sr[n + j], g = sr[2 * n + j], o = sr[3 * n + j], tc = tr[j]; \
            T dcn = (tc * tc - (T)1) * -o * dhr[j] + dcr[j]; \
            dr[j] = dcn * g * ((T)1 - i) * i; \
            dr[n + j] = dcn * cr[j] * ((T)1 - f) * f; \
            dr[2 * n + j] = dcn * i * ((T)1 - g * g); \
            dr[3 * n + j] = dhr[j] * tc * ((T)1 - o) * o; \
            dcpr[j] = dcn * f; \
        } \
    } \
}

#define GRU_FORWARD(NAME, T, E) \
void NAME(long rows, long k, const T *gx, const T *gh, const T *h, T *out, T *rz, T *nn) \
{ \
    for (long r = 0; r < rows; r++) { \
        const T *x = gx + r * 3 * k, *y = gh + r * 3 * k, *hr = h + r * k; \
        T *rzr = rz + r * 2 * k, *nr = nn + r * k, *outr = out + r * k; \
        _Pragma("omp simd") \
        for (long j = 0; j < 2 * k; j++) rzr[j] = SIG(T, E, x[j] + y[j]); \
        _Pragma("omp simd") \
        for (long j = 0; j < k; j++) { \
            T nv = TANH(T, E, x[2 * k + j] + rzr[j] * y[2 * k + j]); \
            nr[j] = nv; \
            outr[j] = nv + rzr[k + j] * (hr[j] - nv); \
        } \
    } \
}

#define GRU_BACKWARD(NAME, T) \
void NAME(long rows, long k, const T *g, const T *gh, const T *h, const T *rz, const T *nn, T *dgx, T *dgh, T *dh) \
{ \
    for (long r = 0; r < rows; r++) { \
        const T *gr = g + r * k, *hn = gh + r * 3 * k + 2 * k, *hr = h + r * k, *rzr = rz + r * 2 * k, *nr = nn + r * k; \
        T *dx = dgx + r * 3 * k, *dy = dgh + r * 3 * k, *dhr = dh + r * k; \
        _Pragma("omp simd") \
        for (long j = 0; j < k; j++) { \
            T rg = rzr[j], z = rzr[k + j], nv = nr[j]; \
            T dn = gr[j] * ((T)1 - z) * ((T)1 - nv * nv); \
            T dr = dn * hn[j] * ((T)1 - rg) * rg; \
            T dz = gr[j] * (hr[j] - nv) * ((T)1 - z) * z; \
            dx[j] = dr; dx[k + j] = dz; dx[2 * k + j] = dn; \
            dy[j] = dr; dy[k + j] = dz; dy[2 * k + j] = dn * rg; \
            dhr[j] = gr[j] * z; \
        } \
    } \
}

#define LOG_SOFTMAX(NAME, T, E, LOG) \
void NAME(long rows, long n, const T *x, T *y) \
{ \
    for (long r = 0; r < rows; r++) { \
        const T *xr = x + r * n; \
        T *yr = y + r * n, m = xr[0], s = 0; \
        _Pragma("omp simd reduction(max: m)") \
        for (long j = 0; j < n; j++) m = xr[j] > m ? xr[j] : m; \
        _Pragma("omp simd reduction(+: s)") \
        for (long j = 0; j < n; j++) s += E(xr[j] - m); \
        T ls = LOG(s); \
        _Pragma("omp simd") \
        for (long j = 0; j < n; j++) yr[j] = (xr[j] - m) - ls; \
    } \
}

/* p: the geometry, N, C, H, W, KH, KW, SH, SW, PT, PL, DH, DW, OH, OW (ops.conv's names) */
#define GEOMETRY \
    long N = p[0], C = p[1], H = p[2], W = p[3], KH = p[4], KW = p[5], SH = p[6], SW = p[7]; \
    long PT = p[8], PL = p[9], DH = p[10], DW = p[11], OH = p[12], OW = p[13];

/* the window positions k in [*lo, *hi) (of n) whose pixel k * s + off lies inside [0, size) */
static void inside(long n, long s, long off, long size, long *lo, long *hi)
{
    *lo = off < 0 ? (-off + s - 1) / s : 0;
    *hi = off < size ? (size - 1 - off) / s + 1 : 0;
    if (*hi > n) *hi = n;
    if (*lo > *hi) *lo = *hi;
}

/* cols (C, KH, KW, OH, OW, N) -> out (N, C, H, W), through acc (H, W, N), one channel at a time:
   every window of cols is added to acc in ascending (u, v), so each pixel sums its windows from
   zero in the order ops.conv._col2im adds them (both give the same bits); the batch, contiguous in
   cols and acc, is the inner loop */
#define COL2IM(NAME, T) \
void NAME(long rows, long len, const long *p, const T *restrict cols, T *restrict out, T *restrict acc) \
{ \
    GEOMETRY \
    for (long c = 0; c < rows; c++) { \
        for (long k = 0; k < H * W * N; k++) acc[k] = 0; \
        for (long u = 0; u < KH; u++) \
        for (long v = 0; v < KW; v++) { \
            long i0, i1, j0, j1;  /* the windows inside the image */ \
            inside(OH, SH, u * DH - PT, H, &i0, &i1); \
            inside(OW, SW, v * DW - PL, W, &j0, &j1); \
            for (long i = i0; i < i1; i++) { \
                const T *src = cols + (((c * KH + u) * KW + v) * OH + i) * OW * N; \
                T *dst = acc + (i * SH + u * DH - PT) * W * N; \
                for (long j = j0; j < j1; j++) { \
                    T *d = dst + (j * SW + v * DW - PL) * N; \
                    _Pragma("omp simd") \
                    for (long b = 0; b < N; b++) d[b] += src[j * N + b]; \
                } \
            } \
        } \
        for (long b = 0; b < N; b++) { \
            T *o = out + (b * C + c) * H * W; \
            for (long k = 0; k < H * W; k++) o[k] = acc[k * N + b]; \
        } \
    } \
}

/* leaky ReLU: the factor f (1 where a > 0, else the slope) is what backward multiplies by; y = a * f,
   as ops.activation.LeakyRelu's numpy lines compute both (the same bits), in one pass */
#define LEAKY_RELU(NAME, T) \
void NAME(long rows, long n, const T *slope, const T *restrict a, T *restrict y, T *restrict s) \
{ \
    T k = slope[0]; \
    _Pragma("omp simd") \
    for (long j = 0; j < rows * n; j++) { T f = a[j] > 0 ? (T)1 : k; s[j] = f; y[j] = a[j] * f; } \
}

/* batch norm's training forward on x (N, C, S), per channel c (rows = C, n = S): the mean, the
   biased variance of x - mean (each a sum in double over the batch and S), then
   y = ((x - mean) * inv) * w + b with inv = 1 / sqrt(var + eps), the operations of
   ops.normalize.BatchNorm's numpy lines in their order; three passes over x where those take seven */
#define BATCH_NORM(NAME, T, SQRT) \
void NAME(long rows, long n, const long *batch, const T *eps, const T *restrict x, const T *restrict w, \
          const T *restrict bias, T *restrict y, T *restrict mean, T *restrict var) \
{ \
    long N = batch[0]; \
    double count = (double)N * n; \
    for (long c = 0; c < rows; c++) { \
        double s = 0, q = 0; \
        for (long b = 0; b < N; b++) { \
            const T *xr = x + (b * rows + c) * n; \
            _Pragma("omp simd reduction(+: s)") \
            for (long j = 0; j < n; j++) s += xr[j]; \
        } \
        T m = (T)(s / count); \
        for (long b = 0; b < N; b++) { \
            const T *xr = x + (b * rows + c) * n; \
            _Pragma("omp simd reduction(+: q)") \
            for (long j = 0; j < n; j++) { T d = xr[j] - m; T dd = d * d; q += dd; } \
        } \
        T v = (T)(q / count), inv = (T)1 / SQRT(v + eps[0]), wc = w[c], bc = bias[c]; \
        mean[c] = m; var[c] = v; \
        for (long b = 0; b < N; b++) { \
            const T *xr = x + (b * rows + c) * n; \
            T *yr = y + (b * rows + c) * n; \
            _Pragma("omp simd") \
            for (long j = 0; j < n; j++) { T d = (xr[j] - m) * inv; T e = d * wc; yr[j] = e + bc; } \
        } \
    } \
}

/* batch norm's gradients on g and x (N, C, S), per channel (rows = C, n = S): with inv = 1 / sqrt(var +
   eps) and xhat = (x - mean) * inv, gb = sum g and gw = sum g * xhat (in double), then
   gx = g * scale + c0 + xhat * c1, the constants as ops.normalize.BatchNormBackward's numpy lines
   make them; two passes over g and x where those take nine */
#define BATCH_NORM_BACKWARD(NAME, T, SQRT) \
void NAME(long rows, long n, const long *batch, const T *eps, const T *restrict g, const T *g_mean, \
          const T *g_var, const T *restrict x, const T *w, const T *mean, const T *var, T *restrict gx, \
          T *restrict gw, T *restrict gb) \
{ \
    long N = batch[0]; \
    T count = (T)(N * n); \
    for (long c = 0; c < rows; c++) { \
        T m = mean[c], inv = (T)1 / SQRT(var[c] + eps[0]); \
        double sb = 0, sw = 0; \
        for (long b = 0; b < N; b++) { \
            const T *gr = g + (b * rows + c) * n, *xr = x + (b * rows + c) * n; \
            _Pragma("omp simd reduction(+: sb, sw)") \
            for (long j = 0; j < n; j++) { T xh = (xr[j] - m) * inv; T p = gr[j] * xh; sb += gr[j]; sw += p; } \
        } \
        T b_c = (T)sb, w_c = (T)sw, scale = w[c] * inv; \
        T c0 = g_mean[c] / count - scale * b_c / count; \
        T c1 = g_var[c] * (T)2 / (count * inv) - scale * w_c / count; \
        gb[c] = b_c; gw[c] = w_c; \
        for (long b = 0; b < N; b++) { \
            const T *gr = g + (b * rows + c) * n, *xr = x + (b * rows + c) * n; \
            T *o = gx + (b * rows + c) * n; \
            _Pragma("omp simd") \
            for (long j = 0; j < n; j++) { T xh = (xr[j] - m) * inv; T s = gr[j] * scale; T t = s + c0; T u = xh * c1; o[j] = t + u; } \
        } \
    } \
}

LOG_SOFTMAX(log_softmax_float, float, expf, logf)
LOG_SOFTMAX(log_softmax_double, double, exp, log)
COL2IM(col2im_float, float)
COL2IM(col2im_double, double)
LEAKY_RELU(leaky_relu_float, float)
LEAKY_RELU(leaky_relu_double, double)
BATCH_NORM(batch_norm_float, float, sqrtf)
BATCH_NORM(batch_norm_double, double, sqrt)
BATCH_NORM_BACKWARD(batch_norm_backward_float, float, sqrtf)
BATCH_NORM_BACKWARD(batch_norm_backward_double, double, sqrt)
LSTM_FORWARD(lstm_forward_float, float, expf)
LSTM_FORWARD(lstm_forward_double, double, exp)
LSTM_BACKWARD(lstm_backward_float, float)
LSTM_BACKWARD(lstm_backward_double, double)
GRU_FORWARD(gru_forward_float, float, expf)
GRU_FORWARD(gru_forward_double, double, exp)
GRU_BACKWARD(gru_backward_float, float)
GRU_BACKWARD(gru_backward_double, double)
"""

_ARGS = {"lstm_forward": 7, "lstm_backward": 7, "gru_forward": 6, "gru_backward": 8, "log_softmax": 2,
         "col2im": 4, "leaky_relu": 4, "batch_norm": 8,
         "batch_norm_backward": 12}  # pointers after (rows, n)
_TYPES = {numpy.dtype("float32"): "float", numpy.dtype("float64"): "double"}
_functions: dict[str, Any] = {}
_library: list = []  # [the loaded library], or [False] when none could be built (asked once per process)


def _build() -> Any:
    from minigrad.backend import cc

    try:
        return cc.build(_SOURCE)
    except cc.CompilerUnavailable as e:
        warnings.warn(f"the C loops of the gate ops and log-softmax are off ({e}); they run as numpy", cc.KernelWarning,
                      stacklevel=4)
        return False


def _kernel(name: str, *arrays: Any) -> Any:
    """The C function ``name`` for these arrays' dtype, or None where the numpy lines must run:
    not all numpy arrays of one float dtype, an empty step, kernels switched off or not buildable."""
    first = arrays[0]
    if type(first) is not numpy.ndarray or not first.size:
        return None
    dtype = first.dtype
    ctype = _TYPES.get(dtype)
    if ctype is None or not enabled():
        return None
    for a in arrays:
        if type(a) is not numpy.ndarray or (a.dtype is not dtype and a.dtype != dtype):  # `is`: the usual, cheap case
            return None
    fn = _functions.get(name + ctype)
    if fn is None:
        fn = getattr(_library[0], f"{name}_{ctype}")
        fn.restype = None
        fn.argtypes = [ctypes.c_long, ctypes.c_long] + [ctypes.c_void_p] * _ARGS[name]
        _functions[name + ctype] = fn
    return fn


def enabled() -> bool:
    """Whether the C loops run: ``MINIGRAD_KERNELS`` was not ``numpy`` when first asked, and a
    compiler built them (both settled once per process, at the first step or log-softmax that asks)."""
    if not _library:
        _library.append(os.environ.get("MINIGRAD_KERNELS") != "numpy" and _build())
    return _library[0] is not False


def _c(a: Any) -> Any:
    return a if a.flags.c_contiguous else numpy.ascontiguousarray(a)


def _launch(fn: Any, rows: int, n: int, *arrays: Any) -> None:
    """Call a C loop over ``rows`` rows of ``n`` with the arrays' data, inputs then outputs."""
    fn(rows, n, *[_address(a) for a in arrays])


def _launch_step(fn: Any, rows: int, n: int, *arrays: Any) -> None:
    """``_launch`` for a recurrent step's loop, whose arrays are contiguous, non-empty and, all but
    always, writable: their buffers asked directly. An LSTM step launches two loops of seven arrays,
    28 steps a sequence, and ``address``'s checks of each array's flags are a quarter of its time."""
    try:
        addresses = [_addressof(_from_buffer(a)) for a in arrays]
    except (TypeError, ValueError, BufferError):  # a read-only array has no writable buffer to ask
        addresses = [_address(a) for a in arrays]
    fn(rows, n, *addresses)


def lstm_forward(xg: Any, hg: Any, c: Any) -> tuple | None:
    """``(h', c', s, t)`` of one LSTM step (``s`` the activated gates i, f, g, o, ``t`` tanh(c')),
    as ``ops.recurrent.LSTMGates`` computes them; None where the numpy lines must run."""
    fn = _kernel("lstm_forward", xg, hg, c)
    if fn is None:
        return None
    xg, hg, c = _c(xg), _c(hg), _c(c)
    h, cn, t, s = numpy.empty_like(c), numpy.empty_like(c), numpy.empty_like(c), numpy.empty_like(xg)
    n = c.shape[-1]
    _launch_step(fn, c.size // n, n, xg, hg, c, h, cn, s, t)
    return h, cn, s, t


def lstm_backward(dh: Any, dc: Any, c: Any, s: Any, t: Any) -> tuple | None:
    """``(d gates, d c)`` of one LSTM step from forward's activations ``s`` and ``t``, as
    ``ops.recurrent.LSTMGatesBackward`` computes them; None where the numpy lines must run."""
    fn = _kernel("lstm_backward", dh, dc, c, s, t)
    if fn is None or dh.shape != c.shape or dc.shape != c.shape:
        return None
    dh, dc, c, s, t = _c(dh), _c(dc), _c(c), _c(s), _c(t)
    d, dcp = numpy.empty_like(s), numpy.empty_like(c)
    n = c.shape[-1]
    _launch_step(fn, c.size // n, n, dh, dc, c, s, t, d, dcp)
    return d, dcp


def gru_forward(gx: Any, gh: Any, h: Any) -> tuple | None:
    """``(h', rz, n)`` of one GRU step (``rz`` the reset and update gates, ``n`` the candidate),
    as ``ops.recurrent.GRUGates`` computes them; None where the numpy lines must run."""
    fn = _kernel("gru_forward", gx, gh, h)
    if fn is None:
        return None
    gx, gh, h = _c(gx), _c(gh), _c(h)
    k = h.shape[-1]
    out, rz, n = numpy.empty_like(h), numpy.empty(h.shape[:-1] + (2 * k,), h.dtype), numpy.empty_like(h)
    _launch_step(fn, h.size // k, k, gx, gh, h, out, rz, n)
    return out, rz, n


def gru_backward(g: Any, gh: Any, h: Any, rz: Any, n: Any) -> tuple | None:
    """``(d gx, d gh, d h)`` of one GRU step from forward's ``rz`` and ``n``, as
    ``ops.recurrent.GRUGatesBackward`` computes them; None where the numpy lines must run."""
    fn = _kernel("gru_backward", g, gh, h, rz, n)
    if fn is None or g.shape != h.shape:
        return None
    g, gh, h, rz, n = _c(g), _c(gh), _c(h), _c(rz), _c(n)
    dgx, dgh, dh = numpy.empty_like(gh), numpy.empty_like(gh), numpy.empty_like(h)
    k = h.shape[-1]
    _launch_step(fn, h.size // k, k, g, gh, h, rz, n, dgx, dgh, dh)
    return dgx, dgh, dh


def log_softmax(a: Any, dim: int) -> Any:
    """``log_softmax(a)`` along ``dim`` as ``ops.softmax.LogSoftmax`` computes it, for rows that
    are the last axis of a C-contiguous array; None where the numpy lines must run."""
    if dim != a.ndim - 1 or a.ndim == 0 or not a.flags.c_contiguous:
        return None
    fn = _kernel("log_softmax", a)
    if fn is None:
        return None
    y = numpy.empty_like(a)
    n = a.shape[-1]
    _launch(fn, a.size // n, n, a, y)
    return y


def _geometry(n: int, c: int, h: int, w: int, g: Any, oh: int, ow: int) -> Any:
    """The longs the conv loops read their geometry from (``GEOMETRY`` in the C source)."""
    (kh, kw), (sh, sw), (pt, _, pl, _), (dh, dw) = g
    return numpy.array([n, c, h, w, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow], dtype=numpy.int64)


def col2im(cols: Any, g: Any, h: int, w: int) -> Any:
    """The adjoint of im2col (``ops.conv``): (C, KH, KW, OH, OW, N) columns added back into (N, C, H, W), each
    pixel's windows in ``ops.conv._col2im``'s order (the same sums, bit for bit); None where the
    numpy lines must run."""
    fn = _kernel("col2im", cols)
    if fn is None:
        return None
    cols = _c(cols)
    c, kh, kw, oh, ow, n = cols.shape
    out = allocator.empty(numpy, (n, c, h, w), cols.dtype)
    if out.size:
        acc = allocator.empty(numpy, (h, w, n), cols.dtype)  # one channel's sums, batch last
        _launch(fn, c, n * h * w, _geometry(n, c, h, w, g, oh, ow), cols, out, acc)
    return out


def leaky_relu(a: Any, negative_slope: float) -> tuple | None:
    """``(a * f, f)`` with ``f`` 1 where ``a > 0`` and ``negative_slope`` elsewhere, as
    ``ops.activation.LeakyRelu`` computes them; None where the numpy lines must run."""
    fn = _kernel("leaky_relu", a)
    if fn is None or not a.flags.c_contiguous:  # numpy's lines keep another layout (channels_last)
        return None
    y, s = allocator.empty(numpy, a.shape, a.dtype), allocator.empty(numpy, a.shape, a.dtype)
    _launch(fn, 1, a.size, numpy.array([negative_slope], a.dtype), a, y, s)
    return y, s


def batch_norm(x: Any, weight: Any, bias: Any, eps: float) -> tuple | None:
    """Batch norm's training forward over every dim of ``x`` (N, C, ...) but the channels:
    ``(y, mean, var)``, mean and biased variance in keepdim shape, as ``ops.normalize.BatchNorm``
    computes them but for the order of the sums; None where the numpy lines must run."""
    fn = _kernel("batch_norm", x, weight, bias)
    if fn is None or x.ndim < 2 or not x.shape[0] or weight.size != x.shape[1] or not x.flags.c_contiguous:
        return None  # (numpy's lines keep another layout, such as channels_last)
    weight, bias = _c(weight), _c(bias)
    n, c = x.shape[:2]
    y = allocator.empty(numpy, x.shape, x.dtype)
    mean, var = numpy.empty(c, x.dtype), numpy.empty(c, x.dtype)
    _launch(fn, c, x.size // max(n * c, 1), numpy.array([n], numpy.int64), numpy.array([eps], x.dtype), x, weight, bias,
            y, mean, var)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return y, mean.reshape(shape), var.reshape(shape)


def batch_norm_backward(g: Any, g_mean: Any, g_var: Any, x: Any, weight: Any, mean: Any, var: Any,
                        eps: float) -> tuple | None:
    """``(gx, gw, gb)`` of batch norm's training pass (gw and gb in ``var``'s keepdim shape) from the
    gradients reaching its three outputs, as ``ops.normalize.BatchNormBackward`` computes them but
    for the order of the sums; None where the numpy lines must run."""
    fn = _kernel("batch_norm_backward", g, g_mean, g_var, x, weight, mean, var)
    if fn is None or x.ndim < 2 or not x.shape[0] or g.shape != x.shape or weight.size != x.shape[1] \
            or not x.flags.c_contiguous:  # numpy's lines keep another layout (channels_last)
        return None
    n, c = x.shape[:2]
    if not (g_mean.size == g_var.size == mean.size == var.size == c):
        return None
    g, g_mean, g_var, x, weight, mean, var = (_c(a) for a in (g, g_mean, g_var, x, weight, mean, var))
    gx = allocator.empty(numpy, x.shape, x.dtype)
    gw, gb = numpy.empty(var.shape, x.dtype), numpy.empty(var.shape, x.dtype)
    _launch(fn, c, x.size // max(n * c, 1), numpy.array([n], numpy.int64), numpy.array([eps], x.dtype), g, g_mean,
            g_var, x, weight, mean, var, gx, gw, gb)
    return gx, gw, gb
