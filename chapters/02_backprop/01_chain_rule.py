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
# # 02.1 The chain rule, by hand and by the engine
#
# **Question:** what exactly does `loss.backward()` compute, and in which order?
#
# We answer it on the smallest network that has every ingredient of a real one, a 3-layer
# perceptron with one hidden layer of two sigmoid units:
#
# $$z = W_1 x + b_1,\qquad h = \sigma(z),\qquad y = W_2 h + b_2,\qquad L = \tfrac12 (y - t)^2 .$$
#
# First with pencil-and-paper numbers, then with minigrad, then we watch the engine do it.
#
# **You will:** compute a forward and a backward pass by hand with the chain rule; check every
# gradient against `loss.backward()`; read the graph autograd recorded; watch the engine visit
# the nodes in topological order; see why a value used twice gets the sum of two gradients; then
# backpropagate through a batched ReLU network yourself, with a check after every gradient.
# **Time:** about 19 minutes (18 reading, 3 s running).

# %%
import numpy as np

import minigrad
from minigrad.autograd import topological_order
from minigrad.graph import draw

np.set_printoptions(precision=4, suppress=True)

x = np.array([1.0, 2.0])
W1 = np.array([[0.1, -0.2], [0.3, 0.4]])
b1 = np.array([0.0, 0.1])
W2 = np.array([[0.5, -0.6]])
b2 = np.array([0.2])
t = np.array([1.0])

# %% [markdown]
# ## Forward pass by hand
# Each line is one node of the graph; we keep every intermediate value, because the backward
# pass needs them.

# %%
def sigma(a):
    return 1 / (1 + np.exp(-a))


z = W1 @ x + b1
h = sigma(z)
y = W2 @ h + b2
L = 0.5 * ((y - t) ** 2).sum()
print("z =", z, " h =", h, " y =", y, " L =", round(L, 4))

# %% [markdown]
# ## Backward pass by hand
# The chain rule, read from the loss back to the inputs: every gradient is the gradient that
# arrives from above times the *local* derivative of one node. The only local derivatives we need:
# $\partial L/\partial y = y - t$, $\partial (W h)/\partial h = W^\top$, $\partial (W h)/\partial W = (\cdot)\, h^\top$
# and $\sigma'(z) = \sigma(z)(1 - \sigma(z))$.

# %%
dy = y - t                    # dL/dy
dW2 = np.outer(dy, h)         # dL/dW2 = dy h^T
db2 = dy                      # dL/db2
dh = W2.T @ dy                # dL/dh  = W2^T dy
dz = dh * h * (1 - h)         # dL/dz  = dh * sigma'(z)
dW1 = np.outer(dz, x)         # dL/dW1 = dz x^T
db1 = dz                      # dL/db1
print("dL/dy  =", dy)
print("dL/dh  =", dh)
print("dL/dz  =", dz)
print("dL/dW1 =\n", dW1)
print("dL/dW2 =", dW2, " dL/db1 =", db1, " dL/db2 =", db2)

# %% [markdown]
# Notice the order: we could not compute `dz` before `dh`, nor `dh` before `dy`. Backward runs
# the forward pass in reverse, and each step reuses a value (`h`, `x`) saved from the forward pass.
#
# ## The same numbers from minigrad
# We mark the weights as leaves that require gradients, write the forward pass once, and call
# `backward()`. Float64 so that the comparison is exact to the last digits.

# %%
f64 = minigrad.float64
xt, tt = minigrad.tensor(x, dtype=f64), minigrad.tensor(t, dtype=f64)
W1t = minigrad.tensor(W1, dtype=f64, requires_grad=True)
b1t = minigrad.tensor(b1, dtype=f64, requires_grad=True)
W2t = minigrad.tensor(W2, dtype=f64, requires_grad=True)
b2t = minigrad.tensor(b2, dtype=f64, requires_grad=True)

Lt = 0.5 * ((W2t @ (W1t @ xt + b1t).sigmoid() + b2t - tt) ** 2).sum()
Lt.backward()
print("L =", Lt)
for name, ours, theirs in [("W1", dW1, W1t), ("b1", db1, b1t), ("W2", dW2, W2t), ("b2", db2, b2t)]:
    print(f"d L / d {name}: matches the hand computation: {np.allclose(ours, theirs.grad.numpy(), rtol=1e-12)}")

# %% [markdown]
# ## The graph, with the gradients on it
# `minigrad.graph.draw` draws what autograd recorded: boxes are ops, blue ellipses the leaves
# that require gradients (with their `.grad` after backward), grey ellipses constants (`x`, `t`),
# edges labelled with the shape that flows along them.

