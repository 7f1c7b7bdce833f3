"""``python -m minigrad.course``: the course's commands for students and instructors (chapters/README.md).

Exit status: 0 when the command did its job (a grade of 0/10 included), 1 when ``verify`` finds a
notebook whose solutions do not all pass or whose student version passes something, when a
mutant survives its chapter's tests or an emptied region does not fail them, 2 when the
command could not run (a missing or malformed notebook, a kernel that does not start).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import nbformat

from minigrad.course.exercises import CourseError, read_notebook, tag_notebook
from minigrad.course.grade import CELL_TIMEOUT, LIMIT, grade, verify, write_junit
from minigrad.course.package import (
    CHAPTER_TESTS, ROOT, check_chapter, find_regions, find_stubs, grade_repository, release_package,
)
from minigrad.course.release import release, ship

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minigrad.course", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("release", help="write student versions of a notebook or a folder of them")
    cmd.add_argument("src", help="a notebook, or a folder (every notebook below it is released)")
    cmd.add_argument("dest", help="the output notebook or folder (never inside src)")
    for name, help_text in (("grade", "grade a student's notebook and print its per-exercise score"),
                            ("verify", "check that a solution notebook grades 100%% and its student version 0%%")):
        cmd = commands.add_parser(name, help=help_text)
        cmd.add_argument("notebook", help="a notebook" + (", or a student's repository" if name == "grade" else ""))
        if name == "grade":
            cmd.add_argument("--solution", metavar="NB", help="the instructor's notebook (default: the "
                             "chapter's solutions/exercises.ipynb, from the notebook's metadata)")
            cmd.add_argument("--junit", metavar="XML", help="also write the result as JUnit XML")
        cmd.add_argument("--timeout", type=int, default=CELL_TIMEOUT, metavar="S",
                         help=f"seconds one exercise's process may run before it is killed and fails (default {CELL_TIMEOUT})")
        cmd.add_argument("--limit", type=float, default=LIMIT, metavar="S",
                         help=f"seconds the whole grading may take; exercises not started by then fail (default {LIMIT})")
        cmd.add_argument("--json", action="store_true", help="print the result as JSON")
    cmd = commands.add_parser("ship", help="write chapters/*/X.ipynb, the student versions of chapters/*/solutions/X.ipynb")
    cmd.add_argument("chapters", nargs="?", default="chapters")
    cmd.add_argument("--check", action="store_true",
                     help="write nothing; fail if a shipped student version is not what the release gives")
    cmd = commands.add_parser("release-package", help="write the student repository (package regions emptied)")
    cmd.add_argument("dest", help="an empty or new folder outside this repository")
    cmd.add_argument("--upto", type=int, default=0, metavar="K",
                     help="keep the regions of chapters 1..K written (default 0: every region empty)")
    cmd.add_argument("--no-git", action="store_true", help="write the files only (default: a git repository "
                     "with one commit)")
    commands.add_parser("regions", help="list the package regions a student writes, with their line counts "
                        "(in a student repository: those still to write)")
    cmd = commands.add_parser("check-order", help="for each chapter k (or those given), run chapter k's "
                              "tests in a student repository with chapters 1..k written")
    cmd.add_argument("chapters", nargs="*", type=int)
    cmd.add_argument("--per-region", action="store_true",
                     help="instead: empty each region of chapter k alone (the rest of 1..k written) and check "
                          "that chapter k's tests for it fail, naming the region")
    cmd.add_argument("--jobs", type=int, default=2, metavar="N", help="parallel workers for --per-region (default 2)")
    cmd = commands.add_parser("mutants", help="apply each catalogued student mistake of chapter K (all chapters if "
                              "omitted) and check that its region's tests, run without PyTorch, fail")
    cmd.add_argument("chapters", nargs="*", type=int)
    cmd.add_argument("--jobs", type=int, default=2, metavar="N", help="parallel workers (default 2)")
    cmd.add_argument("--only", action="append", metavar="NAME", help="run only this mutant (repeatable)")
    cmd.add_argument("--list", action="store_true",
                     help="print the catalog (name, region, the mistake) and run nothing")
    cmd = commands.add_parser("test-chapter", help="run chapter K's tests here (your package regions of chapter K)")
    cmd.add_argument("chapter", type=int)
    cmd = commands.add_parser("tag", help="write each exercise cell's number and role into its metadata")
    cmd.add_argument("notebooks", nargs="+")
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "release":
        for path in release(args.src, args.dest):
            print(f"wrote {path}")
        return 0
    if args.command == "grade":
        if Path(args.notebook).is_dir():
            reports = grade_repository(args.notebook, limit=args.limit)
        else:
            reports = [grade(args.notebook, args.solution, args.timeout, args.limit)]
        if args.junit:
            write_junit(reports, args.junit)
        if args.json:
            print(json.dumps([r.to_dict() for r in reports] if len(reports) > 1 else reports[0].to_dict(), indent=2))
        else:
            print("\n\n".join(map(str, reports)))
        return 0
    if args.command == "verify":
        ok, solved, released = verify(args.notebook, args.timeout, args.limit)
        if args.json:
            print(json.dumps({"ok": ok, "solved": solved.to_dict(), "released": released.to_dict()}, indent=2))
        else:
            print(f"{solved}\n\n{released}\n")
            print("OK: the solutions pass every exercise and the student version none" if ok else
                  "FAILED: the solutions must pass every exercise and the student version none")
        return 0 if ok else 1
    if args.command == "release-package":
        regions = release_package(args.dest, args.upto, git=not args.no_git)
        empty = [r for r in regions if r.chapter > args.upto]
        print(f"wrote the student repository to {args.dest}: {len(empty)} of {len(regions)} regions to write"
              + ("" if args.no_git else "; it is a git repository with one commit, push it where students clone from"))
        return 0
    if args.command == "regions":
        regions = find_regions()
        for region in regions:
            print(f"{region.path.relative_to(ROOT)}:{region.begin}  {region.lines:>3} lines  {region.tag}")
        if not regions:  # a student repository: its markers are gone, its empty regions raise
            stubs = sorted(find_stubs(), key=lambda s: s.chapter)  # chapter by chapter, as students go
            for stub in stubs:
                print(f"{stub.path.relative_to(ROOT)}:{stub.begin}  {stub.tag}")
            print(f"{len(stubs)} regions to write" if stubs else "every region is written")
        return 0
    if args.command == "mutants" and args.list:
        return _list_mutants(args.chapters)
    if args.command == "mutants" or (args.command == "check-order" and args.per_region):
        return _mutation_table(args.command, args.chapters or sorted(CHAPTER_TESTS), args.jobs,
                               args.only if args.command == "mutants" else None)
    if args.command == "check-order":
        failed = [k for k in (args.chapters or sorted(CHAPTER_TESTS)) if check_chapter(k) != 0]
        print(f"FAILED: chapter {', '.join(map(str, failed))}" if failed else "OK: every chapter passes "
              "with its own and earlier regions written and later ones empty")
        return 1 if failed else 0
    if args.command == "test-chapter":
        if args.chapter not in CHAPTER_TESTS:
            raise CourseError(f"no chapter {args.chapter}: the chapters are {sorted(CHAPTER_TESTS)}")
        return subprocess.run([sys.executable, "-m", "pytest", "-q", *CHAPTER_TESTS[args.chapter]], cwd=ROOT).returncode
    if args.command == "ship":
        paths = ship(args.chapters, args.check)
        for path in paths:
            print(f"{'out of date' if args.check else 'wrote'}: {path}")
        if args.check and paths:
            print("run `python -m minigrad.course ship` and commit the student versions", file=sys.stderr)
        return 1 if args.check and paths else 0
    for path in args.notebooks:
        nb = read_notebook(path)
        exercises = tag_notebook(nb)
        nbformat.write(nb, path)
        print(f"tagged {len(exercises)} exercises in {path}")
    return 0


def _mutate_module() -> ModuleType:
    """``minigrad.course.mutate``, which the student repository does not have (the catalog quotes the solutions)."""
    try:
        from minigrad.course import mutate
    except ModuleNotFoundError as error:
        if error.name not in ("minigrad.course.mutate", "minigrad.course.mutants"):
            raise
        raise CourseError("the mutant catalog is the instructor's and is not part of the student repository; "
                          "use test-chapter K") from error
    return mutate


def _list_mutants(chapters: list[int]) -> int:
    for m in _mutate_module().MUTANTS:
        if not chapters or m.chapter in chapters:
            print(f"{m.name:<30} {m.region:<55} {m.why}")
    return 0


def _mutation_table(command: str, chapters: list[int], jobs: int, only: list[str] | None = None) -> int:
    """Print one row per mutant (or emptied region) as it finishes; 1 when any survives."""
    mutate = _mutate_module()
    unknown = [k for k in chapters if k not in CHAPTER_TESTS]
    if unknown:
        raise CourseError(f"no chapter {unknown[0]}: the chapters are {sorted(CHAPTER_TESTS)}")
    what = "mutant" if command == "mutants" else "emptied region"
    survivors, total, start = [], 0, time.perf_counter()
    print(f"{'mutant':<30} {'region':<55} {'result':<9} {'seconds':>7}  by")

    def row(o: mutate.Outcome) -> None:
        result = "killed" if o.killed else "SURVIVED"
        print(f"{o.name:<30} {o.region:<55} {result:<9} {o.seconds:7.1f}  {o.by}", flush=True)

    for chapter in chapters:
        outcomes = (mutate.run_mutants(chapter, workers=jobs, report=row, names=only) if command == "mutants"
                    else mutate.run_regions(chapter, workers=jobs, report=row))
        total += len(outcomes)
        survivors += [o for o in outcomes if not o.killed]
    seconds = time.perf_counter() - start
    if command == "mutants":
        ok, bad = "caught by their chapter's tests", "survived their chapter's tests"
    else:
        ok = "fail their chapter's tests, each naming its region,"
        bad = "did not fail their chapter's tests naming the region"
    if survivors:
        print(f"FAILED: {len(survivors)} of {total} {what}s {bad} without PyTorch ({seconds:.0f} s): "
              f"{', '.join(f'{o.name} ({o.region})' for o in survivors)}")
        return 1
    print(f"OK: all {total} {what}s of chapter {', '.join(map(str, chapters))} {ok} without PyTorch ({seconds:.0f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (CourseError, OSError) as error:
        print(f"python -m minigrad.course {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
