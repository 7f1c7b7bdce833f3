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
# # 02.5 Higher-order derivatives
#
# **Question:** the gradient is itself computed by minigrad ops. What do we get by differentiating
# *it*?
#
# Because every backward rule is written with differentiable ops, `create_graph=True` records the
# backward pass as a graph, and backward can run through that graph again: Hessians,
# Hessian-vector products, Newton's method, and gradients through an optimisation step (MAML).
#
# **You will:** compute Hessians and Hessian-vector products by double backward, set them beside
# `jax.hessian` and AdaHessian's diagonal estimate, compare Newton's method, gradient descent and
# L-BFGS, and meta-train a model with MAML's exact gradient and its first-order approximation.
# **Time:** about 32 minutes (31 reading, 20 s running).

# %%
import matplotlib.pyplot as plt
import numpy as np

import minigrad
from minigrad.autograd import gradcheck
from minigrad.autograd.functional import hessian, hvp
from minigrad.data import load_digits

np.set_printoptions(precision=4, suppress=True)
f64 = minigrad.float64
minigrad.manual_seed(0)

# %% [markdown]
# ## 1. The Hessian of a small function
# $f(x, y) = x^2 y + e^{y}$. By hand, $\nabla f = (2xy,\; x^2 + e^y)$ and
# $H = \begin{pmatrix} 2y & 2x \\ 2x & e^y \end{pmatrix}$.
# In code: take the gradient with `create_graph=True`, then differentiate each of its components.

# %%
def f(v):
    x, y = v[0], v[1]
    return x ** 2 * y + y.exp()


v = minigrad.tensor([1.0, 0.5], dtype=f64, requires_grad=True)
(g,) = minigrad.grad(f(v), v, create_graph=True)   # g is a tensor with a grad_fn
rows = [minigrad.grad(g[i], v, retain_graph=True)[0].numpy() for i in range(2)]
print("gradient:", g.detach().numpy())
print("Hessian, row by row:\n", np.stack(rows))
print("by hand:\n", np.array([[2 * 0.5, 2 * 1.0], [2 * 1.0, np.exp(0.5)]]))
print("autograd.functional.hessian:\n", hessian(f, v.detach()).numpy())

# %% [markdown]
# ## 2. Hessian-vector products without the Hessian
# For $n$ parameters the Hessian has $n^2$ entries and costs $n$ backward passes. But
# $H u = \nabla_v\,(\nabla f(v) \cdot u)$: one backward pass for the gradient (recorded), one
# through the dot product. Two passes, whatever $n$. We check it on a logistic regression that
# tells 0s from 1s in the digits (65 parameters).

# %%
images, labels = load_digits()
keep = labels < 2
X = minigrad.tensor(images[keep].reshape(-1, 64), dtype=f64)
y = minigrad.tensor(labels[keep], dtype=f64)


def logistic_loss(w):
    logits = X @ w[:64] + w[64]
    return minigrad.nn.functional.binary_cross_entropy_with_logits(logits, y) + 1e-3 * (w * w).sum()


w = minigrad.randn(65, dtype=f64) * 0.1
u = minigrad.randn(65, dtype=f64)

w.requires_grad_(True)
(grad_w,) = minigrad.grad(logistic_loss(w), w, create_graph=True)
(Hu,) = minigrad.grad((grad_w * u).sum(), w)        # the double backward
H = hessian(logistic_loss, w.detach())              # 65 backward passes
print("H u by double backward agrees with the full Hessian:", np.allclose(Hu.numpy(), H.numpy() @ u.numpy()))
print("and with autograd.functional.hvp:", np.allclose(Hu.numpy(), hvp(logistic_loss, w.detach(), u)[1].numpy()))

# %% [markdown]
# What HVPs buy: the curvature of a loss along any direction, at the cost of two gradients. Power
# iteration ($u \leftarrow Hu / \lVert Hu \rVert$) finds the largest eigenvalue of $H$, the
# "sharpness" that bounds a stable learning rate for gradient descent ($\eta < 2/\lambda_\max$),
# without ever forming $H$.

# %%
u = minigrad.randn(65, dtype=f64)
for _ in range(30):
    Hu = hvp(logistic_loss, w.detach(), u)[1]
    lam = (Hu * u).sum().item() / (u * u).sum().item()
    u = Hu / (Hu * Hu).sum().sqrt()
print(f"largest eigenvalue by power iteration (30 HVPs): {lam:.4f}")
print(f"largest eigenvalue of the full Hessian:          {np.linalg.eigvalsh(H.numpy())[-1]:.4f}")

