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
# # 02.0 A scalar engine from scratch
#
# **Question:** how can a program give the derivative of *any* expression you write, with respect
# to every input at once, for about the cost of evaluating it?
#
# We answer it the way micrograd (A. Karpathy) does: a `Value` class of eighty lines that remembers
# how each number was made, a picture of the graph it records, one backward pass done by hand and
# then by the code, and a small neural network trained with it. The rest of the chapter builds the
# same engine for tensors, in `minigrad`.
#
# **You will:** write an autograd engine for scalars; draw its graph with every value and gradient;
# backpropagate through it by hand, node by node; name the three gate patterns (add distributes,
# multiply swaps, max routes); train a small MLP on two moons and plot its decision boundary; get
# the same numbers from minigrad.
# **Time:** about 37 minutes (36 reading, 17 s running).

# %% [markdown]
# ## The engine
# A `Value` holds a number (`data`), the gradient of the final output with respect to it (`grad`,
# filled in later), the Values it was computed from (`_prev`) and a closure `_backward` that applies
# the chain rule at this one node: it takes `out.grad` and *adds* each input's share into that
# input's `.grad`. Subtraction, division and negation are compositions of the primitives, so they
# need no backward rule of their own.

# %%
import math
import random


class Value:
    """A scalar that records how it was made, so that gradients can flow back through it."""

    def __init__(self, data, _prev=(), _op="", label=""):
        self.data, self.grad = float(data), 0.0
        self._prev, self._op, self.label = _prev, _op, label
        self._backward = lambda: None  # a leaf has no inputs to pass a gradient to

    def __add__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        out = Value(self.data + other.data, (self, other), "+")
        def _backward():  # d(a+b)/da = d(a+b)/db = 1
            self.grad += out.grad
            other.grad += out.grad
        out._backward = _backward
        return out

    def __mul__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        out = Value(self.data * other.data, (self, other), "*")
        def _backward():  # d(ab)/da = b, d(ab)/db = a
            self.grad += other.data * out.grad
            other.grad += self.data * out.grad
        out._backward = _backward
        return out

    def __pow__(self, k):  # k is a plain number
        out = Value(self.data ** k, (self,), f"**{k}")
        def _backward():
            self.grad += k * self.data ** (k - 1) * out.grad
        out._backward = _backward
        return out

    def tanh(self):
        t = math.tanh(self.data)
        out = Value(t, (self,), "tanh")
        def _backward():  # tanh' = 1 - tanh^2, from the saved output
            self.grad += (1 - t * t) * out.grad
        out._backward = _backward
        return out

    def relu(self):
        out = Value(max(0.0, self.data), (self,), "relu")
        def _backward():
            self.grad += (self.data > 0) * out.grad
        out._backward = _backward
        return out

    def max(self, other):
        other = other if isinstance(other, Value) else Value(other)
        out = Value(max(self.data, other.data), (self, other), "max")
        def _backward():  # the whole gradient goes to the input that won
            if self.data >= other.data:
                self.grad += out.grad
            else:
                other.grad += out.grad
        out._backward = _backward
        return out

    def __neg__(self): return self * -1
    def __sub__(self, other): return self + (-other)
    def __truediv__(self, other): return self * other ** -1
    def __radd__(self, other): return self + other
    def __rmul__(self, other): return self * other
    def __rsub__(self, other): return other + (-self)

    def topological_order(self):
        order, seen = [], set()
        def visit(v):  # depth first: v joins the order after every Value it was computed from
            if v not in seen:
                seen.add(v)
                for child in v._prev:
                    visit(child)
                order.append(v)
        visit(self)
        return order

    def backward(self):
        self.grad = 1.0  # d(self)/d(self)
        for v in reversed(self.topological_order()):  # a node runs once all its users have sent their share
            v._backward()


# %% [markdown]
# ## A neuron, and its graph
# One neuron with two inputs, $o = \tanh(x_1 w_1 + x_2 w_2 + b)$, with micrograd's numbers (the
# bias makes $o = 1/\sqrt 2$). Each box in the drawing is a `Value`: its label, its data and its
# grad; each circle is the op that made the box to its right. Nothing has flowed back yet, so every
# grad is 0. (The drawing names its nodes by a counter in visiting order, so the same graph always
# gives the same picture.)

