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
# # 00 A scalar engine from scratch
#
# Before the real thing, the whole idea in fifty lines. Every number is a `Value` that remembers
# the values it was computed from and how to send a gradient back to them; `backward` visits the
# graph in reverse topological order and applies the chain rule at each node. This is
# micrograd's design; the rest of the chapter builds the same engine for tensors, in `minigrad`.

# %%
import math


class Value:
    """A scalar that records how it was made, so that gradients can flow back through it."""

    def __init__(self, data, parents=(), op=""):
        self.data, self.grad = float(data), 0.0
        self.parents, self.op = parents, op
        self.send_back = lambda: None  # adds this node's gradient into its parents' .grad

    def __add__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        out = Value(self.data + other.data, (self, other), "+")
        def send_back():
            self.grad += out.grad
            other.grad += out.grad
        out.send_back = send_back
        return out

    def __mul__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        out = Value(self.data * other.data, (self, other), "*")
        def send_back():
            self.grad += other.data * out.grad
            other.grad += self.data * out.grad
        out.send_back = send_back
        return out

    def tanh(self):
        out = Value(math.tanh(self.data), (self,), "tanh")
        def send_back():
            self.grad += (1 - out.data ** 2) * out.grad
        out.send_back = send_back
        return out

    def exp(self):
        out = Value(math.exp(self.data), (self,), "exp")
        def send_back():
            self.grad += out.data * out.grad
        out.send_back = send_back
        return out

    __radd__, __rmul__ = __add__, __mul__

    def backward(self):
        order, seen = [], set()
        def visit(node):  # depth first: a node joins the order after everything it depends on
            if node not in seen:
                seen.add(node)
                for parent in node.parents:
                    visit(parent)
                order.append(node)
        visit(self)
        self.grad = 1.0
        for node in reversed(order):  # the output first, each node before the nodes it came from
            node.send_back()


# %% [markdown]
# A neuron with two inputs, `tanh(w1 * x1 + w2 * x2 + b)`, and a loss that uses its output twice
# (so one node's gradient is a sum over two paths, which is what `+=` is for):

# %%
x1, x2, w1, w2, b = Value(2.0), Value(-1.0), Value(-3.0), Value(1.0), Value(6.88)
y = (w1 * x1 + w2 * x2 + b).tanh()
loss = y * y + y.exp()
loss.backward()
print(f"loss {loss.data:.6f}")
for name, v in [("x1", x1), ("x2", x2), ("w1", w1), ("w2", w2), ("b", b)]:
    print(f"d loss / d {name} = {v.grad:+.6f}")

# %% [markdown]
# The same computation in minigrad, whose engine does on tensors exactly what `backward` does
# above: the gradients agree to the last digit printed.

# %%
import minigrad

leaves = {name: minigrad.tensor(v.data, dtype=minigrad.float64, requires_grad=True)
          for name, v in [("x1", x1), ("x2", x2), ("w1", w1), ("w2", w2), ("b", b)]}
t = (leaves["w1"] * leaves["x1"] + leaves["w2"] * leaves["x2"] + leaves["b"]).tanh()
(t * t + t.exp()).backward()
for name, v in [("x1", x1), ("x2", x2), ("w1", w1), ("w2", w2), ("b", b)]:
    assert math.isclose(leaves[name].grad.item(), v.grad, rel_tol=1e-12), name
    print(f"{name}: scratch {v.grad:+.6f}   minigrad {leaves[name].grad.item():+.6f}")

# %% [markdown]
# What the rest of the chapter adds to these fifty lines: tensors instead of scalars (so a
# gradient must be summed back over broadcast dimensions), backward rules written with the same
# differentiable ops (so gradients of gradients work), an iterative order (no recursion limit),
# freeing the graph after use unless `retain_graph`, and checking every rule against central
# differences (`gradcheck`).
