"""The instructor's side of grading: the checks, run on the student's answers in a process the student never touched.

``python checker.py`` (a copy in the grader's scratch folder) reads from stdin, per exercise, the
instructor's setup cells and that exercise's check cells (hidden ones included) in notebook
order, and per check cell the answers the student's process sent, still encoded
(``minigrad.course.answers``). In a fresh namespace per exercise it runs the setup, then each check with
``answer(expr)`` replaced by the next decoded answer (``minigrad.course.checks``), and writes one
JSON line per check cell to the pipe it is given: ``{"cell": N, "passed": bool, "error": "..."}``.
A check whose answers ran out fails with the error the student's process reported for it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

_here = Path(__file__).resolve().parent


def _load(name: str) -> Any:
    """A grader module from this file's folder (the scratch copy): the package's ``__init__`` is not needed."""
    spec = importlib.util.spec_from_file_location(f"minigrad_grade_{name}", _here / f"{name}.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


answers, runner = _load("answers"), _load("runner")


class AnswerMissing(RuntimeError):
    """A check read more answers than the student's process sent (it raised, died or was killed first)."""


def main() -> int:
    program = json.loads(sys.stdin.buffer.read())
    out = os.fdopen(program["fd"], "wb")
    queue: list[Any] = []
    why: list[str] = []

    def received(expression: str) -> Any:
        if not queue:
            raise AnswerMissing(why[0] if why else f"no answer for {expression}: the student's process sent none")
        return answers.decode(queue.pop(0))

    def verdict(cell: int, error: str) -> None:
        answers.write_message(out, {"verdict": {"cell": cell, "passed": not error, "error": error}})

    for exercise in program["exercises"]:  # a fresh namespace each: the same state the student's side had
        namespace: dict[str, Any] = {"__name__": "__main__", program["received"]: received}
        for step in exercise["steps"]:
            sent = step["answers"]
            queue[:], why[:] = list(sent.get("values", [])), [sent["error"]] if sent.get("error") else []
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(compile(step["source"], f"<{step['role']} cell {step['cell']}>", "exec"), namespace)  # noqa: S102
            except AnswerMissing as error:
                verdict(step["cell"], str(error))
            except answers.AnswerError as error:
                verdict(step["cell"], f"AnswerError: {error}")
            except Exception as error:  # noqa: BLE001 - a failed check, or the instructor's setup failing
                if step["role"] == "setup":
                    answers.write_message(out, {"setup_failed": {"cell": step["cell"], "error": runner.error_line(error)}})
                    return 1
                verdict(step["cell"], runner.error_line(error))
            else:
                if step["role"] != "setup":
                    verdict(step["cell"], "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
