"""The mutant catalog stays true to the package: every mutant applies exactly once inside its region,
every region has mistakes and tagged tests, and the tagged tests belong to the region's chapter.

When a region is rewritten (a backward rule moved onto ``ctx.ops``, say), the first test here fails
and names the mutant to bring up to date. Running the mutants themselves is ``make course-check``
(``python -m minigrad.course mutants``); one runs here, end to end.
"""

import re
from collections import Counter

import pytest

from minigrad.course.exercises import CourseError
from minigrad.course.mutants import MUTANTS, REGION_TESTS, Mutant
from minigrad.course import mutate
from minigrad.course.__main__ import main
from minigrad.course.mutate import apply_mutant, empty_region
from minigrad.course.package import CHAPTER_TESTS, ROOT, Region, find_regions

REGIONS = {r.tag: r for r in find_regions()}


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_every_mutant_applies_exactly_once_inside_its_region_and_compiles(mutant):
    assert mutant.region in REGIONS, f"mutant {mutant.name}: no region '{mutant.region}' in the package"
    region = REGIONS[mutant.region]
    text = region.path.read_text()
    mutated = apply_mutant(text, region, mutant)
    assert mutated != text and mutant.old != mutant.new
    compile(mutated, str(region.path), "exec")
    # only the region's body changed: the text before its BEGIN marker and after its END marker is the same
    lines, new_lines = text.splitlines(), mutated.splitlines()
    assert new_lines[:region.begin] == lines[:region.begin]
    tail = len(lines) - (region.begin + region.lines)
    assert new_lines[len(new_lines) - tail:] == lines[len(lines) - tail:]


def test_the_catalog_covers_every_region_with_plausible_mistakes():
    names = [m.name for m in MUTANTS]
    assert len(MUTANTS) >= 40 and len(set(names)) == len(names), Counter(names).most_common(3)
    missing = sorted(set(REGIONS) - {m.region for m in MUTANTS})
    assert not missing, f"regions with no mutant in the catalog: {missing}"
    assert all(m.why and m.name == m.name.lower() and " " not in m.name for m in MUTANTS)
    assert all(m.chapter == REGIONS[m.region].chapter for m in MUTANTS)


def test_every_region_is_tagged_with_tests_of_its_own_chapter():
    assert set(REGION_TESTS) == set(REGIONS), (sorted(set(REGIONS) - set(REGION_TESTS)),
                                               sorted(set(REGION_TESTS) - set(REGIONS)))
    for tag, nodes in REGION_TESTS.items():
        chapter = REGIONS[tag].chapter
        for node in nodes:
            path, _, name = node.partition("::")
            assert path in CHAPTER_TESTS[chapter], (
                f"'{tag}' is tagged with {node}, which test-chapter {chapter} does not run")
            if name:
                assert re.search(rf"^\s*(def|class) {re.escape(name)}\b", (ROOT / path).read_text(), re.M), (
                    f"'{tag}' is tagged with {node}, which does not exist")


def test_a_mutant_whose_text_is_gone_is_refused():
    region = REGIONS["chapter 02: Mean.backward"]
    stale = Mutant("stale", region.tag, "this text is not in the region", "x", "a rewritten rule")
    with pytest.raises(CourseError, match="occurs 0 times in region 'chapter 02: Mean.backward'"):
        apply_mutant(region.path.read_text(), region, stale)
    # text that exists outside the region only does not count either
    outside = Mutant("outside", region.tag, "class Mean", "class Average", "outside the region")
    with pytest.raises(CourseError, match="occurs 0 times"):
        apply_mutant(region.path.read_text(), region, outside)


def test_empty_region_raises_the_regions_tag_at_its_indentation():
    text = "def f(x):\n    y = 1\n    ### BEGIN SOLUTION chapter 02: f\n    return x\n    ### END SOLUTION\n"
    region = Region(ROOT / "f.py", 3, 2, "f", 1)
    assert empty_region(text, region) == ("def f(x):\n    y = 1\n    ### BEGIN SOLUTION chapter 02: f\n"
                                          '    raise NotImplementedError("chapter 02: f")\n    ### END SOLUTION\n')


def test_the_command_runs_a_mutant_without_torch_and_fails_when_one_survives(capsys, monkeypatch):
    assert main(["mutants", "1", "--only", "load-reversed", "--jobs", "1"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("load-reversed"))
    assert " killed " in row and "tests/course/test_chapter01.py::TestCheckpoint" in row, row
    # tagged with tests that never load a checkpoint, the same mistake survives and the command fails
    monkeypatch.setitem(mutate.REGION_TESTS, "chapter 01: loading a checkpoint", ["tests/course/test_chapter01.py::TestBatch"])
    assert main(["mutants", "1", "--only", "load-reversed", "--jobs", "1"]) == 1
    out = capsys.readouterr().out
    assert "SURVIVED" in out and "FAILED: 1 of 1 mutants survived" in out, out
    assert main(["mutants", "9"]) == 2
    assert main(["mutants", "--list", "4"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == sum(m.chapter == 4 for m in MUTANTS) and "ring-allgather-indices" in listed[4], listed
