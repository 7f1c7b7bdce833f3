# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03.8 Quantization: from float32 to int8
#
# **Question:** a trained network's weights and activations are float32. How much is lost if each
# one is stored in 8 bits instead, and how does a framework compute with those 8-bit numbers?
#
# An int8 model is 4x smaller. It can also be faster, where int8 instructions (VNNI on x86, dot
# products on ARM) multiply four times as many numbers per instruction as float32's, and the
# layers are large enough to pay for quantizing each activation; section 7 measures whether this
# tiny CNN's are, and prints the verdict. The price is rounding: every value is snapped to one
# of 256 levels. This lesson measures that price on the digits CNN and shows the two ways to keep
# it small: choosing the levels well (post-training quantization, PTQ) and training against the
# rounding (quantization-aware training, QAT).
#
# **You will:** quantize numbers by hand with a scale and a zero point; compare a min-max and a
# histogram observer; quantize the digits CNN with `prepare`/`convert` and find which layer loses
# most; read the int8 kernel and check that its integer sums are exact; compare PTQ and QAT as the
# bit width shrinks; and export the int8 model to ONNX in QDQ form and run it in onnxruntime.
# **Time:** about 29 minutes (28 reading, 13 s running).

# %%
import os

# One BLAS thread: the float32 products below give the same bits on every run (set before numpy).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import inspect
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import minigrad
import minigrad.quantization as Q
from minigrad import nn, optim
from minigrad.data import Digits
from minigrad.examples.train_digits import make_model, train
from minigrad.quantization.ops import Int8Linear, int_matmul, quantize

np.set_printoptions(precision=4, suppress=True)
minigrad.manual_seed(0)

# %% [markdown]
# ## 1. Affine quantization: a scale and a zero point
# An 8-bit grid has 256 integers. To cover real values in $[lo, hi]$, affine quantization maps
#
# $$q = \mathrm{clamp}\big(\mathrm{round}(x / s) + z,\ q_{min},\ q_{max}\big), \qquad \hat x = (q - z)\, s,$$
#
# with **scale** $s = (hi - lo) / (q_{max} - q_{min})$ (the step between levels) and **zero point**
# $z = q_{min} - \mathrm{round}(lo / s)$, the integer that stands for 0.0. The range is first widened
# to contain 0, so that 0.0 (zero padding, ReLU's output) is stored exactly. Activations use uint8
# (0..255, any $z$); weights use int8 with $z = 0$ (*symmetric*), which keeps the kernel simple.

# %%
x = np.array([-1.0, -0.3, 0.0, 0.1234, 2.0, 3.0], dtype="float32")
qp = Q.calculate_qparams(np, x.min(), x.max(), "quint8")
q = quantize(np, x, qp.scale, qp.zero_point, qp.qmin, qp.qmax)
print(f"scale {float(qp.scale):.5f}   zero point {int(qp.zero_point)}")
print("x      ", x)
print("q      ", q, q.dtype)
print("x back ", (q.astype("float32") - qp.zero_point) * qp.scale)

# %% [markdown]
# Inside the range the error is at most half a step, $s/2$; outside it the value is clamped and
# the error grows without bound. The staircase and its error, for a grid on $[-1, 3]$ drawn with
# 16 levels so that the steps are visible:

# %%
xs = np.linspace(-2, 4, 2001, dtype="float32")
grid = Q.calculate_qparams(np, -1.0, 3.0, "quint8", quant_max=15)
back = (quantize(np, xs, grid.scale, grid.zero_point, 0, 15).astype("float32") - grid.zero_point) * grid.scale
fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.2))
a1.plot(xs, xs, "k:", lw=1, label="x")
a1.plot(xs, back, label="dequantize(quantize(x))")
a1.set_xlabel("x"), a1.legend()
a2.plot(xs, back - xs)
a2.axhline(float(grid.scale) / 2, color="gray", ls="--"), a2.axhline(-float(grid.scale) / 2, color="gray", ls="--")
a2.set_xlabel("x"), a2.set_title("error: within +-s/2 inside [-1, 3], clamping outside")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 2. Observers: where the range comes from
# Weights are known, so their range is read off directly; per output channel, since one
# channel's large filter would otherwise coarsen every other channel's grid. Activations depend
# on the input, so an **observer** watches them on a few calibration batches. `MinMaxObserver`
# keeps the extremes: one outlier stretches the grid for every other value. `HistogramObserver`
# keeps a histogram and picks the range with the least expected squared error, clipping a tail
# when the finer grid saves more on the bulk of the values than clipping costs.

