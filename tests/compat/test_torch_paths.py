"""Every public torch module path imports in minigrad (``minigrad.compat.torch_paths``), and what a
stand-in module lacks raises NotImplementedError naming it, never ModuleNotFoundError.

The stored list (``minigrad/compat/torch_modules.txt``) is checked without torch: sorted, public by
PyTorch's rule, and every path importable. Where torch is installed, the list is generated again
from it (``tools/torch_modules.py``) and every path it names must import too, so a new torch
release that adds a module fails here until the list is regenerated.
"""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import minigrad
from minigrad.compat import torch_paths

ROOT = Path(__file__).resolve().parents[2]
STORED = (ROOT / "minigrad" / "compat" / "torch_modules.txt").read_text().split()


def _unimportable(torch_names) -> list[str]:
    failed = []
    for name in torch_names:
        try:
            importlib.import_module("minigrad" + name[len("torch"):])
        except Exception as e:  # noqa: BLE001 - any failure is a path that does not resolve
            failed.append(f"{name}: {type(e).__name__}: {e}")
    return failed


def test_the_stored_list_is_sorted_public_and_without_torchs_own_tests():
    assert STORED == sorted(set(STORED)) and len(STORED) > 500
    assert all(n.startswith("torch.") and not any(p.startswith("_") for p in n.split(".")) for n in STORED)
    assert not [n for n in STORED if re.search(r"\.(tests?|benchmarks?|examples?)(\.|$)", n)]
    for wanted in ("torch.utils.data.dataloader", "torch.nn.parallel", "torch.distributions", "torch.onnx",
                   "torch.nn.modules.conv", "torch.serialization"):
        assert wanted in STORED


def test_every_stored_path_imports_in_minigrad():
    assert _unimportable(STORED) == []


def test_every_public_torch_module_imports_in_minigrad():
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from torch_modules import public_modules
    finally:
        sys.path.remove(str(ROOT / "tools"))
    generated = public_modules()
    assert _unimportable(generated) == [], "run tools/torch_modules.py --write and make the new paths resolve"


def test_a_stand_in_takes_torchs_names_from_its_home():
    from minigrad.nn.modules.conv import Conv2d
    from minigrad.utils.data.dataloader import DataLoader
    from minigrad.nn.parallel import DistributedDataParallel

    assert Conv2d is minigrad.nn.Conv2d and DataLoader is minigrad.utils.data.DataLoader
    assert DistributedDataParallel is minigrad.distributed.DistributedDataParallel
    assert torch_paths.is_stand_in(minigrad.nn.modules.conv) and not torch_paths.is_stand_in(minigrad.nn)
    assert minigrad.nn.modules.linear.Linear is minigrad.nn.Linear  # no import statement needed, as in torch
    from minigrad.nn.modules.loss import _Loss
    from minigrad.nn.modules.batchnorm import _BatchNorm

    assert _Loss is minigrad.nn.loss._Loss and _BatchNorm is minigrad.nn.normalization._BatchNorm


def test_what_a_stand_in_lacks_raises_not_implemented_naming_it():
    import minigrad.jit
    import minigrad.nn.modules.conv as conv

    with pytest.raises(NotImplementedError, match="torch.jit.script: TorchScript"):
        minigrad.jit.script
    with pytest.raises(NotImplementedError, match=r"torch.nn.modules.conv.LazyConv2d: .*minigrad.nn.conv and minigrad.nn"):
        conv.LazyConv2d
    with pytest.raises(NotImplementedError, match="torch.nn.parallel.DataParallel: minigrad runs one process"):
        minigrad.nn.parallel.DataParallel
    with pytest.raises(NotImplementedError, match="torch.masked.masked_tensor: minigrad has no code for torch.masked"):
        importlib.import_module("minigrad.masked").masked_tensor
    assert not hasattr(conv, "__wrapped__")  # dunders stay AttributeErrors, for inspect and pickle


def test_a_module_minigrad_has_becomes_a_package_where_torchs_is_one():
    import minigrad.nn.utils.rnn as rnn

    assert rnn.__name__ == "minigrad.nn.utils.rnn" and minigrad.nn.utils.clip_grad_norm_ is not None
    # torch.sparse: kept under ops, registered under torch's name
    assert importlib.import_module("minigrad.sparse") is minigrad.ops.sparse


def test_paths_torch_lacks_are_still_module_not_found():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("minigrad.nn.no_such_module")


def test_imports_resolve_in_a_fresh_interpreter():
    code = ("import minigrad.utils.data.dataloader, minigrad.nn.modules.transformer, minigrad.onnx, "
            "minigrad.distributions\nfrom minigrad.nn.modules.loss import MSELoss\nprint(MSELoss.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "MSELoss"


@pytest.mark.parametrize("package, name", [("minigrad.quantization", "fuse_modules"),
                                           ("minigrad.quantization", "fake_quantize"),
                                           ("minigrad.distributed", "launch")])
def test_importing_a_path_keeps_the_function_of_the_same_name(package, name):
    """torch.quantization.fuse_modules is a module and a function. Importing the path must not
    bind the stand-in module over the function on its package (it did: every later call of
    Q.fuse_modules raised "'module' object is not callable" once the paths had been imported)."""
    owner = importlib.import_module(package)
    before = getattr(owner, name)
    importlib.import_module(f"{package}.{name}")
    assert getattr(owner, name) is before and callable(before)
