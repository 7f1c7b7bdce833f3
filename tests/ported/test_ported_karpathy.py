"""karpathy/makemore's makemore.py, ported by changing only its import lines: all six
of its language models (bigram, MLP, RNN, GRU, bag of words, transformer) train through its own
command line on generated names, it evaluates, saves, resumes with --sample-only and samples; where
PyTorch is installed each model, started from the same weights, gives the same loss, gradients and
AdamW step as on torch."""

from __future__ import annotations

import itertools
import random
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from harness import grads_of, lib_module, numbers_after, run, same_draws

SMALL = ["-n", "0", "-b", "16", "--n-layer", "1", "--n-embd", "16", "--n-embd2", "16", "--n-head", "2"]
TYPES = ["bigram", "mlp", "rnn", "gru", "bow", "transformer"]


def names(n: int = 400) -> list[str]:
    """Made-up names from two or three syllables: the stand-in for makemore's names.txt."""
    syllables = ["ka", "mi", "lo", "ra", "na", "el", "jo", "an", "si", "ty", "be", "li", "sa", "em", "ma", "ri"]
    words = sorted({"".join(p) for k in (2, 3) for p in itertools.product(syllables, repeat=k)})
    random.Random(0).shuffle(words)
    return words[:n]


@pytest.fixture
def names_file(tmp_path: Path) -> Path:
    (tmp_path / "names.txt").write_text("\n".join(names()) + "\n")
    return tmp_path


def test_makemore_bigram_trains_evaluates_saves_and_samples_through_its_command_line(names_file):
    out = run("makemore", argv=["-i", "names.txt", "-o", "out", "--type", "bigram", "--max-steps", "501", *SMALL],
              cwd=names_file).stdout
    losses = numbers_after(out, r"\| loss")
    (test_loss,) = numbers_after(out, r"test loss:")
    assert len(losses) == 51 and losses[-1] < losses[0] - 0.2 and test_loss < losses[0], out[-500:]
    assert "10 samples that are new" in out or "samples that are in train" in out
    assert (names_file / "out" / "model.pt").exists() and list((names_file / "out").glob("events.out.tfevents.*"))
    resumed = run("makemore", argv=["-i", "names.txt", "-o", "out", "--type", "bigram", "--sample-only", *SMALL],
                  cwd=names_file).stdout
    assert "resuming from existing model" in resumed and resumed.count("samples that are") == 3


@pytest.mark.parametrize("kind", [t for t in TYPES if t != "bigram"])
def test_makemore_model_trains_through_its_command_line(names_file, kind):
    out = run("makemore", argv=["-i", "names.txt", "-o", "out", "--type", kind, "--max-steps", "21", *SMALL],
              cwd=names_file).stdout
    losses = numbers_after(out, r"\| loss")
    assert len(losses) == 3 and losses[-1] < losses[0], out[-500:]


def _tensorboard_for_torch() -> None:
    """torch.utils.tensorboard needs the tensorboard package; where it is missing, the program's
    SummaryWriter import (logging only, nothing compared) gets minigrad's writer instead."""
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        from minigrad.utils.tensorboard import SummaryWriter

        sys.modules["torch.utils.tensorboard"] = types.SimpleNamespace(SummaryWriter=SummaryWriter)


def makemore_steps(lib: str, kind: str = "transformer") -> dict[str, Any]:
    """One model's loss and gradients on the first 16 names, then two AdamW steps as the program makes them."""
    if lib == "torch":
        _tensorboard_for_torch()
    ns = run("makemore", lib, main=False).namespace
    torch = lib_module(lib)
    words = names(64)
    chars = sorted(set("".join(words)))
    data = ns["CharDataset"](words, chars, max(len(w) for w in words))
    batch = [data[i] for i in range(16)]
    X, Y = torch.stack([x for x, _ in batch]), torch.stack([y for _, y in batch])
    config = ns["ModelConfig"](vocab_size=data.get_vocab_size(), block_size=data.get_output_length(),
                               n_layer=1, n_head=2, n_embd=16, n_embd2=16)
    classes = {"transformer": ns["Transformer"], "bigram": ns["Bigram"], "mlp": ns["MLP"], "bow": ns["BoW"],
               "rnn": lambda c: ns["RNN"](c, cell_type="rnn"), "gru": lambda c: ns["RNN"](c, cell_type="gru")}
    with same_draws(torch):
        model = classes[kind](config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.01, betas=(0.9, 0.99), eps=1e-8)
    losses, grads = [], {}
    for step in range(3):
        logits, loss = model(X, Y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        grads = grads if step else grads_of(model)
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "grads": grads}


PAIRS = {
    "makemore": ("6 language models: hand-written attention (masked_fill, tril buffers), GRU/RNN cells, "
                 "Embedding, roll, cross_entropy(ignore_index), AdamW, RandomSampler, SummaryWriter, "
                 "save/load state_dict, multinomial/topk sampling", makemore_steps),
}


@pytest.mark.parametrize("kind", TYPES)
def test_makemore_model_matches_pytorch_from_the_same_weights(kind):
    pytest.importorskip("torch")
    from harness import compare

    compare(makemore_steps("minigrad", kind), makemore_steps("torch", kind), rtol=1e-4)