# %%
rng = np.random.default_rng(0)
acts = np.concatenate([np.abs(rng.standard_normal(1_000_000)), [25.0]]).astype("float32")  # ReLU-like, one outlier
observers = {"min-max": Q.MinMaxObserver(), "histogram": Q.HistogramObserver()}
fig, ax = plt.subplots(figsize=(8, 3))
ax.hist(acts, bins=200, log=True, color="lightgray")
for (name, obs), colour in zip(observers.items(), ("C0", "C3")):
    obs(minigrad.tensor(acts))
    g = obs.calculate_qparams()
    hi = (255 - int(g.zero_point)) * float(g.scale)
    err = (quantize(np, acts, g.scale, g.zero_point, 0, 255).astype("float32") - g.zero_point) * g.scale - acts
    ax.axvline(hi, color=colour, label=f"{name}: range [0, {hi:.2f}], mean squared error {np.mean(err ** 2):.2e}")
ax.set_xlabel("activation value"), ax.legend()
plt.show()

# %% [markdown]
# ## 3. Post-training static quantization of the digits CNN
# First a float model: the shipped example trains the CNN (two Conv+ReLU+MaxPool blocks and a
# Linear) for four epochs.

# %%
with tempfile.TemporaryDirectory() as tmp:
    train(epochs=4, checkpoint=Path(tmp) / "digits.ckpt", progress=False)
    model = make_model()
    model.load_state_dict(minigrad.load(Path(tmp) / "digits.ckpt")["model_state_dict"])
model.eval()
train_set, test_set = Digits(train=True), Digits(train=False)
X_test, y_test = minigrad.tensor(test_set.data), test_set.targets


def accuracy(m):
    with minigrad.no_grad():
        return float((m(X_test).array.argmax(1) == y_test).mean())


print(f"float32 test accuracy {accuracy(model):.2%}")

# %% [markdown]
# PyTorch's eager-mode recipe, step by step: **fuse** each Conv with its ReLU (one layer, so one
# rounding, and the int8 kernel clamps at the output's zero point for free; a BatchNorm would be
# folded into the conv here too), **prepare** (observers around every Linear/Conv2d),
# **calibrate** (run a few batches), **convert** (int8 weights, int32 bias, the grids as buffers).

# %%
fused = Q.fuse_modules(model)  # finds Conv2d+ReLU, Linear+ReLU and Conv+BN(+ReLU) runs in Sequentials
prepared = Q.prepare(fused)
with minigrad.no_grad():
    prepared(minigrad.tensor(train_set.data[:256]))  # calibration: 256 training images
int8_model = Q.convert(prepared)
print(int8_model)
print(f"\nint8 test accuracy {accuracy(int8_model):.2%}   "
      f"bytes: float32 {Q.model_size(model):,}, int8 {Q.model_size(int8_model):,}")

# %% [markdown]
# ## 4. Where the error comes from, layer by layer
# Running the float and the int8 model side by side and comparing each layer's output gives the
# signal-to-quantization-noise ratio, $10 \log_{10}(\lVert f\rVert^2 / \lVert f - q\rVert^2)$ in dB
# (each 6 dB is one more bit of precision). Errors add up along the network: each layer rounds
# its output and also receives its predecessor's rounded input.

