"""The table of notebooks in ``chapters/README.md``: words, code lines, reading and run time.

Reading time is estimated from the notebook itself: 150 words of markdown and 10 non-blank code
lines a minute, rounded. Run time is measured: ``--measure`` runs every notebook under nbval (as
``make chapters`` does) and sums its cells' call times from pytest's JUnit report; without it the
run column keeps the figures already in the README. ``tests/test_chapter_table.py`` checks that
the README's words, code lines and reading times are the notebooks' own, so the table stays true
when a lesson grows, and that every lesson's header line ``**Time:** about T minutes (R reading, S s
running).`` states its row: R the reading minutes, S the run seconds, T their sum in whole minutes
(the seconds rounded up). ``--write`` rewrites those lines too, in the ``.ipynb`` and its jupytext
``.py`` twin; the line's words do not depend on its numbers, so rewriting it never changes a count.

    python tools/chapter_table.py            # print the table
    python tools/chapter_table.py --write    # rewrite it in chapters/README.md
    python tools/chapter_table.py --measure --write
    python tools/chapter_table.py --junit nbval.xml --write   # times from a run already made
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "chapters" / "README.md"
HEADER = "| notebook | words | code lines | reading (min) | run (s) |"
WORDS_PER_MINUTE, CODE_LINES_PER_MINUTE = 150, 10
_WORD = re.compile(r"[A-Za-z0-9']+")
TIME_LINE = re.compile(r"\*\*Time:\*\* about (\d+) minutes \((\d+) reading, (\d+) s running\)\.")


def notebooks(root: Path = ROOT) -> list[Path]:
    """Every lesson and exercise notebook a student opens, chapter by chapter (solutions excluded)."""
    return sorted(p for p in (root / "chapters").glob("0*/*.ipynb"))


def count(path: Path) -> tuple[int, int, int]:
    """(words of markdown, non-blank code lines, reading minutes) of one notebook."""
    cells = json.loads(path.read_text())["cells"]
    source = lambda c: "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
    words = sum(len(_WORD.findall(source(c))) for c in cells if c["cell_type"] == "markdown")
    code = sum(1 for c in cells if c["cell_type"] == "code" for line in source(c).splitlines() if line.strip())
    return words, code, round(words / WORDS_PER_MINUTE + code / CODE_LINES_PER_MINUTE)


def lessons(root: Path = ROOT) -> list[Path]:
    """The lesson notebooks: every notebook of the table but the exercises, which state no time."""
    return [p for p in notebooks(root) if p.name != "exercises.ipynb"]


def time_line(reading: int, run: int) -> str:
    """A lesson's header line for ``reading`` minutes of reading and ``run`` seconds of running."""
    return f"**Time:** about {reading + math.ceil(run / 60)} minutes ({reading} reading, {run} s running)."


def header_time(path: Path) -> tuple[int, int, int]:
    """(total minutes, reading minutes, run seconds) that a lesson's first markdown cell states."""
    cells = json.loads(path.read_text())["cells"]
    first = next(c for c in cells if c["cell_type"] == "markdown")
    found = TIME_LINE.findall("".join(first["source"]))
    if len(found) != 1:
        raise ValueError(f"{path.name}: expected one line '**Time:** about T minutes (R reading, S s running).' "
                         f"in the first markdown cell, found {len(found)}")
    return tuple(int(n) for n in found[0])


def write_time_lines(rows: dict[str, list[str]], root: Path = ROOT) -> list[Path]:
    """Rewrite every lesson's ``**Time:**`` line (in the notebook and its ``.py`` twin) from the
    table's ``rows``; returns the files that changed."""
    changed = []
    for path in lessons(root):
        name = path.relative_to(root / "chapters").as_posix()
        words, code, reading, run = rows[name]
        if not run.isdigit():
            continue  # never measured: nothing true to state yet
        line = time_line(int(reading), int(run))
        for file in (path, path.with_suffix(".py")):
            if not file.exists():
                continue
            text = file.read_text()
            new, count = TIME_LINE.subn(line, text, count=1)
            if count != 1:
                raise ValueError(f"{file}: expected a line '**Time:** about T minutes (R reading, S s running).', "
                                 "found none")
            if new != text:
                file.write_text(new)
                changed.append(file)
    return changed


def stored_rows(text: str) -> dict[str, list[str]]:
    """The README table's rows, by notebook name (``01_graphs/01_graphs_as_dags.ipynb``)."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def measure(paths: list[Path]) -> dict[str, int]:
    """Seconds each notebook's cells take under nbval, from one pytest run's JUnit report."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "nbval.xml"
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "--nbval", f"--junitxml={report}",
                        "--nbval-sanitize-with", "chapters/nbval_sanitize.cfg", *map(str, paths)], cwd=ROOT, check=False)
        return seconds_from_report(report)


def seconds_from_report(report: Path) -> dict[str, int]:
    """Seconds per notebook (``01_graphs/x.ipynb``) in an nbval run's JUnit report."""
    seconds: dict[str, float] = {}
    for case in ET.parse(report).iter("testcase"):
        parts = case.get("classname", "").split(".")  # chapters.01_graphs.x.ipynb
        if len(parts) == 4 and parts[0] == "chapters" and parts[3] == "ipynb":
            key = f"{parts[1]}/{parts[2]}.ipynb"
            seconds[key] = seconds.get(key, 0.0) + float(case.get("time", 0))
    return {k: max(1, round(v)) for k, v in seconds.items()}


def table(root: Path = ROOT, run: dict[str, str] | None = None) -> str:
    """The markdown table; ``run`` gives the run column by notebook name ("?" where missing)."""
    run = run or {}
    lines = [HEADER, "| --- | ---: | ---: | ---: | ---: |"]
    for path in notebooks(root):
        name = path.relative_to(root / "chapters").as_posix()
        words, code, minutes = count(path)
        lines.append(f"| `{name}` | {words} | {code} | {minutes} | {run.get(name, '?')} |")
    return "\n".join(lines)


def replace_table(text: str, new: str) -> str:
    """``text`` with its notebook table (header to the last row) replaced by ``new``."""
    lines = text.splitlines()
    start = lines.index(HEADER)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[:start] + new.splitlines() + lines[end:]) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="run every notebook under nbval and time it")
    parser.add_argument("--junit", type=Path, help="take the run times from this nbval run's JUnit report")
    parser.add_argument("--write", action="store_true",
                        help="rewrite the table in chapters/README.md and the lessons' **Time:** lines")
    args = parser.parse_args(argv)
    text = README.read_text()
    run = {name: cells[3] for name, cells in stored_rows(text).items()}
    if args.measure or args.junit:
        times = seconds_from_report(args.junit) if args.junit else measure(notebooks())
        run.update({k: str(v) for k, v in times.items()})
    new = table(ROOT, run)
    if args.write:
        README.write_text(replace_table(text, new))
        write_time_lines(stored_rows(new))
    print(new)


if __name__ == "__main__":
    main()
