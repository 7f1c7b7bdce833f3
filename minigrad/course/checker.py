"""The instructor's side of grading: the checks, run on the student's answers in a process the student never touched.

``python -m minigrad.course.checker`` reads from stdin the instructor's setup cells and check cells
(hidden ones included) in notebook order, and per check cell the answers the student's process
sent, still encoded (``minigrad.course.answers``). It runs the setup cells, then each check with
``answer(expr)`` replaced by the next decoded answer (``minigrad.course.checks``), and writes one
JSON line per check cell to the pipe it is given: ``{"cell": N, "passed": bool, "error": "..."}``.
A check whose answers ran out fails with the error the student's process reported for it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from typing import Any

from minigrad.course.answers import AnswerError, decode, write_message
from minigrad.course.runner import error_line

__all__ = ["AnswerMissing", "main"]


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
        return decode(queue.pop(0))

    namespace: dict[str, Any] = {"__name__": "__main__", program["received"]: received}
    for step in program["steps"]:
        sent = step.get("answers") or {}
        queue[:], why[:] = list(sent.get("values", [])), [sent["error"]] if sent.get("error") else []
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(step["source"], f"<{step['role']} cell {step['cell']}>", "exec"), namespace)  # noqa: S102
        except AnswerMissing as error:
            write_message(out, {"verdict": {"cell": step["cell"], "passed": False, "error": str(error)}})
        except AnswerError as error:
            write_message(out, {"verdict": {"cell": step["cell"], "passed": False, "error": f"AnswerError: {error}"}})
        except Exception as error:  # noqa: BLE001 - a failed check
            if step["role"] == "setup":
                write_message(out, {"setup_failed": {"cell": step["cell"], "error": error_line(error)}})
                return 1
            write_message(out, {"verdict": {"cell": step["cell"], "passed": False, "error": error_line(error)}})
        else:
            if step["role"] != "setup":
                write_message(out, {"verdict": {"cell": step["cell"], "passed": True, "error": ""}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