# %%
draw(Lt, show_grads=True, names={"W1": W1t, "b1": b1t, "W2": W2t, "b2": b2t, "L": Lt})

# %% [markdown]
# ## How the engine walks the graph
# Each op node points to the nodes that produced its inputs (`next_functions`). The engine sorts
# the nodes reachable from the loss in **topological order**, every node before the nodes it
# depends on, so that a node runs only after all its consumers have sent their gradient to it.

# %%
order = topological_order([Lt.grad_fn])
print(" -> ".join(n.name() for n in order))

# %% [markdown]
# To watch the gradient flow, we rebuild the graph and put a hook on every node; a node's
# pre-hook sees the gradient arriving at its output just before its `backward` runs.

# %%
def fmt(g):
    return np.array2string(np.asarray(g.numpy()).reshape(-1), precision=4, separator=", ")


W1t.grad = b1t.grad = W2t.grad = b2t.grad = None
Lt = 0.5 * ((W2t @ (W1t @ xt + b1t).sigmoid() + b2t - tt) ** 2).sum()
leaf_names = {id(W1t): "W1", id(b1t): "b1", id(W2t): "W2", id(b2t): "b2"}
for step, node in enumerate(topological_order([Lt.grad_fn])):
    label = f"AccumulateGrad({leaf_names[id(node.variable)]})" if hasattr(node, "variable") else node.name()
    node.register_prehook(lambda grads, step=step, label=label: print(f"{step:2d}  {label:22s} receives {fmt(grads[0])}"))
Lt.backward()

# %% [markdown]
# Read it top to bottom: `Sub` receives $y - t = -1.0483$, `Sigmoid` receives $\partial L/\partial h$
# and passes on $\partial L/\partial z$, and each leaf's `AccumulateGrad` stores what reaches it in
# `.grad`. These are the numbers of the hand computation, in the same order.
#
# ## A value used twice
# When a tensor feeds two ops, its node has two consumers and the gradients from both are summed
# (the multivariate chain rule). Topological order guarantees that both have arrived before the
# node runs.

# %%
a = minigrad.tensor(3.0, requires_grad=True)
b = a * a + a          # a is used by Mul (twice) and by Add
b.backward()
print("d(a^2 + a)/da at a = 3:", a.grad.item(), "(2a + 1 = 7)")
draw(b)

# %% [markdown]
# ## Predict, then run
# 1. Add 1 to the target `t` and run the forward and backward pass again. By how much does
#    $\partial L/\partial b_2$ change?
# 2. In `b = a * a + a` the leaf `a` feeds three edges. How many times does its `AccumulateGrad`
#    node run during `b.backward()`?
# 3. What is the local derivative of the sigmoid at $z = 0$, and where does $\sigma'$ peak?

# %%
b2_fresh = minigrad.tensor(b2, dtype=f64, requires_grad=True)  # b2t's node still carries the hook above
Lt = 0.5 * ((W2t @ (W1t @ xt + b1t).sigmoid() + b2_fresh - (tt + 1)) ** 2).sum()
(db2_shifted,) = minigrad.grad(Lt, b2_fresh)
print("1. dL/db2 went from", db2, "to", db2_shifted.numpy(), "= (y - t): it falls by exactly 1")
a = minigrad.tensor(3.0, requires_grad=True)
b = a * a + a
visits = []
topological_order([b.grad_fn])[-1].register_prehook(lambda grads: visits.append(grads[0].item()))
b.backward()
print("2. AccumulateGrad(a) ran", len(visits), "time(s), receiving", visits, ": the three edges are summed first")
z0 = minigrad.zeros(5, dtype=f64, requires_grad=True)
(z0 + minigrad.tensor([-2.0, -1.0, 0.0, 1.0, 2.0], dtype=f64)).sigmoid().sum().backward()
print("3. sigma'(z) at z = -2, -1, 0, 1, 2:", z0.grad.numpy().round(4), "(peak 1/4 at 0)")

# %% [markdown]
# ## Drill: backprop by hand, checked as you go
# Now you do it, on a batch and with a ReLU. Five inputs of size 3 go through a hidden layer of 4
# ReLU units to 2 outputs, with the mean squared error over the batch:
#
# $$Z_1 = X W_1 + b_1,\quad H = \operatorname{relu}(Z_1),\quad Y = H W_2 + b_2,\quad
#   L = \tfrac{1}{2N}\textstyle\sum (Y - T)^2 .$$
#
# The forward pass is given; minigrad's autograd computes the reference gradients, which the check
# compares with yours, in backward order, stopping at the first gradient that is missing or wrong
# (it names it, gives the shape it must have and a hint).

