"""A caching allocator in the spirit of PyTorch's CUDA caching allocator (chapter 03, memory pool).

Asking the system for memory is slow on a GPU (``cudaMalloc`` synchronises the device) and not free
on a CPU either (a large ``malloc`` maps fresh pages, and the kernel zero-fills each one the first
time it is touched). A caching allocator asks rarely: it reserves big *segments*, cuts them into
*blocks*, and when an array dies keeps its block in a free list instead of giving it back. Sizes
are rounded up to 512 bytes; requests of up to 1 MiB share 2 MiB segments ("small pool"), larger
ones come from 20 MiB segments or their own (rounded to 2 MiB). A request takes the smallest cached
block that fits (best fit) and splits off what it does not need; a freed block merges with free
neighbours. Free lists are kept per stream, so a block is only reused on the stream that freed it.
``empty_cache`` returns the segments no live block uses. What stays reserved but cannot serve a
large request, because it is split around live blocks, is *fragmentation*: ``memory_stats`` reports
it, and chapter 03's lesson plots it.

On the CPU an allocation is a numpy array over a slice of a segment; the block returns to the pool
when the last array sharing its memory dies (a weak reference on the array that owns the slice).
On cuda minigrad uses CuPy's pool, which is this same design, and reads its figures the same way
(``minigrad.cuda.memory_stats``).
"""

from __future__ import annotations

import bisect
import math
import threading
import weakref
from typing import Any

import numpy  # the CPU pool's segments are host byte buffers

MIN_BLOCK = 512  # every size is rounded up to a multiple of this
SMALL_SIZE = 1 << 20  # requests up to this come from the small pool
SMALL_SEGMENT = 2 << 20  # the small pool reserves this much at a time
LARGE_SEGMENT = 20 << 20  # requests under MIN_LARGE_ALLOC share a segment of this size
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20  # larger requests get a segment of their own, rounded up to this


def round_size(nbytes: int) -> int:
    """The block size a request of ``nbytes`` gets: at least 512 bytes, a multiple of 512."""
    return max(MIN_BLOCK, MIN_BLOCK * math.ceil(nbytes / MIN_BLOCK))


