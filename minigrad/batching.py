"""Batching rules: how ``vmap`` runs an op once for a whole batch (chapter 02).

Inside ``minigrad.func.vmap`` a mapped argument is a ``BatchedTensor``: a Tensor that reports the
shape of one example (its *logical* shape) while it holds the whole batch, with the batch in dim 0
of its ``value``. The vmap mode, on the thread's mode stack, sees every op whose arguments are
batched at its level and runs it once on the values instead, after its class's batching rule has
rewritten the arguments: elementwise ops broadcast over the batch dim, reductions and movement ops
shift the dims they name past it, matmul batches. An op declares its rule in one word (``batch``,
see ``minigrad.ops.op``); one without a rule runs once per example and the results are stacked,
so every op works and the common ones are fast. Because rules rewrite arguments and the op itself
still runs through ``Function.apply``, autograd records the batched computation as usual, and a
backward pass whose incoming gradients are batched (``vmap(vjp_fn)``: a whole Jacobian) is one
pass through the graph. Nested vmaps are levels: a BatchedTensor's value may itself be batched at
an outer level, and each mode handles only its own. A random op (a factory such as ``randn``,
``multinomial``, an ``nn.init`` fill, or an op that declares ``random``, such as dropout) follows the
vmap's ``randomness``, as in torch.func: ``"error"`` refuses it, ``"different"`` draws for each
example, ``"same"`` draws once for the batch. An index tensor the vmap batches (``t[i]``) indexes
each example with its own (``index_batched``); the core asks the mode for both (``Mode.random_call``,
``Mode.index_by_tensors``), since neither is one op. An in-place op on a batch (``t.mul_(2)``,
``t[i] = v``) writes into its value, and the node it records and the version it bumps are the
value's too: a BatchedTensor keeps no autograd state of its own.
"""

from __future__ import annotations

from typing import Any, Callable

from minigrad import backend
from minigrad.autograd.mode import Mode, current_modes, random_call
from minigrad.errors import ArgumentError, RandomnessError
from minigrad.tensor_types import Size
from minigrad._tensor import Tensor

__all__ = ["BatchedTensor", "VmapMode", "index_batched", "rule_of"]


def _forwarded(name: str) -> property:
    """A BatchedTensor attribute that is its value's attribute ``name``."""
    def get(self: BatchedTensor) -> Any:
        return getattr(self.value, name)

    def set(self: BatchedTensor, new: Any) -> None:
        setattr(self.value, name, new)
    return property(get, set)


class BatchedTensor(Tensor):
    """A batch of tensors seen as one example: ``value`` holds the batch in dim 0, ``level`` is
    the vmap it belongs to. Shape queries answer for one example; ops go to the vmap mode."""

    __slots__ = ("value", "level")

    def __init__(self, value: Tensor, level: int) -> None:
        self.value, self.level = value, level
        self.array, self.device = value.array, value.device
        self.grad, self._accum, self._hooks = None, None, None

    # The autograd state of a batch is its value's (these shadow Tensor's slots): an in-place op
    # on the wrapper (``t.mul_(2)``, ``t[i] = v``, ``t.zero_()``) records its node, and bumps the
    # version, where the value the vmap returns, and the nodes that saved it, see them.
    grad_fn = _forwarded("grad_fn")
    requires_grad = _forwarded("requires_grad")
    _output_nr = _forwarded("_output_nr")
    _vc = _forwarded("_vc")
    _base = _forwarded("_base")

    @property
    def shape(self) -> Size:
        return Size(tuple(self.value.shape)[1:])

    @property
    def ndim(self) -> int:
        return self.value.ndim - 1

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def detach(self) -> Tensor:
        return BatchedTensor(self.value.detach(), self.level)

    @property
    def data(self) -> Tensor:
        return BatchedTensor(self.value.data, self.level)

    def _values_read(self, how: str) -> Any:
        raise ArgumentError(f"{how} on a tensor batched by vmap (one value per example, logical shape "
                            f"{tuple(self.shape)}): a mapped function must stay in tensor ops")

    def item(self) -> Any: return self._values_read("item()")
    def numpy(self) -> Any: return self._values_read("numpy()")
    def tolist(self) -> Any: return self._values_read("tolist()")
    def __bool__(self) -> bool: return self._values_read("bool()")

    def __repr__(self) -> str:
        return f"BatchedTensor(level={self.level}, shape={tuple(self.shape)}, value={self.value!r})"


