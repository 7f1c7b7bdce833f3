"""The project's skeleton: the package imports, its version is single-sourced, pyproject.toml
says what the README promises, and the README's example runs as printed."""

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

import minigrad

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
REQUIREMENT = re.compile(r"^([A-Za-z0-9_.\-]+)\s*(==|>=)\s*[0-9][0-9A-Za-z.+]*$")


def test_package_imports_with_public_api():
    for name in ("Tensor", "tensor", "zeros", "ones", "randn", "no_grad", "manual_seed", "device"):
        assert hasattr(minigrad, name), f"minigrad.{name} is missing"
    assert re.fullmatch(r"\d+\.\d+\.\d+([ab]|rc|\.dev)?\d*", minigrad.__version__)


def test_version_comes_from_the_package():
    assert "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "minigrad.__version__"}
    try:
        installed = importlib.metadata.version("minigrad")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("minigrad is not pip-installed here (run through PYTHONPATH)")
    assert installed == minigrad.__version__


def test_pyproject_metadata():
    project = PYPROJECT["project"]
    assert project["name"] == "minigrad"
    assert project["requires-python"] == ">=3.11"
    assert project["dependencies"] == ["numpy>=2"]
    extras = project["optional-dependencies"]

    def names(extra: str) -> set[str]:
        """The packages an extra installs, following the extras it names (``minigrad[course]``)."""
        found = set()
        for req in extras[extra]:
            self_extra = re.fullmatch(r"minigrad\[(\w+)\]", req)
            found |= names(self_extra.group(1)) if self_extra else {REQUIREMENT.match(req).group(1)}
        return found

    # everything the four chapters run, MPI included, comes with the course extra, and the dev
    # extra (what `make venv` installs) holds the course and the test tools
    assert {"jupyterlab", "ipykernel", "ipywidgets", "jupyterlab_widgets", "matplotlib", "graphviz", "tqdm", "mpi4py",
            "mpich"} <= names("course")
    assert names("course") | {"pytest", "hypothesis", "nbval"} <= names("dev")
    assert extras["torch"] == ["torch>=2.13"]
    for extra, reqs in extras.items():
        for req in reqs:
            assert REQUIREMENT.match(req) or re.fullmatch(r"minigrad\[\w+\]", req), \
                f"extra {extra!r}: {req!r} needs a version bound"
    assert PYPROJECT["tool"]["pytest"]["ini_options"]["testpaths"] == ["tests"]


def test_readme_example_runs():
    readme = (ROOT / "README.md").read_text()
    example = re.search(r"```python\n(.*?)```", readme, re.S)
    assert example, "README.md has no ```python example"
    exec(compile(example.group(1), "README.md", "exec"), {})
