"""Pipeline (tf.data style): slicing, the shuffle buffer, map (serial and in workers), batch,
take, repeat, len and prefetch."""

import gc
import multiprocessing
import threading
import time

import numpy as np
import pytest

import minigrad
from minigrad.data import AUTOTUNE, Pipeline


def _double(x):
    return x * 2


def _boom(x):
    if x == 5:
        raise KeyError("missing thing")
    return x


def test_from_tensor_slices_structures():
    x, y = np.arange(12).reshape(6, 2), np.arange(6) * 10
    p = Pipeline.from_tensor_slices((x, y))
    assert len(p) == 6
    elements = list(p)
    assert type(elements[0]) is tuple and elements[2][0].tolist() == [4, 5] and elements[2][1] == 20
    d = list(Pipeline.from_tensor_slices({"x": x, "y": y}))
    assert d[1]["y"] == 10 and d[1]["x"].tolist() == [2, 3]
    t = list(Pipeline.from_tensor_slices(minigrad.arange(3)))
    assert all(isinstance(e, minigrad.Tensor) for e in t) and [e.item() for e in t] == [0, 1, 2]
    assert list(Pipeline.from_tensor_slices([1, 2, 3])) == [1, 2, 3]
    with pytest.raises(ValueError, match=r"same first dimension.*\(6, 2\).*\(5,\)"):
        Pipeline.from_tensor_slices((x, y[:5]))


def test_shuffle_buffer_of_one_keeps_the_order():
    assert list(Pipeline.range(20).shuffle(1, seed=0)) == list(range(20))


def test_shuffle_buffer_bounds_how_far_ahead_an_element_can_come():
    b = 4
    out = list(Pipeline.range(50).shuffle(b, seed=1))
    assert sorted(out) == list(range(50)) and out != list(range(50))
    # with a buffer of b, output k can only be one of the first k + b inputs
    assert all(v < k + b for k, v in enumerate(out))
    full = list(Pipeline.range(50).shuffle(50, seed=1))
    assert any(v >= k + b for k, v in enumerate(full))


def test_shuffle_seed_and_reshuffle_each_iteration():
    p = Pipeline.range(30).shuffle(30, seed=3)
    first, second = list(p), list(p)
    assert first != second
    q = Pipeline.range(30).shuffle(30, seed=3)
    assert list(q) == first and list(q) == second
    fixed = Pipeline.range(30).shuffle(30, seed=3, reshuffle_each_iteration=False)
    assert list(fixed) == list(fixed)
    minigrad.manual_seed(0)
    a = list(Pipeline.range(30).shuffle(10))
    minigrad.manual_seed(0)
    assert list(Pipeline.range(30).shuffle(10)) == a


def test_map_unpacks_tuples_and_keeps_order():
    x, y = np.arange(5.0), np.arange(5)
    out = list(Pipeline.from_tensor_slices((x, y)).map(lambda a, b: (a + b, b)))
    assert [o[0] for o in out] == [0.0, 2.0, 4.0, 6.0, 8.0]


@pytest.mark.parametrize("calls", [2, AUTOTUNE])
def test_parallel_map_equals_serial_map(calls):
    x = np.random.default_rng(0).standard_normal((40, 3))
    serial = list(Pipeline.from_tensor_slices(x).map(_double))
    parallel = list(Pipeline.from_tensor_slices(x).map(_double, num_parallel_calls=calls))
    assert len(parallel) == 40 and all((a == b).all() for a, b in zip(serial, parallel))


def test_parallel_map_runs_in_other_processes_and_carries_tensors():
    import os

    p = Pipeline.from_tensor_slices(minigrad.arange(6)).map(lambda t: (t * 2, os.getpid()),
                                                            num_parallel_calls=2)
    out = list(p)
    assert [o[0].item() for o in out] == [0, 2, 4, 6, 8, 10]
    pids = {o[1] for o in out}
    assert len(pids) == 2 and os.getpid() not in pids