class VmapMode(Mode):
    """One vmap level: runs the ops whose arguments are batched at ``level``, by their rules, and
    gives random ops its ``randomness``."""

    runs_ops = True

    def __init__(self, level: int, size: int, randomness: str = "error") -> None:
        self.level, self.size, self.randomness = level, size, randomness
        self.one_by_one = 0  # > 0 while its examples run one at a time (each then draws for itself)

    def each_example(self, run: Callable[[int], Any], devices: Any = ()) -> list:
        """``run(i)`` for every example i of the batch. A random op inside sees no batch at this
        level, since the example is one; with ``"same"`` each example starts from the generator
        state of ``devices`` that the first saw, so all draw what the first drew."""
        states = {d: backend.get_rng_state(d) for d in set(devices)} if self.randomness == "same" else {}
        self.one_by_one += 1
        try:
            results = []
            for i in range(self.size):
                for d, state in states.items():
                    backend.set_rng_state(state, d)
                results.append(run(i))
            return results
        finally:
            self.one_by_one -= 1

    def refuse_random(self, name: str) -> None:
        if self.randomness == "error":
            raise RandomnessError(
                f"vmap: {name} draws random numbers inside a vmap whose randomness is 'error' (the default); "
                "pass randomness='different' to vmap for independent draws per example, or 'same' for one draw "
                "shared by the batch, or draw outside the mapped function")

    def random_call(self, name: str, call: Callable[..., Any], args: tuple, fills: bool) -> Any:
        """A random function that is not an op: one draw per example where an argument is batched
        here (each example's own, or the first one's replayed with ``"same"``) or the randomness is
        ``"different"``; otherwise left to the outer levels. An in-place fill of a tensor this level
        does not batch cannot differ per example, so ``"different"`` refuses it, as torch does."""
        self.refuse_random(name)
        if self.one_by_one:
            return NotImplemented
        level = self.level
        mine = [type(a) is BatchedTensor and a.level == level for a in args]
        if fills and not mine[0]:
            if self.randomness == "different":
                raise RandomnessError(
                    f"vmap: {name} fills a tensor that the vmap does not batch, in place, with randomness="
                    "'different': every example would see the one draw; fill a batched tensor, or pass "
                    "randomness='same'")
            return NotImplemented
        if not any(mine) and self.randomness != "different":
            return NotImplemented

        def one(i: int) -> Any:
            return random_call(name, call, tuple(a.value[i] if b else a for a, b in zip(args, mine)), fills)
        results = self.each_example(one, [a.device for a in args if isinstance(a, Tensor)])
        return args[0] if fills else BatchedTensor(_stack_examples(results), level)

    def index_by_tensors(self, fn: Callable[..., Tensor], x: Tensor, index: Any, rest: tuple) -> Any:
        """``x[index]`` where this level batches an index tensor, or ``x`` and an index tensor
        batched further out: ``index_batched``; a write there (``index_put``) runs per example.
        Other indexes run as usual (the op's rule)."""
        items = index if type(index) is tuple else (index,)
        if not any(type(i) is BatchedTensor for i in items):
            return NotImplemented
        mine = [type(t) is BatchedTensor and t.level == self.level for t in (x, *items, *rest)]
        if not any(mine):
            return NotImplemented
        if not rest:
            return index_batched(x, items, self, fn)

        def one(i: int) -> Tensor:
            x_i, *items_i = [t.value[i] if b else t for t, b in zip((x, *items), mine)]
            return fn(x_i, tuple(items_i), *[t.value[i] if b else t for t, b in zip(rest, mine[1 + len(items):])])
        return BatchedTensor(_stack_examples(self.each_example(one, [x.device])), self.level)

    def run_op(self, cls: type, args: tuple, kwargs: dict) -> Any:
        level = self.level
        batched = [type(a) is BatchedTensor and a.level == level for a in args]
        one_by_one = False
        if getattr(cls, "random", False):
            self.refuse_random(cls.__name__)
            # "same" on a batch (each example replays the first one's draw) or "different" on what
            # is not one (each example draws, and the draws are the batched result): per example
            one_by_one = not self.one_by_one and (self.randomness == "same") == any(batched)
        if not any(batched) and not one_by_one:
            return NotImplemented
        values = [a.value if b else a for a, b in zip(args, batched)]
        rule = None if one_by_one else RULES.get(rule_of(cls))
        out = rule(cls, values, batched, kwargs) if rule is not None else NotImplemented
        if out is NotImplemented:
            out = _per_example(cls, values, batched, kwargs, self)
        if type(out) is tuple:
            return tuple(BatchedTensor(o, level) if isinstance(o, Tensor) else o for o in out)
        return BatchedTensor(out, level)


