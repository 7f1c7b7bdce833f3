"""Mutation testing of the chapter tests: every mistake in the catalog must make its chapter's tests fail.

``run_mutants(k)`` applies each mutant of chapter ``k`` (``minigrad.course.mutants``) to a scratch
copy of the repository in which the regions of chapters after ``k`` are empty, as a student's are,
and runs only the tests tagged for the mutant's region, with PyTorch hidden (a ``torch`` package
on the path that raises ImportError, so every process the tests start sees no PyTorch either): a
student has no PyTorch, so the known-value tests must catch the mistake on their own.
``run_regions(k)`` is the same with each region of chapter ``k`` emptied in turn (``raise
NotImplementedError``): the tagged tests must fail and name the region. The tagged tests lie in
the chapter's ``CHAPTER_TESTS`` files, so a failure here is a failure of ``test-chapter k``.
Workers run in parallel, one scratch copy each; the byte code is hash-checked, so restoring a file
after its mutant makes every other module's cached byte code valid again.
"""

from __future__ import annotations

import compileall
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import Queue

from minigrad.course.exercises import CourseError
from minigrad.course.mutants import MUTANTS, REGION_TESTS, Mutant
from minigrad.course.package import CHAPTER_TESTS, ROOT, Region, _copy_tests, find_regions, strip_regions

__all__ = ["MUTANTS", "Outcome", "apply_mutant", "empty_region", "run_mutants", "run_regions"]

_NO_TORCH = ('"""PyTorch hidden by minigrad.course mutants: the student has none."""\n'
             'raise ModuleNotFoundError("No module named \'torch\' (hidden by minigrad.course mutants)",\n'
             '                          name="torch")\n')
_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


@dataclass
class Outcome:
    """What one run gave: ``killed`` when the tagged tests failed (for a region: and named it)."""

    name: str
    region: str
    killed: bool
    by: str
    seconds: float


def _region_bounds(text: str, region: Region) -> tuple[int, int]:
    """Character offsets of the region's body (between its marker lines) in ``text``."""
    lines = text.splitlines(keepends=True)
    start = sum(len(line) for line in lines[:region.begin])
    return start, start + sum(len(line) for line in lines[region.begin:region.begin + region.lines])


def _regions_by_tag(root: Path) -> dict[str, Region]:
    return {r.tag: r for r in find_regions(root / "minigrad")}


def apply_mutant(text: str, region: Region, mutant: Mutant) -> str:
    """``text`` (the file holding ``region``) with ``mutant`` applied inside the region's body.

    Raises CourseError unless ``mutant.old`` occurs exactly once there."""
    start, end = _region_bounds(text, region)
    body = text[start:end]
    count = body.count(mutant.old)
    if count != 1:
        raise CourseError(f"mutant {mutant.name}: its old text occurs {count} times in region "
                          f"'{mutant.region}' ({region.path}:{region.begin}), expected exactly once:\n{mutant.old}")
    return text[:start] + body.replace(mutant.old, mutant.new) + text[end:]


def empty_region(text: str, region: Region) -> str:
    """``text`` with only ``region``'s body replaced by ``raise NotImplementedError``, as a student gets it."""
    start, end = _region_bounds(text, region)
    indent = re.match(r"\s*", text.splitlines()[region.begin - 1])[0]  # the BEGIN marker's
    return text[:start] + f'{indent}raise NotImplementedError("{region.tag}")\n' + text[end:]


def _scratch(dest: Path, upto: int, root: Path) -> None:
    """A copy of the repository's package and tests at ``dest``: chapters after ``upto`` empty, no torch."""
    for path in sorted((root / "minigrad").rglob("*")):
        relative = path.relative_to(root)
        if "__pycache__" in relative.parts or not path.is_file():
            continue
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".py" and relative.parts[:2] != ("minigrad", "course"):
            target.write_text(strip_regions(path.read_text(), upto, relative))
        else:
            shutil.copy(path, target)
    _copy_tests(root, dest, sorted(CHAPTER_TESTS))
    (dest / "pytest.ini").write_text("[pytest]\n")
    (dest / "_hidden" / "torch").mkdir(parents=True)
    (dest / "_hidden" / "torch" / "__init__.py").write_text(_NO_TORCH)
    for folder in ("minigrad", "tests"):  # hash-checked: valid again as soon as a mutated file is restored
        compileall.compile_dir(dest / folder, quiet=1, workers=1,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)