# %% [markdown]
# ### Two relatives: `jax.hessian` and AdaHessian
# **`jax.hessian(f)`** is a function transform: it returns a new function that computes the whole
# $n \times n$ Hessian, defined as `jacfwd(jacrev(f))`, forward mode over reverse mode: one
# reverse pass gives the gradient, and forward mode differentiates it along each of the $n$ unit
# vectors. `minigrad.func.hessian` is the same transform with the same definition (PyTorch's
# `torch.func.hessian` copies JAX's); `autograd.functional.hessian`, used above, gets the same
# matrix reverse over reverse, one backward pass per row. Neither is cheap for large $n$, and JAX
# writes a Hessian-vector product as `jvp(grad(f), (w,), (u,))`: a forward-mode derivative of the
# gradient along $u$, the same $Hu$ as `hvp`.
#
# **AdaHessian** (Yao et al., 2021) is Adam with the squared gradient in its denominator replaced
# by the squared *diagonal* of the Hessian, estimated with one HVP per step by Hutchinson's
# trick: for a random $z$ of $\pm 1$ entries, $\mathbb{E}[z \odot Hz] = \mathrm{diag}(H)$, since
# the off-diagonal terms cancel on average. One sample is noisy, so AdaHessian averages the
# estimate over steps (the running mean Adam keeps anyway) and over each weight tensor's blocks.
# Below: all three Hessians agree, JAX's HVP agrees, and the estimate's error falls like
# $1/\sqrt{k}$ with $k$ samples.

# %%
from minigrad import func

print("func.hessian = functional.hessian:", np.allclose(func.hessian(logistic_loss)(w.detach()).numpy(), H.numpy()))
_, Hu_jax = func.jvp(func.grad(logistic_loss), (w.detach(),), (u,))  # JAX's hvp, forward over reverse
print("jvp(grad(f)) = hvp:", np.allclose(Hu_jax.numpy(), hvp(logistic_loss, w.detach(), u)[1].numpy()))
rng = np.random.default_rng(0)
diag, estimate = np.diag(H.numpy()), np.zeros(65)
for k in range(1, 1001):
    z = minigrad.tensor(rng.choice([-1.0, 1.0], size=65), dtype=f64)  # Rademacher
    estimate += (z * hvp(logistic_loss, w.detach(), z)[1]).numpy()
    if k in (10, 100, 1000):
        print(f"Hutchinson's diag(H) from {k:>4} HVPs: relative error "
              f"{np.linalg.norm(estimate / k - diag) / np.linalg.norm(diag):.0%}")

# %% [markdown]
# Ten samples are worse than useless here: each row of this Hessian has 64 off-diagonal entries
# that together outweigh its diagonal one, and each adds noise to the estimate. A thousand get
# within about a tenth. One noisy sample per step is affordable only because the optimiser
# averages over thousands of steps.

# %% [markdown]
# ## 3. Newton's method vs gradient descent
# Gradient descent steps along $-\nabla f$ with a step size that must suit the sharpest direction,
# so it crawls along flat ones. Newton's method minimises the local quadratic model:
# $w \leftarrow w - H^{-1} \nabla f$. The test function, the logarithm of Boyd & Vandenberghe's
# example 9.3.2 (theirs is the sum of the three exponentials; the log has the same minimiser), is
# smooth, convex and not quadratic:
# $f(x, y) = \log\left(e^{x + 3y - 0.1} + e^{x - 3y - 0.1} + e^{-x - 0.1}\right)$, with minimum
# $f^\star = \log(2\sqrt 2) - 0.1$ at $(-\tfrac12 \log 2, 0)$.

# %%
def boyd(w):
    x, y = w[0], w[1]
    return ((x + 3 * y - 0.1).exp() + (x - 3 * y - 0.1).exp() + (-x - 0.1).exp()).log()


f_star = np.log(2 * np.sqrt(2)) - 0.1


def newton(start, steps):
    w, path = np.array(start), [np.array(start)]
    for _ in range(steps):
        wt = minigrad.tensor(w, dtype=f64, requires_grad=True)
        (g,) = minigrad.grad(boyd(wt), wt)
        w = w - np.linalg.solve(hessian(boyd, wt.detach()).numpy(), g.numpy())
        path.append(w)
    return np.array(path)


def gradient_descent(start, steps, lr=0.1):
    w = minigrad.tensor(start, dtype=f64, requires_grad=True)
    path = [w.detach().numpy().copy()]
    for _ in range(steps):
        (g,) = minigrad.grad(boyd(w), w)
        with minigrad.no_grad():
            w -= lr * g
        path.append(w.detach().numpy().copy())
    return np.array(path)


