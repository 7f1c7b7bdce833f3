"""Write ``minigrad/compat/torch_modules.txt``: PyTorch's public module paths, which ``minigrad.compat.torch_paths``
makes importable.

A program written for torch may import any public module of torch (``torch.utils.data.dataloader``,
``torch.nn.modules.conv``, ``torch.distributions``); in minigrad each of those paths must import,
so that a missing feature explains itself on first use instead of failing the import line. The
list is generated from the installed torch by walking its packages with ``pkgutil``, keeping the
modules that PyTorch's own rule calls public (no component of the dotted path starts with ``_``;
see torch's ``test/test_public_bindings.py``) and leaving out the test, benchmark and example
code that ships inside the wheel (a component named ``test(s)``, ``benchmark(s)`` or
``example(s)``): those are tools of torch's own
developers, not API a training program imports. A package that fails to import in torch itself
(``torch.utils.tensorboard`` without the ``tensorboard`` package) is listed without its
submodules, which the walk cannot see. ``tests/compat/test_torch_paths.py`` regenerates the
list where torch is installed and compares it with the stored one.

    python tools/torch_modules.py            # print the list
    python tools/torch_modules.py --write    # rewrite minigrad/compat/torch_modules.txt
"""

from __future__ import annotations

import argparse
import pkgutil
import re
import warnings
from pathlib import Path

STORED = Path(__file__).resolve().parent.parent / "minigrad" / "compat" / "torch_modules.txt"
INTERNAL = re.compile(r"\.(tests?|benchmarks?|examples?)(\.|$)")


def public_modules() -> list[str]:
    """torch's public module paths (walking imports torch's packages, not its leaf modules)."""
    import torch

    names = []
    with warnings.catch_warnings():  # walking imports deprecated packages, which warn
        warnings.simplefilter("ignore")
        for info in pkgutil.walk_packages(torch.__path__, "torch.", onerror=lambda name: None):
            parts = info.name.split(".")
            if any(p.startswith("_") for p in parts) or INTERNAL.search(info.name[len("torch"):]):
                continue
            names.append(info.name)
    return sorted(names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {STORED.name}")
    args = parser.parse_args()
    text = "\n".join(public_modules()) + "\n"
    if args.write:
        STORED.write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
