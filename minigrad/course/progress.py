"""A pytest plugin for the grader: each notebook cell's outcome, appended as it happens.

``pytest -p minigrad_grade_progress --nbval-lax graded.ipynb`` (the grader loads a copy of this
file under that name) writes one JSON line per code cell
to the file named by ``$MINIGRAD_GRADE_PROGRESS``: ``{"cell": N, "passed": bool, "error": "..."}``.
The lines are written as the cells finish, so a run killed at its limit still says how far it got.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest

__all__ = ["error_line"]

PROGRESS = "MINIGRAD_GRADE_PROGRESS"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TIMEOUT = re.compile(r"Timeout of (\S+) seconds exceeded")


def error_line(excinfo: Any) -> str:
    """The last line of a failed cell's traceback (``AssertionError: expected 3, got 4``)."""
    if excinfo is None:
        return "failed"
    error = excinfo.value
    message = str(error.args[0]) if error.args else type(error).__name__
    if timeout := _TIMEOUT.match(message):
        return f"timed out after {timeout[1]} s"
    lines = [line.strip() for line in _ANSI.sub("", getattr(error, "inner_traceback", "") or "").splitlines()]
    lines = [line for line in lines if line]
    return lines[-1] if lines else message


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    report = outcome.get_result()
    cell = getattr(item, "cell_num", None)
    path = os.environ.get(PROGRESS)
    if path is None or cell is None or not (report.when == "call" or not report.passed):
        return
    error = "" if report.passed else error_line(call.excinfo)
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps({"cell": cell, "passed": report.passed, "error": error}) + "\n")
