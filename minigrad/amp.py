"""Mixed precision: ``autocast`` runs each op in the precision it tolerates, and ``GradScaler``
keeps small float16 gradients from flushing to zero (chapter 03).

float16 halves the bytes an activation keeps for backward, but rounds coarsely and cannot
represent magnitudes below 6e-8. So ``autocast`` (a ``Mode`` on the thread's stack) gives each op
the precision its class declares (``autocast``), and ``GradScaler`` scales the loss up before backward
so that small gradients survive, then scales them back down before the optimizer step.
"""

from __future__ import annotations

import functools
import math
import struct
from collections import defaultdict
from enum import Enum
from typing import Any, Callable, Iterable, NamedTuple

from minigrad import backend
from minigrad.autograd import grad_mode
from minigrad.autograd.mode import Mode, active, backward_depth, pop, push
from minigrad.errors import DTypeError
from minigrad.ops.elementwise import cast
from minigrad._tensor import Tensor

__all__ = ["AutocastMode", "GradScaler", "OptState", "autocast", "is_autocast_enabled"]

_SUPPORTED = (backend.float16,)


class _Region(NamedTuple):
    dtype: Any  # the low-precision dtype of the allow-listed ops
    depth: int  # the thread's backward depth when the region was entered
    cache: bool


class AutocastMode(Mode):
    """The mode ``autocast`` regions share on a thread: the innermost region of each device type
    decides, and one cast cache lives as long as any region is entered."""

    def __init__(self) -> None:
        self.regions: dict[str, _Region | None] = {}  # device type -> the innermost region, if enabled
        self.nesting = 0  # regions entered and not yet left; the mode leaves the stack at 0
        self.cache: dict[tuple, tuple] = {}  # (id(param), dtype, grad mode) -> (param, version, cast)

    @property
    def casts_inputs(self) -> bool:  # ops leave mixed input dtypes to it (see Mode)
        return any(self.regions.values())

    def before_op(self, cls: type, args: tuple) -> tuple:
        """``args`` with floating tensors cast to the dtype the op's ``autocast`` declaration asks
        for (unchanged when the op needs no cast): ``"low"`` matmul-like ops, where most of the time
        and memory go and rounding averages out; ``"fp32"`` sums of many terms, exponentials, values
        outside float16's range; ``"keep"`` the casts autocast itself makes; ``"promote"`` (the rest)
        the widest input dtype. These are PyTorch's autocast lists, for the ops minigrad has
        (``minigrad.ops.op``)."""
        policy = getattr(cls, "autocast", "promote")
        if policy == "keep":
            return args
        dtypes = [a.array.dtype for a in args if isinstance(a, Tensor) and a.array.dtype.kind == "f"]
        if not dtypes:
            return args
        region = self.regions.get(next(a for a in args if isinstance(a, Tensor)).device.type)
        # ops run at a deeper backward depth are backward rules of a pass started inside the region:
        # they keep the dtypes their forward used
        if region is None or backward_depth() != region.depth:
            return args
        if policy == "low":
            target = region.dtype
            wanted = [d != target and d != backend.float64 for d in dtypes]  # float64 is left alone, as torch
        elif policy == "fp32":
            target = backend.float32
            wanted = [d.itemsize < 4 for d in dtypes]
        else:
            if all(d == dtypes[0] for d in dtypes):
                return args
            target = functools.reduce(lambda a, b: backend.result_type(a, b, False, False), dtypes)
            wanted = [d != target for d in dtypes]
        if not any(wanted):
            return args
        out, i = [], 0
        for a in args:
            if isinstance(a, Tensor) and a.array.dtype.kind == "f":
                a = self._cast(a, target, region.cache) if wanted[i] else a
                i += 1
            out.append(a)
        return tuple(out)

    def _cast(self, t: Tensor, dtype: Any, use_cache: bool) -> Tensor:
        """``cast(t, dtype)``; a parameter (a leaf that requires grad) is cast once per region, so
        one float16 copy of a weight serves every use, as in PyTorch."""
        if not (use_cache and t.requires_grad and t.grad_fn is None and t._base is None):
            return cast(t, dtype)
        key = (id(t), dtype, grad_mode.is_grad_enabled())  # a cast made under no_grad has no graph to reuse
        hit = self.cache.get(key)
        if hit is not None and hit[0] is t and hit[1] == t._version:  # an in-place update makes it stale
            return hit[2]
        out = cast(t, dtype)
        self.cache[key] = (t, t._version, out)
        return out