def rule_of(cls: type) -> str | None:
    """The op's batching rule: its ``batch`` declaration, or ``"elementwise"`` for elementwise ops."""
    declared = getattr(cls, "batch", None)
    if declared is not None:
        return declared
    return "elementwise" if getattr(cls, "kind", None) == "elementwise" else None


def current_level() -> int:
    """How many vmaps run on this thread (the next one's level is this plus one)."""
    return sum(1 for m in current_modes() if isinstance(m, VmapMode))


# -- the rules: (cls, values, batched, kwargs) -> the batched result's value, or NotImplemented ---
def _ndim(v: Any, b: bool) -> int:
    """The logical rank of an argument (its value's rank less the batch dim)."""
    return v.ndim - 1 if b else v.ndim


def _lift(v: Tensor, n: int) -> Tensor:
    """A batched value ``(B, *s)`` with ones inserted after the batch dim up to logical rank n, so it
    broadcasts against unbatched operands exactly as one example would."""
    shape = tuple(v.shape)
    pad = n - (len(shape) - 1)
    return v if pad <= 0 else v.reshape(shape[:1] + (1,) * pad + shape[1:])


def _elementwise(cls: type, values: list, batched: list, kwargs: dict) -> Any:
    n = max(_ndim(v, b) for v, b in zip(values, batched) if isinstance(v, Tensor))
    return cls.apply(*[_lift(v, n) if b else v for v, b in zip(values, batched)], **kwargs)


def _shift(d: Any, n: int) -> Any:
    """Dims of one example (an int, a sequence, or None: all) as dims of the batched value."""
    if d is None:
        return tuple(range(1, n + 1))
    if isinstance(d, int):
        return d % n + 1
    return tuple(_shift(i, n) for i in d)


def _dims(cls: type, values: list, batched: list, kwargs: dict) -> Any:
    """Argument 1 names dims of input 0 (None: all of them; sums, means, flips): shift them past
    the batch dim."""
    if not batched[0] or any(batched[1:]) or values[0].ndim == 1:
        return NotImplemented
    return cls.apply(values[0], _shift(values[1], values[0].ndim - 1), *values[2:], **kwargs)


def _dim(cls: type, values: list, batched: list, kwargs: dict) -> Any:
    """Argument 1 is one dim of input 0 (softmax, cumsum, argmax); None there means "flattened",
    which has no batched form, so that call runs per example."""
    return NotImplemented if values[1] is None else _dims(cls, values, batched, kwargs)


def _perm(cls: type, values: list, batched: list, kwargs: dict) -> Any:
    return cls.apply(values[0], (0,) + _shift(tuple(values[1]), values[0].ndim - 1), **kwargs)


