"""What a GPU would hit, found without one: the cuda code path on the strict stand-in for cupy
(``fake_cupy``), which refuses what cupy refuses and counts every host synchronisation.

An op on a second GPU computes there (forward, backward, and a fused kernel's output); no op waits
for the GPU: index, target and probability checks are read at the next host read, where a failed
one raises its usual error; a small GPT's training step makes no host synchronisation at all, and
one with a GradScaler (which must know whether to skip the step); generated CUDA kernels are the
same text for the same chain, so cupy compiles each once; random numbers are drawn in float32 on
the device. Skipped where a real GPU is present (``simulated_cuda``)."""

import sys
from pathlib import Path

import numpy as np
import pytest

import fake_cupy
import minigrad as mg
from minigrad import nn
from minigrad.graph import trace
from minigrad.graph.codegen import cuda
from minigrad.graph.passes import fuse_elementwise
from minigrad.nn import functional as F
from helpers import to_numpy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_transformer  # noqa: E402


class Syncs:
    """``with Syncs() as s:`` counts the host synchronisations made inside (``s.made``)."""

    def __enter__(self):
        self.before = fake_cupy.syncs()
        return self

    def __exit__(self, *exc):
        self.made = fake_cupy.syncs()[len(self.before):]


# -- a second GPU ------------------------------------------------------------------------------------
def test_an_op_on_a_second_gpu_computes_there_forward_and_backward(simulated_cuda):
    assert simulated_cuda.cuda.runtime.getDevice() == 0  # cuda:0 is current, as in a fresh process
    x = mg.randn(3, 4, device="cuda:1", requires_grad=True)
    layer = nn.Linear(4, 2).to("cuda:1")
    y = mg.tanh(layer(x * 2)).exp().sum()
    y.backward()
    assert y.device == "cuda:1" and y.array.device.id == 1
    assert x.grad.array.device.id == 1 and layer.weight.grad.array.device.id == 1
    np.testing.assert_allclose(to_numpy(x.grad), to_numpy(x.grad.cpu()))


def test_a_fused_kernel_allocates_its_output_on_its_groups_gpu(simulated_cuda, monkeypatch):
    launched = []

    class Kernel:  # cupy.ElementwiseKernel: records on which GPU it was launched
        def __init__(self, **params):
            self.params = params

        def __call__(self, *arrays):
            launched.append((simulated_cuda.cuda.runtime.getDevice(), [a.device.id for a in arrays]))

    monkeypatch.setattr(simulated_cuda, "ElementwiseKernel", Kernel, raising=False)
    x = mg.randn(8, device="cuda:1")
    (node,) = [n for n in fuse_elementwise(trace(lambda a: mg.sigmoid(a * 3) + 1, x).graph) if n.op == "fused"]
    out = cuda.generate(node.meta["group"])(x.array)
    assert out.device.id == 1 and launched == [(1, [1, 1])]


# -- one source per chain -------------------------------------------------------------------------------
def test_generated_cuda_source_names_values_by_place_not_by_node(simulated_cuda):
    mg.set_default_device("cuda")
    a, b = mg.randn(4, 5), mg.randn(4, 5)
    chain = lambda t: mg.sigmoid(t * 1.5 - 0.25) * t  # noqa: E731
    fused = [n for n in fuse_elementwise(trace(lambda p, q: (chain(p), chain(q)), a, b).graph) if n.op == "fused"]
    assert len(fused) == 2 and fused[0].name != fused[1].name
    first, second = (cuda.generate(n.meta["group"]) for n in fused)
    assert first.params == second.params  # cupy's cache is keyed by the source: compiled once
    assert "v0" in first.params["operation"] and "%" not in first.params["operation"]


# -- no op waits for the GPU ---------------------------------------------------------------------------
def _on_cuda_then_read(make):
    """``make()`` on cuda makes no host synchronisation; returns its result."""
    mg.set_default_device("cuda")
    with Syncs() as s:
        out = make()
    assert s.made == [], f"host synchronisations inside the op: {s.made}"
    return out


OPS = {"embedding": lambda i, w, logits: F.embedding(i, w), "gather": lambda i, w, logits: logits.gather(1, i[:, None]),
       "index": lambda i, w, logits: w[i], "cross_entropy": lambda i, w, logits: F.cross_entropy(logits, i),
       "one_hot": lambda i, w, logits: F.one_hot(i, 5)}


@pytest.mark.parametrize("case", sorted(OPS))
def test_index_checks_wait_for_no_gpu_and_raise_at_the_next_host_read(simulated_cuda, case):
    w, logits = mg.randn(5, 3, device="cuda"), mg.randn(4, 5, device="cuda")
    ok, bad = mg.tensor([0, 4, 2, 1], device="cuda"), mg.tensor([0, 7, 2, 1], device="cuda")
    out = _on_cuda_then_read(lambda: OPS[case](ok, w, logits))
    np.testing.assert_allclose(to_numpy(out), to_numpy(OPS[case](ok.cpu(), w.cpu(), logits.cpu())), rtol=1e-6)
    out = _on_cuda_then_read(lambda: OPS[case](bad, w, logits))  # queued; nothing is known on the host yet
    with pytest.raises(ValueError if case == "one_hot" else IndexError, match="7"):
        out.cpu()  # the next host read reports it, as CUDA reports a device-side assert


