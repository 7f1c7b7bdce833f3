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
# # 03.9 Exporting a model: ONNX and onnxruntime
#
# **Question:** the model is trained. How does it leave minigrad, to run where there is no
# minigrad (a server, a phone, a browser), and what does a runtime built only for inference do
# with it?
#
# ONNX is a file format for a *static* graph of standard ops (`Conv`, `Relu`, `Gemm`...) with the
# weights inside. minigrad gets that graph the way chapter 01 taught: it *traces* the model, then
# writes each traced op as its class declares. onnxruntime loads the file, rewrites the graph once
# more (its own fusions) and runs it.
#
# **You will:** trace and optimise a trained CNN, export it with a dynamic batch size, open the
# file and draw it next to minigrad's IR, check onnxruntime against minigrad, time both at
# onnxruntime's four optimisation levels, name the optimiser's real API and ONNX's neighbours
# (TorchScript, SavedModel), and see what the exporter refuses and why.
# **Time:** about 24 minutes (23 reading, 8 s running).

# %%
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one thread everywhere: a fair comparison

import tempfile
import time
from pathlib import Path

import graphviz
import matplotlib.pyplot as plt
import numpy as np
import onnx
import onnxruntime as ort

import minigrad
from minigrad import nn, optim
from minigrad.data import DataLoader, Digits
from minigrad.graph import draw, export_onnx, trace
from minigrad.graph.passes import fold_batch_norm, fold_constants, fold_conv_bn
from minigrad.ops import all_ops

minigrad.manual_seed(0)
train_set, test_set = Digits(train=True), Digits(train=False)
X_test, Y_test = minigrad.tensor(test_set.data), test_set.targets
workdir = Path(tempfile.mkdtemp())

# %% [markdown]
# ## 1. A trained model
# A small CNN with BatchNorm, trained for three epochs on the 8x8 digits.

# %%
# NBVAL_IGNORE_OUTPUT
# (three epochs of Adam amplify the CPU's rounding: 97.5% to 98.1% on x86 machines; checked here)
model = nn.Sequential(
    nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(128, 10),
)
opt = optim.Adam(model.parameters(), lr=0.01)
for epoch in range(3):
    for x, y in DataLoader(train_set, batch_size=64, shuffle=True, generator=epoch):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
model.eval()
with minigrad.no_grad():
    logits = model(X_test).numpy()
accuracy = np.mean(logits.argmax(1) == Y_test)
assert accuracy > 0.95, f"expected a test accuracy above 95% after 3 epochs, got {accuracy:.1%}"
print(f"test accuracy {accuracy:.1%} on {len(Y_test)} digits")

# %% [markdown]
# ## 2. Trace, then optimise
# Tracing runs the model once and records its ops: the IR of chapter 01. BatchNorm is not one op
# there but its arithmetic: `Add` eps, `Rsqrt`, `Mul`... In eval mode all of that depends on the
# weights alone, so constant folding turns it into a scale and a shift (`Mul`, `Add`), and those
# fold into the convolution before them (`fold_batch_norm`, 03.1). `fold_conv_bn` does the same on
# the layers of the model, which is the form we export.

# %%
STRUCTURE = ("placeholder", "parameter", "constant", "output")
ops = lambda g: [n.op for n in g.topological_order() if n.op not in STRUCTURE]  # noqa: E731
with minigrad.no_grad():
    traced = trace(model, X_test[:4])
frozen = fold_constants(traced.graph, freeze=True)
print(f"traced  {len(ops(traced.graph)):2d} ops:", " ".join(ops(traced.graph)))
print(f"frozen  {len(ops(frozen)):2d} ops:", " ".join(ops(frozen)))
print(f"folded  {len(ops(fold_batch_norm(frozen))):2d} ops:", " ".join(ops(fold_batch_norm(frozen))))
deploy = fold_conv_bn(model)
with minigrad.no_grad():
    traced_deploy = trace(deploy, X_test[:4])
    print("fold_conv_bn(model) gives the same logits:", np.allclose(deploy(X_test).numpy(), logits, atol=1e-4))

# %% [markdown]
# ## 3. Export, with a dynamic batch
# `export_onnx` traces in eval mode under `no_grad`, folds what depends on the weights alone, and
# emits each op. A trace records shapes, so `Flatten`'s reshape to `(4, 128)` would bake the batch
# of 4 into the file. `dynamic_axes` (as in `torch.onnx.export`) names the axes that may vary:
# the exporter traces once more with each one grown by one, and a dim that changed follows the
# axis at run time (a reshape target of `-1`, or `Shape`, `Gather`, `Concat` on the input's shape).

# %%
path = workdir / "digits_cnn.onnx"
exported = export_onnx(deploy, X_test[:4], path, input_names=["pixels"], output_names=["logits"],
                       dynamic_axes={"pixels": {0: "batch"}, "logits": {0: "batch"}})
dims = lambda v: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]  # noqa: E731
print("input ", exported.graph.input[0].name, dims(exported.graph.input[0]))
print("output", exported.graph.output[0].name, dims(exported.graph.output[0]))
print(f"{path.stat().st_size / 1e3:.1f} kB, {len(exported.graph.initializer)} initializers, opset "
      f"{exported.opset_import[0].version}")