def _shape(cls: type, values: list, batched: list, kwargs: dict) -> Any:
    """Argument 1 is a shape for one example (reshape, broadcast_to, sum_to): the batch keeps dim 0.
    The shorter of input and target gets ones after the batch dim, so leading dims never meet it."""
    v, target = values[0], tuple(values[1])
    if any(batched[1:]):
        return NotImplemented
    lead = v.shape[0]
    v = _lift(v, len(target))
    pad = (v.ndim - 1) - len(target)
    out = cls.apply(v, (lead,) + (1,) * pad + target, *values[2:], **kwargs)
    return out.reshape((lead,) + target) if pad > 0 else out


def _matmul(cls: type, values: list, batched: list, kwargs: dict) -> Any:
    """A batched vector becomes a batch of 1-row (left) or 1-column (right) matrices; leading dims
    then broadcast as in elementwise ops, with the batch in front."""
    (a, b), (ba, bb) = values, batched
    squeeze = None
    if ba and a.ndim == 2:
        a, squeeze = a.reshape((a.shape[0], 1, a.shape[1])), -2
    if bb and b.ndim == 2:
        b = b.reshape((b.shape[0], b.shape[1], 1))
        squeeze = -1 if squeeze is None else (-2, -1)
    if ba and bb or (ba and b.ndim >= 2) or (bb and a.ndim >= 2):
        n = max(_ndim(a, ba), _ndim(b, bb))
        a, b = (_lift(a, n) if ba else a), (_lift(b, n) if bb else b)
    out = cls.apply(a, b, **kwargs)
    if squeeze is None:
        return out
    shape = list(out.shape)
    for d in (squeeze,) if isinstance(squeeze, int) else squeeze:  # -2 before -1: -1 stays the last
        del shape[d]
    return out.reshape(tuple(shape))


def _rows(cls: type, values: list, batched: list, kwargs: dict) -> Any:
    """The op maps over the leading dims of input 0 (linear, triangle): the batch is one more."""
    if any(batched[1:]):
        return NotImplemented
    return cls.apply(*values, **kwargs)


def _fold(cls: type, values: list, batched: list, kwargs: dict) -> Any:
    """The op maps over the rows (dim 0) of input 0 alone, as a convolution or a pooling maps over
    a batch of images: the vmap batch folds into those rows and unfolds from each output's."""
    if any(batched[1:]):
        return NotImplemented
    v = values[0]
    b, n = v.shape[0], v.shape[1]
    out = cls.apply(v.reshape((b * n,) + tuple(v.shape[2:])), *values[1:], **kwargs)

    def unfold(o: Any) -> Any:
        return o.reshape((b, n) + tuple(o.shape[1:])) if isinstance(o, Tensor) else o
    return tuple(unfold(o) for o in out) if type(out) is tuple else unfold(out)


def _index(cls: type, values: list, batched: list, kwargs: dict) -> Any:
    """Argument 1 is ``(basic, advanced)`` (``minigrad.ops.indexing``): a basic index (ints,
    slices, None, ...) of one example is the same index after a full slice of the batch dim;
    advanced indexing moves dims, so it runs per example."""
    basic, advanced = values[1]
    if any(batched[1:]) or advanced is not None:
        return NotImplemented
    return cls.apply(values[0], ((slice(None),) + tuple(basic), None), *values[2:], **kwargs)