def gaps(path):
    return np.array([boyd(minigrad.tensor(p, dtype=f64)).item() - f_star for p in path])


start = (0.0, 0.3)
newton_gap, gd_path = gaps(newton(start, 6)), gradient_descent(start, 150)
gd_gap = gaps(gd_path)
print("iterations to f - f* < 1e-10:  Newton", int(np.argmax(newton_gap < 1e-10)),
      "  gradient descent", int(np.argmax(gd_gap < 1e-10)))

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
ax1.semilogy(np.maximum(newton_gap, 1e-17), "o-", label="Newton")
ax1.semilogy(np.maximum(gd_gap, 1e-17), label="gradient descent (lr 0.1)")
ax1.set_xlabel("iteration")
ax1.set_ylabel("f - f*")
ax1.legend()
xs, ys = np.meshgrid(np.linspace(-1.2, 0.6, 120), np.linspace(-0.5, 0.5, 120))
zs = np.log(np.exp(xs + 3 * ys - 0.1) + np.exp(xs - 3 * ys - 0.1) + np.exp(-xs - 0.1))
ax2.contour(xs, ys, zs, levels=12, cmap="Greys", linewidths=0.8)
ax2.plot(*newton(start, 6).T, "o-", label="Newton")
ax2.plot(*gd_path.T, ".-", ms=3, label="gradient descent")
ax2.set_title("paths from (0, 0.3)")
ax2.legend()
plt.show()

# %% [markdown]
# Newton's error squares at every step (quadratic convergence: 3 iterations), gradient descent's
# shrinks by a constant factor (linear convergence: about 100). Each Newton step is dearer, a
# Hessian and a linear solve, which is why it suits small problems. And pure Newton trusts its
# quadratic model everywhere: started further away it can diverge, so practical versions add a
# line search or a trust region.

# %%
with np.errstate(all="ignore"):
    print("pure Newton from (-1, 0.5): f - f* =", gaps(newton((-1.0, 0.5), 3)))

# %% [markdown]
# ## 4. L-BFGS on the Rosenbrock function
# L-BFGS builds an approximation of $H^{-1}$ from the last few gradient differences: Newton-like
# steps from gradients alone. `minigrad.optim.LBFGS` (with a strong-Wolfe line search) calls a
# closure that recomputes the loss and its gradient. The Rosenbrock function
# $(1 - x)^2 + 100\,(y - x^2)^2$ has its minimum at $(1, 1)$ at the end of a long, curved, narrow valley.

# %%
def rosenbrock(p):
    return (1 - p[0]) ** 2 + 100 * (p[1] - p[0] ** 2) ** 2


p = minigrad.tensor([-1.5, 2.0], dtype=f64, requires_grad=True)
lbfgs = minigrad.optim.LBFGS([p], lr=1, max_iter=200, line_search_fn="strong_wolfe",
                             tolerance_grad=1e-10, tolerance_change=1e-14)
lbfgs_path, lbfgs_loss = [], []


def closure():
    lbfgs.zero_grad()
    loss = rosenbrock(p)
    loss.backward()
    lbfgs_path.append(p.detach().numpy().copy())
    lbfgs_loss.append(loss.item())
    return loss


lbfgs.step(closure)
print(f"L-BFGS: {lbfgs.state[p]['n_iter']} iterations, {len(lbfgs_loss)} function evaluations, "
      f"ends at {np.round(p.detach().numpy(), 6)}")

q = minigrad.tensor([-1.5, 2.0], dtype=f64, requires_grad=True)
adam = minigrad.optim.Adam([q], lr=0.02)
adam_path, adam_loss = [], []
for _ in range(3000):
    adam.zero_grad()
    loss = rosenbrock(q)
    loss.backward()
    adam_path.append(q.detach().numpy().copy())
    adam_loss.append(loss.item())
    adam.step()
print(f"Adam (lr 0.02): 3000 steps, ends at {np.round(q.detach().numpy(), 6)}")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
ax1.loglog(range(1, len(lbfgs_loss) + 1), np.maximum(lbfgs_loss, 1e-20), "C0", label="L-BFGS")
ax1.loglog(range(1, len(adam_loss) + 1), np.maximum(adam_loss, 1e-20), "C1", label="Adam")
ax1.set_xlabel("function evaluations")
ax1.set_ylabel("loss")
ax1.legend()
xs, ys = np.meshgrid(np.linspace(-2, 2, 200), np.linspace(-1, 3, 200))
ax2.contour(xs, ys, np.log1p((1 - xs) ** 2 + 100 * (ys - xs ** 2) ** 2), levels=12, cmap="Greys", linewidths=0.8)
ax2.plot(*np.array(lbfgs_path).T, "C0.-", label="L-BFGS (every evaluation)")
ax2.plot(*np.array(adam_path).T, "C1", lw=1, label="Adam")
ax2.plot(1, 1, "k*", ms=10)
ax2.legend()
plt.show()

