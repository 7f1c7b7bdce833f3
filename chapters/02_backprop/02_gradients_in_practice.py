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
# # 02.2 Gradients in practice: broadcasting, checking, accumulating
#
# Three questions every framework user meets sooner or later:
# 1. A bias of shape `(3,)` is added to a batch of shape `(4, 3)`. Why is its gradient of shape `(3,)`?
# 2. How do we know a backward rule is right?
# 3. What happens to `.grad` when `backward()` is called twice, and how does that buy large batches?
#
# **You will:** derive why a broadcast input's gradient is summed, check gradients with finite
# differences and choose their step, catch a wrong backward rule with `gradcheck`, accumulate
# gradients over micro-batches, and see a shared weight's gradient summed.
# **Time:** about 23 minutes (22 reading, 6 s running).

# %%

import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad.autograd import Function, GradcheckError, gradcheck

np.set_printoptions(precision=4, suppress=True)
f64 = minigrad.float64
minigrad.manual_seed(0)

# %% [markdown]
# ## 1. Broadcasting, and why gradients are summed back
# In `X + b`, numpy-style broadcasting uses the same `b` in every row. Each of those copies
# contributes to the loss, so by the multivariate chain rule `b`'s gradient is the **sum** of
# the gradients of its copies. We give each output element its own upstream gradient `G` to see it.

# %%
X = minigrad.arange(12, dtype=f64).reshape(4, 3)
b = minigrad.tensor([10.0, 20.0, 30.0], dtype=f64, requires_grad=True)
G = minigrad.arange(1, 13, dtype=f64).reshape(4, 3)  # upstream gradient, one value per output

out = X + b                                   # b is broadcast from (3,) to (4, 3)
out.register_hook(lambda g: print("gradient arriving at X + b:", tuple(g.shape)))
out.backward(G)
print("b.grad:", b.grad.numpy(), "  shape", tuple(b.grad.shape))
print("G summed over the batch dim:", G.numpy().sum(axis=0))

# %% [markdown]
# The rule is the same for every broadcast: sum over the dimensions that were added in front and
# over those that were stretched from 1. Here `u` (4, 1) times `v` (1, 3) is an outer product;
# each gets the gradient summed over the other's dimension.

# %%
u = minigrad.tensor([[1.0], [2.0], [3.0], [4.0]], dtype=f64, requires_grad=True)
v = minigrad.tensor([[1.0, 10.0, 100.0]], dtype=f64, requires_grad=True)
(u * v).backward(G)
print("u.grad:", u.grad.numpy().ravel(), "= (G * v).sum(1):", (G.numpy() * v.detach().numpy()).sum(1))
print("v.grad:", v.grad.numpy().ravel(), "= (G * u).sum(0):", (G.numpy() * u.detach().numpy()).sum(0))

# %% [markdown]
# minigrad does this in one place, the engine, with `minigrad.ops.sum_to(g, shape)`, for every op:
# that is why `Add.backward` is just `return g, g`.

# %%
print(minigrad.ops.sum_to(G, (3,)).numpy(), minigrad.ops.sum_to(G, (4, 1)).numpy().ravel())

# %% [markdown]
# ### One rule, two bindings
# A built-in rule is written once, against `ctx.ops`: operators plus a few functions
# (`ctx.ops.where`, `ctx.ops.sum_to`, `ctx.ops.apply(OtherOp, ...)`). The engine binds `ctx.ops`
# to raw numpy arrays when nobody records the backward pass (a plain `backward()`), and to
# minigrad's differentiable ops when it is recorded (`create_graph=True`, or any mode on the
# stack), so the same lines give fast first derivatives and a graph for second ones. Here is one
# rule, run both ways.

# %%
from minigrad.autograd.mode import Mode
from minigrad.ops.op import Op


class Cube(Op):
    onnx_refused = "a lesson's example"

    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a * a * a

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        print(f"  g is a {type(g).__name__}; ctx.ops is the {'array' if ctx.ops.arrays else 'Tensor'} binding")
        return 3 * g * a * a


x3 = minigrad.tensor([1.0, -2.0], dtype=f64, requires_grad=True)
print("backward(), nobody records:")
Cube.apply(x3).sum().backward()
print("grad(create_graph=True), the backward pass is recorded:")
(g3,) = minigrad.autograd.grad(Cube.apply(x3).sum(), [x3], create_graph=True)
print("same gradient both ways:", x3.grad.numpy(), g3.detach().numpy())

# %% [markdown]
# On arrays the rule builds no Tensor and no graph node, which is most of what a backward pass of
# small ops costs. The same 150-op backward, timed with the binding forced to Tensors (an empty
# mode on the stack) and left to arrays:

# %%
# NBVAL_IGNORE_OUTPUT
import contextlib
import time


def backward_ms(recorded: bool, repeats: int = 30) -> float:
    x = minigrad.randn(16, requires_grad=True)
    times = []
    for _ in range(repeats):
        y = x
        for _ in range(50):
            y = (y * 0.9).tanh() + 0.1
        loss = y.sum()
        start = time.perf_counter()
        with Mode() if recorded else contextlib.nullcontext():
            loss.backward()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


