"""Worker processes and background prefetch: the machinery DataLoader and Pipeline share.

Preparing data (decoding, augmenting, collating) is CPU work a training step should not wait for.
``WorkerPool`` runs a task in worker *processes* (threads would take turns on the GIL), deals the
inputs out round-robin and yields the results in input order, so a run is reproducible however
the workers are scheduled. ``BackgroundIterator`` runs any iterator a bounded number of items
ahead in a thread, which overlaps preparation with compute. Chapter 01 measures both
(benchmarks/bench_dataloader.py).
"""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import random
import signal
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy

from minigrad import backend
from minigrad._tensor import Tensor, _wrap

__all__ = ["WorkerInfo", "get_worker_info", "WorkerPool", "BackgroundIterator", "map_tensors", "pack",
           "unpack"]

# How often a wait wakes up to check that the workers (or, in a worker, the parent) are alive.
_POLL = 0.1
# How long a shutdown waits for workers to finish their current task before terminating them.
_GRACE = 2.0


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker knows about itself, as ``torch.utils.data.get_worker_info()`` returns it."""

    id: int
    num_workers: int
    seed: int
    dataset: Any = None


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """Inside a worker process: its ``WorkerInfo`` (an ``IterableDataset`` uses it to shard
    itself). In the main process: ``None``."""
    return _worker_info


# ---------------------------------------------------------------------------------------------
# What travels between processes: plain arrays, never Tensors with their autograd graph.
class _TensorData:
    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array

    def __reduce__(self):
        return (_TensorData, (self.array,))


def pack(obj: Any) -> Any:
    """Replace every Tensor in a (nested) sample by its numpy array, marked to become a Tensor again."""
    if isinstance(obj, Tensor):
        return _TensorData(obj.detach().numpy())
    return _map_containers(pack, obj)


def unpack(obj: Any) -> Any:
    """Undo ``pack``: the marked arrays become (CPU) Tensors again, without a copy."""
    if isinstance(obj, _TensorData):
        return _wrap(obj.array, backend.cpu)
    return _map_containers(unpack, obj)


def map_tensors(fn: Callable[[Tensor], Any], obj: Any) -> Any:
    """Apply ``fn`` to every Tensor in a (nested) batch, keeping the containers around them
    (pinning and device copies use it); anything else is returned as is."""
    if isinstance(obj, Tensor):
        return fn(obj)
    return _map_containers(lambda o: map_tensors(fn, o), obj)


def _map_containers(fn, obj: Any) -> Any:
    if isinstance(obj, tuple):
        items = [fn(o) for o in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, list):
        return [fn(o) for o in obj]
    if isinstance(obj, dict):
        out = {k: fn(v) for k, v in obj.items()}
        return out if type(obj) is dict else type(obj)(out)
    return obj


# ---------------------------------------------------------------------------------------------
class _KeyErrorMessage(str):
    """KeyError shows its argument with repr(); this keeps the traceback's newlines readable."""

    def __repr__(self) -> str:
        return self


class _Failure:
    """An exception raised in a worker, carried back as its type and its traceback text.

    A class defined inside a function cannot travel by name, so the nearest base class that can
    travel goes instead, with the original name; one whose constructor takes other arguments
    than a message is re-raised as a stand-in subclass that does. Either way the consumer sees
    the original type's name and message, and ``except`` clauses for its bases still catch it.
    """

    def __init__(self, exc_type: type, name: str, where: str, text: str) -> None:
        self.exc_type, self.name, self.where, self.text = exc_type, name, where, text

    @classmethod
    def capture(cls, where: str) -> _Failure:
        original = sys.exc_info()[0]
        exc_type = next(t for t in original.__mro__ if _travels(t))
        return cls(exc_type, original.__name__, where, traceback.format_exc())

    def reraise(self) -> None:
        msg = f"Caught {self.name} in {self.where}.\nOriginal {self.text}"
        if self.exc_type is KeyError:
            msg = _KeyErrorMessage(msg)
        if self.exc_type.__name__ == self.name:
            try:
                exc = self.exc_type(msg)
            except Exception:  # a constructor that needs other arguments
                exc = _stand_in(self.exc_type, self.name)(msg)
        else:
            exc = _stand_in(self.exc_type, self.name)(msg)
        raise exc


def _travels(exc_type: type) -> bool:
    try:
        pickle.loads(pickle.dumps(exc_type))
    except Exception:
        return False
    return True


def _stand_in(base: type, name: str) -> type:
    """A subclass of ``base`` named ``name`` whose constructor takes just a message."""
    def __init__(self, msg):
        BaseException.__init__(self, msg)

    def __str__(self):
        return str(self.args[0])

    try:
        return type(name, (base,), {"__init__": __init__, "__str__": __str__, "__module__": base.__module__})
    except TypeError:  # a base that cannot be subclassed
        return type(name, (RuntimeError,), {"__module__": __name__})


