"""Shared test setup: the tests directory is importable (``from op_table import OPS``), and every
test starts from the same random seed, with grad mode on and on the suite's default device, so
tests do not depend on order.

Devices: a test that takes the ``device`` fixture runs once on ``cpu`` and once on ``cuda``. Where
there is no GPU the ``cuda`` case runs on the strict stand-in for cupy (``fake_cupy.py``: numpy
underneath, cupy's refusals on top, host synchronisations counted), so device dispatch, lost
placement and numpy calls on device data fail on a CPU too; the summary says how many ran on it.
A real GPU stays the reference where there is one. ``MINIGRAD_TEST_DEVICE=cuda`` makes cuda the
default device of every tensor the whole suite creates. ``MINIGRAD_SIMULATE_CUDA=1`` stands the
imitation in for cupy for the whole run: it checks minigrad's dispatch, never a GPU.
"""

import os
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fake_cupy  # noqa: E402

if os.environ.get("MINIGRAD_SIMULATE_CUDA") == "1":
    sys.modules["cupy"] = fake_cupy.module
    fake_cupy.strict_numpy()

import minigrad  # noqa: E402

TEST_DEVICE = minigrad.device(os.environ.get("MINIGRAD_TEST_DEVICE", "cpu"))
HAS_CUDA = minigrad.cuda.is_available()
NO_CUDA = "no CUDA GPU (cupy not installed or no device)"


@pytest.fixture(autouse=True)
def _fresh_state():
    minigrad.manual_seed(0)
    minigrad.set_default_device(TEST_DEVICE)
    yield
    minigrad.set_grad_enabled(True)  # a failed test must not leave grad mode switched off for the next one
    minigrad.set_default_device(TEST_DEVICE)


def require(device: str) -> str:
    """``device``, or skip the test when it is a GPU and there is none."""
    if device.startswith("cuda") and not HAS_CUDA:
        pytest.skip(NO_CUDA)
    return device


_on_stand_in: list[str] = []  # the cuda cases that ran on fake_cupy (no GPU here)


@pytest.fixture(params=["cpu", "cuda"])
def device(request) -> str:
    """Each device in turn; cuda is the GPU where there is one, else the strict stand-in."""
    if request.param == "cuda" and not HAS_CUDA:
        forget = fake_cupy.install(request.getfixturevalue("monkeypatch"))
        request.addfinalizer(forget)
        _on_stand_in.append(request.node.nodeid)
    return request.param


@pytest.fixture
def simulated_cuda(monkeypatch):
    """The numpy-backed cupy imitation as ``cupy`` for one test (a simulation, not a GPU); skipped
    where a real GPU is present, whose devices it must not replace."""
    if HAS_CUDA and sys.modules.get("cupy") is not fake_cupy.module:
        pytest.skip("a real CUDA GPU is present; the simulation stands in only where there is none")
    forget = fake_cupy.install(monkeypatch)
    yield fake_cupy.module
    forget()


def _skip_reason(report: pytest.TestReport) -> str:
    """A skip's reason with the module path folded in: "could not import 'torch.nn.functional': No
    module named 'torch'" and "... 'torch': ..." are one reason, the missing package."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    missing = re.fullmatch(r"could not import '[\w.]+': No module named '(\w+)[\w.]*'", reason)
    return f"{missing.group(1)} is not installed" if missing else reason


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """One line per reason for the skipped tests (pytest's -rs prints one per test location), so
    a run without the optional extras says in a few lines what it did not check and why. Then how
    many cuda cases ran on the stand-in for want of a GPU."""
    stand_in = set(_on_stand_in)
    ran = {r.nodeid for r in terminalreporter.stats.get("passed", []) if r.nodeid in stand_in}
    if _on_stand_in:
        terminalreporter.line(f"{len(ran)} cuda test(s) passed on the cupy stand-in (fake_cupy.py, no GPU here)")
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    terminalreporter.section(f"{len(skipped)} skipped, by reason")
    for reason, count in Counter(map(_skip_reason, skipped)).most_common():
        terminalreporter.line(f"{count:6d}  {reason}")