# %%
def layer_outputs(m, x):
    outs = []
    with minigrad.no_grad():
        for layer in m:
            x = layer(x)
            outs.append(x.array)
    return outs


names = [type(m).__name__ for m in fused]
sqnr = [10 * np.log10((f ** 2).sum() / ((f - q) ** 2).sum())
        for f, q in zip(layer_outputs(fused, X_test), layer_outputs(int8_model, X_test))]
keep = [i for i, n in enumerate(names) if n != "Identity"]
fig, ax = plt.subplots(figsize=(8, 3))
ax.bar([f"{i}: {names[i]}" for i in keep], [sqnr[i] for i in keep])
ax.set_ylabel("SQNR (dB)"), ax.tick_params(axis="x", rotation=30)
plt.tight_layout()
plt.show()
print("SQNR per layer (dB):", {i: round(float(sqnr[i]), 1) for i in keep})

# %% [markdown]
# ## 5. The int8 kernel
# A quantized Linear computes $y = s_x s_w \sum_k (q_x - z_x)\, q_w$ plus the bias: the sum runs
# over integers, with uint8 inputs and int8 weights, accumulated in int32 (the products of 8-bit
# numbers need 16 bits, their sum a few more). One float multiplier per output channel,
# $s_x s_w / s_y$, then maps the int32 sum onto the output's uint8 grid:

# %%
print(inspect.getsource(Int8Linear.forward))

# %% [markdown]
# numpy has no BLAS kernel for integer matrices, so `int_matmul` uses float32 BLAS wherever that
# is *provably exact*: float32 holds every integer up to $2^{24}$, and with uint8 inputs and
# 7-bit weights one product is at most $255 \cdot 63$, so sums over up to 1,044 terms never round.
# (7-bit weights are the default because x86 CPUs without VNNI add pairs of uint8 x int8
# products in int16, which overflows with full 8-bit weights; onnxruntime's quantizer makes the
# same choice there.) The same integers, checked against int64:

# %%
layer = int8_model[-1]
with minigrad.no_grad():
    h = X_test
    for m in list(int8_model)[:-1]:
        h = m(h)
xq = quantize(np, h.array, layer.input_scale.array, layer.input_zero_point.array, 0, 255).astype("int32")
a, w = xq - int(layer.input_zero_point.array), layer.weight.array.astype("int32").T
exact = a.astype("int64") @ w.astype("int64")
print("K =", a.shape[1], "  largest |sum| =", np.abs(exact).max(), "  < 2**24 =", 2 ** 24)
print("float32 BLAS sums == int64 sums:", np.array_equal(int_matmul(a, w, 255 * 63), exact))

# %% [markdown]
# ## 6. PTQ vs QAT as the bits shrink
# At 8 bits PTQ loses little on this model. With fewer bits the rounding error grows and QAT
# starts to pay: `prepare_qat` puts `FakeQuantize` modules where the observers were, which round in
# the forward pass, so the loss sees the rounding; round has zero derivative almost everywhere, so
# the backward pass uses the **straight-through estimator**, gradient 1 where the value was inside
# the grid's range and 0 where it was clamped. Both curves below are simulated with fake
# quantization (the int8 kernels take 8-bit grids only): PTQ is the fake-quantized model right
# after calibration, QAT the same model after one epoch of fine-tuning. (One test image is 0.28%.)

# %%
# NBVAL_IGNORE_OUTPUT
# (the exact accuracies move by a test image or two with the CPU's rounding: the cell after the
# plot checks what holds on any machine)
def qconfig(bits):
    return Q.QConfig(lambda: Q.FakeQuantize(Q.MovingAverageMinMaxObserver(quant_max=2 ** bits - 1)),
                     lambda: Q.FakeQuantize(Q.PerChannelMinMaxObserver(quant_min=1 - 2 ** (bits - 1),
                                                                       quant_max=2 ** (bits - 1) - 1)))


