"""chapters/README.md's table of notebooks tells the truth: every notebook a student opens has a row,
and its words, code lines and reading time are the notebook's own (``tools/chapter_table.py``
recounts them; ``--write`` rewrites the table after a lesson changes), and every lesson's **Time:** header
states its row."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("chapter_table", ROOT / "tools" / "chapter_table.py")
chapter_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(chapter_table)


def test_every_notebook_has_a_row_with_its_own_counts():
    rows = chapter_table.stored_rows(chapter_table.README.read_text())
    for path in chapter_table.notebooks():
        name = path.relative_to(ROOT / "chapters").as_posix()
        assert name in rows, f"chapters/README.md has no row for {name}: run python tools/chapter_table.py --write"
        counted = [str(n) for n in chapter_table.count(path)]
        assert rows[name][:3] == counted, (f"{name}: README says words, code lines, minutes = {rows[name][:3]}, "
                                           f"the notebook has {counted}: run python tools/chapter_table.py --write")
        assert rows[name][3].isdigit(), f"{name}: run time {rows[name][3]!r} was never measured (--measure)"


def test_the_table_is_rewritten_in_place(tmp_path):
    text = "intro\n\n" + chapter_table.HEADER + "\n| --- | ---: |\n| `old.ipynb` | 1 | 2 | 3 | 4 |\n\nafter\n"
    new = chapter_table.replace_table(text, chapter_table.HEADER + "\n| x |")
    assert new == "intro\n\n" + chapter_table.HEADER + "\n| x |\n\nafter\n"


def test_every_lesson_header_states_its_row_of_the_table():
    rows = chapter_table.stored_rows(chapter_table.README.read_text())
    for path in chapter_table.lessons():
        name = path.relative_to(ROOT / "chapters").as_posix()
        reading, run = int(rows[name][2]), int(rows[name][3])
        stated = chapter_table.header_time(path)
        expected = (reading + -(-run // 60), reading, run)
        assert stated == expected, (f"{name}: its header says about {stated[0]} minutes ({stated[1]} reading, "
                                    f"{stated[2]} s running), the table gives {expected[0]} ({reading} reading, "
                                    f"{run} s running): run python tools/chapter_table.py --write")
        twin = path.with_suffix(".py")
        if twin.exists():
            assert chapter_table.time_line(reading, run) in twin.read_text(), \
                f"{twin.name}: its **Time:** line is not the notebook's: run python tools/chapter_table.py --write"


def test_time_lines_are_rewritten_in_the_notebook_and_its_twin(tmp_path):
    lesson = tmp_path / "chapters" / "01_x" / "01_lesson.ipynb"
    lesson.parent.mkdir(parents=True)
    header = "# 01.1 A lesson\n\n**You will:** read.\n**Time:** about 9 minutes (9 reading, 0 s running)."
    lesson.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": header}]}))
    lesson.with_suffix(".py").write_text("# %% [markdown]\n# " + header.replace("\n", "\n# ") + "\n")
    changed = chapter_table.write_time_lines({"01_x/01_lesson.ipynb": ["1", "2", "13", "61"]}, tmp_path)
    assert changed == [lesson, lesson.with_suffix(".py")]
    assert chapter_table.header_time(lesson) == (15, 13, 61)
    assert "# **Time:** about 15 minutes (13 reading, 61 s running).\n" in lesson.with_suffix(".py").read_text()
    lesson.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": "# no time"}]}))
    with pytest.raises(ValueError, match="expected one line .* found 0"):
        chapter_table.header_time(lesson)