class autocast:
    """Run the ops in a region in mixed precision: ``with minigrad.autocast(): loss = model(x)``.

    Matrix products and convolutions, which hold most of the arithmetic and tolerate rounding, get
    float16 inputs; ops that sum many terms or leave float16's narrow range (reductions, softmax,
    exp, log, pow, losses, normalisation) get float32 inputs; every other op runs in the widest
    float dtype among its inputs. The casts are ordinary differentiable ops, so parameters stay
    float32 ("master weights") and their gradients arrive in float32. Backward rules run in the
    dtypes their forward used, as in PyTorch.

    Also a decorator. Regions nest; ``autocast(enabled=False)`` inside one runs in the inputs'
    dtypes again. ``dtype`` must be float16: numpy has no native bfloat16. Wrap the forward pass
    and the loss, as PyTorch recommends; a backward pass run inside the region is not autocast
    either way.
    """

    def __init__(self, device_type: str = "cpu", dtype: Any = backend.float16, enabled: bool = True,
                 cache_enabled: bool = True) -> None:
        if device_type not in ("cpu", "cuda"):
            raise ValueError(f"autocast: device_type must be 'cpu' or 'cuda', got {device_type!r}")
        try:
            dtype = backend.as_dtype(dtype)
        except DTypeError:
            dtype = None
        if dtype not in _SUPPORTED:
            raise DTypeError(
                f"autocast: dtype must be float16, got {dtype!r}; bfloat16 is not supported because numpy "
                "has no native bfloat16 (ml_dtypes' bfloat16 is not a floating kind to numpy, sums it "
                "in bfloat16 and has no einsum)"
            )
        self.device_type, self.dtype = device_type, dtype
        self.enabled, self.cache_enabled = bool(enabled), bool(cache_enabled)
        self._saved: list[tuple] = []  # a stack, so one instance may be entered recursively

    def __enter__(self) -> autocast:
        mode = active(AutocastMode)
        if mode is None:
            mode = AutocastMode()
            push(mode)
        self._saved.append((mode, mode.regions.get(self.device_type)))
        region = _Region(self.dtype, backward_depth(), self.cache_enabled) if self.enabled else None
        mode.regions[self.device_type] = region
        mode.nesting += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        mode, previous = self._saved.pop()
        mode.regions[self.device_type] = previous
        mode.nesting -= 1
        if mode.nesting == 0:
            pop(mode)  # and its cast cache with it

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)

        return wrapper


def is_autocast_enabled(device_type: str = "cpu") -> bool:
    """Whether ops on ``device_type`` are autocast here (as ``torch.is_autocast_enabled``)."""
    mode = active(AutocastMode)
    return mode is not None and mode.regions.get(device_type) is not None


# -- loss scaling -------------------------------------------------------------------------------------
class OptState(Enum):
    """Where an optimizer is in the current iteration: ``unscale_`` and ``step`` may each run once."""

    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _fresh_state() -> dict[str, Any]:
    return {"stage": OptState.READY, "found_inf_per_device": {}}


def _float32(x: float) -> float:
    """``x`` rounded to float32 (inf past its range): PyTorch keeps the scale in a float32 tensor."""
    return struct.unpack("f", struct.pack("f", x))[0]


