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
# # 03.1 Graph optimisation: passes that rewrite a traced graph
#
# **Question:** once a function is traced into a static graph, what can we rewrite before running
# it, and what does each rewrite buy?
#
# Eager execution sees one op at a time: it cannot know whether a value will be used, whether it
# was computed before, or whether an op changes nothing. A traced graph is the whole program, so a
# compiler can answer those questions first. Each *pass* below is a function `Graph -> Graph` from
# `minigrad.graph.passes` that returns a new, cheaper graph computing the same values.
#
# **You will:** remove dead code, fold constants, merge common subexpressions and apply exact
# algebraic identities on a traced layer, then fold a BatchNorm into the convolution before it for
# inference, reading each pass's effect in the graph.
# **Time:** about 14 minutes (13 reading, 3 s running).
# Fusion, the pass that changes how the remaining work runs, is lesson 03.6.

# %%
import difflib
import math

import numpy as np
from IPython.display import display

import minigrad
from minigrad import nn
from minigrad.graph import draw, trace
from minigrad.graph.passes import (PassManager, default_passes, eliminate_common_subexpressions, eliminate_dead_code,
                                   fold_constants, fold_conv_bn, simplify)
from minigrad.graph.trace import run_graph
from minigrad.graph.viz import draw_pair

minigrad.manual_seed(0)

# %% [markdown]
# ## 1. Why a static graph
# A small layer: scores plus a fixed positional bias, divided by a temperature, then a softmax
# over the last axis. It is written the way code often is: a sanity check on the input, the bias
# recomputed at every call, `exp` written twice. We trace it and read the graph as a compiler
# would.

# %%
positions = minigrad.arange(8) / 8  # fixed: not an input, not a parameter


def scores(x, temperature=1.0):
    if x.abs().max() > 100:  # a check Python evaluates once, at trace time
        print("large scores")
    bias = (positions * math.pi).sin()
    h = (x + bias) / temperature
    return h.exp() / h.exp().sum(-1, keepdim=True)


x = minigrad.randn(4, 8)
traced = trace(scores, x)
print(traced.graph)
draw(traced.graph)

# %% [markdown]
# Four wastes are visible in the graph: `Abs`, `Amax`, `Greater` compute the check, whose result
# nothing reads any more; `Mul`, `Sin` compute the bias from a constant, the same at every call;
# `Exp(%8)` appears twice; and the division by `1.0` changes nothing. Each pass below removes one
# of them. To see what a pass did, `compare` prints the lines of the listing it removed (`-`) and
# added (`+`), and draws the graph before and after with those nodes outlined in red
# (`minigrad.graph.viz.draw_pair`).

# %%
def compare(graph, graph_pass):
    """Run one pass; print the listing's changed lines and draw before and after."""
    new = graph_pass(graph)
    print(f"{graph_pass.__name__}: {len(graph)} -> {len(new)} nodes")
    for line in difflib.unified_diff(str(graph).splitlines(), str(new).splitlines(), n=0, lineterm=""):
        if not line.startswith(("---", "+++", "@@")):
            print(" ", line)
    display(draw_pair(graph, new))
    return new


# %% [markdown]
# ## 2. Dead code elimination
# A node is *live* when its value reaches the output or a side effect (an in-place write, a
# `.grad`); `eliminate_dead_code` walks back from those along the in-edges and drops everything
# else. Placeholders stay (they are the graph's signature), and so do random ops: a dropout
# nobody reads still advances the random generator.

# %%
g1 = compare(traced.graph, eliminate_dead_code)

# %% [markdown]
# ## 3. Constant folding
# A node whose inputs are all constants has the same value at every run, so `fold_constants`
# runs it once, now, and keeps the result as a `constant`. Parameters are not constants, since an
# optimizer changes them between calls; `fold_constants(graph, freeze=True)` treats them as
# constants for inference (section 6).

# %%
g2 = compare(g1, fold_constants)

# %% [markdown]
# ## 4. Common subexpression elimination
# Two nodes applying the same op to the same inputs with the same attributes compute the same
# value; `eliminate_common_subexpressions` keeps the first and points the users of the second at
# it. In traced training steps this matters more than here: backward often recomputes what
# forward had. Random ops never merge (two dropouts draw two masks).

# %%
g3 = compare(g2, eliminate_common_subexpressions)