# %% [markdown]
# L-BFGS follows the valley in a few dozen evaluations; Adam needs thousands of steps to crawl
# along it. On large, noisy, mini-batch problems the balance turns, which is why deep learning
# trains with first-order methods.
#
# ## 5. A second-order MAML step
# Model-agnostic meta-learning looks for initial weights $\theta$ that become good on a task after
# one gradient step on that task's support set:
# $\theta' = \theta - \alpha \nabla L_\text{support}(\theta)$, meta-loss $L_\text{query}(\theta')$.
# Its gradient with respect to $\theta$ passes *through* the inner gradient:
# $\nabla_\theta L_\text{query}(\theta') = (I - \alpha H_\text{support})\, \nabla L_\text{query}(\theta')$.
# With `create_graph=True` in the inner step, backward computes exactly that. The first-order
# approximation (FOMAML) treats the inner gradient as a constant and drops the Hessian term.
#
# One task: fit $\sin(1.5x + 0.5)$ with a 1-8-1 tanh MLP whose 25 weights live in one vector.

# %%
x_support = minigrad.linspace(-2, 2, 10, dtype=f64).reshape(-1, 1)
x_query = minigrad.linspace(-1.9, 1.9, 10, dtype=f64).reshape(-1, 1)
y_support, y_query = (1.5 * x_support + 0.5).sin(), (1.5 * x_query + 0.5).sin()
alpha = 0.1


def mlp(theta, x):
    W1, b1, W2, b2 = theta[0:8].reshape(1, 8), theta[8:16], theta[16:24].reshape(8, 1), theta[24]
    return (x @ W1 + b1).tanh() @ W2 + b2


def mse(theta, x, y):
    return ((mlp(theta, x) - y) ** 2).mean()


def meta_loss(theta):
    with minigrad.enable_grad():  # the inner step needs a graph, even when called under no_grad
        (g,) = minigrad.grad(mse(theta, x_support, y_support), theta, create_graph=True)
        return mse(theta - alpha * g, x_query, y_query)


theta = (minigrad.randn(25, dtype=f64) * 0.5).requires_grad_()
(second_order,) = minigrad.grad(meta_loss(theta), theta)

(g,) = minigrad.grad(mse(theta, x_support, y_support), theta)
adapted = (theta - alpha * g).detach().requires_grad_()
(first_order,) = minigrad.grad(mse(adapted, x_query, y_query), adapted)

H_support = hessian(lambda t: mse(t, x_support, y_support), theta.detach())
formula = first_order.numpy() - alpha * H_support.numpy() @ first_order.numpy()
print("second order = (I - alpha H) * first order:", np.allclose(second_order.numpy(), formula))
print("second order passes gradcheck (finite differences through the inner step):", gradcheck(meta_loss, (theta,)))
a, b = second_order.numpy(), first_order.numpy()
print(f"|second order| = {np.linalg.norm(a):.3f}, |first order| = {np.linalg.norm(b):.3f}, "
      f"cosine = {a @ b / np.linalg.norm(a) / np.linalg.norm(b):.3f}, "
      f"|second - first| / |first| = {np.linalg.norm(a - b) / np.linalg.norm(b):.0%}")

# %% [markdown]
# The two meta-gradients point in similar directions but differ by the curvature term
# $\alpha H_\text{support} \nabla L_\text{query}$, here by about 40% of the first-order gradient's length (printed above). First-order MAML saves the double backward; second-order MAML is the exact gradient,
# which only a framework whose backward is differentiable can give.
#
# ## 6. Does the curvature term matter? Meta-training on a family of tasks
# The picture that makes MAML's point: a family of tasks, $y = a \sin(x + \varphi)$ with random
# amplitude $a \in [0.5, 2]$ and phase $\varphi \in [0, \pi]$, and an initialisation that should
# fit *any* of them after one gradient step (here with a larger inner step, $\alpha = 0.3$). Each
# meta-step samples one task and moves $\theta$ against the second-order or the first-order
# meta-gradient, or, as a baseline, against the plain gradient of the query loss at $\theta$
# (ordinary training on all tasks' data, no inner step). Every 10 meta-steps we measure the mean
# query loss *after one inner step* on 20 held-out tasks.

# %%
ALPHA = 0.3


def sample_task(rng):
    a, phase = rng.uniform(0.5, 2.0), rng.uniform(0, np.pi)
    return a * (x_support + phase).sin(), a * (x_query + phase).sin()