# %%
from minigrad.graph.viz import Digraph  # graphviz's Digraph, with a clear message if `dot` is missing


def draw_graph(root):
    """Draw the Values ``root`` was computed from, left to right, each with its data and grad."""
    dot = Digraph(graph_attr={"rankdir": "LR"}, node_attr={"fontsize": "11"})
    names = {}
    def visit(v):
        if v in names:
            return names[v]
        names[v] = name = f"v{len(names)}"
        dot.node(name, f"{{ {v.label} | data {v.data:.4f} | grad {v.grad:.4f} }}", shape="record")
        if v._op:
            dot.node(name + "_op", v._op, shape="circle", width="0.3")
            dot.edge(name + "_op", name)
            for child in v._prev:
                dot.edge(visit(child), name + "_op")
        return name
    visit(root)
    return dot


x1, x2 = Value(2.0, label="x1"), Value(0.0, label="x2")
w1, w2 = Value(-3.0, label="w1"), Value(1.0, label="w2")
b = Value(6.8813735870195432, label="b")
x1w1 = x1 * w1; x1w1.label = "x1*w1"
x2w2 = x2 * w2; x2w2.label = "x2*w2"
s = x1w1 + x2w2; s.label = "x1w1+x2w2"
n = s + b; n.label = "n"
o = n.tanh(); o.label = "o"
draw_graph(o)

# %% [markdown]
# ## Backward, by hand
# Start at the output, where $\partial o/\partial o = 1$, and walk left. At every node the gradient
# that arrives from the right is multiplied by that node's *local* derivative, and nothing else:
# - `tanh`: local derivative $1 - \tanh^2(n) = 1 - o^2$, here $1 - \tfrac12 = 0.5$;
# - `+`: local derivative 1 for both inputs, so both receive the arriving gradient unchanged;
# - `*`: the local derivative for one factor is the *other* factor's value.
#
# Each line below is one step of the pencil-and-paper pass, written into the `.grad` fields.

# %%
o.grad = 1.0
n.grad = (1 - o.data ** 2) * o.grad    # tanh
s.grad = n.grad                        # + passes it on
b.grad = n.grad                        # + passes it on
x1w1.grad = s.grad                     # + passes it on
x2w2.grad = s.grad                     # + passes it on
x1.grad = w1.data * x1w1.grad          # * : the other factor's value
w1.grad = x1.data * x1w1.grad
x2.grad = w2.data * x2w2.grad
w2.grad = x2.data * x2w2.grad

hand_order = (o, n, s, b, x1w1, x2w2, x1, w1, x2, w2)
by_hand = {v.label: v.grad for v in hand_order}
print(f"{'node':10s} {'data':>8s} {'grad':>8s}")
for v in hand_order:
    print(f"{v.label:10s} {v.data:8.4f} {v.grad:8.4f}")
draw_graph(o)

# %% [markdown]
# Read the table as sensitivities: nudging $w_1$ up by $\varepsilon$ raises $o$ by about
# $1.0\,\varepsilon$, nudging $x_1$ lowers it by $1.5\,\varepsilon$, and $w_2$ does nothing here
# because it multiplies $x_2 = 0$. Now the code does the same pass: clear the grads, call
# `backward()`, compare, and check every leaf against a central difference
# $(f(v + h) - f(v - h)) / 2h$ that knows nothing about the chain rule.

# %%
for v in hand_order:
    v.grad = 0.0
o.backward()
print("backward() gives the hand values at all", len(hand_order), "nodes:",
      all(v.grad == by_hand[v.label] for v in hand_order))


def neuron(x1, x2, w1, w2, b):
    return math.tanh(x1 * w1 + x2 * w2 + b)