# %% [markdown]
# ## 5. Algebraic simplification
# `simplify` applies exact identities only: `x*1`, `x+0`, `x/1`, `-(-x)`, a cast to the same
# dtype, a reshape to the same shape, two transposes that cancel. `x*0` is not among them: it is
# `NaN` when `x` is `inf` or `NaN`. An identity holds only when the op changes neither shape nor
# dtype (`x*1` with a larger `1` broadcasts `x`).

# %%
g4 = compare(g3, simplify)
x = minigrad.randn(4, 8)
np.testing.assert_allclose(run_graph(g4, [x])[0], scores(x).numpy(), rtol=1e-6)
print(f"{len(traced.graph)} nodes traced, {len(g4)} after four passes; same result")

# %% [markdown]
# `default_passes()` runs the same passes in a good order (folding first, since it makes
# constants for CSE to merge, and dead code last, to sweep up what the others left).
#
# %% [markdown]
# ## 6. Folding Conv + BatchNorm for inference
# In evaluation mode BatchNorm is an affine map per channel, `y * s + t` with
# $s = \gamma / \sqrt{\sigma^2_{\text{running}} + \epsilon}$ and $t = \beta - \mu_{\text{running}}\, s$.
# Applied to a convolution's output $y = W * x + b$ it gives $(W s) * x + (b s + t)$: the same
# convolution with each output channel's filter scaled, and a new bias. `fold_conv_bn(model)`
# does this on the modules:

# %%
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
for _ in range(5):  # a few training batches, so the running statistics are not 0 and 1
    model(minigrad.randn(16, 3, 8, 8) * 2 + 1)
model.eval()
folded_model = fold_conv_bn(model)
print(folded_model)
images = minigrad.randn(2, 3, 8, 8)
with minigrad.no_grad():
    np.testing.assert_allclose(folded_model(images).numpy(), model(images).numpy(), rtol=1e-5, atol=1e-5)
print("outputs match")

# %% [markdown]
# On a traced graph the same happens in passes: `default_passes(freeze=True)` folds the
# parameters into constants, so BatchNorm's scale and shift become one array each, and
# `fold_batch_norm` merges them into the convolution. With `verbose=True` the `PassManager`
# prints what each pass changed:

# %%
with minigrad.no_grad():
    traced_cnn = trace(lambda x: model(x), images)
inference = PassManager(default_passes(freeze=True), verbose=True)(traced_cnn.graph)

# %%
print(inference)
with minigrad.no_grad():
    np.testing.assert_allclose(run_graph(inference, [images])[0], model(images).numpy(), rtol=1e-5, atol=1e-5)
draw_pair(traced_cnn.graph, inference)

# %% [markdown]
# ## What the passes buy
# - **Less work at every call.** Dead code, a value computed from constants, and a value computed
#   twice each cost time on every call of the eager function; on the graph they cost nothing after
#   one rewrite.
# - **Only exact rewrites.** Every pass keeps the values, bit for bit or within rounding (BN
#   folding); `x*0` stays, because it is `NaN` when `x` is. Treating parameters as constants has
#   to be asked for (`freeze=True`).
# - **What they cannot see.** Python control flow was decided at trace time (the check of
#   section 1 is gone from the graph), so a traced graph is only valid for inputs that take the
#   same branches.
#
# ## Predict, then run
# 1. `fold_constants` on `f(x) = x + minigrad.ones(3).sum()`: which ops are left between the
#    input and the output?
# 2. Two dropouts with the same probability on the same input, in a training-mode trace: does
#    `eliminate_common_subexpressions` merge them?
# 3. `simplify` on `f(x) = x * ones` where `ones` is `minigrad.ones(2, 3)` and `x` has shape
#    `(3,)`: is the multiplication removed?

# %%
ones = minigrad.ones(3)
folded = fold_constants(trace(lambda x: x + ones.sum(), minigrad.randn(3)).graph)
print("1.", [n.op for n in folded if n.op not in ("placeholder", "constant", "output")],
      "(the sum is folded into a constant)")
both = trace(lambda x: nn.functional.dropout(x, 0.5) + nn.functional.dropout(x, 0.5), minigrad.randn(3)).graph
merged = eliminate_common_subexpressions(both)
print("2. dropouts before and after CSE:", sum(n.op == "Dropout" for n in both),
      sum(n.op == "Dropout" for n in merged), "(random ops never merge)")
wide = minigrad.ones(2, 3)
kept = simplify(trace(lambda x: x * wide, minigrad.randn(3)).graph)
print("3. ops after simplify:", [n.op for n in kept if n.op not in ("placeholder", "constant", "output")],
      "(x * ones(2, 3) broadcasts x to (2, 3): not an identity)")
