"""``ctx.ops``: one backward rule, two bindings (chapter 02; DESIGN.md principle 2).

A built-in backward rule is written once, with operators and the few functions of ``ctx.ops``.
The engine binds ``ctx.ops`` per backward pass: to ``TENSOR_OPS``, minigrad's differentiable ops,
when the pass is itself recorded (``create_graph=True``, or any mode on the stack: the tracer,
anomaly mode, the profiler, the memory tracker, vmap), and to an ``ArrayOps``, the raw array
module of the node's device, when nobody records. Under the array binding ``g`` and
``ctx.saved_tensors`` are arrays and no Tensor or graph node is built, which is where the time
of an unrecorded backward went; under the Tensor binding the same lines build the graph that
higher-order derivatives need. This is autodidax's idea (a rule is evaluated by whichever
interpreter is current) with MiniTorch's backend namespace.

Both bindings offer the same names with the same signatures, and every array function computes
with the op's own array forward (``apply(OpClass, *args)`` runs ``OpClass.forward`` and records
nothing), so a gradient is bit-identical under either binding (``tests/autograd/test_bindings.py``).
"""

from __future__ import annotations

from typing import Any

from minigrad.backend import device_of, numpy
from minigrad.errors import ShapeError
from minigrad._tensor import Tensor, _wrap


class TensorOps:
    """The recorded binding: every name is minigrad's differentiable op of that name (the
    functions of ``minigrad.ops``), and ``apply(OpClass, *args)`` is ``OpClass.apply``."""

    arrays = False
    device = None  # any device's: Tensors carry their own (``on`` returns this binding)

    def __getattr__(self, name: str) -> Any:
        import minigrad.ops as ops  # (autograd is imported before the ops; looked up once per name)

        fn = getattr(ops, name)
        setattr(self, name, fn)  # later reads find it on the instance
        return fn

    @staticmethod
    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        return cls.apply(*args, **kwargs)

    def on(self, device: Any) -> TensorOps:
        """This binding for a node on ``device``: the same one (Tensors carry their device)."""
        return self

    @staticmethod
    def zeros(shape: tuple, dtype: Any, device: Any) -> Tensor:
        return _wrap(device.xp.zeros(shape, dtype), device)

    @staticmethod
    def data(g: Any) -> Any:
        """What shape and dtype are read from: the array (a sparse gradient has both itself)."""
        return g if g.is_sparse else g.array

    @staticmethod
    def constant(array: Any) -> Tensor:
        """An array a rule builds (an identity matrix, a mask) as a value of this binding: a Tensor
        that needs no gradient."""
        return _wrap(array, device_of(array))

    @staticmethod
    def tensor(g: Any, device: Any = None) -> Tensor:
        """A value of this binding as a Tensor, for hooks, ``.grad`` and user rules: itself."""
        return g

    @staticmethod
    def value(t: Tensor) -> Any:
        """A Tensor as a value of this binding: itself."""
        return t