class GradScaler:
    """Dynamic loss scaling, with the API and the update rule of ``torch.amp.GradScaler``::

        scaler.scale(loss).backward()
        scaler.unscale_(opt)                      # optional: to clip or inspect true gradients
        clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)                          # skipped when a gradient is inf or nan
        scaler.update()

    It multiplies the loss by a large factor before backward, divides the gradients by it before
    the optimizer step, skips the steps whose gradients overflowed, and adapts the factor: halve it
    after an overflow, double it after ``growth_interval`` clean steps (PyTorch's rules). The scale
    is a host float; whether a gradient overflowed is computed on the gradients' device and read
    once, in ``step``.
    """

    def __init__(self, device: str = "cpu", init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        if str(device).partition(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"GradScaler: device must be 'cpu' or 'cuda', got {device!r}")
        self._device = str(device)  # torch's first argument; minigrad scales on each gradient's own device
        self._enabled = bool(enabled)
        if self._enabled:
            if growth_factor <= 1.0:
                raise ValueError(f"GradScaler: the growth factor must be > 1.0, got {growth_factor}")
            if backoff_factor >= 1.0:
                raise ValueError(f"GradScaler: the backoff factor must be < 1.0, got {backoff_factor}")
        self._init_scale = float(init_scale)
        self._growth_factor, self._backoff_factor = float(growth_factor), float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._init_growth_tracker = 0
        self._scale: float | None = None  # set by the first scale(), as torch does
        self._growth_tracker: int | None = None
        self._per_optimizer_states: defaultdict[int, dict[str, Any]] = defaultdict(_fresh_state)

    def _check_started(self, funcname: str) -> None:
        if self._scale is None:
            raise RuntimeError(
                f"GradScaler: attempted {funcname} before any scale(); this may indicate your script did not "
                "use scaler.scale(loss or outputs) earlier in the iteration"
            )

    def scale(self, outputs: Tensor | Iterable[Tensor]) -> Any:
        """``outputs * scale`` (a tensor, or each tensor of a list or tuple, recursively)."""
        if not self._enabled:
            return outputs
        if self._scale is None:
            self._scale, self._growth_tracker = _float32(self._init_scale), self._init_growth_tracker
        if isinstance(outputs, Tensor):
            return outputs * self._scale
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        if isinstance(outputs, Iterable):
            return map(self.scale, outputs)
        raise ValueError(f"GradScaler.scale: outputs must be a Tensor or an iterable of Tensors, got "
                         f"{type(outputs).__name__}")

    def unscale_(self, optimizer: Any) -> None:
        """Divide the optimizer's gradients by the scale in place, noting whether any is inf/nan.
        At most once per optimizer between ``update()`` calls, and before ``step``."""
        if not self._enabled:
            return
        self._check_started("unscale_")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = _float32(1.0 / self._scale)  # the reciprocal in double, rounded, as torch
        found: dict = {}
        with grad_mode.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    g = p.grad
                    if g is None:
                        continue
                    if g.dtype == backend.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    dev = g.device
                    bad = ~dev.xp.isfinite(g.array).all()  # a 0-d array on the device: no sync here
                    found[dev] = bad if dev not in found else found[dev] | bad
                    g.mul_(inv_scale)
        state["found_inf_per_device"] = found
        state["stage"] = OptState.UNSCALED

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """``unscale_(optimizer)`` if not done yet, then ``optimizer.step(*args, **kwargs)`` unless a
        gradient was inf or nan. Returns what ``optimizer.step`` returned (None when skipped)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_started("step")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if not state["found_inf_per_device"]:
            raise RuntimeError("GradScaler.step: no inf checks were recorded for this optimizer (no parameter "
                               "has a gradient); call backward on the scaled loss first")
        result = None
        found = state["found_inf_per_device"]
        for dev, bad in found.items():  # the one wait for the GPU a scaled step makes: update() reads these
            found[dev] = bool(bad)
        if not any(found.values()):
            result = optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        return result

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """End the iteration: back off after an overflow in any optimizer, grow the scale after
        ``growth_interval`` clean steps in a row, or set ``new_scale`` if given.

        Nothing happens when the scaler is disabled; ``self._check_started("update")`` first.
        ``new_scale``: a float or a 1-element tensor without grad (``ValueError`` otherwise).
        Otherwise read every optimizer's ``found_inf_per_device`` values
        (``self._per_optimizer_states``; none at all is a ``RuntimeError`` saying to call
        ``step()`` or ``unscale_()`` first): any nonzero one multiplies ``self._scale`` by
        ``self._backoff_factor`` and resets ``self._growth_tracker``; else the clean step is
        counted, and the ``growth_interval``-th in a row multiplies the scale by
        ``self._growth_factor`` (unless that overflows float32) and resets the count. Keep the
        scale a float32 value (``_float32``). Last, start the next iteration with fresh
        per-optimizer states (``defaultdict(_fresh_state)``).
        """
        ### BEGIN SOLUTION chapter 03: GradScaler's update
        if not self._enabled:
            return
        self._check_started("update")
        if new_scale is not None:
            if isinstance(new_scale, Tensor):
                if new_scale.numel() != 1 or new_scale.requires_grad:
                    raise ValueError("new_scale should be a float or a 1-element tensor with requires_grad=False.")
                new_scale = new_scale.item()
            self._scale = _float32(float(new_scale))
        else:
            found = [v for s in self._per_optimizer_states.values() for v in s["found_inf_per_device"].values()]
            if not found:
                raise RuntimeError("GradScaler.update: no inf checks were recorded prior to update(); call "
                                   "step() (or unscale_()) first")
            if any(bool(v) for v in found):
                self._scale = _float32(self._scale * self._backoff_factor)
                self._growth_tracker = 0
            elif self._growth_tracker + 1 == self._growth_interval:
                grown = _float32(self._scale * self._growth_factor)
                if math.isfinite(grown):  # never grow past float32's range
                    self._scale = grown
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
        self._per_optimizer_states = defaultdict(_fresh_state)
        ### END SOLUTION

    def get_scale(self) -> float:
        """The current scale (1.0 when disabled; ``init_scale`` before the first ``scale``)."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else self._scale

    def is_enabled(self) -> bool:
        return self._enabled

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = int(new_interval)

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        return self._init_growth_tracker if self._growth_tracker is None else self._growth_tracker

    def state_dict(self) -> dict[str, Any]:
        """Scale, factors, interval and the count of clean steps (empty when disabled); take it
        after ``update()``."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._get_growth_tracker()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved from a disabled "
                               "instance of GradScaler.")
        self._init_scale = float(state_dict["scale"])
        if self._scale is not None:
            self._scale = _float32(self._init_scale)
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        if self._growth_tracker is not None:
            self._growth_tracker = self._init_growth_tracker
