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
# # Chapter 02 exercises: backpropagation
#
# Nine exercises, one per idea of the chapter. Write your code where it says
# `raise NotImplementedError`, then run the check cell below it: it compares your answer with
# minigrad's own implementation or with known values, and fails with a message if it is wrong.
# The exercises are independent; do them in any order (run the setup cell first).

# %%
import math

import numpy as np

import minigrad
from minigrad import nn
from minigrad.autograd import Function, gradcheck, gradgradcheck
from minigrad.autograd.functional import hessian, hvp
from minigrad.course import answer

f64 = minigrad.float64
minigrad.manual_seed(0)

# %% [markdown]
# ## Exercise 1: the MLP's gradients by hand
# For a batch of $N$ inputs (rows of `X`), the 3-layer perceptron of 02.1 computes
# $H = \sigma(X W_1^\top + b_1)$, $Y = H W_2^\top + b_2$ and $L = \frac{1}{2N} \sum (Y - T)^2$.
# Return the gradients of $L$ with respect to `W1, b1, W2, b2` using numpy only (no autograd).
# Remember that a bias is broadcast over the batch.

# %% minigrad={"forbid": ["minigrad.autograd.engine.topological_order"]}
# Exercise 1: The MLP's gradients by hand
def mlp_gradients(X, T, W1, b1, W2, b2):
    """Numpy arrays in; returns (dW1, db1, dW2, db2) with the shapes of W1, b1, W2, b2."""
    ### BEGIN SOLUTION
    N = X.shape[0]
    H = 1 / (1 + np.exp(-(X @ W1.T + b1)))
    Y = H @ W2.T + b2
    dY = (Y - T) / N
    dW2, db2 = dY.T @ H, dY.sum(0)
    dZ = (dY @ W2) * H * (1 - H)
    dW1, db1 = dZ.T @ X, dZ.sum(0)
    return dW1, db1, dW2, db2
    ### END SOLUTION

# %%
# Check 1
rng = np.random.default_rng(1)
arrays = dict(X=rng.normal(size=(5, 3)), T=rng.normal(size=(5, 2)), W1=rng.normal(size=(4, 3)),
              b1=rng.normal(size=4), W2=rng.normal(size=(2, 4)), b2=rng.normal(size=2))
ts = {k: minigrad.tensor(v, dtype=f64, requires_grad=k not in ("X", "T")) for k, v in arrays.items()}
H_ = (ts["X"] @ ts["W1"].T + ts["b1"]).sigmoid()
loss_ = 0.5 * ((H_ @ ts["W2"].T + ts["b2"] - ts["T"]) ** 2).sum() / 5
loss_.backward()
yours = answer(mlp_gradients(**arrays))
for name, g in zip(("W1", "b1", "W2", "b2"), yours):
    expected = ts[name].grad.numpy()
    assert np.shape(g) == expected.shape, f"d{name}: expected shape {expected.shape}, got {np.shape(g)}"
    assert np.allclose(g, expected, rtol=1e-10, atol=1e-12), f"d{name}: expected\n{expected}\ngot\n{g}"
print("Check 1 passed")

# %% [markdown]
# ## Exercise 2: summing a gradient back to a broadcast input's shape
# When an input of shape `shape` was broadcast to the shape of `g`, its gradient is `g` summed
# over the broadcast dimensions (02.2). Write that with minigrad ops (`sum` with `dim` and
# `keepdim`, `reshape`), so that it works for leading dimensions that were added and for
# dimensions that were stretched from 1.

