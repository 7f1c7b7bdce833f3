"""The student's side of grading: one exercise's cells in a process of their own, answers out on a pipe.

``python runner.py`` (the grader copies this file and ``answers.py`` into the exercise's scratch
folder, where the confined process can read them) reads its program from stdin: the instructor's
setup cells, the student's solution cell and the probes of the checks (``minigrad.course.checks``),
in notebook order. It runs them as plain Python in one namespace and sends, on the pipe it is
given, each answer the probes compute (``{"answer": ...}``), each error (``{"error": ...}``), and
``{"done": ...}`` at the end. Nothing here decides a grade: the student's code can rewrite this
process entirely, and all it can then send is data that the instructor's checks, elsewhere, judge.
"""

from __future__ import annotations

import builtins
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

_spec = importlib.util.spec_from_file_location("minigrad_grade_answers", Path(__file__).with_name("answers.py"))
answers = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(answers)  # type: ignore[union-attr]


class ReferenceCalled(RuntimeError):
    """A solution called the library function its exercise asks the student to write (its body is gone here)."""


class StopProbe(BaseException):  # noqa: N818 - not an error of the probe: it ends the probe past `except Exception`
    """An answer could not be computed; the error has been sent, and the rest of this check cannot run."""


def error_line(error: BaseException) -> str:
    """``Type: message`` of an exception, first line only (what the score table shows)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def main() -> int:
    program = json.loads(sys.stdin.buffer.read())
    out = os.fdopen(program["fd"], "wb")
    sys.path.insert(0, program["path"])
    builtins.ReferenceCalled = ReferenceCalled  # type: ignore[attr-defined] - raised by stripped references
    step: dict[str, Any] = {}

    def send(thunk: Callable[[], Any]) -> Any:
        try:
            value = thunk()
            data = answers.encode(value)
        except Exception as error:  # noqa: BLE001 - the student's error, sent in place of the answer
            answers.write_message(out, {"error": {"cell": step["cell"], "role": step["role"], "message": error_line(error)}})
            raise StopProbe from error
        answers.write_message(out, {"answer": {"cell": step["cell"], "value": data}})
        return value

    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins, program["send"]: send}
    for step in program["steps"]:
        try:
            code = compile(step["source"], f"<{step['role']} {step['exercise'] or ''} cell {step['cell']}>", "exec")
            exec(code, namespace)  # noqa: S102 - running the student's solution is the point
        except StopProbe:
            continue
        except BaseException as error:  # noqa: BLE001 - SystemExit and KeyboardInterrupt fail the cell too
            answers.write_message(out, {"error": {"cell": step["cell"], "role": step["role"], "message": error_line(error)}})
            if step["role"] in ("setup", "solution"):
                break  # what follows needs this cell
    answers.write_message(out, {"done": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