# %%
rng = np.random.default_rng(0)
N = 5
X, T = rng.standard_normal((N, 3)), rng.standard_normal((N, 2))
W1, b1 = rng.standard_normal((3, 4)), rng.standard_normal(4)
W2, b2 = rng.standard_normal((4, 2)), rng.standard_normal(2)

Z1 = X @ W1 + b1
H = np.maximum(Z1, 0)
Y = H @ W2 + b2
L = 0.5 * ((Y - T) ** 2).sum() / N

params = {name: minigrad.tensor(v, dtype=f64, requires_grad=True) for name, v in
          [("W1", W1), ("b1", b1), ("W2", W2), ("b2", b2)]}
Z1t = minigrad.tensor(X, dtype=f64) @ params["W1"] + params["b1"]
Ht = Z1t.relu()
Yt = Ht @ params["W2"] + params["b2"]
for node in (Z1t, Ht, Yt):
    node.retain_grad()  # keep the gradients of the intermediate tensors too, not only the leaves'
(0.5 * ((Yt - minigrad.tensor(T, dtype=f64)) ** 2).sum() / N).backward()
reference = {"dY": Yt.grad, "db2": params["b2"].grad, "dW2": params["W2"].grad, "dH": Ht.grad,
             "dZ1": Z1t.grad, "db1": params["b1"].grad, "dW1": params["W1"].grad}
HINTS = {
    "dY": "differentiate 0.5 * (Y - T)**2 and keep the 1/N of the mean",
    "db2": "b2 was broadcast over the N rows of the batch: sum dY over axis 0",
    "dW2": "Y = H @ W2, so dW2 = H^T @ dY (the shapes allow one product only)",
    "dH": "Y = H @ W2, so dH = dY @ W2^T",
    "dZ1": "relu routes: dH where Z1 > 0, zero where it was cut",
    "dW1": "Z1 = X @ W1, so dW1 = X^T @ dZ1",
    "db1": "sum dZ1 over the batch, as for db2",
}


def check_drill(answers):
    """Check the drill's gradients in backward order; stop at the first one that is missing or wrong."""
    for name, hint in HINTS.items():
        want, got = reference[name].numpy(), answers.get(name)
        if got is None:
            print(f"... {name} is not filled in yet: it has shape {want.shape}. Hint: {hint}")
            return
        got = np.asarray(got.numpy() if hasattr(got, "numpy") else got, dtype=np.float64)
        if got.shape != want.shape:
            print(f"WRONG {name}: shape {got.shape}, expected {want.shape}. Hint: {hint}")
            return
        if not np.allclose(got, want, rtol=1e-9, atol=1e-12):
            wrong = int((~np.isclose(got, want, rtol=1e-9, atol=1e-12)).sum())
            print(f"WRONG {name}: shape {want.shape} is right, {wrong} of {want.size} entries are not. Hint: {hint}")
            return
        print(f"ok    {name} {want.shape}")
    print("All seven gradients are right.")


# %% [markdown]
# Your cell. Every line ending in `# answer` is a solution: delete those lines (the first line sets
# every gradient back to `None`) and write your own, one gradient at a time, running this cell and
# the check after each. Use only numpy and the forward values `X, Z1, H, Y, T, W1, W2, N`.

# %%
# ==================== DRILL: your gradients (erase the lines marked "# answer") ====================
dY = db2 = dW2 = dH = dZ1 = dW1 = db1 = None

dY = (Y - T) / N                  # answer
db2 = dY.sum(axis=0)              # answer
dW2 = H.T @ dY                    # answer
dH = dY @ W2.T                    # answer
dZ1 = dH * (Z1 > 0)               # answer
dW1 = X.T @ dZ1                   # answer
db1 = dZ1.sum(axis=0)             # answer

# %%
check_drill({"dY": dY, "db2": db2, "dW2": dW2, "dH": dH, "dZ1": dZ1, "dW1": dW1, "db1": db1})

# %% [markdown]
# What the check says for two classic slips: a bias gradient left unsummed, and the ReLU mask
# forgotten.

# %%
check_drill({"dY": dY, "db2": dY})
print()
check_drill({"dY": dY, "db2": db2, "dW2": dW2, "dH": dH, "dZ1": dH})