leaves = {"x1": x1, "x2": x2, "w1": w1, "w2": w2, "b": b}
h = 1e-6
for name, leaf in leaves.items():
    up = {k: v.data + (h if k == name else 0.0) for k, v in leaves.items()}
    down = {k: v.data - (h if k == name else 0.0) for k, v in leaves.items()}
    numeric = (neuron(**up) - neuron(**down)) / (2 * h)
    print(f"do/d{name:2s}  backprop {leaf.grad:+.4f}   central difference {round(numeric, 4) + 0.0:+.4f}")

# %% [markdown]
# ## The order `backward()` visits
# A node may send its gradient on only once every node that uses it has sent its share to it.
# The depth-first walk puts each Value after everything it was computed from (a topological
# order); walking that list backwards gives exactly the order of the hand pass. Each node's rule
# runs once, so the gradients with respect to *all* inputs cost about one more forward pass.

# %%
order = o.topological_order()
print("topological order:", " -> ".join(v.label for v in order))
print("backward visits:  ", " -> ".join(v.label for v in reversed(order)))

# %% [markdown]
# ## Three gate patterns
# Every backward rule above is one of a few patterns, and knowing them lets you read gradients off
# a graph. In $f = 2\,(x y + \max(z, w))$ with $x = 3, y = -4, z = 2, w = -1$ (CS231n's example):
# - **add distributes**: `+` hands the arriving gradient to each input unchanged;
# - **multiply swaps**: `*` gives each input the *other* input's value times the arriving gradient;
# - **max routes**: `max` sends all of it to the input that won and nothing to the other
#   (`relu` is `max(0, v)`).

# %%
x, y, z, w = Value(3.0, label="x"), Value(-4.0, label="y"), Value(2.0, label="z"), Value(-1.0, label="w")
xy = x * y; xy.label = "x*y"
m = z.max(w); m.label = "max(z,w)"
inner = xy + m; inner.label = "xy+max"
f = 2 * inner; f.label = "f"
f.backward()
for v, why in [(inner, "*2: multiply swaps, the other factor is 2"),
               (xy, "+: add distributes"), (m, "+: add distributes"),
               (x, "*: multiply swaps, y * 2"), (y, "*: multiply swaps, x * 2"),
               (z, "max: routes, z won"), (w, "max: routes, w lost")]:
    print(f"df/d{v.label:9s} = {v.grad:+5.1f}   {why}")
draw_graph(f)

# %% [markdown]
# ## A small neural network
# With `Value` a neuron is $\tanh(\sum_i w_i x_i + b)$ and an MLP is lists of neurons; nothing else
# is needed to train one. The data: two interleaving half-moons in the plane, generated by formula
# with a seeded generator, labelled $\pm 1$. The loss is micrograd's: the hinge loss
# $\max(0, 1 - y\,s)$ averaged over the points (zero once a point is on the right side with margin
# 1, so `relu` routes gradient only from the points still inside the margin), plus a little $L_2$
# penalty.

# %%
class Neuron:
    def __init__(self, n_in, rng, nonlinear=True):
        self.w = [Value(rng.uniform(-1, 1)) for _ in range(n_in)]
        self.b = Value(0.0)
        self.nonlinear = nonlinear

    def __call__(self, x):
        act = sum((wi * xi for wi, xi in zip(self.w, x)), self.b)
        return act.tanh() if self.nonlinear else act


class MLP:
    def __init__(self, sizes, rng):  # the last layer is linear: its output is a score
        self.layers = [[Neuron(n_in, rng, nonlinear=i < len(sizes) - 2) for _ in range(n_out)]
                       for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:]))]

    def __call__(self, x):
        for layer in self.layers:
            x = [neuron(x) for neuron in layer]
        return x[0]

    def parameters(self):
        return [p for layer in self.layers for neuron in layer for p in neuron.w + [neuron.b]]


def two_moons(n, noise, rng):
    """n points on two interleaving half circles (alternating labels +1 and -1), with Gaussian noise."""
    points, labels = [], []
    for i in range(n):
        angle = math.pi * rng.random()
        if i % 2 == 0:
            px, py, label = math.cos(angle), math.sin(angle), 1.0
        else:
            px, py, label = 1 - math.cos(angle), 0.5 - math.sin(angle), -1.0
        points.append((px + rng.gauss(0, noise), py + rng.gauss(0, noise)))
        labels.append(label)
    return points, labels