# %% [markdown]
# ## 4. Open the file
# The file is a protobuf: nodes with named inputs and outputs, and initializers holding the
# weights. Reading it back with `onnx.load` and drawing it beside minigrad's IR of the same model
# shows one ONNX node per traced op; `getitem` (MaxPool2d's second output, the argmax indices
# that only backward reads) is not emitted.

# %%
loaded = onnx.load(path)
for node in loaded.graph.node:
    print(f"{node.op_type:<8} {', '.join(node.input):<52} -> {', '.join(node.output)}")


# %%
def draw_onnx(graph, dot):
    """ONNX nodes as boxes, graph inputs and outputs as ellipses; initializers are left out."""
    weights = {t.name for t in graph.initializer}
    for v in list(graph.input) + list(graph.output):
        dot.node(v.name, f"{v.name}\\n{dims(v)}", shape="ellipse", style="filled", fillcolor="#ffffcc")
    producer = {out: node.name for node in graph.node for out in node.output}
    for node in graph.node:
        dot.node(node.name, node.op_type, shape="box", style="filled,rounded", fillcolor="#c6dbef")
        for name in node.input:
            if name not in weights:
                dot.edge(producer.get(name, name), node.name)
    for v in graph.output:
        dot.edge(producer[v.name], v.name)


pair = graphviz.Digraph(graph_attr={"rankdir": "TB"}, node_attr={"fontname": "Helvetica", "fontsize": "10"})
with pair.subgraph(name="cluster_ir", graph_attr={"label": "minigrad IR (traced)"}) as box:
    box.body += draw(fold_constants(traced_deploy.graph, freeze=True)).body
with pair.subgraph(name="cluster_onnx", graph_attr={"label": "ONNX file"}) as box:
    draw_onnx(loaded.graph, box)
pair

# %% [markdown]
# ## 5. Run it in onnxruntime
# An `InferenceSession` loads the file once; `run` takes numpy arrays by input name. The batch is
# free: one digit, a batch of 32, the whole test set. The outputs agree with minigrad's to float32
# rounding: the two sum the convolutions in different orders, so the logits differ by a few units
# in their seventh digit (a few 1e-6 here), and the predicted digits are the same.

# %%
session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
scale = np.abs(logits).max()
for n in (1, 32, len(Y_test)):
    (out,) = session.run(None, {"pixels": test_set.data[:n]})
    # The differences are a few float32 roundings, whose digits depend on the CPU's kernels: print the bound.
    close = np.abs(out - logits[:n]).max() < 1e-5 * scale
    print(f"batch {n:3d}: output {out.shape}, largest difference from minigrad under 1e-5 of the largest logit: {close}")
print("onnxruntime predicts the same digits as minigrad:", np.array_equal(out.argmax(1), logits.argmax(1)))

# %% [markdown]
# ## 6. What onnxruntime's optimiser does, and what it buys
# onnxruntime rewrites the graph when a session starts, at one of four levels: `ORT_DISABLE_ALL`
# runs the file as it is; `BASIC` folds constants and removes redundant nodes; `EXTENDED` adds
# fusions of several ops into one kernel (Conv + ReLU, Gemm + activation); `ALL` adds layout
# changes (NCHWc blocks for the CPU's vector units, hence the `ReorderOutput` back to NCHW).
# `optimized_model_filepath` saves the graph it ends up running. These are chapter 03's passes,
# done by the runtime.

# %%
LEVELS = ["ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"]
sessions = {}
for level in LEVELS:
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: not the warning that an ALL-level file is machine-specific
    options.optimized_model_filepath = str(workdir / f"{level}.onnx")
    sessions[level] = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    print(f"{level:<20}", [n.op_type for n in onnx.load(workdir / f"{level}.onnx").graph.node])


# %% [markdown]
# Now the time for the whole test set, the median of repeated runs, minigrad eager (under
# `no_grad`) beside each onnxruntime level. Timings on a shared machine are noisy: read the
# ratios, not the digits.

# %%
def median_time(fn, repeats=30):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def minigrad_eager():
    with minigrad.no_grad():
        deploy(X_test)


# NBVAL_IGNORE_OUTPUT
timings = {"minigrad eager": median_time(minigrad_eager)}
for level, s in sessions.items():
    timings[level.replace("ORT_", "ort ").replace("ENABLE_", "").lower()] = median_time(
        lambda s=s: s.run(None, {"pixels": test_set.data}))
for name, t in timings.items():
    print(f"{name:<18} {t * 1e3:7.2f} ms   {timings['minigrad eager'] / t:5.1f}x minigrad")

# %%
fig, ax = plt.subplots(figsize=(6, 2.4))
ax.barh(list(timings), [t * 1e3 for t in timings.values()], color=["#fdae6b"] + ["#6baed6"] * 4)
ax.invert_yaxis()
ax.set_xlabel(f"ms for {len(Y_test)} digits (median, 1 thread)")
plt.tight_layout()
plt.show()

