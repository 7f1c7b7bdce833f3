"""The gate arithmetic of one LSTM or GRU step as one op each (chapter 02's recurrences, made fast).

An LSTM step is one matrix product (the gates' pre-activations, ``x W_ih^T + h W_hh^T + b``) and
then a dozen elementwise operations on slices of it: three sigmoids, two tanhs, the cell update.
As separate ops that is a dozen graph nodes per time step, each paying Python's dispatch, so a
28-step sequence spends its time recording nodes rather than computing. ``LSTMGates`` does the
elementwise part in one forward pass over the (N, 4H) pre-activations, ``GRUGates`` the GRU's,
and ``Unbind`` and ``Stack`` give the loop its steps and join its outputs in one node each. A
gate op's backward is one op too (``LSTMGatesBackward``, ``GRUGatesBackward``, as Sigmoid's is
``SigmoidBackward``), fed the activations forward kept, and whose own backward is built from
minigrad ops, so a recurrent network stays differentiable at any order (gradgradcheck of the
backward ops). Gate order is PyTorch's: i, f, g, o and r, z, n. The array forwards run as one C
loop each where a compiler is found (``minigrad.ops.c_loops``), the numpy lines below otherwise.
"""

from __future__ import annotations

from minigrad import backend
from minigrad._tensor import Tensor
from minigrad.errors import ShapeError
from minigrad.ops import c_loops
from minigrad.ops.elementwise import sigmoid, tanh
from minigrad.ops.indexing import _as_view, _dim_of
from minigrad.ops.movement import cat
from minigrad.ops.op import GRADIENT_OP, Op

__all__ = ["gru_gates", "lstm_gates", "unbind"]

_NO_ONNX = "one step's gates: ONNX's LSTM and GRU ops take a whole sequence, and no emitter writes them"


# The activations below take one exp each, written in place: numpy's float32 exp is about twice
# as fast as its tanh, and the gate arithmetic, not the matrix product, is most of a step's time.
# For a << 0, exp(-a) overflows to inf, and 1 / (1 + inf) is the right 0.
def _sigmoid_(xp, e):
    """``e`` holds -a on entry (or -2a) and sigmoid(a) (sigmoid(2a)) on return."""
    with backend.numpy.errstate(over="ignore"):
        xp.exp(e, out=e)
    e += 1
    return xp.reciprocal(e, out=e)


def _tanh(xp, a):
    """tanh(a) = 2 sigmoid(2a) - 1, in a new array."""
    t = _sigmoid_(xp, a * -2)
    t *= 2
    t -= 1
    return t


def _sigmoid(xp, a):
    return _sigmoid_(xp, -a)


def _lstm_activations(xp, xg, hg, n: int):
    """The four gates of an LSTM from their two pre-activation terms, activated in one pass:
    sigmoid for i, f and o, tanh for g."""
    scale = xp.full(4 * n, -1, xg.dtype)
    scale[2 * n:3 * n] = -2
    s = xg + hg
    s *= scale
    s = _sigmoid_(xp, s)
    g = s[..., 2 * n:3 * n]  # a view: sigmoid(2a) becomes tanh(a) in place
    g *= 2
    g -= 1
    return s


def _blocks(s, n: int):
    """The (i, f, g, o) views of the activated gates."""
    return s[..., :n], s[..., n:2 * n], s[..., 2 * n:3 * n], s[..., 3 * n:]