def segment_size(size: int) -> int:
    """How much to reserve from the system when no cached block can serve a ``size``-byte block."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return ROUND_LARGE * math.ceil(size / ROUND_LARGE)


class Segment:
    """One reservation from the system; its blocks tile it, in address order."""

    __slots__ = ("buffer", "size", "stream", "small", "id", "head")

    def __init__(self, buffer: Any, size: int, stream: int, small: bool, id: int) -> None:
        self.buffer, self.size, self.stream, self.small, self.id = buffer, size, stream, small, id
        self.head = Block(self, 0, size)  # the block at offset 0 (merges keep the lower block)


class Block:
    """``size`` bytes at ``offset`` in ``segment``; ``prev``/``next`` are its neighbours there."""

    __slots__ = ("segment", "offset", "size", "requested", "allocated", "prev", "next", "ref")

    def __init__(self, segment: Segment, offset: int, size: int) -> None:
        self.segment, self.offset, self.size = segment, offset, size
        self.requested, self.allocated = 0, False
        self.prev = self.next = self.ref = None

    def key(self) -> tuple:
        return (self.size, self.segment.id, self.offset)  # best fit, then lowest address


class CachingAllocator:
    """Blocks cut from cached segments, as described in the module docstring.

    ``malloc(nbytes, stream)`` returns a ``Block`` and ``free(block)`` gives it back; ``empty``
    returns a numpy array over a block that frees itself when the array dies. ``reserve`` is how
    segments are obtained (a host buffer here; a test may pass a counting one).
    """

    def __init__(self, reserve: Any = None) -> None:
        self.reserve = reserve or (lambda n: numpy.empty(n, numpy.uint8))
        self.segments: dict[int, Segment] = {}
        self.free_lists: dict[tuple[int, bool], list] = {}  # (stream, small) -> sorted [(key, block)]
        self._next_id = 0
        # blocks whose arrays died: a weakref callback may run inside malloc (the garbage collector
        # runs at any allocation) or on another thread, so it only queues; malloc frees them first
        self._dead: list[Block] = []
        self._lock = threading.RLock()  # bookkeeping is shared by every thread
        self.reset_stats()

    def reset_stats(self) -> None:
        """Zero the counters and start the peaks from what is in use now."""
        self._free_dead()
        self.allocated = sum(b.size for b in self.blocks() if b.allocated)
        self.requested = sum(b.requested for b in self.blocks() if b.allocated)
        self.reserved = sum(s.size for s in self.segments.values())
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved
        self.n_malloc = self.n_free = self.n_segment_alloc = self.n_segment_free = self.n_cache_hit = 0

    # -- allocation -------------------------------------------------------------------------------
    def malloc(self, nbytes: int, stream: int = 0) -> Block:
        """A block of at least ``nbytes`` for ``stream``: the best-fitting cached one, split if it
        is much larger, or a fresh segment when none fits."""
        with self._lock:
            self._free_dead()
            return self._malloc(nbytes, stream)

    def _free_dead(self) -> None:
        with self._lock:
            while self._dead:
                self._free(self._dead.pop())

    def _malloc(self, nbytes: int, stream: int) -> Block:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        free = self.free_lists.setdefault((stream, small), [])
        i = bisect.bisect_left(free, ((size, -1, -1),))
        if i < len(free):
            block = free.pop(i)[1]
            self.n_cache_hit += 1
        else:
            block = self._new_segment(size, stream, small)
        rest = block.size - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_SIZE):  # a small tail is not worth a block
            tail = Block(block.segment, block.offset + size, rest)
            tail.prev, tail.next = block, block.next
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            self._insert(tail)
        block.allocated, block.requested = True, nbytes
        self.allocated += block.size
        self.requested += nbytes
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.n_malloc += 1
        return block

    def _new_segment(self, size: int, stream: int, small: bool) -> Block:
        n = segment_size(size)
        segment = Segment(self.reserve(n), n, stream, small, self._next_id)
        self._next_id += 1
        self.segments[segment.id] = segment
        self.reserved += n
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.n_segment_alloc += 1
        return segment.head

    def free(self, block: Block) -> None:
        """Return ``block`` to its stream's free list, merged with free neighbours."""
        with self._lock:
            self._free(block)

    def _free(self, block: Block) -> None:
        if not block.allocated:
            raise ValueError(f"free: block at offset {block.offset} of segment {block.segment.id} is not allocated")
        block.allocated, block.ref = False, None
        self.allocated -= block.size
        self.requested -= block.requested
        self.n_free += 1
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._remove(neighbour)
                first, second = (neighbour, block) if neighbour is block.prev else (block, neighbour)
                first.size += second.size
                first.next = second.next
                if second.next is not None:
                    second.next.prev = first
                block = first
        self._insert(block)

    def _insert(self, block: Block) -> None:
        s = block.segment
        bisect.insort(self.free_lists.setdefault((s.stream, s.small), []), (block.key(), block))

    def _remove(self, block: Block) -> None:
        free = self.free_lists[(block.segment.stream, block.segment.small)]
        del free[bisect.bisect_left(free, (block.key(),))]

    def empty(self, shape: Any, dtype: Any, stream: int = 0) -> numpy.ndarray:
        """An uninitialised array from the pool; its block is freed when the array and every view
        of it are gone (views of a ``frombuffer`` array keep that array as their base)."""
        dtype = numpy.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = dtype.itemsize * math.prod(shape)
        block = self.malloc(nbytes, stream)
        view = memoryview(block.segment.buffer)[block.offset:block.offset + nbytes]
        array = numpy.frombuffer(view, dtype)
        block.ref = weakref.ref(array, lambda _, b=block: self._dead.append(b))
        return array.reshape(shape)

    def empty_cache(self) -> None:
        """Give back every segment that holds no live block."""
        with self._lock:
            self._free_dead()
            self._release_free_segments()

    def _release_free_segments(self) -> None:
        for segment in list(self.segments.values()):
            first = segment.head
            if not first.allocated and first.size == segment.size:
                self._remove(first)
                del self.segments[segment.id]
                self.reserved -= segment.size
                self.n_segment_free += 1

    # -- inspection -------------------------------------------------------------------------------
    def blocks(self) -> list[Block]:
        """Every block, free or allocated, in address order per segment."""
        out = []
        for segment in self.segments.values():
            block = segment.head
            while block is not None:
                out.append(block)
                block = block.next
        return out

    def memory_stats(self) -> dict[str, int | float]:
        """The pool's figures, under the names ``torch.cuda.memory_stats`` uses where it has one.

        ``inactive_split_bytes`` is free memory inside segments that also hold live blocks: it
        cannot be given back and serves only requests that fit in its pieces. ``fragmentation``
        is ``1 - largest free block / free bytes`` (0: all free memory in one piece).
        """
        with self._lock:  # one consistent walk of the blocks, which other threads may be relinking
            self._free_dead()
            blocks = self.blocks()
            free = [b.size for b in blocks if not b.allocated]
            partly_used = {b.segment.id for b in blocks if b.allocated}
            split = [b.size for b in blocks if not b.allocated and b.segment.id in partly_used]
            active = len(blocks) - len(free)
        return {
            "allocated_bytes.all.current": self.allocated,
            "allocated_bytes.all.peak": self.peak_allocated,
            "requested_bytes.all.current": self.requested,
            "reserved_bytes.all.current": self.reserved,
            "reserved_bytes.all.peak": self.peak_reserved,
            "active.all.current": active,
            "inactive_split.all.current": len(split),
            "inactive_split_bytes.all.current": sum(split),
            "cached_blocks": len(free),
            "cached_bytes": sum(free),
            "segment.all.current": len(self.segments),
            "num_alloc": self.n_malloc,
            "num_free": self.n_free,
            "num_cache_hits": self.n_cache_hit,
            "num_segment_alloc": self.n_segment_alloc,
            "num_segment_free": self.n_segment_free,
            "fragmentation": 1 - max(free) / sum(free) if free else 0.0,
        }

    def memory_summary(self) -> str:
        """The stats as a short table, as ``torch.cuda.memory_summary``."""
        return format_summary("cpu", self.memory_stats())