# %% [markdown]
# ### Which call optimises a model file?
# A snippet that circulates calls `onnxruntime.tools.optimize_model(...)`. There is no such
# function. The graph rewrites above are chosen with `SessionOptions.graph_optimization_level`,
# and `optimized_model_filepath` saves their result, so a server can load the optimised file with
# optimisation off. `onnxruntime.transformers.optimizer.optimize_model` exists too, but it is a
# separate tool for transformer graphs (BERT, GPT-2...): it fuses attention, LayerNorm and GELU
# subgraphs, given the model type and head count.

# %%
import importlib.util
import inspect

import onnxruntime.tools
from onnxruntime.transformers import optimizer as transformers_optimizer

print("onnxruntime.tools.optimize_model exists:", hasattr(onnxruntime.tools, "optimize_model")
      or importlib.util.find_spec("onnxruntime.tools.optimize_model") is not None)
print("onnxruntime.transformers.optimizer.optimize_model",
      list(inspect.signature(transformers_optimizer.optimize_model).parameters)[:4], "...")
print("SessionOptions.graph_optimization_level:", LEVELS)

# %% [markdown]
# ### ONNX's neighbours: TorchScript and SavedModel
# ONNX is not the only way out of a framework. Each big framework also has its own format, which
# keeps more of the program and runs only on that framework's runtime:
#
# | format | what the file holds | made by | runs on |
# | --- | --- | --- | --- |
# | ONNX | a static graph of standard, versioned ops (opsets) and the weights | exporters from any framework (minigrad's trace, above) | onnxruntime, TensorRT, OpenVINO, browsers... |
# | TorchScript | a PyTorch program in a typed subset of Python, with the weights, in a zip | `torch.jit.trace` (records one run, as minigrad does) or `torch.jit.script` (compiles the source, control flow included) | libtorch: PyTorch's C++ runtime, no Python needed |
# | SavedModel | a TensorFlow graph of its functions, with named, typed *signatures*, plus a `variables/` folder | `tf.saved_model.save` | TF Serving, TF Lite and TF.js after conversion |
#
# TorchScript keeps loops and branches that a trace would unroll, and PyTorch now puts it in
# maintenance in favour of `torch.export`. SavedModel can keep a model's training functions
# too. ONNX gives up both for one standard op set that many runtimes implement.
#
# ## 7. What the exporter refuses
# Whatever follows the batch only through a reshape or a broadcast exports with a dynamic batch.
# A value built from the batch size as a *number* does not: `minigrad.ones(x.shape[0], 10)` is a
# constant in the trace, one that changed between the two traces, and the exporter names it.

# %%
try:
    export_onnx(lambda x: deploy(x) + minigrad.ones(x.shape[0], 10), X_test[:4], workdir / "bad.onnx",
                dynamic_axes={"x": {0: "batch"}})
except Exception as e:
    print(f"{type(e).__name__}: {e}")

# %% [markdown]
# Each op class says why it has no ONNX translation (`onnx_refused`, beside its `onnx` emitter),
# and the exporter's error quotes it. Today's list: gradient ops only meet inference graphs by
# mistake, tensor-parallel communication has no meaning in a single-device file, and the rest are
# emitters nobody has written yet.

# %%
for op in sorted((op for op in all_ops() if op.onnx is None), key=lambda op: (op.onnx_refused, op.__name__)):
    print(f"{op.__name__:<20} {op.onnx_refused}")

# %% [markdown]
# ## Predict, then run
# 1. Export without `dynamic_axes` and run the file on one digit: what does onnxruntime say?
# 2. The model flattens with `nn.Flatten()`. Writing `x.reshape(x.shape[0], -1)` instead: does the
#    exported `Reshape` target change?
# 3. At `ORT_ENABLE_EXTENDED`, how many nodes does onnxruntime run, and why fewer than the file has?

# %%
fixed_path = workdir / "fixed.onnx"
export_onnx(deploy, X_test[:4], fixed_path)
try:
    ort.InferenceSession(fixed_path, providers=["CPUExecutionProvider"]).run(None, {"input": test_set.data[:1]})
except Exception as e:
    print("1.", type(e).__name__, str(e).splitlines()[0][:160])


class ReshapeCNN(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        h = self.body[:8](x)
        return self.body[9](h.reshape(h.shape[0], -1))


other = export_onnx(ReshapeCNN(deploy), X_test[:4], workdir / "reshape.onnx", dynamic_axes={"x": {0: "batch"}})
target = lambda m: [onnx.numpy_helper.to_array(t).tolist() for t in m.graph.initializer  # noqa: E731
                    if t.name == next(n for n in m.graph.node if n.op_type == "Reshape").input[1]]
print("2. Reshape target:", target(exported), "and", target(other), "(the same: the batch dim became -1)")
print("3.", len(onnx.load(workdir / "ORT_ENABLE_EXTENDED.onnx").graph.node), "nodes instead of",
      len(loaded.graph.node), "(each Conv and the ReLU after it are one FusedConv kernel)")
