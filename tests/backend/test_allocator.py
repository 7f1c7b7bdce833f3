"""The caching allocator's invariants (minigrad.backend.allocator): live blocks never overlap, blocks tile
their segments, free neighbours are merged, and the stats add up, under random alloc/free sequences."""

import gc

import numpy
import pytest
from hypothesis import given, settings, strategies as st

import minigrad
from minigrad.backend import allocator as pool
from minigrad.backend.allocator import MIN_BLOCK, SMALL_SIZE, CachingAllocator, round_size, segment_size


def check_invariants(p: CachingAllocator, live: list) -> None:
    blocks = p.blocks()
    for segment in p.segments.values():
        mine = [b for b in blocks if b.segment is segment]
        assert [b.offset for b in mine] == sorted(b.offset for b in mine)
        assert sum(b.size for b in mine) == segment.size  # blocks tile the segment, no gap, no overlap
        for a, b in zip(mine, mine[1:]):
            assert a.offset + a.size == b.offset
            assert a.allocated or b.allocated  # two free neighbours would have been merged
    spans = sorted((b.segment.id, b.offset, b.offset + b.size) for b in live)
    for (s1, _, end), (s2, start, _) in zip(spans, spans[1:]):
        assert s1 != s2 or end <= start  # live blocks never overlap
    assert all(b.allocated for b in live)
    stats = p.memory_stats()
    assert stats["allocated_bytes.all.current"] == sum(b.size for b in live)
    assert stats["requested_bytes.all.current"] == sum(b.requested for b in live)
    assert stats["reserved_bytes.all.current"] == sum(s.size for s in p.segments.values())
    assert stats["allocated_bytes.all.current"] + stats["cached_bytes"] == stats["reserved_bytes.all.current"]
    assert stats["active.all.current"] == len(live)
    assert stats["num_alloc"] - stats["num_free"] == len(live)
    assert 0 <= stats["fragmentation"] < 1
    assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"]


# sizes from a few bytes to past the 10 MiB large-allocation threshold; streams 0 and 1
ops = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.integers(1, 12 << 20), st.integers(0, 1)),
    st.tuples(st.just("free"), st.integers(0, 1000), st.just(0)),
    st.tuples(st.just("empty_cache"), st.just(0), st.just(0)),
), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_random_alloc_free_sequences_keep_the_invariants(sequence):
    p = CachingAllocator(reserve=lambda n: None)  # bookkeeping only: no memory behind the segments
    live = []
    for op, n, stream in sequence:
        if op == "alloc":
            block = p.malloc(n, stream)
            # a block is split unless the rest is too small to keep: under 512 bytes, or 1 MiB in the large pool
            rest = block.size - round_size(n)
            assert rest >= 0 and block.segment.stream == stream
            assert rest < MIN_BLOCK if block.segment.small else rest <= SMALL_SIZE
            live.append(block)
        elif op == "free" and live:
            p.free(live.pop(n % len(live)))
        elif op == "empty_cache":
            p.empty_cache()
            assert all(any(b.allocated for b in p.blocks() if b.segment is s) for s in p.segments.values())
        check_invariants(p, live)
    for block in live:
        p.free(block)
    p.empty_cache()
    assert p.memory_stats()["reserved_bytes.all.current"] == 0


def test_rounding_and_segment_sizes_follow_torch():
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert segment_size(1 << 20) == 2 << 20  # small pool: 2 MiB segments
    assert segment_size((1 << 20) + 512) == 20 << 20  # up to 10 MiB: 20 MiB segments
    assert segment_size(11 << 20) == 12 << 20  # larger: its own segment, rounded to 2 MiB


def test_a_freed_block_is_reused_only_on_its_stream():
    p = CachingAllocator(reserve=lambda n: None)
    a = p.malloc(4096, stream=0)
    p.free(a)
    assert p.malloc(4096, stream=1).segment is not a.segment
    assert p.malloc(4096, stream=0).segment is a.segment
    assert p.memory_stats()["num_cache_hits"] == 1


def test_a_free_block_is_split_and_merged_back():
    p = CachingAllocator(reserve=lambda n: None)
    a, b, c = (p.malloc(1024) for _ in range(3))
    assert (a.segment, a.offset, b.offset, c.offset) == (b.segment, 0, 1024, 2048)  # one 2 MiB segment
    p.free(b)
    assert p.memory_stats()["inactive_split_bytes.all.current"] == (2 << 20) - 2048
    p.free(a)
    p.free(c)
    assert [blk.size for blk in p.blocks()] == [2 << 20]
    p.empty_cache()
    assert p.segments == {}


def test_double_free_is_refused():
    p = CachingAllocator(reserve=lambda n: None)
    a = p.malloc(10)
    p.free(a)
    with pytest.raises(ValueError, match="not allocated"):
        p.free(a)


def test_arrays_return_their_block_when_the_last_view_dies():
    p = CachingAllocator()
    x = p.empty((64, 64), numpy.float32)
    x[...] = 1
    view = x[1:].T
    del x
    gc.collect()
    assert p.memory_stats()["active.all.current"] == 1  # the view keeps the block alive
    y = p.empty((64, 64), numpy.float32)
    y[...] = 2
    assert (view == 1).all()  # the live view's memory was not handed out again
    del view, y
    gc.collect()
    assert p.memory_stats()["active.all.current"] == 0


def test_memory_stats_and_summary_for_cpu_and_the_top_level_names():
    stats = minigrad.memory_stats()
    assert stats == pool.cpu_allocator.memory_stats()
    assert "reserved_bytes.all.current" in minigrad.memory_summary()
    minigrad.empty_cache()
    assert minigrad.memory_stats("cpu")["cached_bytes"] == 0