class LSTMGates(Op):
    """``(xg, hg, c) -> (h', c')``: ``c' = f * c + i * g``, ``h' = o * tanh(c')`` with i, f, o the
    sigmoids and g the tanh of the four (N, H) blocks of ``xg + hg``, the input's and the hidden
    state's projections (the sum is taken here, not by a node of its own)."""

    onnx_refused = _NO_ONNX

    @staticmethod
    def forward(ctx, xg, hg, c):
        fused = c_loops.lstm_forward(xg, hg, c)  # one C loop, where a compiler built it
        if fused is not None:
            h, c_next, s, t = fused
        else:
            s = _lstm_activations(ctx.xp, xg, hg, c.shape[-1])
            i, f, g, o = _blocks(s, c.shape[-1])
            c_next = f * c
            c_next += i * g
            t = _tanh(ctx.xp, c_next)
            h = t * o
        # the activations and tanh(c') are kept, as im2col's columns are by Conv2d: backward then
        # needs no exp at all (its own backward, for second derivatives, recomputes them from xg, hg, c)
        ctx.save_for_backward(xg, hg, c, s, t)
        return h, c_next

    @staticmethod
    def backward(ctx, dh, dc):
        xg, hg, c, s, t = ctx.saved_tensors
        # s and t are constants to the backward op (no gradient flows into them): under either binding
        d_gates, d_c = ctx.ops.apply(LSTMGatesBackward, dh, dc, xg, hg, c, s, t)
        return d_gates, d_gates, d_c


class LSTMGatesBackward(Op):
    """The gradients of ``LSTMGates`` in one pass: ``(dh, dc, xg, hg, c) -> (d gates, d c)``, the
    gradient of the gates' pre-activations (both terms get it) and of the cell state (``s`` and
    ``t``, forward's activations and tanh(c'), spare recomputing them); with
    dc' = dc + dh * o * (1 - tanh(c')^2) the gradient reaching c' (through c' and through h').
    Differentiable again for higher orders, as ``SigmoidBackward`` is."""

    onnx_refused = GRADIENT_OP
    # a second-derivative rule, run only when a gradient is itself differentiated: written once on
    # Tensors (sigmoid, tanh, cat) rather than doubled into array helpers it alone would use
    tensor_backward = True

    @staticmethod
    def forward(ctx, dh, dc, xg, hg, c, s=None, t=None):
        xp, n = ctx.xp, c.shape[-1]
        ctx.save_for_backward(dh, dc, xg, hg, c)
        if s is None:  # the activations and tanh(c'), unless forward's are given
            fused = c_loops.lstm_forward(xg, hg, c)
            s, t = (fused[2], fused[3]) if fused is not None else (_lstm_activations(xp, xg, hg, n), t)
        fused = c_loops.lstm_backward(dh, dc, c, s, t) if t is not None else None
        if fused is not None:
            return fused
        i, f, g, o = _blocks(s, n)
        if t is None:
            t = _tanh(xp, f * c + i * g)
        dcn = t * t  # then dc + dh * o * (1 - t^2), in place
        dcn -= 1
        dcn *= -o
        dcn *= dh
        dcn += dc
        d = xp.empty(i.shape[:-1] + (4 * n,), dtype=dcn.dtype)  # each gate's gradient times its slope
        d[..., :n] = dcn * g * (1 - i) * i
        d[..., n:2 * n] = dcn * c * (1 - f) * f
        d[..., 2 * n:3 * n] = dcn * i * (1 - g * g)
        d[..., 3 * n:] = dh * t * (1 - o) * o
        dcn *= f
        return d, dcn

    @staticmethod
    def backward(ctx, u, v):
        """Second derivatives: the chain rule through forward's expressions, one cotangent per
        quantity (w reaches dc', cn reaches c'), then each gate's through its own slope."""
        gh, gc, xg, hg, c = ctx.saved_tensors
        n = c.shape[-1]
        gates = xg + hg
        s = sigmoid(gates)
        i, f, o, g = s[..., :n], s[..., n:2 * n], s[..., 3 * n:], tanh(gates[..., 2 * n:3 * n])
        ui, uf, ug, uo = u[..., :n], u[..., n:2 * n], u[..., 2 * n:3 * n], u[..., 3 * n:]
        di, df, do, dg = i * (1 - i), f * (1 - f), o * (1 - o), 1 - g * g
        t = tanh(f * c + i * g)
        dt = 1 - t * t
        dc = gc + gh * o * dt
        w = ui * g * di + uf * c * df + ug * i * dg + v * f
        cn = (uo * gh * do - 2 * w * gh * o * t) * dt
        d_i = (ui * dc * g * (1 - 2 * i) + ug * dc * dg + cn * g) * di
        d_f = (uf * dc * c * (1 - 2 * f) + v * dc + cn * c) * df
        d_g = (ui * dc * di - 2 * ug * dc * i * g + cn * i) * dg
        d_o = (w * gh * dt + uo * gh * t * (1 - 2 * o)) * do
        d_gates = cat([d_i, d_f, d_g, d_o], -1)
        return w * o * dt + uo * t * do, w, d_gates, d_gates, uf * dc * df + cn * f, None, None


