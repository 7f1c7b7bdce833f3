"""Exception types a student can act on: each names the op, what was expected and what was given.

They subclass the built-in exceptions PyTorch raises in the same situations, so code written
against ``torch`` (``except RuntimeError``) keeps working.
"""


class ShapeError(ValueError):
    """Shapes that do not fit an op (broadcasting, matmul, reshape, a bad ``dim``)."""


class DimensionError(ShapeError, IndexError):
    """A ``dim`` out of range for the tensor (``x.sum(dim=5)`` on a 2-d tensor): a ShapeError for
    minigrad's code, and the IndexError torch raises (``Dimension out of range``) for torch's."""


class ArgumentError(ValueError):
    """An argument value an op cannot take (``clamp`` with neither bound, a bad ``chunks``)."""


class DTypeError(TypeError):
    """A dtype an op cannot take, or a cast that would lose information in place."""


class DeviceError(RuntimeError):
    """Tensors on different devices, or a device that is not available."""


class AutogradError(RuntimeError):
    """Misuse of the autograd engine: a freed graph, a modified saved tensor, a bad ``backward``."""


class DistributedError(RuntimeError):
    """A collective that ran past the group's timeout, or a rank that left the job early."""


class AnomalyError(RuntimeError):
    """NaN or Inf found by ``detect_anomaly``; the message names the op and where it was created."""


class RandomnessError(RuntimeError):
    """A random op inside ``vmap(randomness="error")`` (the default), where it is ambiguous
    whether the examples should share one draw or each get their own (torch's RuntimeError)."""


class TraceError(RuntimeError):
    """Something the tracer cannot record faithfully (a write that bypassed the ops, a bad output),
    or a recorded graph that cannot replay (a ``.grad`` it reads is gone)."""


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read back: damaged, truncated, tampered or not one at all."""
