"""``tools/moved_paths.txt`` records every file the package's regrouping moved, and
``tools/follow_moves.py`` rewrites imports, module names and paths by it: each old path is gone and
each new one exists, a moved name in a ``from`` import gets a line of its own under its new package
(in notebooks' JSON too), a public torch path (``minigrad.cuda``) is rewritten only in the package's
own imports, and a second run changes nothing."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("follow_moves", ROOT / "tools" / "follow_moves.py")
follow_moves = importlib.util.module_from_spec(spec)
spec.loader.exec_module(follow_moves)
PAIRS = follow_moves.read_moves()
PUBLIC = follow_moves.public_aliases()


def test_every_old_path_is_gone_and_every_new_one_exists():
    assert len(PAIRS) > 100
    assert [old for old, _ in PAIRS if (ROOT / old).exists()] == []
    assert [new for _, new in PAIRS if not (ROOT / new).exists()] == []


def test_public_torch_paths_are_the_aliases_the_package_keeps():
    assert {"minigrad.cuda", "minigrad.utils.checkpoint", "minigrad.onnx"} <= PUBLIC
    import minigrad.compat

    assert set(minigrad.compat.ALIASES) == PUBLIC


def test_imports_module_names_and_paths_follow():
    text = ("from minigrad import allocator, nn\n"
            "    from minigrad.graph.codegen import cpu  # why\n"
            'x = minigrad.meta.xp; open("minigrad/graph/helpers.py"); see tests/test_ops.py\n')
    assert follow_moves.rewrite(text, PAIRS, False, PUBLIC) == (
        "from minigrad import nn\n"
        "from minigrad.backend import allocator\n"
        "    from minigrad.graph.codegen import numpy_blocks as cpu  # why\n"
        'x = minigrad.backend.meta.xp; open("minigrad/graph/signature.py"); see tests/suites/test_ops.py\n')


def test_a_module_renamed_in_its_package_stays_on_its_line():
    assert follow_moves.rewrite("from minigrad.graph.codegen import c, cpu, cuda\n", PAIRS, True, PUBLIC) == \
        "from minigrad.graph.codegen import c, numpy_blocks as cpu, cuda\n"


def test_a_notebook_source_line_stays_json():
    line = '    "from minigrad import allocator, nn\\n",\n'
    assert follow_moves.rewrite(line, PAIRS, False, PUBLIC) == (
        '    "from minigrad import nn\\n",\n    "from minigrad.backend import allocator\\n",\n')


def test_a_public_path_changes_only_in_the_package_imports():
    text = 'import minigrad.cuda\nraise DeviceError("minigrad.cuda: no GPU")\n'
    assert follow_moves.rewrite(text, PAIRS, False, PUBLIC) == text
    assert follow_moves.rewrite(text, PAIRS, True, PUBLIC) == \
        'import minigrad.backend.cuda\nraise DeviceError("minigrad.cuda: no GPU")\n'


def test_a_second_run_changes_nothing():
    text = ("from minigrad import allocator, cuda\nimport minigrad.utils.checkpoint\n"
            "minigrad/data/pipeline.py minigrad.distributed.pipeline tests/test_pool.py\n")
    once = follow_moves.rewrite(text, PAIRS, True, PUBLIC)
    assert once != text and follow_moves.rewrite(once, PAIRS, True, PUBLIC) == once
    assert "minigrad/data/input_pipeline.py minigrad.distributed.pipeline_parallel tests/backend/test_allocator.py" in once
