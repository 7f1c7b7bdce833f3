"""The grader's guard inside the kernel: student code runs under watch, checks run on a clean slate.

The graded notebook (``minigrad.course.grade.assemble``) does not run a student's solution cell as
a cell: it hands its source to ``Guard.solution``, which compiles it under the file name
``<exercise N solution>`` and runs it in the notebook's namespace. That buys two defences.

- **Calling the reference.** An exercise may name, in its solution cell's metadata, the library
  functions it re-implements (``"forbid": ["minigrad.graph.ir.topological_order"]``). Every
  reference to such a function (in any module, class or the notebook) is replaced by a wrapper
  that raises ``ReferenceCalled`` whenever code of that exercise's solution is on the call stack
  (or one of the functions it defined is running), and calls the original otherwise, so the check
  cells and the library itself still use it.
- **Patching the judge.** Before and after every solution and check the guard compares the
  functions and classes of numpy, math, builtins, minigrad and a few other modules (and the names
  the instructor's cells defined) with a snapshot; anything replaced or deleted is put back and
  the cell fails with ``TamperingDetected``, naming what was changed.

Both run in the student's process, so they stop the cheats a student would try, not a determined
attack on the grader itself; the hard limit, the process bound and the scratch copy
(``minigrad.course.sandbox``) do not depend on the student's code.
"""

from __future__ import annotations

import builtins
import functools
import importlib
import linecache
import sys
import types
from typing import Any, Callable

__all__ = ["Guard", "ReferenceCalled", "TamperingDetected", "PROTECTED"]

# The modules whose functions a check relies on (allclose, isclose, gradcheck, the builtins...).
PROTECTED = ("builtins", "numpy", "math", "cmath", "operator", "functools", "itertools", "collections",
             "random", "statistics", "copy", "minigrad")

_ROUTINE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, type,
            staticmethod, classmethod, property, functools.partial, types.MethodDescriptorType,
            types.WrapperDescriptorType)


_MISSING = object()


class ReferenceCalled(RuntimeError):
    """A solution called the library function its exercise asks the student to write."""


class TamperingDetected(RuntimeError):
    """A solution replaced a function the checks rely on (the guard has put it back)."""


_BUILTINS = vars(builtins)


def _restore_builtins(real: dict[str, Any]) -> list[str]:
    """Put the builtins back as ``real`` holds them, calling no builtin the student could have replaced."""
    changed = [f"builtins.{k}" for k, v in real.items() if _BUILTINS.get(k, _MISSING) is not v]
    _BUILTINS.update(real)
    return changed


def _protected(name: str) -> bool:
    return name.split(".", 1)[0] in PROTECTED


def _snapshot() -> dict[Any, dict[str, Any]]:
    """For every protected module and every class it defines: its routine-valued attributes."""
    snap: dict[Any, dict[str, Any]] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not _protected(name):
            continue
        entries = {k: v for k, v in list(vars(module).items()) if callable(v) or type(v) in _ROUTINE}
        snap[module] = entries
        for value in entries.values():
            if isinstance(value, type) and value not in snap and getattr(value, "__module__", "") == name:
                snap[value] = dict(vars(value))
    return snap


def _restore(snap: dict[Any, dict[str, Any]]) -> list[str]:
    """Put back what changed since ``snap``; returns the changed names."""
    changed = []
    for owner, entries in snap.items():
        current = vars(owner)
        label = getattr(owner, "__name__", "?") if isinstance(owner, types.ModuleType) else \
            f"{owner.__module__}.{owner.__qualname__}"
        for key, value in entries.items():
            if current.get(key, _MISSING) is not value:
                changed.append(f"{label}.{key}")
                setattr(owner, key, value)
        if isinstance(owner, type):  # a class may not gain a method either (Tensor.__eq__, say)
            for key in [k for k in current if k not in entries]:
                changed.append(f"{label}.{key}")
                delattr(owner, key)
    return changed


def _resolve(qualname: str) -> tuple[Any, str, Any]:
    """``minigrad.graph.ir.topological_order`` -> (owner, attribute name, value)."""
    parts = qualname.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:-1]:
            owner = getattr(owner, attr)
        return owner, parts[-1], vars(owner)[parts[-1]] if isinstance(owner, type) else getattr(owner, parts[-1])
    raise ImportError(f"cannot find {qualname!r}")


