"""The mode stack (minigrad.autograd.mode): one interface, per thread, events from the core."""

import threading

import numpy as np

import minigrad as mg
from minigrad import nn, optim
from minigrad.autograd import Function, Mode, is_backward_running, mode
from minigrad.profiler import profile


class Recorder(Mode):
    """Writes down every hook call it receives."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def before_op(self, cls, args):
        self.log.append((self.name, "before", cls.__name__))
        return args

    def after_op(self, ctx, args, kwargs, outputs):
        self.log.append((self.name, "after", ctx.name()))

    def node_backward(self, node, grads):
        self.log.append((self.name, "node_backward", node.name()))

    def saved_array(self, ctx, index, array):
        self.log.append((self.name, "saved_array", ctx.name(), index))

    def inplace_write(self, t, result):
        self.log.append((self.name, "inplace_write", tuple(t.shape)))

    def fresh_grad(self, leaf, grad, value):
        self.log.append((self.name, "fresh_grad", tuple(leaf.shape), grad is value))


def test_the_innermost_mode_wraps_the_op_closest_and_the_stack_empties():
    log: list = []
    x = mg.ones(3)
    with Recorder("outer", log) as outer, Recorder("inner", log) as inner:
        assert mode.current_modes() == (outer, inner)
        x.exp()
    assert mode.current_modes() == ()
    assert log == [("inner", "before", "Exp"), ("outer", "before", "Exp"),
                   ("outer", "after", "Exp"), ("inner", "after", "Exp")]


def test_before_op_may_replace_the_arguments():
    class Doubling(Mode):
        def before_op(self, cls, args):
            return tuple(a * 2.0 if isinstance(a, mg.Tensor) and cls.__name__ == "Exp" else a for a in args)

    with Doubling():
        y = mg.zeros(2).exp() + mg.ones(2).log()  # exp(0 * 2) + log(1)
    np.testing.assert_allclose(y.numpy(), [1.0, 1.0])


def test_events_from_the_core_saved_array_backward_write_and_fresh_grad():
    log: list = []
    w = mg.tensor([1.0, -2.0, 3.0], requires_grad=True)
    with Recorder("r", log):
        loss = w.relu().sum()  # ReLU keeps its mask, an array of its own, for backward
        loss.backward()
        with mg.no_grad():
            w.sub_(w.grad)  # no mode asks to see writes: in-place arithmetic takes its out= path
    events = [e[1:] for e in log if e[1] not in ("before", "after")]
    assert events == [("saved_array", "Relu", 0), ("node_backward", "Sum"), ("node_backward", "Relu"),
                      ("fresh_grad", (3,), True)]  # the engine kept its own gradient, without a copy

    class Watcher(Recorder):
        sees_writes = True

    log.clear()
    with Watcher("w", log), mg.no_grad():
        w.sub_(1.0)
    assert ("w", "inplace_write", (3,)) in log


def test_is_backward_running_inside_backward_rules_only():
    seen = []

    class Probe(Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(("forward", is_backward_running()))
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            seen.append(("backward", is_backward_running()))
            return g

    x = mg.ones(2, requires_grad=True)
    Probe.apply(x).sum().backward()
    assert seen == [("forward", False), ("backward", True)] and not is_backward_running()


def test_modes_are_per_thread():
    other: list = []

    def work():
        other.append(mode.current_modes())
        (mg.ones(2) + 1.0).exp()

    with profile() as prof:
        t = threading.Thread(target=work)
        t.start()
        t.join()
        mg.ones(2).log()
    assert other == [()]
    assert [e.name for e in prof.events] == ["Log"]


def test_a_recomputation_counts_as_forward_on_its_own_thread_only():
    inside, done = threading.Event(), threading.Event()
    seen = []

    def recompute():  # checkpointing's backward: a segment's forward again, inside a backward pass
        with mode.backward_pass(), mode.recomputation():
            seen.append(mode.in_forward())
            inside.set()
            done.wait(60)  # stay inside while the main thread runs a backward rule

    t = threading.Thread(target=recompute)
    t.start()
    inside.wait(60)
    with mode.backward_pass():
        seen.append(mode.in_forward())  # this thread's backward rules make gradients, not activations
    done.set()
    t.join()
    assert seen == [True, False] and mode.in_forward()


def test_a_traced_training_step_uses_the_engines_fresh_gradient():
    """The tracer binds a leaf's first .grad from the engine's event, not by guessing."""
    mg.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = optim.SGD(model.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        loss = (model(x) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    x = mg.randn(4, 3)
    step(x)
    traced = mg.graph.trace(step, x)
    assert sum(n.op == "set_grad" for n in traced.graph) == 2
    eager = nn.Linear(3, 2)
    eager.load_state_dict(model.state_dict())
    eager_opt = optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(2):
        eager_opt.zero_grad()
        (eager(x) ** 2).mean().backward()
        eager_opt.step()
        traced(x)
    np.testing.assert_allclose(model.weight.detach().numpy(), eager.weight.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(model.weight.grad.numpy(), eager.weight.grad.numpy(), rtol=1e-6)


def test_the_engines_copy_of_a_gradient_reads_the_node_of_what_it_copied():
    p = mg.ones(3, requires_grad=True)

    def f(x):
        (p + x).sum().backward()  # Sum's gradient is a broadcast view: the engine stores a copy of it
        return x

    traced = mg.graph.trace(f, mg.ones(3))
    (set_grad,) = [n for n in traced.graph if n.op == "set_grad"]
    assert set_grad.inputs[1].op == "BroadcastTo"  # computed at replay, not frozen as a constant
    p.grad = None
    traced(mg.ones(3))
    np.testing.assert_array_equal(p.grad.numpy(), [1.0, 1.0, 1.0])


def test_grad_mode_is_per_thread():
    seen = []

    def work():
        seen.append(mg.is_grad_enabled())
        with mg.no_grad():
            seen.append(mg.is_grad_enabled())

    with mg.no_grad():
        t = threading.Thread(target=work)
        t.start()
        t.join()
        assert not mg.is_grad_enabled()
    assert seen == [True, False] and mg.is_grad_enabled()
