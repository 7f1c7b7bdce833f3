"""A check cell split in two: the probe the student's process runs, and the check the instructor's runs.

A check cell reads the student's code only through ``answer(...)`` (``minigrad.course.answers``).
``probe`` keeps, of a check cell, what the student's process needs to compute those answers: the
``answer`` expressions and the statements that build their inputs (a backward slice), without the
assertions, the prints and the expected values, so a hidden check's reference never reaches the
student. ``checked`` is the whole cell with each ``answer(expr)`` replaced by the next value the
student's process sent. ``student_names`` and ``misuses`` let ``grade`` refuse a check that
touches a name of the student's solution outside ``answer`` (that would run the student's code in
the checker's process, or fail there).
"""

from __future__ import annotations

import ast
import copy

from minigrad.course.exercises import CourseError

__all__ = ["ANSWER", "RECEIVED", "SEND", "checked", "misuses", "probe", "student_names"]

ANSWER = "answer"                 # what a check cell writes
SEND = "__minigrad_send__"        # the probe's: evaluates its thunk in the student's process, sends the value
RECEIVED = "__minigrad_received__"  # the checker's: the next value received, decoded


def _is_answer(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == ANSWER
            and len(node.args) == 1 and not node.keywords)


def _answers(node: ast.AST) -> list[ast.Call]:
    """The outermost ``answer(...)`` calls in ``node``, in the order Python evaluates them (near enough)."""
    found: list[ast.Call] = []

    def visit(n: ast.AST) -> None:
        if _is_answer(n):
            found.append(n)  # type: ignore[arg-type]
            if any(_is_answer(inner) for inner in ast.walk(n.args[0])):  # type: ignore[attr-defined]
                raise CourseError(f"line {n.lineno}: answer(...) inside answer(...)")
            return
        for child in ast.iter_child_nodes(n):
            visit(child)

    visit(node)
    return found


def _parse(source: str, what: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError as error:
        raise CourseError(f"{what}: not valid Python ({error.msg}, line {error.lineno})") from error


def _loads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _stores(node: ast.AST) -> set[str]:
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in n.names)
    return names


def student_names(solution: str) -> set[str]:
    """The names the instructor's solution cell binds at its top level (functions, classes, variables)."""
    names: set[str] = set()
    for stmt in _parse(solution, "solution cell").body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names |= _stores(stmt)
    return names


def misuses(check: str, names: set[str]) -> set[str]:
    """The ``names`` a check cell reads outside ``answer(...)``."""
    tree = _parse(check, "check cell")
    for call in _answers(tree):
        call.args = []  # what is inside an answer runs in the student's process
    return _loads(tree) & names


class _Rewrite(ast.NodeTransformer):
    def __init__(self, probe: bool) -> None:
        self.probe = probe

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if not _is_answer(node):
            return self.generic_visit(node)
        if self.probe:  # send(lambda: expr): the probe sends an error in place of a value that raised
            thunk = ast.Lambda(ast.arguments([], [], None, [], [], None, []), node.args[0])
            return ast.Call(ast.Name(SEND, ast.Load()), [thunk], [])
        return ast.Call(ast.Name(RECEIVED, ast.Load()), [ast.Constant(ast.unparse(node.args[0]))], [])


def checked(source: str) -> str:
    """The check cell as the checker runs it: each ``answer(expr)`` reads the next value received."""
    tree = _parse(source, "check cell")
    _answers(tree)
    return ast.unparse(ast.fix_missing_locations(_Rewrite(probe=False).visit(tree)))


def _guarded(stmt: ast.stmt) -> ast.stmt:
    """``stmt`` under ``try: ... except Exception: pass``: instructor code the probe can do without."""
    handler = ast.ExceptHandler(ast.Name("Exception", ast.Load()), None, [ast.Pass()])
    return ast.Try([stmt], [handler], [], [])


def _is_print(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "print")


_BLOCKS = ("body", "orelse", "finalbody")


def _slice(body: list[ast.stmt], needed: set[str]) -> list[ast.stmt]:
    kept: list[ast.stmt] = []
    for stmt in reversed(body):
        kept[:0] = _slice_statement(stmt, needed)
    return kept


def _slice_statement(stmt: ast.stmt, needed: set[str]) -> list[ast.stmt]:
    answers = _answers(stmt)
    if isinstance(stmt, ast.Assert):  # the assertion goes; the answers it reads are still sent
        for call in answers:
            needed |= _loads(call)
        return [_guarded(ast.Expr(call)) for call in answers]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [stmt]
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        if stmt.name in needed or answers:
            needed |= _loads(stmt)
            return [stmt]
        return []
    if any(isinstance(getattr(stmt, block, None), list) for block in _BLOCKS):  # for, while, if, with, try
        new, inner = copy.copy(stmt), set(needed)
        for _ in range(2):  # twice: a loop's body may need what a later statement of the body binds
            for block in _BLOCKS:
                if isinstance(getattr(stmt, block, None), list):
                    setattr(new, block, _slice(getattr(stmt, block), inner))
        if not any(getattr(new, block, None) for block in _BLOCKS):
            return []
        new.body = new.body or [ast.Pass()]
        if isinstance(new, ast.Try) and not new.handlers and not new.finalbody:
            new.finalbody = [ast.Pass()]
        header = copy.copy(stmt)
        for block in _BLOCKS:
            if hasattr(header, block):
                setattr(header, block, [])
        needed |= inner | _loads(header)
        return [new]
    if isinstance(stmt, ast.Expr) and not answers:
        if _is_print(stmt):
            return []
        needed |= _loads(stmt)
        return [_guarded(stmt)]  # a call for its side effect (a seed, a backward pass)
    if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and not answers and not (_stores(stmt) & needed):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if all(isinstance(n, ast.Name) for t in targets for n in ast.walk(t) if isinstance(n.ctx if hasattr(n, "ctx") else None, ast.Store)):
            return []  # binds only names nobody needs; an assignment to an attribute or item is kept
    needed |= _loads(stmt)
    return [_guarded(stmt)]


def probe(source: str) -> str | None:
    """What the student's process runs of a check cell, or ``None`` when the cell reads no answer."""
    tree = _parse(source, "check cell")
    if not _answers(tree):
        return None
    body = _slice(tree.body, set())
    module = ast.fix_missing_locations(_Rewrite(probe=True).visit(ast.Module(body, [])))
    return ast.unparse(module)