def index_batched(x: Tensor, items: tuple, mode: VmapMode, getitem: Callable[[Tensor, Any], Tensor]) -> Tensor:
    """``x[index]`` where ``index`` holds tensors batched by a vmap (``t[i]`` with ``i`` mapped):
    each example reads ``x_b[i_b]``. The rule: the batched index tensors keep the batch as their
    first dim, so it leads the broadcast block of the advanced indices; a batched ``x`` has its
    batch dim moved next to the first advanced index and read with ``arange(B)`` there, so each
    example reads its own slice. Where one example's block lands (its place, or the front when the
    advanced indices are apart) the batch lands too, and moves back to dim 0. One vmap level at a
    time, innermost first (``mode``'s): ``getitem`` on the unwrapped values meets the outer ones.
    Bool masks (whose counts may differ per example) and a batched 0-d index beside other advanced
    ones (an int for each example, which is not advanced) run once per example."""
    level = mode.level
    mine = [type(i) is BatchedTensor and i.level == level for i in items]
    ranks = [_index_rank(i) for i in items]
    advanced = [k for k, r in enumerate(ranks) if r is not None and (r > 0 or mine[k])]
    x_mine = type(x) is BatchedTensor and x.level == level
    if not advanced:  # ints and slices only: the same view of every example
        return BatchedTensor(getitem(x.value, (slice(None),) + items), level)
    if any(r == -1 for r in ranks) or (len(advanced) > 1 and any(mine[k] and ranks[k] == 0 for k in advanced)):
        def one(i: int) -> Tensor:
            return getitem(x.value[i] if x_mine else x, tuple(t.value[i] if b else t for t, b in zip(items, mine)))
        return BatchedTensor(_stack_examples(mode.each_example(one, [x.device])), level)
    first, size, rank = advanced[0], mode.size, max(ranks[k] for k in advanced)
    spread = x.ndim - sum(i is not None and i is not Ellipsis for i in items)  # dims an Ellipsis stands for
    x_dim = sum(spread if i is Ellipsis else int(i is not None) for i in items[:first])
    before = sum(spread if i is Ellipsis else int(r is None) for i, r in zip(items[:first], ranks[:first]))
    together = all(r is not None for r in ranks[first:advanced[-1] + 1])  # ints do not part them, as in torch
    new = [t.value.reshape((size,) + (1,) * (rank - t.ndim) + tuple(t.shape)) if b else t
           for t, b in zip(items, mine)]
    if x_mine:
        source = x.value.movedim(0, x_dim) if x_dim else x.value
        new.insert(first, x.device.xp.arange(size).reshape((size,) + (1,) * rank))
    else:
        source = x
    out = getitem(source, tuple(new))
    at = before if together else 0  # one example's block starts here, and the batch with it
    return BatchedTensor(out.movedim(at, 0) if at else out, level)


def _index_rank(item: Any) -> int | None:
    """How an index item reads one example: None for a slice, None or Ellipsis (which keep dims),
    -1 for a bool mask, else the rank of the integer index (0 for an int, which drops its dim)."""
    if item is None or item is Ellipsis or isinstance(item, slice):
        return None
    if isinstance(item, bool):
        return -1
    if isinstance(item, (list, tuple)):
        item = backend.numpy.asarray(item)
    if hasattr(item, "dtype"):
        return -1 if str(item.dtype) == "bool" else item.ndim
    return 0


def _cat(cls: type, values: list, batched: list, kwargs: dict) -> Any:
    """Argument 0 is the dim; every operand gets the batch (an unbatched one is broadcast)."""
    size = next(v.shape[0] for v, b in zip(values, batched) if b)
    parts = [v if b else v.unsqueeze(0).expand((size,) + tuple(v.shape)) for v, b in zip(values[1:], batched[1:])]
    return cls.apply(_shift(values[0], parts[0].ndim - 1), *parts, **kwargs)


RULES: dict[str, Callable[..., Any]] = {  # one rule per kind of op, not per op
    "elementwise": _elementwise, "dims": _dims, "dim": _dim, "perm": _perm, "shape": _shape, "matmul": _matmul,
    "rows": _rows, "fold": _fold, "index": _index, "cat": _cat,
}


def _per_example(cls: type, values: list, batched: list, kwargs: dict, mode: VmapMode) -> Any:
    """The fallback for an op without a rule: run it on each example and stack the results."""
    devices = [v.device for v in values if isinstance(v, Tensor)]
    return _stack_examples(mode.each_example(
        lambda i: cls.apply(*[v[i] if b else v for v, b in zip(values, batched)], **kwargs), devices))


def _stack_examples(results: list) -> Any:
    from minigrad.ops import stack

    if type(results[0]) is tuple:
        return tuple(stack(list(col), 0) if isinstance(col[0], Tensor) else col[0] for col in zip(*results))
    return stack(results, 0)
