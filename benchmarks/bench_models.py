"""Four programs real projects run, one training step each: minigrad eager (and compiled) vs PyTorch eager.

Each model is written once, as a function of the library (``minigrad`` or ``torch``): minigrad
follows torch's API, so the same lines build both twins, and the torch twin is loaded with the
minigrad twin's initial weights, so their first losses must agree (the test checks that on tiny
sizes, ``tests/suites/test_bench_models.py``). The workloads (chapter 02's layers at work):

- ``lstm``: an LSTM classifier of 28-pixel rows (pytorch/examples mnist_rnn's shape): LSTM 28->64
  over 28 steps, a linear head on the last output, batch 64, cross-entropy, Adam.
- ``word_lm``: pytorch/examples word_language_model at a small size: Embedding 2000x64, LSTM 64,
  a linear decoder back to 2000 words, sequence 20 x batch 16, clip_grad_norm_(0.25), SGD.
- ``dcgan``: pytorch/examples dcgan at 64x64: a generator of ConvTranspose2d+BatchNorm+ReLU, a
  discriminator of strided convs+LeakyReLU, BCELoss and two Adams; one step trains D on real and
  fake images, then G. At the full width (ngf=ndf=64, batch 64) PyTorch alone took 3.5 s a step
  on one thread of a 2-core AMD EPYC, so the benchmark runs ngf=ndf=16, batch 16 (about 1/64 of
  the work; ``--dcgan-width``, ``--dcgan-batch`` set them).
- ``gpt``: ng-video-lecture's ``gpt.py`` (one Linear per head for key, query and value, a masked
  softmax, heads joined with ``cat``, a ReLU MLP, pre-norm blocks) at block 16, width 32, 2 heads,
  its 6 layers, batch 32, with dropout 0 so the two frameworks compute the same step; AdamW.

One thread each (``common`` sets OPENBLAS/OMP threads and torch's to 1), repeats interleaved,
medians; ms per step, the ratio minigrad / torch against its target (eager at most 1.5x torch
eager; compiled at most 1.2x torch eager where ``minigrad.compile`` applies to the step).

``python benchmarks/bench_models.py [--steps N] [--repeats R] [--only lstm,gpt]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("OMP_NUM_THREADS", "1")
from common import conditions, interleaved, torch  # first: sets BLAS threads before numpy  # noqa: E402

import numpy  # noqa: E402

import minigrad  # noqa: E402
from minigrad.graph.compile import CompileWarning  # noqa: E402

EAGER_TARGET, COMPILED_TARGET = 1.5, 1.2
SIZES = {  # the benchmark's sizes; the test passes tiny ones
    "lstm": dict(batch=64, steps=28, features=28, hidden=64, classes=10),
    "word_lm": dict(vocab=2000, width=64, seq=20, batch=16),
    "dcgan": dict(nz=100, width=16, batch=16, image=64),
    "gpt": dict(vocab=65, block=16, width=32, heads=2, layers=6, batch=32),
}


def lstm(lib, batch: int, steps: int, features: int, hidden: int, classes: int, seed: int = 0):
    """The LSTM classifier: ``(model, step)``; ``step()`` trains once and returns the loss."""
    nn = lib.nn

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = nn.LSTM(features, hidden, batch_first=True), nn.Linear(hidden, classes)

        def forward(self, x):
            out, _ = self.rnn(x)
            return self.head(out[:, -1])

    rng = numpy.random.default_rng(seed)
    x = lib.tensor(rng.standard_normal((batch, steps, features)).astype(numpy.float32))
    y = lib.tensor(rng.integers(0, classes, batch))
    model = Classifier()
    opt = lib.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return model, step


def word_lm(lib, vocab: int, width: int, seq: int, batch: int, seed: int = 0):
    """word_language_model's RNNModel (LSTM, tied sizes, no dropout) and its step: clip, then SGD."""
    nn = lib.nn

    class RNNModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder, self.rnn = nn.Embedding(vocab, width), nn.LSTM(width, width)
            self.decoder = nn.Linear(width, vocab)

        def forward(self, tokens):
            out, _ = self.rnn(self.encoder(tokens))
            return self.decoder(out).reshape(-1, vocab)

    rng = numpy.random.default_rng(seed)
    words = rng.integers(0, vocab, (seq + 1, batch))
    data, targets = lib.tensor(words[:-1]), lib.tensor(words[1:].reshape(-1))
    model = RNNModel()
    opt = lib.optim.SGD(model.parameters(), lr=1.0)

    def step():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(data), targets)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        opt.step()
        return loss

    return model, step


