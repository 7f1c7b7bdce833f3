"""Shared test setup: the tests directory is importable (``from op_table import OPS``), and every
test starts from the same random seed and with grad mode on, so tests do not depend on order."""

import sys
from pathlib import Path

import pytest

import minigrad

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True)
def _fresh_state():
    minigrad.manual_seed(0)
    yield
    minigrad.set_grad_enabled(True)  # a failed test must not leave grad mode switched off for the next one
