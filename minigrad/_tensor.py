"""``Tensor``: an N-D array on a device, plus what autograd needs to differentiate through it.

A Tensor holds ``array`` (an ``xp`` array: numpy on the CPU, cupy on a GPU), ``requires_grad``,
``grad`` and ``grad_fn`` (the graph node that produced it, ``None`` for a leaf); ``data`` is, as in
PyTorch, the same memory as a Tensor outside autograd. Every operator and method below is one line
that applies a ``Function`` from ``minigrad.ops``; the graph is recorded there (chapter 01 draws
it, chapter 02 walks it backwards). Views share memory with their base and its version counter, so
an in-place change to either is seen by autograd's saved-tensor check.

The module is ``minigrad._tensor`` so that ``minigrad.tensor`` is one thing, the function that
makes a tensor (as ``torch.tensor``); ``minigrad.Tensor`` is the class. Tensor and the ops import
each other, the one import circle in the package (``tools/import_graph.py``): the ops build on
Tensor, and Tensor's operators call the ops, bound by the import at the end of this module.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any, Callable, Iterator, Sequence

from minigrad import backend
from minigrad.backend import Device, cpu
from minigrad.errors import AutogradError, DTypeError, ShapeError
from minigrad.hooks import RemovableHandle, add_hook
from minigrad.tensor_types import TYPE_NAMES, Size, dtype_of_type_name
from minigrad.backend.value_checks import raise_pending


class Tensor:
    """An N-D array with autograd. Create one with ``minigrad.tensor(...)`` or ``Tensor(data)``."""

    __slots__ = (
        "array", "device", "requires_grad", "grad", "grad_fn", "_output_nr", "_vc", "_base",
        "_accum", "_hooks", "__weakref__",
    )
    is_sparse = False  # minigrad.sparse.SparseTensor says True
    __array_priority__ = 1000  # numpy array (op) tensor defers to Tensor's reflected operator

    def __init__(self, data: Any, dtype: Any = None, device: str | Device | None = None,
                 requires_grad: bool = False) -> None:
        if device is not None:
            dev = Device(device)
        elif isinstance(data, Tensor):
            dev = data.device
        else:  # an array on a GPU stays there; host data goes to the default device
            dev = backend.device_of(data)
            if dev is cpu:
                dev = backend.get_default_device()
        if dtype is None and isinstance(data, (list, tuple)):
            dtype = backend.get_default_dtype()  # Tensor([0]) is a FloatTensor, as in torch; tensor() infers
        arr = _as_array(data, dtype, dev)
        _init(self, arr, dev)
        if requires_grad:
            self.requires_grad_(True)

    # -- metadata -------------------------------------------------------------------------------
    @property
    def shape(self) -> Size:
        return Size(self.array.shape)

    @property
    def ndim(self) -> int:
        return self.array.ndim

    @property
    def dtype(self):
        return self.array.dtype

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def _version(self) -> int:
        return (self._base if self._base is not None else self)._vc

    def size(self, dim: int | None = None):
        return Size(self.array.shape) if dim is None else self.array.shape[_dim(dim, self.ndim, "size")]

    def dim(self) -> int:
        return self.array.ndim

    def numel(self) -> int:
        return self.array.size

    nelement = numel

    def element_size(self) -> int:
        return self.array.itemsize

    @property
    def nbytes(self) -> int:
        return self.array.nbytes

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.array.shape[0]

    # -- conversion -----------------------------------------------------------------------------
    def item(self) -> Any:
        if self.array.size != 1:
            raise ShapeError(f"item(): only one-element tensors can be converted, got shape {tuple(self.shape)}")
        if _current_modes():  # a tracer must know: what is computed from the number is not recorded
            _reads_values(self, "item()")
        if self.device is not cpu:
            raise_pending()  # the host waits for the GPU here: the checks queued on it are read too
        return self.array.item()

    def numpy(self):
        if self.requires_grad:
            raise AutogradError("numpy(): the tensor requires grad; call tensor.detach().numpy()")
        if _current_modes():
            _reads_values(self, "numpy()")
        if self.device is cpu:
            return self.array
        raise_pending()
        return self.array.get()

    def tolist(self) -> Any:
        if _current_modes():
            _reads_values(self, "tolist()")
        if self.device is cpu:
            return self.array.tolist()
        raise_pending()
        return self.array.get().tolist()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self.dtype.kind not in "iu":
            raise TypeError(f"only integer tensors can be used as an index, got {self.dtype}")
        return int(self.item())

    def __bool__(self) -> bool:
        if self.array.size != 1:
            raise RuntimeError(f"the truth value of a tensor with {self.array.size} elements is ambiguous")
        if self.device is not cpu:
            raise_pending()
        return bool(self.array.item())  # a branch on a traced value is baked in, as documented (trace)

    def __format__(self, spec: str) -> str:
        """``f"{loss:.4f}"`` formats a one-element tensor's value, as PyTorch does."""
        if self.ndim == 0 and spec:
            return format(self.item(), spec)
        return object.__format__(self, spec) if spec else repr(self)

    def __array__(self, dtype=None, copy=None):
        arr = self.detach().numpy()
        return arr if dtype is None else arr.astype(dtype)

    def __iter__(self) -> Iterator[Tensor]:
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        if self.device.type == "meta":  # no values to print, as torch: tensor(..., device='meta', size=(2, 3))
            return f"tensor(..., device='meta', size={tuple(self.shape)}" + (
                f", dtype={self.dtype})" if self.dtype is not backend.get_default_dtype() else ")")
        body = backend.numpy.array2string(
            self.detach().numpy(), separator=", ", precision=4, prefix="tensor(", threshold=100
        )
        extra = []
        if self.dtype is not backend.get_default_dtype() and self.dtype not in (backend.int64, backend.bool_):
            extra.append(f"dtype=minigrad.{self.dtype}")
        if self.device is not cpu:
            extra.append(f"device='{self.device}'")
        if self.grad_fn is not None:
            extra.append(f"grad_fn=<{self.grad_fn.name()}Backward>")
        elif self.requires_grad:
            extra.append("requires_grad=True")
        return "tensor(" + body + "".join(", " + e for e in extra) + ")"

    # -- autograd -------------------------------------------------------------------------------
    def backward(self, gradient: Tensor | None = None, retain_graph: bool | None = None,
                 create_graph: bool = False, inputs: Sequence[Tensor] | None = None) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad`` (see ``autograd.engine``)."""
        from minigrad.autograd.engine import backward

        backward(self, gradient, retain_graph, create_graph, inputs)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if requires_grad and self.dtype.kind != "f":
            raise DTypeError(f"only floating point tensors can require gradients, got dtype {self.dtype}")
        if not requires_grad and self.grad_fn is not None:
            raise AutogradError("requires_grad_(False) on a non-leaf tensor; use detach() instead")
        self.requires_grad = bool(requires_grad)
        return self

    @property
    def data(self) -> Tensor:
        """As in PyTorch: a tensor sharing this one's memory, outside autograd (no graph, and its
        own version counter, so in-place changes through it are not checked). The raw ``xp`` array
        is ``tensor.array``."""
        return _wrap(self.array, self.device)

    @data.setter
    def data(self, value: Tensor) -> None:
        if not isinstance(value, Tensor):
            raise TypeError(f"tensor.data = value: expected a Tensor, got {type(value).__name__}")
        self.array, self.device = value.array, value.device

    def detach(self) -> Tensor:
        """The same data (shared memory, shared version counter), cut from the graph."""
        t = _wrap(self.array, self.device)
        t._base = self._base if self._base is not None else self
        return t

    def detach_(self) -> Tensor:
        self.grad_fn, self.requires_grad = None, False
        return self

    def retain_grad(self) -> None:
        """Keep ``.grad`` on a non-leaf tensor after backward (leaves always keep theirs)."""
        if self.grad_fn is None:
            return
        ref, nr = weakref.ref(self), self._output_nr

        def store(grads):
            t = ref()
            if t is not None and grads[nr] is not None:
                g = grads[nr]
                t.grad = g if t.grad is None else t.grad + g
            return None

        self.grad_fn.register_prehook(store)

    def register_hook(self, hook: Callable[[Tensor], Tensor | None]) -> RemovableHandle:
        """Call ``hook(grad)`` when this tensor's gradient is computed; a returned tensor replaces
        it. Returns a handle whose ``remove()`` takes the hook away again."""
        if not self.requires_grad:
            raise AutogradError("register_hook: cannot register a hook on a tensor that doesn't require grad")
        if self.grad_fn is None:
            if self._hooks is None:
                self._hooks = OrderedDict()
            return add_hook(self._hooks, hook)
        nr = self._output_nr

        def prehook(grads):
            if grads[nr] is None:
                return None
            new = hook(grads[nr])
            if new is None:
                return None
            grads = list(grads)
            grads[nr] = new
            return grads

        return self.grad_fn.register_prehook(prehook)

    # -- dtype and device -----------------------------------------------------------------------
    def to(self, *args: Any, dtype: Any = None, device: Any = None, memory_format: Any = None) -> Tensor:
        """``to(dtype)``, ``to(device)``, ``to(device, dtype)`` or ``to(other_tensor)``, and
        ``to(memory_format=minigrad.channels_last)``; differentiable."""
        dtype, device = parse_to_args(args, dtype, device)
        out = self if memory_format is None else _ops.to_memory_format(self, memory_format)
        if device is not None and device is not self.device:
            out = _ops.to_device(out, device)
        if dtype is not None and dtype != out.dtype:
            out = _ops.cast(out, dtype)
        return out

    def astype(self, dtype: Any) -> Tensor:
        return self.to(dtype=dtype)

    def type(self, dtype: Any = None) -> str | Tensor:
        """``x.type()`` is the type name (``"minigrad.FloatTensor"``); ``x.type(dtype)`` or
        ``x.type("minigrad.LongTensor")`` converts, as in PyTorch."""
        if dtype is None:
            return "minigrad." + TYPE_NAMES[self.dtype]
        return self.to(dtype=dtype_of_type_name(dtype) if isinstance(dtype, str) and "Tensor" in dtype else dtype)

    def float(self) -> Tensor:
        return self.to(dtype=backend.float32)

    def double(self) -> Tensor:
        return self.to(dtype=backend.float64)

    def half(self) -> Tensor:
        return self.to(dtype=backend.float16)

    def long(self) -> Tensor:
        return self.to(dtype=backend.int64)

    def int(self) -> Tensor:
        return self.to(dtype=backend.int32)

    def bool(self) -> Tensor:
        return self.to(dtype=backend.bool_)

    def cpu(self) -> Tensor:
        return self.to(device=cpu)

    def cuda(self, index: int = 0) -> Tensor:
        return self.to(device=f"cuda:{index}")

    def clone(self) -> Tensor:
        return _ops.clone(self)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def is_cpu(self) -> bool:
        return self.device.type == "cpu"

    @property
    def is_xpu(self) -> bool:
        return False  # Intel GPUs are not a minigrad device

    # -- new tensors like this one: torch's new_*, of this dtype and device unless told otherwise -----
    def new_tensor(self, data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        """A copy of ``data`` (never sharing memory with it, and detached when it is a Tensor)."""
        data = data.detach() if isinstance(data, Tensor) else data
        return Tensor(data, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

    def new_zeros(self, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        return self.new_full(_shape_arg(size), 0, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_ones(self, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        return self.new_full(_shape_arg(size), 1, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_empty(self, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        """Zeros: minigrad never hands out uninitialised memory (torch's values are arbitrary)."""
        return self.new_full(_shape_arg(size), 0, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_full(self, size: Sequence[int], fill_value: Any, dtype: Any = None, device: Any = None,
                 requires_grad: bool = False) -> Tensor:
        dev = backend.resolve_device(device or self.device)
        with backend.selected(dev):
            out = _wrap(dev.xp.full(tuple(size), fill_value, backend.as_dtype(dtype or self.dtype)), dev)
        return out.requires_grad_(True) if requires_grad else out

    # -- storage and strides (minigrad.ops.layout; chapter 01, lesson 05) --------------------------
    def contiguous(self, memory_format: Any = None) -> Tensor:
        return _ops.to_memory_format(self, memory_format or _ops.contiguous_format)

    def is_contiguous(self, memory_format: Any = None) -> bool:
        return _ops.layout.is_contiguous(self, memory_format or _ops.contiguous_format)

    def stride(self, dim: int | None = None):
        """Steps, in elements, between neighbours along each dim: ``(3, 1)`` for a (2, 3) tensor."""
        s = _ops.layout.array_strides(self.array)
        return s if dim is None else s[_dim(dim, self.ndim, "stride")]

    def storage_offset(self) -> int:
        return _ops.layout.array_offset(self.array)

    def data_ptr(self) -> int:
        """The address of the first element: equal for two tensors that start at the same memory."""
        return _ops.layout.data_ptr(self.array)

    def untyped_storage(self) -> Any:
        return _ops.layout.UntypedStorage(_ops.layout.storage_of(self.array))

    def as_strided(self, size, stride, storage_offset=None): return _ops.as_strided(self, size, stride, storage_offset)

    def to_sparse(self, sparse_dim: int | None = None) -> Any:
        """A COO tensor of the non-zero entries (``minigrad.ops.sparse``; chapter 01, lesson 06)."""
        return _ops.sparse.to_sparse(self, sparse_dim)

    def to_dense(self) -> Tensor:
        return self

    # -- arithmetic (numpy broadcasting; Python scalars do not promote the tensor's dtype) -------
    # the commonest operators call their op's entry point (_binary), or the op's apply itself for a
    # float tensor and a Python float, or two tensors of one dtype, where the entry point would only
    # check what is known already
    def __add__(self, other):
        if (type(other) is float and self.array.dtype.kind == "f"
                or isinstance(other, Tensor) and other.array.dtype is self.array.dtype):
            return _Add.apply(self, other)
        return _binary(_Add, self, other)
    def __radd__(self, other): return _binary(_Add, other, self)
    def __sub__(self, other):  # (sub's wrapper refuses bools: a float tensor and a number are none)
        if type(other) is float and self.array.dtype.kind == "f":
            return _Sub.apply(self, other)
        return _ops.sub(self, other)
    def __rsub__(self, other): return _ops.sub(other, self)
    def __mul__(self, other):
        if (type(other) is float and self.array.dtype.kind == "f"
                or isinstance(other, Tensor) and other.array.dtype is self.array.dtype):
            return _Mul.apply(self, other)
        return _binary(_Mul, self, other)
    def __rmul__(self, other): return _binary(_Mul, other, self)
    def __truediv__(self, other): return _ops.div(self, other)
    def __rtruediv__(self, other): return _ops.div(other, self)
    def __pow__(self, other): return _ops.pow(self, other)
    def __rpow__(self, other): return _ops.pow(other, self)
    def __matmul__(self, other): return _ops.matmul(self, other)
    def __rmatmul__(self, other): return _ops.matmul(other, self)
    def __neg__(self): return _ops.neg(self)
    def __pos__(self): return self
    def __abs__(self): return _ops.abs(self)
    def __eq__(self, other): return _ops.eq(self, other)  # type: ignore[override]
    def __ne__(self, other): return _ops.ne(self, other)  # type: ignore[override]
    def __lt__(self, other): return _ops.lt(self, other)
    def __le__(self, other): return _ops.le(self, other)
    def __gt__(self, other): return _ops.gt(self, other)
    def __ge__(self, other): return _ops.ge(self, other)
    def __and__(self, other): return _ops.bitwise_and(self, other)
    def __rand__(self, other): return _ops.bitwise_and(other, self)
    def __or__(self, other): return _ops.bitwise_or(self, other)
    def __ror__(self, other): return _ops.bitwise_or(other, self)
    def __invert__(self): return _ops.bitwise_not(self)

    add = __add__
    sub = __sub__
    mul = __mul__
    div = __truediv__
    matmul = __matmul__
    neg = __neg__
    eq = __eq__
    ne = __ne__
    lt = __lt__
    le = __le__
    gt = __gt__
    ge = __ge__

    def pow(self, exponent): return _ops.pow(self, exponent)
    def exp(self): return _Exp.apply(self) if self.array.dtype.kind == "f" else _ops.exp(self)
    def log(self): return _ops.log(self)
    def sqrt(self): return _ops.sqrt(self)
    def rsqrt(self): return _ops.rsqrt(self)
    def abs(self): return _ops.abs(self)
    def sign(self): return _ops.sign(self)
    def sin(self): return _ops.sin(self)
    def cos(self): return _ops.cos(self)
    def tanh(self): return _Tanh.apply(self) if self.array.dtype.kind == "f" else _ops.tanh(self)
    def sigmoid(self): return _Sigmoid.apply(self) if self.array.dtype.kind == "f" else _ops.sigmoid(self)
    def relu(self): return _ops.relu(self)
    def clamp(self, min=None, max=None): return _ops.clamp(self, min, max)
    clip = clamp
    def mm(self, other): return _ops.mm(self, other)
    def maximum(self, other): return _ops.maximum(self, other)
    def minimum(self, other): return _ops.minimum(self, other)

    # -- reductions ---------------------------------------------------------------------------
    def sum(self, dim=None, keepdim=False): return _ops.sum(self, dim, keepdim)
    def mean(self, dim=None, keepdim=False): return _ops.mean(self, dim, keepdim)
    def prod(self, dim=None, keepdim=False): return _ops.prod(self, dim, keepdim)
    def max(self, dim=None, keepdim=False): return _ops.max(self, dim, keepdim)
    def min(self, dim=None, keepdim=False): return _ops.min(self, dim, keepdim)
    def amax(self, dim=None, keepdim=False): return _ops.amax(self, dim, keepdim)
    def amin(self, dim=None, keepdim=False): return _ops.amin(self, dim, keepdim)
    def all(self, dim=None, keepdim=False): return _ops.all(self, dim, keepdim)
    def any(self, dim=None, keepdim=False): return _ops.any(self, dim, keepdim)
    def argmax(self, dim=None, keepdim=False): return _ops.argmax(self, dim, keepdim)
    def argmin(self, dim=None, keepdim=False): return _ops.argmin(self, dim, keepdim)
    def var(self, dim=None, correction=1, keepdim=False): return _ops.var(self, dim, correction, keepdim)
    def std(self, dim=None, correction=1, keepdim=False): return _ops.std(self, dim, correction, keepdim)
    def cumsum(self, dim): return _ops.cumsum(self, dim)
    def logsumexp(self, dim, keepdim=False): return _ops.logsumexp(self, dim, keepdim)
    def softmax(self, dim): return _ops.softmax(self, dim)
    def norm(self, p="fro", dim=None, keepdim=False, dtype=None): return _ops.norm(self, p, dim, keepdim, dtype)
    def topk(self, k, dim=-1, largest=True, sorted=True): return _ops.topk(self, k, dim, largest, sorted)
    def log_softmax(self, dim): return _ops.log_softmax(self, dim)

    # -- movement -------------------------------------------------------------------------------
    def reshape(self, *shape): return _ops.reshape(self, _shape_arg(shape))
    def view(self, *shape): return _ops.view(self, _shape_arg(shape))
    def flatten(self, start_dim=0, end_dim=-1): return _ops.flatten(self, start_dim, end_dim)
    def squeeze(self, dim=None): return _ops.squeeze(self, dim)
    def unsqueeze(self, dim): return _ops.unsqueeze(self, dim)
    def transpose(self, dim0, dim1): return _ops.transpose(self, dim0, dim1)
    def permute(self, *dims): return _ops.permute(self, _shape_arg(dims))
    def expand(self, *sizes): return _ops.expand(self, _shape_arg(sizes))
    def broadcast_to(self, shape): return _ops.broadcast_to(self, tuple(shape))
    def expand_as(self, other): return _ops.expand(self, other.shape)
    def view_as(self, other): return _ops.view(self, other.shape)
    def reshape_as(self, other): return _ops.reshape(self, other.shape)
    def split(self, split_size, dim=0): return _ops.split(self, split_size, dim)
    def chunk(self, chunks, dim=0): return _ops.chunk(self, chunks, dim)
    def unbind(self, dim=0): return _ops.unbind(self, dim)
    def flip(self, dims): return _ops.flip(self, dims)
    def repeat(self, *sizes): return _ops.repeat(self, _shape_arg(sizes))
    def roll(self, shifts, dims=None): return _ops.roll(self, shifts, dims)
    def movedim(self, source, destination): return _ops.movedim(self, source, destination)
    def narrow(self, dim, start, length): return _ops.narrow(self, dim, start, length)
    def gather(self, dim, index): return _ops.gather(self, dim, index)
    def index_select(self, dim, index): return _ops.index_select(self, dim, index)
    def index_add(self, dim, index, source, alpha=1): return _ops.index_add(self, dim, index, source, alpha)
    def scatter_add(self, dim, index, src): return _ops.scatter_add(self, dim, index, src)
    def __getitem__(self, index): return _ops.getitem(self, index)
    def tril(self, diagonal=0): return _ops.tril(self, diagonal)
    def triu(self, diagonal=0): return _ops.triu(self, diagonal)
    def masked_fill(self, mask, value): return _ops.masked_fill(self, mask, value)

    def multinomial(self, num_samples, replacement=False, *, generator=None):
        return _ops.multinomial(self, num_samples, replacement, generator=generator)

    def t(self) -> Tensor:
        """Transpose a 2-D tensor (a view); 0-D and 1-D tensors come back as they are, as in torch."""
        if self.ndim > 2:
            raise ShapeError(f"t() expects a tensor with <= 2 dimensions, but self is {self.ndim}D "
                             f"(shape {tuple(self.shape)}); use transpose(dim0, dim1) or mT")
        return _ops.transpose(self, 0, 1) if self.ndim == 2 else _ops.view(self, self.shape)

    @property
    def T(self) -> Tensor:
        return _ops.permute(self, tuple(range(self.ndim - 1, -1, -1)))

    @property
    def mT(self) -> Tensor:
        return _ops.transpose(self, -2, -1)

    # -- in-place ops: bump the version counter; recorded out-of-place when grad is needed ------
    def __setitem__(self, index, value) -> None:
        _ops.setitem(self, index, value)

    def add_(self, other, alpha=1): return _ops.inplace(self, _ops.add, other if alpha == 1 else other * alpha)
    def sub_(self, other, alpha=1): return _ops.inplace(self, _ops.sub, other if alpha == 1 else other * alpha)
    def mul_(self, other): return _ops.inplace(self, _ops.mul, other)
    def div_(self, other): return _ops.inplace(self, _ops.div, other)
    def pow_(self, other): return _ops.inplace(self, _ops.pow, other)
    def clamp_(self, min=None, max=None): return _ops.inplace(self, _ops.clamp, min, max)
    def copy_(self, src): return _ops.inplace(self, _ops.copy_from, src)
    def zero_(self): return _ops.fill_(self, 0)
    def fill_(self, value): return _ops.fill_(self, value)
    def masked_fill_(self, mask, value): return _ops.inplace(self, _ops.masked_fill, mask, value)
    def tril_(self, diagonal=0): return _ops.inplace(self, _ops.tril, diagonal)
    def triu_(self, diagonal=0): return _ops.inplace(self, _ops.triu, diagonal)
    __iadd__ = add_
    __isub__ = sub_
    __imul__ = mul_
    __itruediv__ = div_
    __ipow__ = pow_

    def _bump_version(self) -> None:
        (self._base if self._base is not None else self)._vc += 1


# ---------------------------------------------------------------------------------------------
def _zero_grad(t: Tensor, set_to_none: bool) -> None:
    """What ``zero_grad`` (of a Module or an optimizer) does to one tensor's ``.grad``: drop it
    (always, for a sparse gradient), or zero it in place, detached from any graph."""
    if t.grad is None:
        return
    if set_to_none or t.grad.is_sparse:
        t.grad = None
    else:
        t.grad = t.grad.detach()
        t.grad.zero_()


def _init(t: Tensor, data: Any, device: Device) -> None:
    t.array, t.device = data, device
    t.requires_grad, t.grad, t.grad_fn = False, None, None
    t._output_nr, t._vc, t._base, t._accum, t._hooks = 0, 0, None, None, None
    if _current_modes():  # the memory tracker counts each new tensor's memory
        _new_array(data)


def _wrap(data: Any, device: Device, modes: tuple | None = None) -> Tensor:
    """A Tensor around an array, without copying or checking it (used on every op's output:
    ``Function.apply`` makes a single output with these same lines inline, so a field added here
    goes there too). ``modes``: the thread's modes, passed by ``Function.apply``, which has read
    them already."""
    t = object.__new__(Tensor)
    t.array, t.device = data, device
    t.requires_grad, t.grad, t.grad_fn = False, None, None
    t._output_nr, t._vc, t._base, t._accum, t._hooks = 0, 0, None, None, None
    for m in _current_modes() if modes is None else modes:  # the memory tracker counts the new array
        m.new_array(data)
    return t


def inferred_dtype(data: Any) -> Any:
    """The dtype ``tensor(data)`` gives Python data: floats the default dtype, ints int64, bools bool
    (None: keep the probe's own unsigned dtype)."""
    probe = backend.numpy.asarray(data)
    if probe.dtype.kind == "f":
        return backend.get_default_dtype()
    if probe.dtype.kind == "i":
        return backend.int64
    if probe.dtype.kind not in "bu":
        raise DTypeError(f"tensor(): cannot make a tensor from data of dtype {probe.dtype}")
    return None


def _as_array(data: Any, dtype: Any, dev: Device) -> Any:
    """Copy ``data`` (a Tensor, array, scalar or nested list) into a new array on ``dev``."""
    xp = dev.xp
    if isinstance(data, Tensor):
        data = data.array
    if dtype is not None:
        dtype = backend.as_dtype(dtype)
    elif not hasattr(data, "dtype"):
        data = backend.numpy.asarray(data)
        dtype = inferred_dtype(data)
    elif data.dtype.name not in backend.DTYPES:
        raise DTypeError(f"tensor(): unsupported dtype {data.dtype}; expected one of {sorted(backend.DTYPES)}")
    with backend.selected(dev):
        return xp.array(backend.to_device(data, dev), dtype=dtype, copy=True)


def parse_to_args(args: tuple, dtype: Any, device: Any) -> tuple[Any, Device | None]:
    """``to``'s arguments, as Tensor.to and Module.to take them: a device, a dtype, both, or a
    tensor whose device and dtype to match. Returns (dtype or None, Device or None)."""
    for a in args:
        if isinstance(a, Tensor):
            dtype, device = a.dtype, a.device
        elif isinstance(a, Device) or (isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda", "meta")):
            device = a
        else:
            dtype = a
    return (backend.as_dtype(dtype) if dtype is not None else None,
            Device(device) if device is not None else None)


def _shape_arg(shape: tuple) -> tuple:
    """Accept both ``x.reshape(2, 3)`` and ``x.reshape((2, 3))``."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


def _dim(dim: int, ndim: int, op: str) -> int:
    """Normalise a possibly negative ``dim``, naming the op when it is out of range."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        from minigrad.errors import DimensionError  # here, not at the top: only the error path needs it
        raise DimensionError(f"{op}: dim {dim} is out of range for a tensor with {ndim} dimension(s) (expected "
                             f"to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


from minigrad.autograd.mode import current_modes as _current_modes, new_array as _new_array, reads_values as _reads_values  # noqa: E402  (autograd imports Tensor from this module)
from minigrad import ops as _ops  # noqa: E402  (ops import Tensor from this module)
# the operators' entry points
_Add, _Sub, _Mul, _binary = _ops.elementwise.Add, _ops.elementwise.Sub, _ops.elementwise.Mul, _ops.elementwise._binary
_Exp, _Tanh, _Sigmoid = _ops.elementwise.Exp, _ops.elementwise.Tanh, _ops.elementwise.Sigmoid