on_tensors, on_arrays = backward_ms(True), backward_ms(False)
print(f"backward of 150 small ops: {on_tensors:.2f} ms on Tensors, {on_arrays:.2f} ms on arrays: "
      f"{on_tensors / on_arrays:.1f}x faster when nobody records")

# %% [markdown]
# ## 2. Gradient checking with finite differences
# A derivative is a limit: $f'(w) \approx \dfrac{f(w + \varepsilon) - f(w - \varepsilon)}{2\varepsilon}$.
# We take the loss of the 3-layer perceptron of 02.1 as a function of its weights and compare one
# element of the analytical gradient with that central difference.

# %%
x = minigrad.tensor([1.0, 2.0], dtype=f64)
t = minigrad.tensor([1.0], dtype=f64)
W1 = minigrad.tensor([[0.1, -0.2], [0.3, 0.4]], dtype=f64, requires_grad=True)
b1 = minigrad.tensor([0.0, 0.1], dtype=f64, requires_grad=True)
W2 = minigrad.tensor([[0.5, -0.6]], dtype=f64, requires_grad=True)
b2 = minigrad.tensor([0.2], dtype=f64, requires_grad=True)


def loss(W1, b1, W2, b2):
    h = (W1 @ x + b1).sigmoid()
    return 0.5 * ((W2 @ h + b2 - t) ** 2).sum()


loss(W1, b1, W2, b2).backward()
analytic = W1.grad[0, 0].item()


def loss_at(w00):
    W = W1.detach().numpy().copy()
    W[0, 0] = w00
    return loss(minigrad.tensor(W, dtype=f64), b1, W2, b2).item()


eps = 1e-6
central = (loss_at(0.1 + eps) - loss_at(0.1 - eps)) / (2 * eps)
print(f"analytic {analytic:.8f}   central difference {central:.8f}")

# %% [markdown]
# How small should $\varepsilon$ be? The truncation error of the one-sided difference
# $(f(w+\varepsilon) - f(w))/\varepsilon$ falls like $\varepsilon$, that of the central one like
# $\varepsilon^2$; but below some $\varepsilon$ the float64 round-off in the subtraction,
# about $10^{-16}/\varepsilon$, takes over.

# %%
epsilons = np.logspace(-1, -13, 25)


def loss_with(i, j, w):
    W = W1.detach().numpy().copy()
    W[i, j] = w
    return loss(minigrad.tensor(W, dtype=f64), b1, W2, b2).item()


def worst_error(difference):
    """The largest |numerical - analytic| over the four weights of W1, as a gradient check reports it."""
    return max(abs(difference(i, j, W1[i, j].item()) - W1.grad[i, j].item()) for i in range(2) for j in range(2))


forward_err = [worst_error(lambda i, j, w: (loss_with(i, j, w + e) - loss_with(i, j, w)) / e) for e in epsilons]
central_err = [worst_error(lambda i, j, w: (loss_with(i, j, w + e) - loss_with(i, j, w - e)) / (2 * e))
               for e in epsilons]

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.loglog(epsilons, forward_err, "o-", label="forward difference")
ax.loglog(epsilons, central_err, "s-", label="central difference")
ax.set_xlabel("epsilon")
ax.set_ylabel("largest |numerical - analytic|")
ax.invert_xaxis()
ax.legend()
ax.set_title("finite-difference error, worst of W1's four weights")
plt.show()
best_forward, best_central = min(forward_err), min(central_err)
# The minima sit where round-off takes over, which differs with the CPU and its libm (one weight's
# best forward error was 7e-11 on one x86 machine, 6e-10 on another): print the bands they keep.
print("best central error below 1e-10:", best_central < 1e-10)
print("best forward error above 1e-9: ", best_forward > 1e-9)
print("central at least 100x better:  ", best_forward > 100 * best_central)

# %% [markdown]
# The central difference is best near $\varepsilon \approx 10^{-5}$, with errors around $10^{-11}$;
# the forward one, best near $10^{-8}$, stays above $10^{-9}$: a hundred times worse or more. Below
# its best $\varepsilon$, a smaller one only adds round-off. The gap grows with the curvature: the
# forward difference's error is first order in $\varepsilon$, the central one's second order. This
# is why gradient checks run in float64, with $\varepsilon \approx 10^{-6}$ and a tolerance.
#
# `minigrad.autograd.gradcheck(fn, inputs)` does this for every element of every input and every
# output, and compares whole Jacobians.

# %%
print(gradcheck(loss, (W1, b1, W2, b2)))

# %% [markdown]
# ### Catching a wrong backward rule
# A custom op is a `Function` with a `forward` and a `backward`. Here is a sigmoid whose backward
# forgets the factor $(1 - \sigma)$: everything runs, the loss even goes down for a while,
# but the gradients are wrong. `gradcheck` says so, and names the worst element.