# %% minigrad={"forbid": ["minigrad.ops.reduce.sum_to"]}
# Exercise 2: Summing a gradient back to a broadcast shape
def unbroadcast(g: minigrad.Tensor, shape: tuple) -> minigrad.Tensor:
    """Sum ``g`` down to ``shape`` (a shape that broadcasts to ``g.shape``)."""
    ### BEGIN SOLUTION
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(tuple(range(lead)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if stretched:
        g = g.sum(stretched, keepdim=True)
    return g.reshape(shape)
    ### END SOLUTION

# %%
# Check 2
minigrad.manual_seed(2)
g = minigrad.randn(2, 4, 3, 5)
for shape in [(2, 4, 3, 5), (5,), (3, 1), (4, 1, 5), (1, 4, 1, 1), (1,), ()]:
    got, expected = answer(unbroadcast(g, shape)), minigrad.ops.sum_to(g, shape)
    assert tuple(got.shape) == shape, f"unbroadcast to {shape}: got shape {tuple(got.shape)}"
    assert np.allclose(got.numpy(), expected.numpy(), atol=1e-5), f"unbroadcast to {shape}: wrong values"
print("Check 2 passed")

# %%
# Hidden check 2
_g = minigrad.randn(3, 1, 4, 6)
for _shape in [(1, 6), (3, 1, 1, 1), (4, 1)]:
    assert np.allclose(answer(unbroadcast(_g, _shape)).numpy(), minigrad.ops.sum_to(_g, _shape).numpy(), atol=1e-5)


# %% [markdown]
# ## Exercise 3: sigmoid as a custom `Function`
# The forward pass is given and saves its output $y = \sigma(a)$. Write the backward pass: given
# the gradient `g` of the output, return the gradient of the input, using $\sigma' = y (1 - y)$.
# Write it with minigrad ops, so that it can itself be differentiated (the check takes second
# derivatives through it too).

# %% minigrad={"forbid": ["minigrad.ops.elementwise.sigmoid"]}
# Exercise 3: Sigmoid's backward
class Sigmoid(Function):
    @staticmethod
    def forward(ctx, a):
        y = 1 / (1 + (-a).exp())
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        ### BEGIN SOLUTION
        (y,) = ctx.saved_tensors
        return g * y * (1 - y)
        ### END SOLUTION

# %%
# Check 3
def derivatives(f, z, g, u):
    """f(z), the gradient of sum(g * f(z)), and the gradient of sum(u * that gradient): first and second order."""
    (first,) = minigrad.grad((f(z) * g).sum(), z, create_graph=True)
    (second,) = minigrad.grad((first * u).sum(), z)
    return f(z).detach().numpy(), first.detach().numpy(), second.numpy()


z = minigrad.tensor([-3.0, -0.5, 0.0, 0.7, 4.0], dtype=f64, requires_grad=True)
g3, u3 = minigrad.tensor([0.5, -1.0, 2.0, 1.5, -0.3], dtype=f64), minigrad.tensor([1.0, 0.2, -0.7, 0.4, 2.0], dtype=f64)
got = answer(derivatives(Sigmoid.apply, z, g3, u3))
for name, mine, theirs in zip(("sigmoid", "its gradient", "its second derivative"), got,
                              derivatives(lambda t: t.sigmoid(), z, g3, u3)):
    assert np.allclose(mine, theirs), f"{name}: expected {theirs}, got {mine}"
print("Check 3 passed")

# %% [markdown]
# ## Exercise 4: a training step
# Write one step of training a classifier: compute the logits, the cross-entropy loss
# (`nn.functional.cross_entropy`), clear the old gradients, backpropagate, update the
# parameters. Return the loss as a Python float.

# %%
# Exercise 4: A training step
def train_step(model: nn.Module, optimizer: minigrad.optim.Optimizer, x: minigrad.Tensor,
               y: minigrad.Tensor) -> float:
    ### BEGIN SOLUTION
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
    ### END SOLUTION

# %%
# Check 4
def make_model():
    minigrad.manual_seed(4)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    return model, minigrad.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)


minigrad.manual_seed(40)
x4, y4 = minigrad.randn(16, 6), minigrad.randint(0, 3, (16,))
ours, our_opt = make_model()
losses = answer([train_step(ours, our_opt, x4, y4) for step in range(3)])
trained = answer({name: p.detach().numpy() for name, p in ours.named_parameters()})
theirs, their_opt = make_model()
for step, loss in enumerate(losses):
    expected = nn.functional.cross_entropy(theirs(x4), y4)
    their_opt.zero_grad()
    expected.backward()
    their_opt.step()
    assert isinstance(loss, float), f"train_step should return a float, got {type(loss).__name__}"
    assert math.isclose(loss, expected.item(), rel_tol=1e-5), f"step {step}: loss {loss}, expected {expected.item()}"
for name, q in theirs.named_parameters():
    assert np.allclose(trained[name], q.detach().numpy(), atol=1e-6), f"after 3 steps, {name} differs"
print("Check 4 passed")

# %% [markdown]
# ## Exercise 5: Xavier initialisation
# Fill `weight` in place with samples from $U(-a, a)$, $a = \text{gain} \sqrt{6 / (\text{fan}_\text{in} + \text{fan}_\text{out})}$.
# A weight has shape `(out_features, in_features, *kernel)`: each input or output unit is
# connected through every position of the kernel, so $\text{fan}_\text{in}$ is `in_features` times the
# kernel size, and $\text{fan}_\text{out}$ is `out_features` times it. Use `nn.init.uniform_` to fill.

# %% minigrad={"forbid": ["minigrad.nn.init.xavier_uniform_"]}
# Exercise 5: Xavier initialisation
def xavier_uniform(weight: minigrad.Tensor, gain: float = 1.0) -> minigrad.Tensor:
    ### BEGIN SOLUTION
    receptive = math.prod(weight.shape[2:])
    fan_in, fan_out = weight.shape[1] * receptive, weight.shape[0] * receptive
    a = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return nn.init.uniform_(weight, -a, a)
    ### END SOLUTION

# %%
# Check 5
def filled(init, shape, gain):
    w = minigrad.empty(*shape)
    init(w, gain)
    return w.numpy()


for shape, gain in [((256, 512), 1.0), ((64, 32, 3, 3), 5 / 3)]:
    got = answer(filled(xavier_uniform, shape, gain))
    ref = filled(nn.init.xavier_uniform_, shape, gain)
    a = np.abs(ref).max()
    assert np.abs(got).max() <= a * 1.001 and np.abs(got).max() > 0.99 * a, \
        f"shape {shape}: samples should fill [-{a:.4f}, {a:.4f}], got max |w| = {np.abs(got).max():.4f}"
    assert abs(got.var() / ref.var() - 1) < 0.05, \
        f"shape {shape}: variance {got.var():.3g}, expected about {ref.var():.3g}"
print("Check 5 passed")

# %% [markdown]
# ## Exercise 6: clipping gradients by their global norm
# Compute the 2-norm of all gradients together (as if concatenated into one vector); if it
# exceeds `max_norm`, scale every gradient in place by `max_norm / total_norm`. Return the norm
# before clipping as a float. Parameters whose `.grad` is `None` are skipped.

# %% minigrad={"forbid": ["minigrad.nn.utils.clip_grad_norm_"]}
# Exercise 6: Clipping by global norm
def clip_by_global_norm(parameters, max_norm: float) -> float:
    ### BEGIN SOLUTION
    grads = [p.grad for p in parameters if p.grad is not None]
    total = math.sqrt(sum((g * g).sum().item() for g in grads))
    if total > max_norm:
        for g in grads:
            g.mul_(max_norm / total)
    return total
    ### END SOLUTION

# %%
# Check 6
for max_norm in (0.5, 100.0):
    minigrad.manual_seed(6)
    mine, ref = nn.Linear(10, 5), nn.Linear(10, 5)
    ref.load_state_dict(mine.state_dict())
    x6 = minigrad.randn(8, 10)
    for m in (mine, ref):
        (m(x6) ** 2).sum().backward()
    mine.bias.grad = None
    ref.bias.grad = None
    total, clipped = answer((clip_by_global_norm(mine.parameters(), max_norm), mine.weight.grad.numpy()))
    expected = nn.utils.clip_grad_norm_(ref.parameters(), max_norm).item()
    assert math.isclose(total, expected, rel_tol=1e-5), f"total norm {total}, expected {expected}"
    assert np.allclose(clipped, ref.weight.grad.numpy(), rtol=1e-4), \
        f"max_norm={max_norm}: the clipped gradient differs from clip_grad_norm_'s"
print("Check 6 passed")

# %% [markdown]
# ## Exercise 7: a numerically stable log-softmax
# $\log \operatorname{softmax}(x)_i = x_i - \log \sum_j e^{x_j}$. Computed as written it overflows
# for logits around 100 in float32. Write it with minigrad ops so that it stays finite for any
# logits (02.4: subtract the maximum along `dim` first).

# %% minigrad={"forbid": ["minigrad.ops.softmax.log_softmax"]}
# Exercise 7: Stable log-softmax
def log_softmax(x: minigrad.Tensor, dim: int) -> minigrad.Tensor:
    ### BEGIN SOLUTION
    z = x - x.amax(dim, keepdim=True).detach()
    return z - z.exp().sum(dim, keepdim=True).log()
    ### END SOLUTION

# %%
# Check 7
minigrad.manual_seed(7)
for logits in (minigrad.randn(4, 6), minigrad.randn(4, 6) * 1000, minigrad.tensor([[1e4, 0.0, -1e4]])):
    for dim in (0, 1, -1):
        got = answer(log_softmax(logits, dim).numpy())
        expected = nn.functional.log_softmax(logits, dim=dim).numpy()
        assert np.isfinite(got).all(), f"non-finite values for logits of scale {np.abs(logits.numpy()).max():.0f}"
        assert np.allclose(got, expected, rtol=1e-5, atol=1e-4), f"dim={dim}: expected\n{expected}\ngot\n{got}"
x7, w7 = minigrad.randn(3, 4, dtype=f64, requires_grad=True), minigrad.randn(3, 4, dtype=f64)
(grad7,) = answer(minigrad.grad((log_softmax(x7, 1) * w7).sum(), x7))
(expected7,) = minigrad.grad((nn.functional.log_softmax(x7, dim=1) * w7).sum(), x7)
assert np.allclose(grad7.numpy(), expected7.numpy()), f"the gradient: expected\n{expected7.numpy()}\ngot\n{grad7.numpy()}"
print("Check 7 passed")

# %%
# Hidden check 7
_big = minigrad.tensor([[-1e4, -1e4 + 1.0, -1e4 + 2.0]])
assert np.allclose(answer(log_softmax(_big, 1).numpy()), nn.functional.log_softmax(_big, dim=1).numpy(), atol=1e-4)


# %% [markdown]
# ## Exercise 8: a Hessian-vector product by double backward
# Return $H v$, the Hessian of the scalar function `f` at `x` times `v`, without forming $H$:
# take the gradient with `create_graph=True`, then the gradient of its dot product with `v`
# (02.5). Use `minigrad.grad`, not `autograd.functional`.

# %% minigrad={"forbid": ["minigrad.autograd.functional.hvp", "minigrad.autograd.functional.hessian"]}
# Exercise 8: Hessian-vector product
def hessian_vector_product(f, x: minigrad.Tensor, v: minigrad.Tensor) -> minigrad.Tensor:
    x = x.detach().requires_grad_()
    ### BEGIN SOLUTION
    (g,) = minigrad.grad(f(x), x, create_graph=True)
    (Hv,) = minigrad.grad((g * v).sum(), x)
    return Hv
    ### END SOLUTION

# %%
# Check 8
A = minigrad.tensor([[3.0, 1.0, 0.0], [1.0, 2.0, 0.5], [0.0, 0.5, 1.0]], dtype=f64)
x8, v8 = minigrad.tensor([0.3, -1.2, 2.0], dtype=f64), minigrad.tensor([1.0, -2.0, 0.5], dtype=f64)
got = answer(hessian_vector_product(lambda x: 0.5 * (x * (A @ x)).sum(), x8, v8).detach().numpy())
assert np.allclose(got, A.numpy() @ v8.numpy()), f"quadratic: expected A v = {A.numpy() @ v8.numpy()}, got {got}"


def bumpy(x):
    return (x[0] * x[1]).sin() + x.exp().sum() * x[2] + (x ** 4).sum()


got = answer(hessian_vector_product(bumpy, x8, v8).detach().numpy())
expected = hvp(bumpy, x8, v8)[1].numpy()
assert np.allclose(got, expected), f"expected {expected}, got {got}"
print("Check 8 passed")

# %% [markdown]
# ## Exercise 9: one Newton step
# Return $x - H^{-1} \nabla f(x)$ as a float64 Tensor. You may use
# `minigrad.autograd.functional.hessian` for $H$, `minigrad.grad` for the gradient and
# `np.linalg.solve` for the linear system.

# %%
# Exercise 9: One Newton step
def newton_step(f, x: minigrad.Tensor) -> minigrad.Tensor:
    x = x.detach().requires_grad_()
    ### BEGIN SOLUTION
    (g,) = minigrad.grad(f(x), x)
    H = hessian(f, x.detach())
    return minigrad.tensor(x.detach().numpy() - np.linalg.solve(H.numpy(), g.numpy()), dtype=f64)
    ### END SOLUTION

# %%
# Check 9
A = np.array([[4.0, 1.0], [1.0, 3.0]])
b = np.array([1.0, 2.0])
At, bt = minigrad.tensor(A, dtype=f64), minigrad.tensor(b, dtype=f64)
x9 = answer(newton_step(lambda x: 0.5 * (x * (At @ x)).sum() - (bt * x).sum(), minigrad.tensor([5.0, -7.0], dtype=f64)))
x9 = x9.detach()
assert np.allclose(x9.numpy(), np.linalg.solve(A, b)), \
    f"on a quadratic one step reaches the minimum {np.linalg.solve(A, b)}, got {x9.numpy()}"
c = np.array([2.0, 0.5, 1.0])
x0 = np.array([0.0, 1.0, -1.0])
x9 = answer(newton_step(lambda x: (x.exp() - minigrad.tensor(c, dtype=f64) * x).sum(), minigrad.tensor(x0, dtype=f64))).detach()
expected = x0 - (np.exp(x0) - c) / np.exp(x0)  # separable: H = diag(exp(x))
assert np.allclose(x9.numpy(), expected), f"expected {expected}, got {x9.numpy()}"
print("Check 9 passed")