class GRUGates(Op):
    """``(gx, gh, h) -> h'``: r, z = sigmoid(gx + gh) of the first two blocks,
    ``n = tanh(gx_n + r * gh_n)``, ``h' = (1 - z) * n + z * h``; ``gx`` and ``gh`` are the input's and
    the hidden state's (N, 3H) projections, each with its own bias, as in PyTorch."""

    onnx_refused = _NO_ONNX

    @staticmethod
    def forward(ctx, gx, gh, h):
        xp, k = ctx.xp, h.shape[-1]
        fused = c_loops.gru_forward(gx, gh, h)  # one C loop, where a compiler built it
        if fused is not None:
            out, rz, n = fused
        else:
            rz = _sigmoid(xp, gx[..., :2 * k] + gh[..., :2 * k])
            n = _tanh(xp, gx[..., 2 * k:] + rz[..., :k] * gh[..., 2 * k:])
            out = n + rz[..., k:] * (h - n)
        ctx.save_for_backward(gx, gh, h, rz, n)  # r, z and n spare the backward op its exps
        return out

    @staticmethod
    def backward(ctx, g):
        gx, gh, h, rz, n = ctx.saved_tensors
        return ctx.ops.apply(GRUGatesBackward, g, gx, gh, h, rz, n)


class GRUGatesBackward(Op):
    """The gradients of ``GRUGates`` in one pass: ``(g, gx, gh, h) -> (d gx, d gh, d h)`` (``rz``
    and ``n``, forward's activations, spare recomputing them); differentiable again."""

    onnx_refused = GRADIENT_OP
    # a second-derivative rule, run only when a gradient is itself differentiated: written once on
    # Tensors (sigmoid, tanh, cat) rather than doubled into array helpers it alone would use
    tensor_backward = True

    @staticmethod
    def forward(ctx, g, gx, gh, h, rz=None, n=None):
        xp, k = ctx.xp, h.shape[-1]
        ctx.save_for_backward(g, gx, gh, h)
        if rz is None or n is None:  # forward's activations, unless given
            fused = c_loops.gru_forward(gx, gh, h)
            if fused is not None:
                rz, n = fused[1], fused[2]
        fused = c_loops.gru_backward(g, gh, h, rz, n) if rz is not None and n is not None else None
        if fused is not None:
            return fused
        if rz is None:
            rz = _sigmoid(xp, gx[..., :2 * k] + gh[..., :2 * k])
        r, z, hn = rz[..., :k], rz[..., k:], gh[..., 2 * k:]
        if n is None:
            n = _tanh(xp, gx[..., 2 * k:] + r * hn)
        dn = g * (1 - z) * (1 - n * n)  # at n's pre-activation
        dr = dn * hn * (1 - r) * r
        dz = g * (h - n) * (1 - z) * z
        return (xp.concatenate([dr, dz, dn], -1), xp.concatenate([dr, dz, dn * r], -1), g * z)

    @staticmethod
    def backward(ctx, u, w, v):
        """Second derivatives: forward's expressions differentiated back to front, ``b_x`` the
        cotangent of quantity x (u, w and v those of the three gradients forward returned)."""
        g, gx, gh, h = ctx.saved_tensors
        k = h.shape[-1]
        rz = sigmoid(gx[..., :2 * k] + gh[..., :2 * k])
        r, z, hn = rz[..., :k], rz[..., k:], gh[..., 2 * k:]
        n = tanh(gx[..., 2 * k:] + r * hn)
        sr, sz, sn = r * (1 - r), z * (1 - z), 1 - n * n
        dn = g * (1 - z) * sn
        ur, uz = u[..., :k] + w[..., :k], u[..., k:2 * k] + w[..., k:2 * k]  # dr and dz go to both
        b_dn = u[..., 2 * k:] + w[..., 2 * k:] * r + ur * hn * sr
        b_n = -uz * g * sz - 2 * b_dn * g * (1 - z) * n
        b_z = v * g + uz * g * (h - n) * (1 - 2 * z) - b_dn * g * sn
        b_g = v * z + uz * (h - n) * sz + b_dn * (1 - z) * sn
        b_an = b_n * sn  # at n's pre-activation gx_n + r * hn
        b_r = ur * dn * hn * (1 - 2 * r) + w[..., 2 * k:] * dn + b_an * hn
        b_hn = ur * dn * sr + b_an * r
        b_ar, b_az = b_r * sr, b_z * sz
        return b_g, cat([b_ar, b_az, b_an], -1), cat([b_ar, b_az, b_hn], -1), uz * g * sz, None, None