rng = random.Random(0)
X, Y = two_moons(40, 0.1, rng)
X_test, Y_test = two_moons(400, 0.1, random.Random(1))
model = MLP([2, 8, 8, 1], rng)
params = model.parameters()


def hinge_loss(points, labels):
    scores = [model(p) for p in points]
    data_loss = sum((1 - y * s).relu() for y, s in zip(labels, scores)) / len(points)
    return data_loss + 1e-4 * sum(p * p for p in params), scores


def accuracy(scores, labels):
    return sum((s.data > 0) == (y > 0) for s, y in zip(scores, labels)) / len(labels)


print(len(params), "parameters,", len(X), "training points")

# %% [markdown]
# Training is the loop every later lesson uses: forward, zero the grads, backward, step.

# %%
STEPS = 30
losses = []
for step in range(STEPS):
    loss, scores = hinge_loss(X, Y)
    for p in params:
        p.grad = 0.0
    loss.backward()
    lr = 3.0 * (1 - 0.9 * step / STEPS)  # large steps first, small ones to settle
    for p in params:
        p.data -= lr * p.grad
    losses.append(loss.data)


def band(fraction):
    """An accuracy as a 10-point band, so the printed verdict does not hang on one borderline point."""
    low = 10 * math.floor(10 * fraction)
    return f"{low}-{low + 10}%" if low < 100 else "100%"


n_values = len(loss.topological_order())
print(f"loss {losses[0]:.2f} -> {losses[-1]:.2f}; the last loss graph had {n_values} Values")
print("training accuracy", band(accuracy(scores, Y)))
test_scores = [model(p) for p in X_test]
print("test accuracy on 400 fresh points", band(accuracy(test_scores, Y_test)))

# %% [markdown]
# The decision boundary: the model's score on a grid over the plane, computed here with numpy from
# the trained weights (the same formula, 10 000 points at once), and the zero level drawn between
# the two colours.

# %%
import matplotlib.pyplot as plt
import numpy as np


def scores_on(grid):
    a = grid
    for i, layer in enumerate(model.layers):
        W = np.array([[wi.data for wi in neuron.w] for neuron in layer])
        bias = np.array([neuron.b.data for neuron in layer])
        a = a @ W.T + bias
        a = np.tanh(a) if i < len(model.layers) - 1 else a
    return a[:, 0]


gx, gy = np.meshgrid(np.linspace(-1.5, 2.5, 100), np.linspace(-1.0, 1.5, 100))
S = scores_on(np.column_stack([gx.ravel(), gy.ravel()])).reshape(gx.shape)
pts, labels = np.array(X), np.array(Y)
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.8))
ax0.plot(losses)
ax0.set(xlabel="step", ylabel="hinge loss + L2", title="training loss")
ax1.contourf(gx, gy, S > 0, levels=1, colors=["#fcbba1", "#c6dbef"], alpha=0.8)
ax1.contour(gx, gy, S, levels=[0.0], colors="k", linewidths=1)
ax1.scatter(*pts[labels > 0].T, c="#2171b5", s=18, label="+1")
ax1.scatter(*pts[labels < 0].T, c="#cb181d", s=18, label="-1")
ax1.set(title="decision boundary (black: score 0)", aspect="equal")
ax1.legend(loc="lower left")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## The same numbers from minigrad
# minigrad's engine does on tensors what `backward` does above: it records a graph as the forward
# pass runs, walks it in reverse topological order and applies one local rule per node. First the
# neuron, with float64 tensors: the same five gradients, and minigrad's drawing of the graph it
# recorded.

# %%
import minigrad
from minigrad.autograd import topological_order
from minigrad.graph import draw

T = {name: minigrad.tensor(v.data, dtype=minigrad.float64, requires_grad=True) for name, v in leaves.items()}
o_t = (T["x1"] * T["w1"] + T["x2"] * T["w2"] + T["b"]).tanh()
o_t.backward()
for name, v in leaves.items():
    print(f"do/d{name:2s}  Value {v.grad:+.4f}   minigrad {T[name].grad.item():+.4f}")
