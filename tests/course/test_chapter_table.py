"""chapters/README.md's table of notebooks tells the truth: every notebook a student opens has a row,
and its words, code lines and reading time are the notebook's own (``tools/chapter_table.py``
recounts them; ``--write`` rewrites the table after a lesson changes)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