class Guard:
    """The graded notebook's guard: ``forbid`` maps an exercise number to the references it may not call."""

    def __init__(self, namespace: dict[str, Any], forbid: dict[int, list[str]] | None = None) -> None:
        self.namespace = namespace
        self.instructor_names: set[str] = set()
        self.student_names: set[str] = set()
        self.running: list[int] = []  # the exercises whose student functions are running now
        self._getframe = sys._getframe
        for number, names in (forbid or {}).items():
            for qualname in names:
                self._forbid(number, qualname)

    # -- calling the reference ------------------------------------------------------------------

    def _student_on_stack(self, number: int) -> bool:
        if number in self.running:
            return True
        frame, filename = self._getframe(2), f"<exercise {number} solution>"
        while frame is not None:
            if frame.f_code.co_filename == filename:
                return True
            frame = frame.f_back
        return False

    def _forbid(self, number: int, qualname: str) -> None:
        owner, attr, original = _resolve(qualname)
        function = original.__func__ if isinstance(original, (staticmethod, classmethod)) else original
        guard = self

        @functools.wraps(function)
        def reference(*args: Any, **kwargs: Any) -> Any:
            if guard._student_on_stack(number):
                raise ReferenceCalled(f"exercise {number} asks you to write this yourself: the solution "
                                      f"may not call {qualname}")
            return function(*args, **kwargs)

        del reference.__wrapped__  # no way back to the original through the wrapper
        replacement = type(original)(reference) if isinstance(original, (staticmethod, classmethod)) else reference
        for module in list(sys.modules.values()):
            space = getattr(module, "__dict__", None)
            if isinstance(space, dict):
                for key, value in list(space.items()):
                    if value is original or value is function:
                        space[key] = reference
                    elif isinstance(value, type) and value.__module__ == module.__name__:
                        for k, v in list(vars(value).items()):
                            if v is original:
                                setattr(value, k, replacement)
        for key, value in list(self.namespace.items()):
            if value is original or value is function:
                self.namespace[key] = reference
        if isinstance(owner, type):
            setattr(owner, attr, replacement)

    def _watch(self, number: int, function: Callable[..., Any]) -> Callable[..., Any]:
        guard = self

        @functools.wraps(function)
        def student(*args: Any, **kwargs: Any) -> Any:
            guard.running.append(number)
            try:
                return function(*args, **kwargs)
            finally:
                guard.running.pop()

        return student

    # -- running cells ---------------------------------------------------------------------------

    def cell(self, source: str) -> None:
        """Run an instructor's cell (setup, helpers) and remember the names it defines."""
        self._run(source, "<instructor cell>")
        self.instructor_names.update(k for k in self.namespace if k not in self.student_names)

    def solution(self, number: int, source: str) -> None:
        """Run exercise ``number``'s student solution; raises if it tampered with the judge."""
        before = set(self.namespace)
        self._run(source, f"<exercise {number} solution>", number, protect_names=True)
        for key in set(self.namespace) - before - self.instructor_names:
            self.student_names.add(key)
            value = self.namespace[key]
            if callable(value) and not isinstance(value, type):
                self.namespace[key] = self._watch(number, value)

    def check(self, number: int, source: str) -> None:
        """Run a check (shown or hidden) of exercise ``number`` on a clean slate."""
        self._run(source, f"<check {number}>", number)

    def _run(self, source: str, filename: str, number: int | None = None, protect_names: bool = False) -> None:
        ip = getattr(builtins, "get_ipython", lambda: None)()
        code = ip.transform_cell(source) if ip is not None else source
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        real_builtins = dict(_BUILTINS)  # (the kernel replaces `input` for every cell it runs)
        snap = _snapshot()
        names = {k: self.namespace[k] for k in self.instructor_names
                 if protect_names and k in self.namespace and not k.startswith("_")}
        error: BaseException | None = None
        try:
            exec(compile(code, filename, "exec"), self.namespace)  # noqa: S102 - the grader's job
        except BaseException as raised:  # noqa: BLE001 - restored first, raised below
            error = raised
        changed = _restore_builtins(real_builtins)
        changed += [name for name in _restore(snap) if name not in changed]
        for key, value in names.items():
            if self.namespace.get(key, _MISSING) is not value:
                changed.append(key)
                self.namespace[key] = value
        if changed:
            where = f"exercise {number}" if number is not None else filename
            raise TamperingDetected(f"{where} replaced {', '.join(sorted(changed)[:5])}"
                                    f"{' ...' if len(changed) > 5 else ''}; the grader put "
                                    f"{'it' if len(changed) == 1 else 'them'} back") from error
        if error is not None:
            raise error.with_traceback(error.__traceback__.tb_next if error.__traceback__ else None)