# %%
class BrokenSigmoid(Function):
    @staticmethod
    def forward(ctx, a):
        y = 1 / (1 + (-a).exp())
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y                  # wrong: sigma' = y * (1 - y)


z = minigrad.tensor([-1.0, 0.0, 2.0], dtype=f64, requires_grad=True)
try:
    gradcheck(BrokenSigmoid.apply, (z,))
except GradcheckError as e:
    print(str(e).splitlines()[0])

# %% [markdown]
# Fixing the rule to `g * y * (1 - y)` makes the check pass (exercise 3 of this chapter).
#
# ## 3. Gradient accumulation
# `backward()` **adds** into `.grad`; it never overwrites. Calling it twice doubles the gradient,
# which is why training loops call `zero_grad()` before every step.

# %%
w = minigrad.tensor([1.0, 2.0], dtype=f64, requires_grad=True)
for call in range(3):
    (w * w).sum().backward()
    print(f"after backward #{call + 1}: w.grad = {w.grad.numpy()}")
w.grad = None                         # what optimizer.zero_grad() does

# %% [markdown]
# That addition is a feature: a batch too large for memory can be split into micro-batches,
# each backward adding its share. With a mean loss, scale each micro-batch loss by
# `1 / n_micro` and the accumulated gradient equals the full-batch gradient: $k$ micro-batches of
# $n$ give the gradient of one batch of $kn$, with the memory of a batch of $n$ (the
# *effective* batch size is $kn$).

# %%
data_x = minigrad.randn(32, 5, dtype=f64)
data_y = minigrad.randn(32, 1, dtype=f64)
model = minigrad.nn.Linear(5, 1).double()

model.zero_grad()
minigrad.nn.functional.mse_loss(model(data_x), data_y).backward()
full = [p.grad.numpy().copy() for p in model.parameters()]

model.zero_grad()
n_micro = 4
for xb, yb in zip(data_x.split(8), data_y.split(8)):
    (minigrad.nn.functional.mse_loss(model(xb), yb) / n_micro).backward()
accumulated = [p.grad.numpy() for p in model.parameters()]
print("4 micro-batches of 8 give the batch-32 gradient:",
      all(np.allclose(a, f, rtol=1e-12, atol=1e-15) for a, f in zip(accumulated, full)))

# %% [markdown]
# ### Shared weights: the same sum, inside one backward
# You may read that accumulation "is for RNNs". Across `backward()` calls it is for effective
# batches larger than memory, as above. What RNNs need is the other sum: a weight *used twice in
# one graph* gets the sum of the gradients of its uses, because the engine adds every path's
# contribution into one `.grad`. An RNN is one case (the same `W` at every time step); tied
# embeddings and siamese networks are others. Below, `W` is applied twice (an RNN unrolled two
# steps), and then the same net is built with two separate copies of it.

# %%
W = minigrad.tensor([[0.5, -1.0], [2.0, 0.3]], dtype=f64, requires_grad=True)
x0 = minigrad.tensor([1.0, 2.0], dtype=f64)
(W @ (W @ x0).tanh()).tanh().sum().backward()  # one backward call, W used at two steps

W_1 = minigrad.tensor(W.detach().numpy().copy(), dtype=f64, requires_grad=True)  # the first use
W_2 = minigrad.tensor(W.detach().numpy().copy(), dtype=f64, requires_grad=True)  # the second
(W_2 @ (W_1 @ x0).tanh()).tanh().sum().backward()
print("W.grad:            ", np.round(W.grad.numpy(), 4).tolist())
print("W_1.grad + W_2.grad:", np.round((W_1.grad + W_2.grad).numpy(), 4).tolist())
print("shared weight gets the sum of its uses:", np.allclose(W.grad.numpy(), (W_1.grad + W_2.grad).numpy()))

# %% [markdown]
# ## Predict, then run
# 1. `x` of shape `(4, 1)` is multiplied by `w` of shape `(1, 3)` and the result summed. What shape is
#    `x.grad`, and what is each of its entries?
# 2. Forgetting the `1 / n_micro` above: by what factor is the accumulated gradient too large?
# 3. A central difference with $\varepsilon = 10^{-20}$ in float64: what does it give for the
#    derivative of $x^2$ at $x = 1$?

# %%
x_col = minigrad.ones(4, 1, dtype=f64, requires_grad=True)
w_row = minigrad.tensor([[1.0, 2.0, 3.0]], dtype=f64)
(x_col * w_row).sum().backward()
print("1.", tuple(x_col.grad.shape), x_col.grad.numpy().ravel(), "(each x meets 1 + 2 + 3)")
model.zero_grad()
for xb, yb in zip(data_x.split(8), data_y.split(8)):
    minigrad.nn.functional.mse_loss(model(xb), yb).backward()
print("2. factor:", {round(float(np.linalg.norm(p.grad.numpy()) / np.linalg.norm(f)), 6) for p, f in zip(model.parameters(), full)})
eps = 1e-20
print("3.", ((1 + eps) ** 2 - (1 - eps) ** 2) / (2 * eps), "(1 + 1e-20 rounds to 1: the difference is 0)")
