"""``docs/architecture.md`` tells the truth about the code: every path it names exists, it names
every top-level module and package of minigrad, the README links to it, and its layer picture
(``docs/layers.dot``, drawn as ``docs/layers.svg``) is the one ``tools/import_graph.py`` draws from
the layers the import test enforces."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
import_graph = importlib.util.module_from_spec(spec)
spec.loader.exec_module(import_graph)


def named_paths(text: str) -> list[str]:
    """Every code span that is a path: it has a slash or a file suffix, and no spaces."""
    spans = re.findall(r"`([^`\s]+)`", text)
    return [s for s in spans if ("/" in s or re.search(r"\.(py|md|dot|svg|txt)$", s)) and not s.startswith("-")]


def test_every_path_it_names_exists():
    paths = named_paths(DOC.read_text())
    assert len(paths) > 60
    missing = [p for p in paths if not (ROOT / p).exists() and not (ROOT / "docs" / p).exists()]
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_it_names_every_top_level_module_and_package():
    text = DOC.read_text()
    tops = sorted(p.name for p in (ROOT / "minigrad").iterdir()
                  if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())) and p.name != "__pycache__")
    unnamed = [t for t in tops if f"minigrad/{t}" not in text]
    assert not unnamed, f"top-level modules docs/architecture.md does not place in a layer: {unnamed}"


def test_the_readme_links_to_it():
    assert "(docs/architecture.md)" in (ROOT / "README.md").read_text()


def test_the_layer_picture_is_the_one_the_layers_draw():
    drawn = import_graph.dot(import_graph.graph(ROOT))
    assert (ROOT / "docs" / "layers.dot").read_text() == drawn, \
        "docs/layers.dot is stale: python tools/import_graph.py --dot > docs/layers.dot, then dot -Tsvg"
    svg = (ROOT / "docs" / "layers.svg").read_text()
    assert svg.lstrip().startswith(("<?xml", "<svg"))
    for title, _ in import_graph.LAYERS:
        assert title.replace("'", "&#39;") in svg or title in svg, f"layers.svg lacks the layer {title!r}"