class _Exhausted:
    """The result a worker sends when its task raised StopIteration (its iterable ran out)."""


def _seed_worker(seed: int) -> None:
    # Forked workers start with copies of the parent's generators: without this, every worker
    # would draw the same "random" augmentations.
    random.seed(seed)
    numpy.random.seed(seed % 2**32)
    backend.manual_seed(seed)


def _worker_loop(worker_id: int, num_workers: int, seed: int, task: Any, worker_init_fn: Any,
                 dataset: Any, name: str, tasks: Any, results: Any, done: Any) -> None:
    global _worker_info
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    where = f"{name} worker process {worker_id}"
    init_failure = None
    try:
        _seed_worker(seed)
        _worker_info = WorkerInfo(worker_id, num_workers, seed, dataset)
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
    except Exception:
        init_failure = _Failure.capture(where)
    parent = multiprocessing.parent_process()
    epoch = None
    while True:
        try:
            msg = tasks.get(timeout=_POLL)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                break  # orphaned: nobody will read our results
            continue
        if msg is None:
            break
        if done.is_set():
            continue  # shutting down: skip what is still queued until the sentinel arrives
        msg_epoch, seq, payload = msg
        result = init_failure
        if result is None:
            try:
                if msg_epoch != epoch:
                    task.begin_epoch()
                    epoch = msg_epoch
                result = pack(task(unpack(payload)))
            except StopIteration:
                result = _Exhausted()
            except Exception:
                result = _Failure.capture(where)
        try:
            # Pickled here, not in the queue's feeder thread, which would only print the error.
            data = pickle.dumps((msg_epoch, seq, result), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            data = pickle.dumps((msg_epoch, seq, _Failure.capture(where + " (pickling its result)")))
        results.put(data)
        del msg, payload, result, data
    results.cancel_join_thread()  # results nobody reads must not keep this process alive


def _default_context(method: Any) -> Any:
    # fork on Linux: the dataset, collate_fn and transforms (often lambdas or classes defined in a
    # notebook) reach the workers without being pickled, and a worker starts in milliseconds
    # instead of re-importing numpy. spawn elsewhere (fork is unsafe on macOS). Pass "spawn" or
    # "forkserver" when the parent runs threads that hold locks a forked child could inherit.
    if method is None:
        method = "fork" if sys.platform.startswith("linux") else "spawn"
    if isinstance(method, str):
        return multiprocessing.get_context(method)
    return method


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"exit code {code} (killed by signal {signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exit code {code}"


def _shutdown(procs: list, task_queues: list, results: Any, done: Any, grace: float = _GRACE) -> None:
    done.set()
    for q in task_queues:
        try:
            q.put(None)
        except (ValueError, OSError):
            pass
    deadline = time.monotonic() + grace
    started = [p for p in procs if p.pid is not None]
    for p in started:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in started:
        if p.is_alive():
            p.terminate()
            p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join(1.0)
    for q in (*task_queues, results):
        q.cancel_join_thread()
        q.close()


class WorkerPool:
    """``num_workers`` processes that each call ``task(payload)`` and send the result back.

    ``task`` has a ``begin_epoch()`` method, called in the worker before its first payload of each
    ``imap`` call (an iterable dataset starts a fresh iterator there); a ``StopIteration`` from
    ``task`` marks that worker as exhausted for the epoch. Worker ``i`` is seeded with
    ``base_seed + i`` (Python's ``random``, numpy's global generator and minigrad's). Payloads
    and results cross as plain arrays (``pack``): a Tensor arrives as a new leaf, without a graph.
    """

    def __init__(self, task: Any, num_workers: int, base_seed: int, worker_init_fn: Any = None,
                 dataset: Any = None, multiprocessing_context: Any = None, timeout: float = 0.0,
                 name: str = "DataLoader") -> None:
        ctx = _default_context(multiprocessing_context)
        self.num_workers, self.timeout, self.name = num_workers, timeout, name
        self._results = ctx.Queue()
        self._queues = [ctx.Queue() for _ in range(num_workers)]
        self._done = ctx.Event()
        self._procs = [
            ctx.Process(target=_worker_loop, daemon=True, name=f"{name}Worker-{i}",
                        args=(i, num_workers, base_seed + i, task, worker_init_fn, dataset, name,
                              self._queues[i], self._results, self._done))
            for i in range(num_workers)
        ]
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._queues,
                                           self._results, self._done)
        try:
            # All of them before any queue's feeder thread exists, so no fork copies a thread.
            for p in self._procs:
                p.start()
        except Exception as e:
            self.shutdown(grace=0.0)
            e.add_note(f"{name}: the {ctx.get_start_method()!r} start method pickles the dataset, "
                       "collate_fn, worker_init_fn and map functions; define them at module level")
            raise
        self._epoch = 0

    @property
    def alive(self) -> bool:
        return self._finalizer.alive

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def shutdown(self, grace: float = _GRACE) -> None:
        """Stop the workers: let them finish the task at hand, then terminate stragglers."""
        state = self._finalizer.detach()
        if state is not None:
            _shutdown(*state[2], grace=grace)

    def imap(self, payloads: Iterable, window: int) -> Iterator:
        """Send payloads round-robin, at most ``window`` in flight, and yield results in order.

        A worker's exception is re-raised here with its traceback text; a worker that dies, or
        no result within ``timeout`` seconds (when set), raises RuntimeError. Either shuts the
        pool down, so nothing is left hanging.
        """
        self._epoch += 1
        epoch, payloads = self._epoch, iter(payloads)
        active = list(range(self.num_workers))  # workers whose task is not exhausted
        in_flight: dict[int, int] = {}  # seq -> worker
        arrived: dict[int, Any] = {}
        sent = turn = next_seq = 0
        more = True
        while True:
            if self._epoch != epoch:
                raise RuntimeError(f"{self.name}: this iterator was superseded by a newer one over the "
                                   "same persistent workers; iterate one at a time")
            while more and active and len(in_flight) < window:
                try:
                    payload = next(payloads)
                except StopIteration:
                    more = False
                    break
                worker = active[turn % len(active)]
                turn += 1
                self._queues[worker].put((epoch, sent, pack(payload)))
                in_flight[sent] = worker
                sent += 1
            if not in_flight:
                return
            while next_seq not in arrived:
                msg_epoch, seq, result = pickle.loads(self._receive())
                if msg_epoch == epoch:  # older epochs' results come from an abandoned loop
                    arrived[seq] = result
            result, worker = arrived.pop(next_seq), in_flight.pop(next_seq)
            next_seq += 1
            if isinstance(result, _Failure):
                self.shutdown()
                result.reraise()
            if isinstance(result, _Exhausted):
                if worker in active:
                    active.remove(worker)
                continue
            yield unpack(result)

    def _receive(self) -> bytes:
        start = time.monotonic()
        while True:
            try:
                return self._results.get(timeout=_POLL)
            except queue.Empty:
                pass
            for i, p in enumerate(self._procs):
                if p.exitcode is not None:
                    self.shutdown(grace=0.0)
                    raise RuntimeError(f"{self.name} worker process {i} (pid {p.pid}) exited "
                                       f"unexpectedly with {_exit_reason(p.exitcode)}")
            if self.timeout > 0 and time.monotonic() - start > self.timeout:
                self.shutdown(grace=0.0)
                raise RuntimeError(f"{self.name} timed out after {self.timeout} s waiting for a "
                                   f"result from its {self.num_workers} worker process(es)")