def dcgan(lib, nz: int, width: int, batch: int, image: int = 64, seed: int = 0):
    """pytorch/examples dcgan's generator and discriminator (ngf = ndf = ``width``) at ``image``
    pixels (64, or 32 with one block fewer each), as one ``ModuleDict``, and a step training D then G."""
    nn = lib.nn
    blocks = {64: 3, 32: 2}[image]  # the middle blocks, each doubling the resolution

    def up(cin, cout, *args):
        return [nn.ConvTranspose2d(cin, cout, 4, *args, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True)]

    def down(cin, cout, norm=True):
        return ([nn.Conv2d(cin, cout, 4, 2, 1, bias=False)] + ([nn.BatchNorm2d(cout)] if norm else [])
                + [nn.LeakyReLU(0.2, inplace=True)])

    top = width * 2 ** blocks
    g_layers = up(nz, top, 1, 0)
    for k in range(blocks):
        g_layers += up(top >> k, top >> (k + 1), 2, 1)
    g_layers += [nn.ConvTranspose2d(width, 3, 4, 2, 1, bias=False), nn.Tanh()]
    d_layers = down(3, width, norm=False)
    for k in range(blocks):
        d_layers += down(width << k, width << (k + 1))
    d_layers += [nn.Conv2d(top, 1, 4, 1, 0, bias=False), nn.Sigmoid()]
    model = nn.ModuleDict({"G": nn.Sequential(*g_layers), "D": nn.Sequential(*d_layers)})
    G, D = model["G"], model["D"]

    rng = numpy.random.default_rng(seed)
    real = lib.tensor(rng.uniform(-1, 1, (batch, 3, image, image)).astype(numpy.float32))
    noise = lib.tensor(rng.standard_normal((batch, nz, 1, 1)).astype(numpy.float32))
    ones, zeros = lib.ones(batch), lib.zeros(batch)
    opt_d = lib.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_g = lib.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = nn.BCELoss()

    def step():
        D.zero_grad()
        fake = G(noise)
        loss_d = bce(D(real).reshape(-1), ones) + bce(D(fake.detach()).reshape(-1), zeros)
        loss_d.backward()
        opt_d.step()
        G.zero_grad()
        loss_g = bce(D(fake).reshape(-1), ones)
        loss_g.backward()
        opt_g.step()
        return loss_d + loss_g

    return model, step