def format_summary(device: str, stats: dict) -> str:
    lines = [f"memory summary ({device})", "-" * 44]
    for name, value in stats.items():
        if isinstance(value, float):
            shown = f"{value:.1%}"
        elif name.endswith(("bytes", "bytes.all.current", "bytes.all.peak")):
            shown = f"{value / 2**20:,.2f} MiB"
        else:
            shown = f"{value:,}"
        lines.append(f"{name:<34}{shown:>10}")
    return "\n".join(lines)


cpu_allocator = CachingAllocator()  # the pool that minigrad's CPU temporaries use

# bench_pool.py: the pool's Python bookkeeping costs ~20 us a call, several times numpy.empty for
# small arrays, and halves the cost of buffers of 256 KiB and more, whose fresh pages malloc maps
# and the kernel zero-fills on every step. So only large temporaries come from the pool.
POOL_MIN_BYTES = 256 << 10
_enabled = True


def enable(on: bool) -> bool:
    """Turn the CPU pool on or off for minigrad's temporaries (it is on); returns the old setting."""
    global _enabled
    old, _enabled = _enabled, bool(on)
    return old


def empty(xp: Any, shape: tuple, dtype: Any) -> Any:
    """``xp.empty(shape, dtype)``, a pooled block on the cpu when it is large."""
    if xp is not numpy or not _enabled or math.prod(shape) * numpy.dtype(dtype).itemsize < POOL_MIN_BYTES:
        return xp.empty(shape, dtype)
    return cpu_allocator.empty(shape, dtype)


def ascontiguousarray(xp: Any, a: Any) -> Any:
    """``xp.ascontiguousarray(a)``, copied into a pooled block on the cpu when ``a`` is large."""
    if xp is not numpy or not _enabled or a.nbytes < POOL_MIN_BYTES:
        return xp.ascontiguousarray(a)
    out = cpu_allocator.empty(a.shape, a.dtype)
    numpy.copyto(out, a)
    return out