# ---------------------------------------------------------------------------------------------
_ITEM, _END, _ERROR = 0, 1, 2


def _fill(it: Iterator, q: queue.Queue, stop: threading.Event) -> None:
    # A module-level function, not a method: the thread must not keep its BackgroundIterator
    # alive, or dropping the iterator half-way could never stop the thread.
    def put(msg) -> bool:
        while not stop.is_set():
            try:
                q.put(msg, timeout=_POLL)
                return True
            except queue.Full:
                pass
        return False

    try:
        for item in it:
            if not put((_ITEM, item)):
                return
        put((_END, None))
    except BaseException as e:  # the consumer re-raises it, traceback and all
        put((_ERROR, e))
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def _stop(stop: threading.Event, q: queue.Queue) -> None:
    stop.set()
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return


class BackgroundIterator:
    """Iterate ``iterable`` in a background thread, up to ``size`` items ahead of the consumer.

    While the training loop computes on one batch, the thread prepares the next ``size``; the
    bounded queue keeps memory in check. Exceptions reach the consumer with their traceback.
    """

    def __init__(self, iterable: Iterable, size: int) -> None:
        # iter() runs here, in the caller's thread, so an upstream WorkerPool forks its workers
        # before this thread exists.
        it = iter(iterable)
        self._queue: queue.Queue = queue.Queue(maxsize=size)
        stop = threading.Event()
        self._thread = threading.Thread(target=_fill, args=(it, self._queue, stop), daemon=True,
                                        name="minigrad-prefetch")
        self._thread.start()
        self._finalizer = weakref.finalize(self, _stop, stop, self._queue)

    def __iter__(self) -> BackgroundIterator:
        return self

    def __next__(self) -> Any:
        if not self._finalizer.alive:
            raise StopIteration
        kind, value = self._queue.get()
        if kind == _ITEM:
            return value
        self.close()
        if kind == _ERROR:
            raise value
        raise StopIteration

    def close(self) -> None:
        """Stop the thread (it also closes the upstream iterator)."""
        self._finalizer()