def gpt(lib, vocab: int, block: int, width: int, heads: int, layers: int, batch: int, seed: int = 0):
    """ng-video-lecture's GPTLanguageModel, line for line but with dropout 0, and its AdamW step."""
    nn, F = lib.nn, lib.nn.functional

    class Head(nn.Module):
        def __init__(self, head_size):
            super().__init__()
            self.key = nn.Linear(width, head_size, bias=False)
            self.query = nn.Linear(width, head_size, bias=False)
            self.value = nn.Linear(width, head_size, bias=False)
            self.register_buffer("tril", lib.tril(lib.ones(block, block)))

        def forward(self, x):
            B, T, C = x.shape
            k, q = self.key(x), self.query(x)
            wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
            wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
            wei = F.softmax(wei, dim=-1)
            return wei @ self.value(x)

    class MultiHeadAttention(nn.Module):
        def __init__(self, num_heads, head_size):
            super().__init__()
            self.heads = nn.ModuleList([Head(head_size) for _ in range(num_heads)])
            self.proj = nn.Linear(head_size * num_heads, width)

        def forward(self, x):
            return self.proj(lib.cat([h(x) for h in self.heads], dim=-1))

    class FeedFoward(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width))

        def forward(self, x):
            return self.net(x)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.sa, self.ffwd = MultiHeadAttention(heads, width // heads), FeedFoward()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)

        def forward(self, x):
            x = x + self.sa(self.ln1(x))
            return x + self.ffwd(self.ln2(x))

    class GPTLanguageModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.token_embedding_table = nn.Embedding(vocab, width)
            self.position_embedding_table = nn.Embedding(block, width)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln_f = nn.LayerNorm(width)
            self.lm_head = nn.Linear(width, vocab)
            self.apply(self._init_weights)

        def _init_weights(self, module):
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

        def forward(self, idx, targets):
            B, T = idx.shape
            x = self.token_embedding_table(idx) + self.position_embedding_table(lib.arange(T))
            logits = self.lm_head(self.ln_f(self.blocks(x)))
            return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))

    rng = numpy.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (batch, block + 1))
    idx, targets = lib.tensor(tokens[:, :-1]), lib.tensor(tokens[:, 1:])
    model = GPTLanguageModel()
    opt = lib.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        loss = model(idx, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return model, step


WORKLOADS = {"lstm": lstm, "word_lm": word_lm, "dcgan": dcgan, "gpt": gpt}
NAMES = {"lstm": "LSTM classifier", "word_lm": "word LM", "dcgan": "DCGAN 64x64", "gpt": "small GPT"}


def twins(name: str, sizes: dict, with_torch: bool = True) -> dict:
    """``{"minigrad": (model, step), "torch": (model, step)}`` for workload ``name`` at ``sizes``,
    the torch twin loaded with the minigrad twin's initial weights (torch left out without it)."""
    build = WORKLOADS[name]
    minigrad.manual_seed(0)
    pairs = {"minigrad": build(minigrad, **sizes)}
    if with_torch and torch is not None:
        model, step = build(torch, **sizes)
        state = pairs["minigrad"][0].state_dict()
        model.load_state_dict({k: torch.tensor(numpy.array(v.numpy())) for k, v in state.items()})
        pairs["torch"] = (model, step)
    return pairs


def compiled_step(step):
    """``minigrad.compile`` of an eager step that has run once (optimizer state exists), or the
    reason it does not apply: a step that falls back to eager (a ``CompileWarning``) is not compiled."""
    compiled = minigrad.compile(step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled()  # the trace
        compiled()  # the first replay
    fallbacks = [w for w in caught if issubclass(w.category, CompileWarning)]
    if fallbacks:
        return None, str(fallbacks[0].message).splitlines()[0]
    return compiled, None


def measure(name: str, sizes: dict, repeats: int, steps: int, compile_too: bool = True) -> tuple[dict, str | None]:
    """Median ms per step of each contender of workload ``name``, and why a compiled column is missing."""
    pairs = twins(name, sizes)
    runs = {who: step for who, (_, step) in pairs.items()}
    first = {who: float(step().item()) for who, step in runs.items()}  # warm-up: Adam's moments exist
    if "torch" in first:
        numpy.testing.assert_allclose(first["minigrad"], first["torch"], rtol=1e-3, err_msg=name)
    why = "not tried"
    if compile_too:
        _, step = WORKLOADS[name](minigrad, **sizes)  # a third twin: the eager one keeps its own state
        step()
        compiled, why = compiled_step(step)
        if compiled is not None:
            runs["compiled"] = compiled
    return interleaved(runs, repeats, steps), why


def row(label: str, ms: dict) -> str:
    line = f"{label:18}" + "".join(f"{ms[w]:11.2f}" if w in ms else f"{'-':>11}"
                                   for w in ("minigrad", "compiled", "torch"))
    if "torch" in ms:
        ratio = ms["minigrad"] / ms["torch"]
        line += f"{ratio:9.2f}x <= {EAGER_TARGET}x {'met' if ratio <= EAGER_TARGET else 'not met':8}"
        if "compiled" in ms:
            ratio = ms["compiled"] / ms["torch"]
            line += f"{ratio:9.2f}x <= {COMPILED_TARGET}x {'met' if ratio <= COMPILED_TARGET else 'not met'}"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="steps per repeat")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats (median taken)")
    parser.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated workloads")
    parser.add_argument("--no-compile", action="store_true", help="time eager steps only")
    parser.add_argument("--dcgan-width", type=int, default=SIZES["dcgan"]["width"], help="ngf = ndf")
    parser.add_argument("--dcgan-batch", type=int, default=SIZES["dcgan"]["batch"])
    args = parser.parse_args()
    SIZES["dcgan"].update(width=args.dcgan_width, batch=args.dcgan_batch)
    print(f"bench_models: one training step, median of {args.repeats} interleaved repeats x {args.steps} steps")
    print(conditions() + f"; torch {torch.__version__ if torch else 'not installed'}")
    print(f"{'ms per step':18}{'minigrad':>11}{'compiled':>11}{'torch':>11}   eager / torch"
          f"{'':14}compiled / torch")
    notes = []
    for name in args.only.split(","):
        ms, why = measure(name, SIZES[name], args.repeats, args.steps, not args.no_compile)
        print(row(NAMES[name], ms), flush=True)
        if "compiled" not in ms:
            notes.append(f"{NAMES[name]}: no compiled column ({why})")
    for name, sizes in SIZES.items():
        print(f"  {NAMES[name]}: " + ", ".join(f"{k}={v}" for k, v in sizes.items()))
    for note in notes:
        print(note)
    if torch is None:
        print("torch is not installed: minigrad's figures only (make torch installs it)")


if __name__ == "__main__":
    main()