def test_parallel_map_error_is_reraised():
    before = {c.pid for c in multiprocessing.active_children()}
    with pytest.raises(KeyError, match="Caught KeyError in Pipeline.map worker process 1") as info:
        list(Pipeline.range(10).map(_boom, num_parallel_calls=2))
    assert "missing thing" in str(info.value) and "_boom" in str(info.value)
    assert {c.pid for c in multiprocessing.active_children()} <= before


def test_batch_and_drop_remainder():
    x, y = np.ones((10, 2), np.float32), np.arange(10)
    batches = list(Pipeline.from_tensor_slices((x, y)).batch(4))
    assert len(batches) == 3 and type(batches[0]) is tuple
    assert batches[0][0].shape == (4, 2) and batches[-1][1].tolist() == [8, 9]
    p = Pipeline.from_tensor_slices((x, y)).batch(4, drop_remainder=True)
    assert len(p) == 2 == len(list(p))
    assert len(Pipeline.range(10).batch(4)) == 3


def test_take_repeat_and_len():
    assert list(Pipeline.range(5).take(3)) == [0, 1, 2] and len(Pipeline.range(5).take(3)) == 3
    assert len(Pipeline.range(5).take(9)) == 5 and list(Pipeline.range(3).take(-1)) == [0, 1, 2]
    assert list(Pipeline.range(3).repeat(2)) == [0, 1, 2, 0, 1, 2] and len(Pipeline.range(3).repeat(2)) == 6
    forever = Pipeline.range(3).repeat()
    with pytest.raises(TypeError, match="infinite"):
        len(forever)
    assert list(forever.take(7)) == [0, 1, 2, 0, 1, 2, 0] and len(forever.take(7)) == 7
    # each pass of repeat is a new iteration, so the shuffle reshuffles
    two = list(Pipeline.range(20).shuffle(20, seed=0).repeat(2))
    assert sorted(two[:20]) == sorted(two[20:]) and two[:20] != two[20:]


def test_prefetch_keeps_order_and_runs_a_bounded_distance_ahead():
    p = Pipeline.range(30).map(_double).batch(4).prefetch(2)
    assert [b.tolist() for b in p][0] == [0, 2, 4, 6] and len(p) == 8
    assert sum(len(b) for b in p) == 30

    produced = []
    it = iter(Pipeline.range(100).map(produced.append).prefetch(3))
    next(it)
    # While the consumer holds one element, the thread fills the queue (3) and makes one more
    # that waits to be put; then it stops, however long we wait.
    deadline = time.monotonic() + 5
    while len(produced) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert len(produced) == 5
    it.close()


def test_prefetch_reraises_errors_from_the_thread():
    with pytest.raises(KeyError, match="missing thing"):
        list(Pipeline.range(10).map(_boom).prefetch(3))


def test_abandoned_prefetch_stops_its_thread():
    # the prefetch thread itself is watched, not a count of threads: a thread an earlier test left
    # may end meanwhile (the count then falls below where it started)
    before = set(threading.enumerate())
    it = iter(Pipeline.range(1000).prefetch(2))
    assert next(it) == 0
    started = [t for t in threading.enumerate() if t not in before]
    assert started, "prefetch(2) started no thread"
    del it
    gc.collect()
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in started) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(t.is_alive() for t in started)


def test_full_chain_with_workers_and_prefetch():
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    y = np.arange(20)
    p = (Pipeline.from_tensor_slices((x, y)).shuffle(8, seed=0)
         .map(lambda a, b: (a * 2, b), num_parallel_calls=2).batch(5).prefetch(2))
    first, again = list(p), list(p)
    assert len(first) == 4 and repr(p).startswith("Pipeline(from_tensor_slices -> shuffle(8)")
    labels = np.concatenate([b[1].numpy() for b in first])
    assert sorted(labels) == list(range(20))
    np.testing.assert_array_equal(np.concatenate([b[0].numpy() for b in first]), x[labels] * 2)
    assert not all((a[1].numpy() == b[1].numpy()).all() for a, b in zip(first, again))