def adapt(theta, task, create_graph=False):
    """theta after one gradient step on the task's support set."""
    (g,) = minigrad.grad(mse(theta, x_support, task[0]), theta, create_graph=create_graph)
    return theta - ALPHA * g


def meta_gradient(theta, task, method):
    if method == "second order":
        (g,) = minigrad.grad(mse(adapt(theta, task, create_graph=True), x_query, task[1]), theta)
    elif method == "first order":
        adapted = adapt(theta, task).detach().requires_grad_()
        (g,) = minigrad.grad(mse(adapted, x_query, task[1]), adapted)
    else:  # ordinary training: no inner step in the objective
        (g,) = minigrad.grad(mse(theta, x_query, task[1]), theta)
    return g


held_out = [sample_task(np.random.default_rng(1000 + i)) for i in range(20)]


def loss_after_one_step(theta):
    theta = theta.detach().requires_grad_()
    return np.mean([mse(adapt(theta, task), x_query, task[1]).item() for task in held_out])


minigrad.manual_seed(0)
theta_init = minigrad.randn(25, dtype=f64) * 0.5
curves, trained = {}, {}
for method in ("second order", "first order", "ordinary training"):
    rng, theta = np.random.default_rng(0), theta_init.clone()
    curves[method] = [loss_after_one_step(theta)]
    for step in range(1, 301):
        g = meta_gradient(theta.requires_grad_(), sample_task(rng), method)
        theta = theta.detach() - 0.02 * g
        if step % 10 == 0:
            curves[method].append(loss_after_one_step(theta))
    trained[method] = theta

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
for method, curve in curves.items():
    ax1.plot(np.arange(0, 301, 10), curve, label=method)
ax1.set(yscale="log", xlabel="meta-step", ylabel="held-out query loss after one step", title="meta-training")
ax1.legend()
support, query = held_out[0]
grid = minigrad.linspace(-2, 2, 100, dtype=f64).reshape(-1, 1)
theta = trained["second order"].requires_grad_()
ax2.plot(x_query.numpy(), query.numpy(), "ko", ms=4, label="held-out task (query points)")
ax2.plot(grid.numpy(), mlp(theta, grid).detach().numpy(), "C0--", label="MAML's initialisation")
ax2.plot(grid.numpy(), mlp(adapt(theta, (support, query)), grid).detach().numpy(), "C0-",
         label="after one step on the support set")
ax2.set(xlabel="x", title="second-order MAML on a task it never saw")
ax2.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# Only the exact (second-order) meta-gradient keeps lowering the loss after adaptation. Ordinary
# training levels off: it learns one average function, and one step from it does not reach every
# task. First-order MAML does worse still on this small model with a large inner step, where the
# dropped term $\alpha H_\text{support} \nabla L_\text{query}$ is large (with many parameters and small
# steps the approximation is usually close). MAML's initialisation fits no task on its own (dashed):
# it is a point from which one step moves towards each of them.
#
# ## Predict, then run
# 1. $f(x) = \sum_i x_i^3$ at $x = (1, 2, 3)$: what is its Hessian?
# 2. Newton's method on a quadratic $f(x) = \tfrac12 x^\top A x - b^\top x$ with positive definite $A$:
#    how many steps from any start to the minimum?
# 3. If the inner step of MAML is taken with $\alpha = 0$, how do the second-order and first-order
#    meta-gradients compare?

# %%
print("1.", hessian(lambda x: (x ** 3).sum(), minigrad.tensor([1.0, 2.0, 3.0], dtype=f64)).numpy().tolist(),
      "= diag(6 x)")
A = minigrad.tensor([[3.0, 1.0], [1.0, 2.0]], dtype=f64)
b_vec = minigrad.tensor([1.0, -1.0], dtype=f64)
x = minigrad.tensor([10.0, -7.0], dtype=f64, requires_grad=True)
quadratic = lambda x: 0.5 * x @ A @ x - b_vec @ x  # noqa: E731
(grad_x,) = minigrad.grad(quadratic(x), x)
x_new = x.detach() - np.linalg.solve(hessian(quadratic, x.detach()).numpy(), grad_x.numpy())
print("2. one Newton step lands on A^-1 b:", np.allclose(x_new.numpy(), np.linalg.solve(A.numpy(), b_vec.numpy())))
ALPHA, task = 0.0, held_out[0]
theta = theta_init.clone().requires_grad_()
print("3. alpha = 0, second order == first order:",
      np.allclose(meta_gradient(theta, task, "second order").numpy(), meta_gradient(theta, task, "first order").numpy()))
