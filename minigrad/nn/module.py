"""``Module`` and ``Parameter``: how a model finds, saves, moves and runs its weights (chapter 02).

A Module keeps three ordered dicts, filled by plain attribute assignment: ``_parameters``
(``Parameter``s, the tensors an optimizer updates), ``_buffers`` (state that is saved but not
trained, such as BatchNorm's running mean) and ``_modules`` (sub-modules). Every recursive
feature - ``parameters()``, ``state_dict()``, ``to()``, ``train()`` - is a walk over that tree,
and the dotted names it produces (``0.weight``, ``bn.running_mean``) are PyTorch's, so a
checkpoint's keys read the same in both frameworks.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, namedtuple
from typing import Any, Callable, Iterator

from minigrad import backend, creation, mapped
from minigrad.autograd.grad_mode import no_grad
from minigrad.backend import Device
from minigrad.errors import DTypeError
from minigrad.hooks import RemovableHandle, add_hook
from minigrad._tensor import Tensor, _init, _zero_grad, parse_to_args

__all__ = ["Module", "Parameter", "RemovableHandle"]


class Parameter(Tensor):
    """A Tensor that a Module registers as trainable when assigned as an attribute.

    ``Parameter(t)`` shares ``t``'s memory, as in PyTorch, and requires grad by default.
    """

    __slots__ = ()
    _is_param = True  # torch's marker; the layers below nn ask it (minigrad.protocols.is_parameter)

    def __init__(self, data: Tensor | Any = None, requires_grad: bool = True) -> None:
        if data is None:
            data = Tensor(backend.numpy.empty((0,), backend.get_default_dtype()))
        elif not isinstance(data, Tensor):
            data = Tensor(data)
        _init(self, data.array, data.device)
        if requires_grad:
            self.requires_grad_(True)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    def __deepcopy__(self, memo: dict) -> Parameter:
        # the default would copy the weak link to this leaf's graph node and share it
        copy = Parameter(Tensor(self.array.copy(), device=self.device), self.requires_grad)
        if self.grad is not None:
            copy.grad = Tensor(self.grad.array.copy(), device=self.device)
        memo[id(self)] = copy
        return copy

    def __reduce_ex__(self, protocol: int):
        return (_rebuild_parameter, (self.detach().numpy(), str(self.device), self.requires_grad))


def _rebuild_parameter(array: Any, device: str, requires_grad: bool) -> Parameter:
    return Parameter(Tensor(array, device=device), requires_grad)


_IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


class Module:
    """Base class of every layer and model: subclass it, assign layers in ``__init__``, write ``forward``."""

    training: bool

    def __init__(self) -> None:
        # object.__setattr__ because our own __setattr__ reads these dicts
        set_ = object.__setattr__
        set_(self, "training", True)
        set_(self, "_parameters", OrderedDict())
        set_(self, "_buffers", OrderedDict())
        set_(self, "_non_persistent_buffers_set", set())
        set_(self, "_modules", OrderedDict())
        set_(self, "_forward_hooks", OrderedDict())
        set_(self, "_forward_pre_hooks", OrderedDict())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not (self._forward_pre_hooks or self._forward_hooks):
            return self.forward(*args, **kwargs)
        for hook in tuple(self._forward_pre_hooks.values()):
            new = hook(self, args)
            if new is not None:
                args = new if isinstance(new, tuple) else (new,)
        out = self.forward(*args, **kwargs)
        for hook in tuple(self._forward_hooks.values()):
            new = hook(self, args, out)
            if new is not None:
                out = new
        return out

    # -- registration -------------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        """``self.name = value``, registering what the value is, as PyTorch's Module does.

        A ``Parameter`` goes into ``self._parameters`` (``register_parameter``, after
        ``self._forget(name)`` drops the name from the other stores; a name already there keeps
        its place, so ``parameters()`` and ``state_dict()`` keep their order); a ``Module`` into
        ``self._modules`` (a new child last, a replaced one in its place); assigning to a name
        already held as a parameter, child or buffer must give the right kind or ``None``
        (``TypeError`` naming the name and the type given otherwise: a plain Tensor may not
        replace a Parameter); anything else is a plain attribute (``object.__setattr__``).
        Assigning a Parameter or Module before ``Module.__init__`` ran (no ``_parameters`` in
        ``self.__dict__`` yet) is an ``AttributeError`` that says so. ``parameters()``,
        ``named_parameters()``, ``state_dict()`` and ``to()`` all read these stores.
        """
        ### BEGIN SOLUTION chapter 02: Module registers its parameters
        d = self.__dict__
        params = d.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            if name in params:  # a replaced parameter keeps its place in parameters() and state_dict
                params[name] = value
            else:
                self._forget(name)
                self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                "(minigrad.nn.Parameter or None expected)")
            params[name] = None
        elif isinstance(value, Module):
            if params is None:
                raise AttributeError("cannot assign module before Module.__init__() call")
            if name not in self._modules:  # a new child goes last; a replaced one keeps its place
                self._forget(name)
            self._modules[name] = value
        elif d.get("_modules") is not None and name in self._modules:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' "
                                "(minigrad.nn.Module or None expected)")
            self._modules[name] = None
        elif d.get("_buffers") is not None and name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                "(minigrad.Tensor or None expected)")
            self._buffers[name] = value
        else:
            object.__setattr__(self, name, value)
        ### END SOLUTION

    def _forget(self, name: str) -> None:
        """Drop ``name`` from wherever it was, so one name lives in exactly one place."""
        self.__dict__.pop(name, None)
        for store in (self._parameters, self._buffers, self._modules):
            store.pop(name, None)
        self._non_persistent_buffers_set.discard(name)

    def __getattr__(self, name: str) -> Any:
        # only called when normal lookup fails, i.e. for registered parameters, buffers and modules
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            s = d.get(store)
            if s is not None and name in s:
                return s[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        for store in (self._parameters, self._buffers, self._modules):
            if name in store:
                del store[name]
                self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self) -> list:
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))

    def _check_name(self, name: Any, kind: str, store: dict) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"cannot assign {kind} before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string, got {type(name).__name__}")
        if name == "" or "." in name:
            raise KeyError(f"{kind} name can't be empty or contain \".\", got {name!r}")
        if hasattr(self, name) and name not in store:
            raise KeyError(f"attribute '{name}' already exists")

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Add a parameter (or a ``None`` placeholder, e.g. ``bias=False``) under ``name``."""
        self._check_name(name, "parameter", self._parameters)
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            "(minigrad.nn.Parameter or None required)")
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Add a tensor that is state but not trained; ``persistent=False`` keeps it out of state_dict."""
        self._check_name(name, "buffer", self._buffers)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            "(minigrad.Tensor or None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def register_module(self, name: str, module: Module | None) -> None:
        """Add a sub-module under ``name`` (what attribute assignment does, for computed names)."""
        self._check_name(name, "module", self._modules)
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        self._modules[name] = module

    add_module = register_module

    def get_submodule(self, target: str) -> Module:
        """The sub-module at a dotted path such as ``"encoder.layers.0"`` (``""`` is self)."""
        mod = self
        for part in target.split(".") if target else ():
            if part not in mod._modules or mod._modules[part] is None:
                raise AttributeError(f"{type(mod).__name__} has no submodule '{part}' (looking up '{target}')")
            mod = mod._modules[part]
        return mod

    def get_parameter(self, target: str) -> Parameter:
        path, _, name = target.rpartition(".")
        mod = self.get_submodule(path)
        if name not in mod._parameters:
            raise AttributeError(f"{type(mod).__name__} has no parameter '{name}'")
        return mod._parameters[name]

    # -- walking the tree -------------------------------------------------------------------------
    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
        """Every module in the tree, self first, depth first, with its dotted name."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if self in memo:
                return
            memo.add(self)
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(memo, prefix + ("." if prefix else "") + name, remove_duplicate)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        seen = set()
        for name, m in self._modules.items():
            if m is not None and m not in seen:
                seen.add(m)
                yield name, m

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def _named_members(self, store: str, prefix: str, recurse: bool,
                       remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        """Tensors of one kind across the tree; a tensor shared by two modules (tied weights) once."""
        seen = set()
        mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for mod_prefix, mod in mods:
            for name, t in getattr(mod, store).items():
                if t is None or (remove_duplicate and id(t) in seen):
                    continue
                seen.add(id(t))
                yield mod_prefix + ("." if mod_prefix else "") + name, t

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def apply(self, fn: Callable[[Module], Any]) -> Module:
        """Call ``fn`` on every sub-module (children first) and then on self; e.g. custom init."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # -- state_dict ---------------------------------------------------------------------------------
    def state_dict(self, destination: dict | None = None, prefix: str = "",
                   keep_vars: bool = False) -> OrderedDict:
        """Parameters and persistent buffers by dotted name, detached (they share memory with the model)."""
        out = OrderedDict() if destination is None else destination
        for name, p in self._parameters.items():
            if p is not None:
                out[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                out[prefix + name] = b if keep_vars else b.detach()
        for name, m in self._modules.items():
            if m is not None:
                m.state_dict(out, prefix + name + ".", keep_vars)
        return out

    def load_state_dict(self, state_dict: dict, strict: bool = True, assign: bool = False):
        """Copy values into this model's tensors, in place (optimizers keep pointing at them).

        With ``assign=True`` each tensor takes the state dict's memory, device and dtype instead
        of a copy, as in torch: how a model built on the meta device gets its weights, and how a
        memory-mapped checkpoint stays mapped. The Parameter objects stay the same (only their
        array changes), so an optimizer built before still holds them.
        Returns ``(missing_keys, unexpected_keys)``; with ``strict`` either one is an error, and a
        shape mismatch is an error in both modes. All problems are reported together.
        """
        own = self.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        errors = []
        if strict:
            if unexpected:
                errors.append("Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ".")
            if missing:
                errors.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ".")
        pending = []
        for key, target in own.items():
            if key not in state_dict:
                continue
            value = state_dict[key]
            if not isinstance(value, Tensor):
                value = Tensor(value, device=target.device)
            if tuple(value.shape) != tuple(target.shape):
                errors.append(f"size mismatch for {key}: copying a param with shape {tuple(value.shape)} "
                              f"from checkpoint, the shape in current model is {tuple(target.shape)}.")
            else:
                pending.append((target, value))
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t" + "\n\t".join(errors))
        mapped.check_mapped([value for _, value in pending])  # a truncated file's map would crash the copy
        with no_grad():
            for target, value in pending:
                if assign:
                    target.array, target.device = value.array, value.device
                    target._bump_version()
                else:
                    target.copy_(value)
        return _IncompatibleKeys(missing, unexpected)

    # -- modes, devices and dtypes ----------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        """Switch self and every sub-module to training mode (dropout on, batch statistics)."""
        if not isinstance(mode, bool):
            raise ValueError(f"train: mode is expected to be a bool, got {type(mode).__name__}")
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            _zero_grad(p, set_to_none)

    def _apply(self, convert: Callable[[Tensor], Tensor]) -> Module:
        """Convert every parameter, gradient and buffer by swapping its ``.array`` in place, so an
        optimizer built before ``model.to(...)`` still holds the very same Parameter objects."""
        tensors = itertools.chain(self.parameters(), self.buffers())
        for t in tensors:
            new = convert(t)
            t.array, t.device = new.array, new.device
            if t.grad is not None and t.grad.is_sparse:  # (minigrad.ops.sparse) indices move, values convert
                g = t.grad
                t.grad = type(g)(convert(g.indices()).array, convert(g.values()), g.shape, g.is_coalesced())
            elif t.grad is not None:
                g = convert(t.grad)
                t.grad.array, t.grad.device = g.array, g.device
        return self

    def to(self, *args: Any, dtype: Any = None, device: Any = None, non_blocking: bool = False,
           memory_format: Any = None) -> Module:
        """``to(device)``, ``to(dtype)``, ``to(device, dtype)`` or ``to(tensor)``, in place.
        A dtype applies to floating tensors only (integer buffers such as counters keep theirs);
        a ``memory_format`` (``minigrad.channels_last``) to 4-D ones only, as in PyTorch."""
        dtype, device = parse_to_args(args, dtype, device)
        if dtype is not None and dtype.kind != "f":
            raise DTypeError(f"Module.to: only floating dtypes are accepted, got {dtype}")

        def convert(t: Tensor) -> Tensor:
            with no_grad():
                return t.to(device=device, dtype=dtype if t.dtype.kind == "f" else None,
                            memory_format=memory_format if t.ndim == 4 else None)

        return self._apply(convert)

    def to_empty(self, *, device: Any) -> Module:
        """Give every parameter and buffer new, uninitialised storage on ``device``, as torch: the
        step after building a model on the meta device, before loading its weights."""
        return self._apply(lambda t: creation.empty(*t.shape, dtype=t.dtype, device=device))

    def cpu(self) -> Module:
        return self.to(device="cpu")

    def cuda(self, device: int | str | Device | None = None) -> Module:
        if device is None or isinstance(device, int):
            device = f"cuda:{device or 0}"
        return self.to(device=device)

    def float(self) -> Module:
        return self.to(dtype=backend.float32)

    def double(self) -> Module:
        return self.to(dtype=backend.float64)

    def half(self) -> Module:
        return self.to(dtype=backend.float16)

    def type(self, dst_type: Any) -> Module:
        return self.to(dtype=dst_type)

    # -- hooks --------------------------------------------------------------------------------------
    def register_forward_pre_hook(self, hook: Callable, *, prepend: bool = False) -> RemovableHandle:
        """``hook(module, args)`` runs before ``forward``; returning a value replaces the args."""
        return add_hook(self._forward_pre_hooks, hook, prepend)

    def register_forward_hook(self, hook: Callable, *, prepend: bool = False) -> RemovableHandle:
        """``hook(module, args, output)`` runs after ``forward``; returning a value replaces the output."""
        return add_hook(self._forward_hooks, hook, prepend)

    # -- repr ----------------------------------------------------------------------------------------
    def extra_repr(self) -> str:
        """The text inside this module's parentheses; layers override it (``in_features=3, ...``)."""
        return ""

    def _get_name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        lines = self.extra_repr().split("\n") if self.extra_repr() else []
        for name, m in self._modules.items():
            lines.append(f"({name}): " + _indent(repr(m), 2))
        if not lines:
            return self._get_name() + "()"
        if len(lines) == 1 and not self._modules:
            return f"{self._get_name()}({lines[0]})"
        return self._get_name() + "(\n  " + "\n  ".join(lines) + "\n)"


def _indent(text: str, n: int) -> str:
    """Indent every line but the first, so nested modules line up under their parent's name."""
    return text.replace("\n", "\n" + " " * n)