def fine_tune(m, epochs=1, lr=1e-3):
    opt, order = optim.Adam(m.parameters(), lr=lr), np.random.default_rng(1).permutation(len(train_set))
    m.train()
    for _ in range(epochs):
        for idx in np.array_split(order, len(order) // 32):
            opt.zero_grad()
            x, y = minigrad.tensor(train_set.data[idx]), minigrad.tensor(train_set.targets[idx])
            nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
    return m.eval()


results = {}
for bits in (8, 4, 3, 2):
    minigrad.manual_seed(0)
    sim = Q.prepare_qat(fused, qconfig(bits))
    with minigrad.no_grad():
        sim(minigrad.tensor(train_set.data[:256]))  # calibrate the moving averages
    ptq_acc = accuracy(sim.eval())
    results[bits] = (ptq_acc, accuracy(fine_tune(sim)))
    print(f"{bits} bits: PTQ {results[bits][0]:.2%}   QAT {results[bits][1]:.2%}")

fig, ax = plt.subplots(figsize=(6, 3))
bits = list(results)
ax.plot(bits, [results[b][0] for b in bits], "o-", label="PTQ (calibrated)")
ax.plot(bits, [results[b][1] for b in bits], "s-", label="QAT (one epoch)")
ax.axhline(accuracy(model), color="gray", ls=":", label="float32")
ax.set_xlabel("bits (activations and weights)"), ax.set_ylabel("test accuracy"), ax.invert_xaxis(), ax.legend()
plt.show()

# %% [markdown]
# The digits above are one machine's: a fine-tune step that rounds differently on another CPU (or
# another BLAS kernel) moves QAT's accuracy by a test image or two, because the next rounding to
# the grid can go the other way. What the lesson rests on holds on any machine:

# %%
float_acc = accuracy(model)
claims = {
    "8 bits: PTQ and QAT within 2 points of float32": all(abs(a - float_acc) < 0.02 for a in results[8]),
    "4 bits: PTQ and QAT within 5 points of float32": all(abs(a - float_acc) < 0.05 for a in results[4]),
    "3 bits: PTQ more than 2 points below float32": float_acc - results[3][0] > 0.02,
    "2 bits: PTQ below 50%, QAT 15 points above it": results[2][0] < 0.5 and results[2][1] > results[2][0] + 0.15,
}
for claim, holds in claims.items():
    print(f"{claim}: {holds}")

# %% [markdown]
# Down to 4 bits the two stay within a few test images of float32: the rounding is small next to
# what separates the classes. At 3 bits PTQ drops by several points; whether one epoch of QAT
# beats it depends on the fine-tune's shuffling (other orders of the training set gave from 92% to
# 96%). At 2 bits PTQ collapses and QAT recovers a good part of the loss, because the fine-tune
# adjusts the weights to the grid they will be rounded to.

# %% [markdown]
# ## 7. The int8 model in ONNX: QDQ form
# `export_onnx` writes each int8 layer the way ONNX's QDQ convention spells it:
# QuantizeLinear/DequantizeLinear pairs on the activations, DequantizeLinear on the int8 weights
# and int32 bias, and the float Conv or Gemm between them. A runtime recognises the pattern and
# runs its own int8 kernel for it. The first layer's nodes:

# %%
import graphviz  # noqa: E402
import onnxruntime as ort  # noqa: E402
from minigrad.graph import export_onnx  # noqa: E402

path = Path(tempfile.mkdtemp()) / "digits_int8.onnx"
onnx_model = export_onnx(int8_model, X_test, path)
weights = {t.name for t in onnx_model.graph.initializer}
dot = graphviz.Digraph(graph_attr={"rankdir": "LR"}, node_attr={"shape": "box", "fontsize": "10"})
for i, node in enumerate(onnx_model.graph.node[:9]):
    label = node.op_type + (f"\n({node.input[0]})" if node.input[0] in weights else "")
    dot.node(str(i), label, style="filled", fillcolor="lightblue" if "uantize" in node.op_type else "white")
    for j, other in enumerate(onnx_model.graph.node[:i]):
        if set(other.output) & set(node.input):
            dot.edge(str(j), str(i))
dot.format = "png"
plt.figure(figsize=(10, 2.4))
plt.imshow(plt.imread(dot.render(path.with_suffix(""), cleanup=True))), plt.axis("off")
plt.show()
print("int8 initializers:", [(t.name, list(t.dims)) for t in onnx_model.graph.initializer if t.data_type == 3])

# %% [markdown]
# onnxruntime runs the file with its int8 kernels; its outputs are minigrad's, and the file is a
# third of the float32 one. Whether int8 is also faster depends on the machine: on this 8x8-digit
# CNN the matrix products are tiny, so quantizing and dequantizing each layer's activations costs
# about what the int8 products save, and on a CPU without VNNI (which adds four uint8 x int8
# products per lane in one instruction) there is little to save. The cell says which it was here
# (timings vary from run to run):

# %%
# NBVAL_IGNORE_OUTPUT
session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
got = session.run(None, {"input": test_set.data})[0]
with minigrad.no_grad():
    mine = int8_model(X_test).array
float_path = path.with_name("digits_float.onnx")
export_onnx(model, X_test, float_path)
print(f"largest difference from minigrad int8: {np.abs(got - mine).max()}   "
      f"file: {os.path.getsize(path):,} bytes (float32: {os.path.getsize(float_path):,})")
float_session = ort.InferenceSession(str(float_path), providers=["CPUExecutionProvider"])
times = {}
for name, run in (("minigrad float32", lambda: model(X_test)), ("minigrad int8", lambda: int8_model(X_test)),
                  ("onnxruntime float32", lambda: float_session.run(None, {"input": test_set.data})),
                  ("onnxruntime int8", lambda: session.run(None, {"input": test_set.data}))):
    with minigrad.no_grad():
        t0 = time.perf_counter()
        for _ in range(5):
            run()
    times[name] = (time.perf_counter() - t0) / 5
    print(f"{name:20s} {times[name] * 1e3:7.2f} ms per pass over {len(y_test)} images")
for engine in ("minigrad", "onnxruntime"):
    ratio = times[f"{engine} float32"] / times[f"{engine} int8"]
    print(f"{engine}: int8 is {ratio:.1f}x faster" if ratio >= 1 else f"{engine}: int8 is {1 / ratio:.1f}x slower",
          "than float32 here")

# %% [markdown]
# `benchmarks/bench_quantization.py` prints the full table (sizes, float32/PTQ/QAT/dynamic
# accuracy, PyTorch's own PTQ, minigrad and onnxruntime speed) for this CNN and an MNIST MLP.
#
# ## Predict, then run
# 1. A ReLU6 output lies in $[0, 6]$. What are the uint8 scale and zero point?
# 2. A weight whose two output channels have ranges $\pm 0.01$ and $\pm 1$ is quantized with one
#    scale for the whole tensor instead of one per channel. Roughly how many distinct levels are
#    left for the small channel?
# 3. `quantize_dynamic` turns the Linear layers to int8 without any calibration batch. Where does
#    it get the activations' range from?

# %%
relu6 = Q.calculate_qparams(np, 0.0, 6.0, "quint8")
print(f"1. scale {float(relu6.scale):.5f} (= 6/255), zero point {int(relu6.zero_point)}")
w2 = np.stack([np.linspace(-0.01, 0.01, 9), np.linspace(-1, 1, 9)]).astype("float32")
per_tensor = Q.calculate_qparams(np, w2.min(), w2.max(), "qint8", symmetric=True)
levels = np.unique(quantize(np, w2[0], per_tensor.scale, per_tensor.zero_point, -127, 127))
print("2. levels left for the small channel:", len(levels), "of 9 distinct values")
dynamic = Q.quantize_dynamic(model)
print("3. from each batch, at run time:", dynamic[-1], f"- accuracy {accuracy(dynamic):.2%}")