draw(o_t, show_grads=True, names={**T, "o": o_t})

# %% [markdown]
# Then the whole training loss of the trained MLP, written with matrices: each layer's neurons
# become the rows of one weight matrix, and a handful of tensor ops replace the thousands of scalar
# Values. Its gradient for every parameter is the scalar engine's (matrix products add in a
# different order, so the two agree to rounding, not bit for bit).

# %%
f64 = minigrad.float64
loss, scores = hinge_loss(X, Y)
for p in params:
    p.grad = 0.0
loss.backward()
weights = [(minigrad.tensor([[wi.data for wi in neuron.w] for neuron in layer], dtype=f64, requires_grad=True),
            minigrad.tensor([neuron.b.data for neuron in layer], dtype=f64, requires_grad=True))
           for layer in model.layers]
a = minigrad.tensor(X, dtype=f64)
for i, (W, bias) in enumerate(weights):
    a = a @ W.T + bias
    a = a.tanh() if i < len(weights) - 1 else a
score = a[:, 0]
penalty = sum((W ** 2).sum() + (bias ** 2).sum() for W, bias in weights)
loss_t = (1 - minigrad.tensor(Y, dtype=f64) * score).relu().mean() + 1e-4 * penalty
loss_t.backward()
ours = np.array([p.grad for p in params])
theirs = np.concatenate([np.column_stack([W.grad.numpy(), bias.grad.numpy()]).ravel() for W, bias in weights])
print("same loss:", math.isclose(loss.data, loss_t.item(), rel_tol=1e-12))
print(f"same gradient for all {len(params)} parameters (to 1e-12):", np.allclose(ours, theirs, rtol=1e-12, atol=1e-12))
print(f"graph nodes: {n_values} Values for the scalar engine,",
      len(topological_order([loss_t.grad_fn])), "nodes for minigrad")

# %% [markdown]
# ## Predict, then run
# 1. `a = Value(3.0); c = a + a; c.backward()`. What is `a.grad`? What would it be if `__add__`'s
#    backward *assigned* (`self.grad = out.grad`) instead of adding?
# 2. In the gate example, change $w$ from $-1$ to $5$. Which of the four gradients change, and to what?
# 3. Raise the neuron's bias from 6.88 to 10. Does the gradient reaching $w_1$ grow or shrink, and
#    by roughly how much?

# %%
a = Value(3.0)
c = a + a
c.backward()
print("1. d(a + a)/da =", a.grad, "(both edges add into a.grad)")


def add_assigning(p, q):  # __add__ with `=` in its backward rule
    out = Value(p.data + q.data, (p, q), "+")
    def _backward():
        p.grad = out.grad
        q.grad = out.grad
    out._backward = _backward
    return out


a = Value(3.0)
add_assigning(a, a).backward()
print("   with = instead of +=:", a.grad, "(the second edge overwrote the first)")

x, y, z, w = Value(3.0), Value(-4.0), Value(2.0), Value(5.0)
f = 2 * (x * y + z.max(w))
f.backward()
print(f"2. with w = 5: df/dx {x.grad:+.0f}, df/dy {y.grad:+.0f}, df/dz {z.grad:+.0f}, df/dw {w.grad:+.0f}"
      " (max now routes to w; x and y are unchanged)")

for bias in (6.8813735870195432, 10.0):
    w1_ = Value(-3.0)
    out = (Value(2.0) * w1_ + Value(0.0) * Value(1.0) + bias).tanh()
    out.backward()
    print(f"3. bias {bias:5.2f}: o = {out.data:.6f}, do/dw1 = {w1_.grad:.2e}")
print("   tanh saturates: 1 - o^2 collapses, and with it every gradient behind it")

# %% [markdown]
# What the rest of the chapter adds to these eighty lines: tensors instead of scalars (a gradient
# must be summed back over broadcast dimensions, 02.2), backward rules written with the same
# differentiable ops (so gradients of gradients work, 02.5), an iterative walk (no recursion
# limit), freeing the graph after use unless `retain_graph`, and checking every rule against
# central differences (`gradcheck`).