def test_probability_and_weight_checks_wait_for_no_gpu(simulated_cuda):
    p, t = mg.rand(6, device="cuda"), mg.ones(6, device="cuda")
    _on_cuda_then_read(lambda: F.binary_cross_entropy(p, t))
    _on_cuda_then_read(lambda: mg.multinomial(mg.tensor([[0.2, 0.8, 0.0]], device="cuda"), 2))
    _on_cuda_then_read(lambda: mg.multinomial(mg.tensor([0.2, 0.8], device="cuda"), 4, replacement=True))
    with np.errstate(invalid="ignore"):  # log(1 - p) of p > 1 is nan; the check says why
        loss = _on_cuda_then_read(lambda: F.binary_cross_entropy(p * 3, t))
    with pytest.raises(ValueError, match="between 0 and 1"):
        loss.item()
    drawn = _on_cuda_then_read(lambda: mg.multinomial(mg.tensor([0.5, -1.0], device="cuda"), 1))
    with pytest.raises(ValueError, match="non-negative"):
        mg.cuda.synchronize()
    assert drawn.device == "cuda:0"


def test_batchnorm_with_a_cumulative_average_waits_for_no_gpu(simulated_cuda):
    bn = nn.BatchNorm1d(3, momentum=None).to("cuda")
    batches = [mg.randn(8, 3, device="cuda") for _ in range(3)]
    for x in batches:
        _on_cuda_then_read(lambda: bn(x))
    want = np.mean([to_numpy(x).mean(0) for x in batches], axis=0)  # the mean of all batches so far
    np.testing.assert_allclose(to_numpy(bn.running_mean), want, rtol=1e-5, atol=1e-6)


def _gpt_step(scaler=None):
    idx, targets, vocab = bench_transformer.batch(2, context=16)
    model = bench_transformer.gpt(mg, vocab, layers=1, width=32, heads=2, context=16).to("cuda")
    opt = mg.optim.AdamW(model.parameters(), lr=1e-3)
    idx, targets = mg.tensor(idx, device="cuda"), mg.tensor(targets, device="cuda")

    def step():
        opt.zero_grad()
        if scaler is None:
            loss = bench_transformer.loss_of(mg, model, idx, targets)
            loss.backward()
            opt.step()
        else:
            with mg.autocast("cuda"):
                loss = bench_transformer.loss_of(mg, model, idx, targets)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss

    return step


def test_a_gpt_training_step_makes_no_host_synchronisation(simulated_cuda):
    mg.set_default_device("cuda")  # the model's arange of positions is made on the default device
    step = _gpt_step()
    losses = []
    for _ in range(3):
        with Syncs() as s:
            loss = step()
        assert s.made == [], f"a training step waited for the GPU: {s.made}"
        losses.append(loss.item())  # the caller's read: the one wait, outside the step
    assert losses[-1] < losses[0]


def test_a_gpt_step_with_a_grad_scaler_waits_once(simulated_cuda):
    mg.set_default_device("cuda")
    step = _gpt_step(mg.amp.GradScaler("cuda"))
    for _ in range(2):
        with Syncs() as s:
            step()
        assert len(s.made) == 1, f"the scaler reads whether to skip the step once, got {s.made}"


# -- random numbers ------------------------------------------------------------------------------------
def test_random_numbers_are_drawn_in_float32_on_the_device(simulated_cuda, monkeypatch):
    asked = []
    for name in ("random", "standard_normal"):
        draw = getattr(fake_cupy._Generator, name)
        monkeypatch.setattr(fake_cupy._Generator, name,
                            lambda self, size=None, dtype=np.float64, _draw=draw, _name=name:
                            asked.append((_name, np.dtype(dtype).name)) or _draw(self, size, dtype))
    made = [mg.rand(4, device="cuda"), mg.randn(4, device="cuda"), mg.randn(4, device="cuda", dtype=mg.float16),
            mg.randn(4, device="cuda", dtype=mg.float64)]
    assert [t.dtype for t in made] == [mg.float32, mg.float32, mg.float16, mg.float64]
    assert asked == [("random", "float32"), ("standard_normal", "float32"), ("standard_normal", "float32"),
                     ("standard_normal", "float64")]


# -- the stand-in itself is strict ----------------------------------------------------------------------
def test_the_stand_in_refuses_implicit_conversion_and_counts_reads(simulated_cuda):
    x = mg.ones(3, device="cuda")
    with pytest.raises(TypeError, match="implicit conversion"):
        np.asarray(x.array)
    with pytest.raises(TypeError, match="implicit conversion"):
        np.array([x.array])
    with pytest.raises(ValueError, match="different from the current device"):
        with simulated_cuda.cuda.Device(1):
            x.array + 1
    with Syncs() as s:
        float(x.array.sum()), x.array.sum().item(), bool(x.array.all()), x.array.get()
    assert s.made == ["float()", ".item()", "bool()", ".get()"]
    assert x.array.device.id == 0 and mg.ones(1, device="cuda:1").array.device.id == 1
