"""pytest settings for the chapter notebooks, so that a plain ``pytest --nbval chapters/...`` runs
them the way CI does: with ``nbval_sanitize.cfg`` masking volatile output, the kernel on the
Python running pytest (whatever kernel name the notebook was saved with), this checkout's
``minigrad`` importable from the kernel, and a fixed ``PYTHONHASHSEED`` so that sets of strings
print in the same order on every run. Options given on the command line win.

The student versions of the exercises (``chapters/*/exercises.ipynb``, every answer a ``raise
NotImplementedError``) are not lessons: nbval skips them. ``make course-check`` checks that they
are exactly the release of ``chapters/*/solutions/exercises.ipynb``, which nbval does run.
"""

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    if collection_path.suffix == ".ipynb" and collection_path.parent.parent == HERE and \
            (collection_path.parent / "solutions" / collection_path.name).exists():
        return True
    return None


def pytest_configure(config: pytest.Config) -> None:
    option = config.option
    if config.pluginmanager.hasplugin("nbval"):
        # (the deprecated spellings --sanitize-with and --current-env count as given)
        if option.nbval_sanitize_with is None and option.sanitize_with is None:
            option.nbval_sanitize_with = str(HERE / "nbval_sanitize.cfg")
        if option.nbval_kernel_name is None and not option.current_env:
            option.nbval_current_env = True
    # nbval starts each kernel with this process's environment, in the notebook's folder.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("PYTHONHASHSEED", "0")