class Unbind(Op):
    """The slices ``x[t]`` along ``dim`` as views, in one node: the sequence loop's steps. Indexing
    each step apart would give each its own backward, and each of those a dense gradient of the
    whole sequence; here the steps' gradients meet once, in one ``stack``."""

    kind = "movement"
    returns_view = True
    onnx_refused = "unbind's emitter (Split, then Squeeze) is not written yet"

    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        return tuple(x[(slice(None),) * dim + (t,)] for t in range(x.shape[dim]))

    @staticmethod
    def backward(ctx, *grads): return ctx.ops.apply(Stack, ctx.dim, *grads), None


class Stack(Op):
    """``Unbind``'s inverse, the loop's outputs joined along a new ``dim`` in one node (``stack``
    of ``minigrad.ops`` unsqueezes each and concatenates: two nodes a step, each with a backward)."""

    kind = "movement"
    onnx_refused = "an internal op of the recurrent layers (export refuses their gate ops anyway)"

    @staticmethod
    def forward(ctx, dim, *arrays):
        ctx.dim = dim
        return ctx.xp.stack(arrays, axis=dim)

    @staticmethod
    def backward(ctx, g): return (None, *ctx.ops.apply(Unbind, g, ctx.dim))


def unbind(input: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """The slices of ``input`` along ``dim``, each without that dim, as ``torch.unbind``."""
    d = _dim_of(input, dim, "unbind")
    if input.shape[d] == 0:
        return ()
    out = Unbind.apply(input, d)
    # views of input, so they share its version counter (autograd's saved-tensor check sees an
    # in-place change through either side), as torch.unbind's are
    return tuple(_as_view(o, input) for o in (out if type(out) is tuple else (out,)))


def _check(op: str, name: str, t: Tensor, shape: tuple) -> None:
    if tuple(t.shape) != shape:
        raise ShapeError(f"{op}: expected {name} of shape {shape}, got {tuple(t.shape)}")


def lstm_gates(xg: Tensor, hg: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """One LSTM step after its two matrix products: the input's and the hidden state's (..., 4H)
    projections (biases included) and the cell state (..., H) give the next ``(h, c)``."""
    shape = (*c.shape[:-1], 4 * c.shape[-1])
    _check("lstm_gates", "xg", xg, shape)
    _check("lstm_gates", "hg", hg, shape)
    return LSTMGates.apply(xg, hg, c)


def gru_gates(gx: Tensor, gh: Tensor, h: Tensor) -> Tensor:
    """One GRU step after its two matrix products: the input's and the hidden state's (..., 3H)
    projections and the state (..., H) give the next state."""
    shape = (*h.shape[:-1], 3 * h.shape[-1])
    _check("gru_gates", "gx", gx, shape)
    _check("gru_gates", "gh", gh, shape)
    return GRUGates.apply(gx, gh, h)