class ArrayOps:
    """The unrecorded binding for one device: numpy (or cupy) arrays, computed by the ops' own
    array forwards so that every value equals the Tensor binding's bit for bit."""

    arrays = True

    def __init__(self, device: Any) -> None:
        self.device = device
        self.xp = device.xp
        self._ndarray = device.xp.ndarray

    def apply(self, cls: type, *args: Any, **kwargs: Any) -> Any:
        """``cls``'s array forward on arrays, as ``cls.apply`` would compute it, recording nothing."""
        ctx = object.__new__(cls)
        ctx.device, ctx.xp = self.device, self.xp
        ctx.needs_input_grad = (False,) * len(args)  # nothing is kept for a backward that never runs
        out = cls.forward(ctx, *args, **kwargs)
        if type(out) is tuple:
            return tuple(o if type(o) is self._ndarray else self.xp.asarray(o) for o in out)
        return out if type(out) is self._ndarray else self.xp.asarray(out)  # numpy reduces to scalars

    def on(self, device: Any) -> ArrayOps:
        """The array binding for a node on ``device``: this one, or that device's."""
        return self if device is self.device else array_ops(device)

    def zeros(self, shape: tuple, dtype: Any, device: Any = None) -> Any:
        return self.xp.zeros(shape, dtype)

    @staticmethod
    def data(g: Any) -> Any:
        return g

    @staticmethod
    def constant(array: Any) -> Any:
        """An array a rule builds (an identity matrix, a mask) as a value of this binding: itself."""
        return array

    def tensor(self, g: Any, device: Any = None) -> Tensor:
        """``g`` as a Tensor on ``device`` (default: the device the array lives on)."""
        if isinstance(g, Tensor) or getattr(g, "is_sparse", False):  # (a sparse gradient is a Tensor of its own kind)
            return g
        if isinstance(g, numpy.generic):
            g = numpy.asarray(g)  # numpy gives 0-D results as scalars
        return _wrap(g, device if device is not None else device_of(g))

    @staticmethod
    def value(t: Tensor) -> Any:
        if t.is_sparse:
            return t.to_dense().array
        return t.array

    # -- the functions rules call, each the op's forward (see minigrad.ops for what each computes)
    def sum_to(self, x: Any, shape: tuple) -> Any:
        from minigrad.ops.reduce import SumTo

        shape = tuple(shape)
        if x.shape == shape:
            return x
        lead = x.ndim - len(shape)
        if lead < 0 or any(n != 1 and n != m for n, m in zip(shape, x.shape[lead:])):
            raise ShapeError(f"sum_to: cannot sum an array of shape {tuple(x.shape)} to shape {shape}")
        return self.apply(SumTo, x, shape)

    def cast(self, x: Any, dtype: Any) -> Any:
        from minigrad import backend
        from minigrad.ops.elementwise import Cast

        dtype = backend.as_dtype(dtype)
        return x if x.dtype == dtype else self.apply(Cast, x, dtype)

    def reshape(self, x: Any, shape: Any) -> Any:
        from minigrad.ops.movement import Reshape

        return self.apply(Reshape, x, tuple(shape))

    def getitem(self, x: Any, index: Any) -> Any:
        """``x[index]`` for a basic index (ints, slices, None, Ellipsis), as ``GetItem`` reads it."""
        from minigrad.ops.indexing import GetItem

        index = index if isinstance(index, tuple) else (index,)
        return self.apply(GetItem, x, (index + (Ellipsis,) if Ellipsis not in index else index, None))

    def narrow(self, x: Any, dim: int, start: int, length: int) -> Any:
        return self.getitem(x, (slice(None),) * (dim % x.ndim) + (slice(start, start + length),))

    def unsqueeze(self, x: Any, dim: int) -> Any:
        d = dim if dim >= 0 else dim + x.ndim + 1
        return self.reshape(x, x.shape[:d] + (1,) + x.shape[d:])

    def matmul(self, a: Any, b: Any) -> Any:
        from minigrad.ops.linalg import Matmul

        return self.apply(Matmul, a, b)

    def sum(self, x: Any, dim: Any = None, keepdim: bool = False) -> Any:
        from minigrad.ops.reduce import Sum, _dims

        return self.apply(Sum, x, _dims(dim, x.ndim, "sum"), keepdim)

    def mean(self, x: Any, dim: Any = None, keepdim: bool = False) -> Any:
        from minigrad.ops.reduce import Mean, _dims

        return self.apply(Mean, x, _dims(dim, x.ndim, "mean"), keepdim)

    def exp(self, x: Any) -> Any:
        from minigrad.ops.elementwise import Exp

        return self.apply(Exp, x)

    def where(self, cond: Any, x: Any, y: Any) -> Any:
        from minigrad import backend
        from minigrad.ops.elementwise import Where

        if hasattr(x, "dtype") and hasattr(y, "dtype") and x.dtype is not y.dtype:  # where()'s promotion
            dt = backend.result_type(x.dtype, y.dtype, x.ndim == 0, y.ndim == 0)
            x, y = self.cast(x, dt), self.cast(y, dt)
        return self.apply(Where, cond, x, y)


TENSOR_OPS = TensorOps()
_ARRAY_OPS: dict = {}


def array_ops(device: Any) -> ArrayOps:
    """The array binding of ``device`` (one per device, made on first use)."""
    ops = _ARRAY_OPS.get(device)
    if ops is None:
        ops = _ARRAY_OPS[device] = ArrayOps(device)
    return ops
