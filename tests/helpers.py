"""What test modules need to stay device-neutral: a tensor's values on the host, whether two
tensors share memory on their device, pinning the few tests that are about the cpu on purpose, and
skipping what the simulated cupy (fake_cupy.py) cannot run: the CUDA kernels that fusion generates
for groups on a cuda device (``cupy.ElementwiseKernel``, ``ReductionKernel``); a real GPU runs them.

The suite runs with any default device (``MINIGRAD_TEST_DEVICE=cuda``, see conftest.py), so a test
never hands ``tensor.array`` to numpy: on cuda that is a cupy array, which numpy cannot read. It
compares ``to_numpy(tensor)`` against numpy on the host instead.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import numpy as np
import pytest

import fake_cupy
import minigrad
from minigrad import backend

NO_KERNELS = "simulated cuda has no ElementwiseKernel"


def to_numpy(x: Any) -> np.ndarray:
    """A host copy of the values of a Tensor on any device, of a cupy array, or of anything numpy
    takes (a copy, so a later in-place change to the tensor does not alter it)."""
    if isinstance(x, minigrad.Tensor):
        return np.array(x.detach().cpu().numpy())
    return np.array(x.get() if minigrad.backend.device_of(x).type == "cuda" else x)


def cpu_only(reason: str) -> Callable[[Callable], Callable]:
    """Run a test with ``cpu`` as the default device whatever the suite's default is, for a test
    about the cpu itself (such as the host memory counter's byte-exact figures); ``reason`` says
    why, where the test is pinned, as ``pytest.mark.skip(reason=...)`` does."""

    def pin(test: Callable) -> Callable:
        @functools.wraps(test)  # keeps the signature, so pytest still passes the test its fixtures
        def run(*args: Any, **kwargs: Any) -> Any:
            with minigrad.device("cpu"):
                return test(*args, **kwargs)

        return run

    return pin


def shares_memory(a: minigrad.Tensor, b: minigrad.Tensor) -> bool:
    """Whether two tensors' data overlap in memory, asked of their device's array module (a view
    shares its base's memory on a GPU as on the cpu; cupy has ``shares_memory`` too)."""
    return bool(a.device.xp.shares_memory(a.array, b.array))


def simulated() -> bool:
    """Whether ``cupy`` is the numpy-backed imitation now (MINIGRAD_SIMULATE_CUDA=1, or the
    ``simulated_cuda`` fixture)."""
    return sys.modules.get("cupy") is fake_cupy.module


def skip_if_kernels_cannot_run(device: Any = None) -> None:
    """Skip a test that runs fused groups' kernels on ``device`` (default: the default device)
    when those are CUDA kernels and cupy is the simulation."""
    if backend.resolve_device(device).type == "cuda" and simulated():
        pytest.skip(NO_KERNELS)


def training_step(model: Any, opt: Any, loss_fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A whole training step as one function of ``(x, t)``, as ``trace`` and ``compile`` record it:
    zero the gradients, ``loss_fn(model(x), t)``, backward, the optimizer's step; returns the loss."""

    def step(x: Any, t: Any) -> Any:
        opt.zero_grad()
        loss = loss_fn(model(x), t)
        loss.backward()
        opt.step()
        return loss

    return step


class AliveProbe:
    """For tests of when an executor frees buffers: ``op`` is an op whose forward adds 1 to its
    input and appends to ``alive`` how many earlier probes' outputs are still alive then (weakly
    referenced, so holding none); ``add(graph, value)`` puts one in a graph after ``value``."""

    def __init__(self) -> None:
        import weakref

        from minigrad.ops.elementwise import Op

        self.alive: list[int] = []
        self.refs: list = []
        probe = self

        class Probe(Op):
            @staticmethod
            def forward(ctx, a):
                out = a + 1.0
                probe.alive.append(sum(r() is not None for r in probe.refs))
                probe.refs.append(weakref.ref(out))
                return out

        self.op = Probe

    def add(self, graph: Any, value: Any) -> Any:
        """A probe node reading ``value``, a float64 vector of 100."""
        from minigrad.graph.trace import TENSOR_ARG

        return graph.add_node("Probe", [value], shape=(100,), dtype=np.dtype("float64"), fn=self.op,
                              meta={"args": (TENSOR_ARG,), "kwargs": ()})

    def clear(self) -> None:
        self.alive.clear()
        self.refs.clear()
