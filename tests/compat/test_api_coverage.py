"""The usage-weighted coverage figure: ``tools/api_coverage.py`` counts the torch API
call sites of the ported programs with an AST walk and resolves each in minigrad; the figure in
``docs/pytorch_compat.md`` must be the one it computes, and the walk must count what it says."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import api_coverage  # noqa: E402


PROGRAM = '''
import torch  # import torch
import minigrad.nn as nn  # import torch.nn as nn
from minigrad.nn import functional as F  # from torch.nn import functional as F
from minigrad.utils.data import DataLoader, Dataset  # from torch.utils.data import DataLoader, Dataset
import numpy as np

class D(Dataset):
    pass

def f(x):
    y = torch.nn.functional.relu(nn.Linear(2, 3)(x))
    loader = DataLoader(D(), batch_size=2)
    return F.softmax(y, dim=-1), np.zeros(3), x.view(-1), torch.jit.script
'''


def test_the_walk_counts_each_outermost_torch_chain_and_each_imported_name_in_the_original_text():
    sites = api_coverage.call_sites(api_coverage.original_text(PROGRAM))
    assert sorted(sites) == sorted([
        "torch.utils.data.Dataset", "torch.nn.functional.relu", "torch.nn.Linear",
        "torch.utils.data.DataLoader", "torch.nn.functional.softmax", "torch.jit.script"])


def test_a_site_resolves_only_where_minigrad_has_it_and_does_not_refuse_it():
    assert api_coverage.resolves("torch.nn.functional.relu")
    assert api_coverage.resolves("torch.utils.data.DataLoader")
    assert not api_coverage.resolves("torch.jit.script")  # NotImplementedError: minigrad does not follow TorchScript
    assert not api_coverage.resolves("torch.nn.NoSuchLayer")


def test_the_compatibility_page_prints_the_figure_the_corpus_gives():
    cov = api_coverage.measure()
    assert len(cov.programs) >= 19 and cov.total > 300
    doc = api_coverage.DOC.read_text()
    assert api_coverage.section(cov) in doc, "run: python tools/api_coverage.py --write"