def _run_tests(dest: Path, tests: list[str], timeout: float) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # nbval and the other plugins cost most of pytest's start-up here and no region test needs them
    env.update(PYTHONPATH=f"{dest}{os.pathsep}{dest / '_hidden'}", PYTHONDONTWRITEBYTECODE="1",
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "_hypothesis_pytestplugin",
               *tests]
    try:
        run = subprocess.run(command, cwd=dest, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, f"timeout after {timeout:.0f} s"
    return run.returncode, run.stdout + run.stderr


Report = Callable[[Outcome], None]


def _run_all(jobs: list[tuple[str, Region, str, str | None]], upto: int, workers: int, root: Path,
             timeout: float, report: Report | None = None) -> list[Outcome]:
    """Each job is (name, region, mutated file text, text the failure must contain or None)."""
    if not jobs:
        return []
    with tempfile.TemporaryDirectory(prefix=f"minigrad-mutants-{upto}-") as scratch:
        copies: Queue = Queue()
        first = Path(scratch) / "w0"
        _scratch(first, upto, root)
        tagged = list(dict.fromkeys(t for _, region, _, _ in jobs for t in REGION_TESTS[region.tag]))
        rc, output = _run_tests(first, tagged, timeout)
        if rc != 0:  # a mutant's failure must be its own, not one the written package has too
            raise CourseError(f"chapter {upto}: the tagged tests fail with no mutant applied (pytest exit {rc}):\n"
                              f"{output[-3000:]}")
        for w in range(workers):
            if w:
                shutil.copytree(first, Path(scratch) / f"w{w}", symlinks=True)
            copies.put(Path(scratch) / f"w{w}")

        def one(job: tuple[str, Region, str, str | None]) -> Outcome:
            name, region, text, must_name = job
            dest = copies.get()
            target = dest / region.path.relative_to(root)
            original = target.read_bytes()
            start = time.perf_counter()
            try:
                target.write_text(strip_regions(text, upto, target))
                rc, output = _run_tests(dest, REGION_TESTS[region.tag], timeout)
            finally:
                target.write_bytes(original)
                copies.put(dest)
            failed = _FAILED.findall(output)
            by = failed[0] if failed else {0: "", -1: "timeout", 5: "no test ran"}.get(rc, f"pytest exit {rc}")
            # 1: a test failed, 2: collection failed (the package does not import), -1: timed out
            killed = rc in (1, 2, -1) and (must_name is None or must_name in output)
            if rc != 0 and must_name is not None and must_name not in output:
                by = f"{by} (without naming '{must_name}')"
            outcome = Outcome(name, region.tag, killed, by, time.perf_counter() - start)
            if report is not None:
                report(outcome)
            return outcome

        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, jobs))


def _chapter_mutants(chapter: int | None, regions: dict[str, Region]) -> list[Mutant]:
    unknown = [m.name for m in MUTANTS if m.region not in regions]
    if unknown:
        raise CourseError(f"mutants of regions the package does not have: {', '.join(unknown)}")
    return [m for m in MUTANTS if chapter is None or regions[m.region].chapter == chapter]


def run_mutants(chapter: int, workers: int = 2, root: Path = ROOT, timeout: float = 300,
                report: Report | None = None, names: list[str] | None = None) -> list[Outcome]:
    """Run every mutant of ``chapter`` (or those of ``names``) against its region's tests; one Outcome per mutant."""
    regions = _regions_by_tag(root)
    jobs = []
    for mutant in _chapter_mutants(chapter, regions):
        if names and mutant.name not in names:
            continue
        region = regions[mutant.region]
        jobs.append((mutant.name, region, apply_mutant(region.path.read_text(), region, mutant), None))
    return _run_all(jobs, chapter, workers, root, timeout, report)


def run_regions(chapter: int, workers: int = 2, root: Path = ROOT, timeout: float = 300,
                report: Report | None = None) -> list[Outcome]:
    """Empty each region of ``chapter`` in turn (the rest of 1..chapter written): its tests must fail naming it."""
    jobs = [("(empty)", r, empty_region(r.path.read_text(), r), r.tag)
            for r in find_regions(root / "minigrad") if r.chapter == chapter]
    return _run_all(jobs, chapter, workers, root, timeout, report)
