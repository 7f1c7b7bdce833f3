"""minigrad.compile: compiled results equal eager ones (random elementwise/broadcast/reduction
programs, random programs of views and in-place writes, MLP and CNN training steps, whose optimizers'
updates are all computed into their tensors), signatures are cached and re-traced, and what a graph
cannot replay falls back to eager with a warning."""

import contextlib
import copy
import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import minigrad as mg
from minigrad import nn, optim
from minigrad.graph import CompileWarning, overlap, trace
from minigrad.graph.codegen import BACKENDS
from minigrad.graph.codegen import numpy_blocks
from minigrad.graph.executor import Executor
from helpers import cpu_only, skip_if_kernels_cannot_run, training_step
from test_trace import _copies_through_an_old_view


@contextlib.contextmanager
def small_blocks():
    saved = numpy_blocks.BLOCK_SIZE, numpy_blocks.NUM_THREADS, numpy_blocks.PARALLEL_MIN_SIZE
    numpy_blocks.BLOCK_SIZE, numpy_blocks.NUM_THREADS, numpy_blocks.PARALLEL_MIN_SIZE = 8, 2, 0
    try:
        yield
    finally:
        numpy_blocks.BLOCK_SIZE, numpy_blocks.NUM_THREADS, numpy_blocks.PARALLEL_MIN_SIZE = saved


def assert_close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=rtol, atol=atol, equal_nan=True)


# -- random programs ---------------------------------------------------------------------------------
UNARY = [lambda a: a.tanh(), mg.sigmoid, lambda a: a.tanh().exp(), lambda a: a.abs().sqrt(), lambda a: -a,
         mg.relu, lambda a: a.clamp(-1.0, 1.0), lambda a: a.sin() * 3]
BINARY = [lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a / (1 + b.abs()),
          mg.maximum, lambda a, b: mg.where(a > b, a, b * 2)]
REDUCE = [lambda a: a.sum(-1, keepdim=True), lambda a: a.mean(0), lambda a: a.amax(-1, keepdim=True),
          lambda a: a.softmax(-1)]
STEP = st.tuples(st.sampled_from("uubbr"), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99))


def run_program(steps, x, row, col, s):
    """Apply the steps to a growing list of values; every shape met broadcasts with every other."""
    values = [x, row, col, s]
    for kind, i, j, k in steps:
        a, b = values[i % len(values)], values[j % len(values)]
        if kind == "u":
            values.append(UNARY[k % len(UNARY)](a))
        elif kind == "b":
            values.append(BINARY[k % len(BINARY)](a, b))
        else:  # a 0-d value has nothing to reduce
            values.append(REDUCE[k % len(REDUCE)](a) if a.ndim else a.tanh())
    return values[-1], values[4 + len(values[4:]) // 2]


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=30, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=12), st.integers(1, 5), st.integers(1, 7))
def test_random_programs_compile_to_the_same_results(backend, steps, rows, cols):
    skip_if_kernels_cannot_run()
    def program(x, row, col, s):
        return run_program(steps, x, row, col, s)

    compiled = mg.compile(program, backend=backend)
    with small_blocks():
        for _ in range(3):  # the first call traces (and is eager), the next ones replay the fused graph
            inputs = mg.randn(rows, cols), mg.randn(rows, 1), mg.randn(cols), mg.randn()
            for a, b in zip(compiled(*inputs), program(*inputs)):
                assert_close(a, b)


# -- views and in-place writes --------------------------------------------------------------------------
VIEWS = [lambda a: a.reshape(-1), lambda a: a.unsqueeze(0), lambda a: a.transpose(0, -1),
         lambda a: a[1:] if a.shape[0] > 1 else a[:], lambda a: a[0] if a.ndim > 1 else a[:2],
         lambda a: a.detach(), lambda a: a.data]  # the last two: the very same array
WRITES = ["add_", "mul_", "copy_"]
MEMORY_STEP = st.tuples(st.sampled_from("vvWwrr"), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99))


def memory_program(steps, p):
    """A program that takes views (``v``) of its input ``t`` and of ``p`` (a tensor it closes over:
    the executor computes updates into its memory), writes in place into them (``W``) or through
    a view (``w``) and reads them (``r``), in any order. A view taken before a write sees the
    write, as the memory it shares does."""
    def f(t, x):
        storages, reads = [[t], [p]], [x]
        with mg.no_grad():
            for kind, i, j, k in steps:
                family = storages[i % 2]
                a = family[0 if kind == "W" else j % len(family)]
                if kind == "v":
                    family.append(VIEWS[k % len(VIEWS)](a))
                elif kind == "r":
                    reads.append((a * 1.5).tanh())
                else:
                    src = reads[k % len(reads)]
                    src = src.reshape(a.shape) if src.numel() == a.numel() else src.mean()
                    getattr(a, WRITES[k % len(WRITES)])(src.tanh() if WRITES[k % len(WRITES)] == "mul_" else src)
            return reads[-1] + 0, t * 1, p.sum()
    return f


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40, deadline=None)
@given(st.lists(MEMORY_STEP, min_size=1, max_size=12))
@example(steps=[("v", 0, 0, 0), ("v", 0, 1, 20), ("v", 0, 2, 0), ("W", 0, 0, 0), ("r", 0, 2, 0)])  # t.reshape(-1).data
def test_views_and_in_place_writes_compile_to_the_same_results(backend, steps):
    """Whatever the order of views, writes and reads, a compiled program computes what eager does
    (inputs and closed-over tensors written in place included), or runs eagerly where the graph
    cannot replay a write (one through a view into memory that is read again elsewhere)."""
    skip_if_kernels_cannot_run()
    p = mg.randn(3, 4)
    twin = p.clone()
    compiled = mg.compile(memory_program(steps, p), backend=backend)
    eager = memory_program(steps, twin)
    with warnings.catch_warnings(), small_blocks():
        warnings.simplefilter("ignore", CompileWarning)
        for _ in range(3):  # the first call traces (and is eager), the next ones replay the graph
            t, x = mg.randn(3, 4), mg.randn(3, 4)
            t2 = t.clone()
            for a, b in zip(compiled(t, x), eager(t2, x)):
                assert_close(a, b)
            assert_close(t, t2)
            assert_close(p, twin)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_view_taken_before_a_write_reads_the_written_values(backend):
    """``v = t.reshape(-1); t.copy_(a); t.copy_(v.reshape(2, 2))`` leaves a's values in t."""
    skip_if_kernels_cannot_run()
    compiled = mg.compile(_copies_through_an_old_view, backend=backend)
    for _ in range(3):
        t, twin, a = mg.zeros(2, 2), mg.zeros(2, 2), mg.ones(2, 2)
        got, want = compiled(t, a), _copies_through_an_old_view(twin, a)
        assert np.array_equal(got.numpy(), want.numpy()), f"eager {want.numpy().ravel()}, compiled {got.numpy().ravel()}"
        assert np.array_equal(t.numpy(), twin.numpy()), f"eager {twin.numpy().ravel()}, compiled {t.numpy().ravel()}"


def test_a_write_through_a_view_that_the_graph_cannot_replay_runs_eagerly():
    def f(t):
        with mg.no_grad():
            t.reshape(-1).add_(1)  # t's new value would need the view undone
        return t * 2

    compiled = mg.compile(f)
    t = mg.zeros(2, 2)
    with pytest.warns(CompileWarning, match="changed in place"):
        assert_close(compiled(t), mg.full((2, 2), 2.0))  # the traced call returns eager's result
    assert_close(compiled(t), mg.full((2, 2), 4.0))  # and later calls run eagerly
    assert list(compiled.graphs.values()) == [None]


# -- training steps -----------------------------------------------------------------------------------
def mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


def sgd(params):
    return optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)


def assert_state_close(a, b, exact):
    """Optimizer state equals eager's: bit for bit when ``exact`` (numpy kernels run numpy's own
    ufuncs), else to float rounding at the state's own scale. RMSprop's buffer holds g / sqrt(v),
    about 1 in size however small g is; an ulp between a C kernel's tanhf and numpy's tanh, carried
    through the step, leaves 3e-6 there, 1e-4 of an element that momentum brought near zero."""
    if exact:
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    else:
        assert_close(a, b, atol=1e-6 * max(1.0, b.abs().max().item()))


def train_both(build, x_shape, classes=3, steps=10, make_opt=sgd, backend=None):
    """Train a model and its copy for ``steps`` steps, one step compiled (with the kernel
    ``backend``) and one eager, after an eager warm-up step each (so the momentum buffers exist
    before the trace)."""
    skip_if_kernels_cannot_run()
    model = build()
    twin = copy.deepcopy(model)
    opts = [make_opt(m.parameters()) for m in (model, twin)]
    rng = np.random.default_rng(0)
    data = [(mg.tensor(rng.standard_normal(x_shape).astype(np.float32)),
             mg.tensor(rng.integers(0, classes, x_shape[0]))) for _ in range(steps + 1)]

    for m, opt in zip((model, twin), opts):
        training_step(m, opt, nn.functional.cross_entropy)(*data[0])
    compiled = mg.compile(training_step(model, opts[0], nn.functional.cross_entropy), backend=backend)
    eager = training_step(twin, opts[1], nn.functional.cross_entropy)
    versions = {p: p._version for m in (model, twin) for p in m.parameters()}  # deepcopy starts twin's at 0
    for x, t in data[1:]:
        assert_close(compiled(x, t), eager(x, t))
    for p, q in zip(model.parameters(), twin.parameters()):
        assert_close(p, q)
        assert_close(p.grad, q.grad)
        state, twin_state = opts[0].state[p], opts[1].state[q]
        assert state.keys() == twin_state.keys()
        for k, v in state.items():  # the momentum buffers too
            if isinstance(v, mg.Tensor):
                assert_state_close(v, twin_state[k], exact=backend == "numpy" and v.device.type == "cpu")
                assert min(v._version, twin_state[k]._version) >= steps, k
        # every step bumps each tensor it writes: the compiled one once per recorded write, eager
        # Adam's array update once per tensor (its in-place writes go to the arrays)
        assert min(p._version - versions[p], q._version - versions[q]) >= steps
    (graph,) = compiled.graphs.values()
    return graph


@pytest.mark.parametrize("backend", BACKENDS)
def test_mlp_training_step_matches_eager_for_ten_steps(backend):
    graph = train_both(mlp, (12, 8), backend=backend)
    kinds = [n.meta["kind"] for n in graph if n.op == "fused"]
    assert "matmul" in kinds and "reduction" in kinds and "elementwise" in kinds


@pytest.mark.parametrize("backend", BACKENDS)
def test_cnn_training_step_matches_eager_for_ten_steps(backend):
    graph = train_both(lambda: nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                             nn.Linear(4 * 3 * 3, 3)), (6, 1, 8, 8), backend=backend)
    assert any(n.op == "fused" for n in graph)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_backward_of_gelu_tanh_and_sigmoid_fuses_and_matches_eager(backend):
    """The elementwise backward of each activation joins its matmul's epilogue: one kernel each,
    in C with the C backend."""
    graph = train_both(lambda: nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 16), nn.Tanh(),
                                             nn.Linear(16, 16), nn.Sigmoid(), nn.Linear(16, 3)), (12, 8),
                       backend=backend)
    kernels = {op: n.fn for n in graph if n.op == "fused" for op in n.attrs["ops"]}
    for op in ("Erf", "TanhBackward", "SigmoidBackward"):
        assert "Matmul" in next(n.attrs["ops"] for n in graph if n.op == "fused" and op in n.attrs["ops"])
        assert type(kernels[op]).__name__ == ("CKernel" if backend == "c" else "CpuKernel")


@pytest.mark.parametrize("make_opt", [sgd, lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
                                      lambda ps: optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=True)],
                         ids=["sgd", "nesterov", "rmsprop"])
@pytest.mark.parametrize("backend", BACKENDS)
@cpu_only("only CPU kernels write into a given array; a fused CUDA kernel's update is copied at the end")
def test_every_update_is_computed_into_its_tensor(make_opt, backend):
    """No copy is left for the end: each new parameter and optimizer state is written where it lives
    (and holds eager's values: bit for bit with numpy kernels, centered RMSprop's included)."""
    graph = train_both(mlp, (12, 8), make_opt=make_opt, backend=backend)
    writes = Executor(graph).writes
    assert writes.absorbed == {n for n in graph if n.op == "copy_"}
    assert writes.into and writes.own_grads


@pytest.mark.parametrize("make_opt", [lambda ps: optim.AdamW(ps, lr=0.01),
                                      lambda ps: optim.Adam(ps, lr=0.01, amsgrad=True),
                                      lambda ps: optim.Adadelta(ps, lr=0.5)], ids=["adamw", "amsgrad", "adadelta"])
def test_adam_step_counts_are_tensors_so_a_compiled_step_counts_too(make_opt):
    """Adam's bias corrections change every step: computed from a tensor step count, they are
    replayed, not frozen (10 compiled steps equal eager), and one graph serves every step."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        train_both(mlp, (12, 8), make_opt=make_opt)


def _lr_schedule_run(compiled: bool, lrs: list[float]) -> tuple[list, mg.Tensor, mg.Tensor]:
    mg.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = optim.SGD(model.parameters(), lr=lrs[0], momentum=0.9)
    x, t = mg.randn(8, 4), mg.randint(0, 2, (8,))
    step = training_step(model, opt, nn.functional.cross_entropy)
    step(x, t)  # the eager warm-up: momentum buffers exist before the trace
    run = mg.compile(step) if compiled else step
    for lr in lrs:
        opt.param_groups[0]["lr"] = lr  # what a scheduler's step() does
        run(x, t)
    return run, model.weight, model.bias


def test_a_new_learning_rate_traces_again_instead_of_replaying_the_old_one():
    skip_if_kernels_cannot_run()
    lrs = [0.1, 0.1, 0.1, 0.01, 0.01, 0.01, 0.1]
    compiled, *params = _lr_schedule_run(True, lrs)
    _, *expected = _lr_schedule_run(False, lrs)
    for p, q in zip(params, expected):
        assert_close(p, q)
    assert len(compiled.graphs) == 2  # one per learning rate: back at 0.1, the first graph replays


def test_python_numbers_that_change_on_every_call_run_eagerly_and_say_which():
    skip_if_kernels_cannot_run()
    lrs = [0.1 / (1 + i) for i in range(6)]  # a per-step schedule
    with pytest.warns(CompileWarning, match=r"Python numbers \(lr\) of its SGD step changed on two calls in a row"):
        _, *params = _lr_schedule_run(True, lrs)
    _, *expected = _lr_schedule_run(False, lrs)
    for p, q in zip(params, expected):
        assert_close(p, q)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_overwritten_momentum_copy_is_dropped_and_the_update_fuses(backend):
    """``buf.mul_(0.9).add_(g)`` records two copies into ``buf``; the first is overwritten, so compile
    drops it and ``buf * 0.9 + g`` becomes one kernel computed into ``buf``; with C kernels the
    weight's update ``p - lr * buf`` joins it, one kernel with two results, each computed into its
    tensor (parameters, momentum buffers and their versions checked against eager for 10 steps
    by ``train_both``)."""
    graph = train_both(mlp, (12, 8), make_opt=lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9), backend=backend)
    targets = [n.inputs[0] for n in graph if n.op == "copy_"]
    assert len(targets) == len(set(targets)) == 12  # one copy per parameter and per buffer
    buffer_updates = [n for n in graph if n.op == "copy_" and n.attrs.get("writes") == 2]
    kernels = [n.inputs[1].inputs[0] if n.inputs[1].op == "getitem" else n.inputs[1] for n in buffer_updates]
    assert len(buffer_updates) == 6 and all(k.op == "fused" for k in kernels)
    assert all(k.attrs["ops"] == (("Mul", "Add", "Mul", "Sub") if backend == "c" else ("Mul", "Add")) for k in kernels)
    written = Executor(graph).writes.into
    assert all(n.inputs[1] in written for n in graph if n.op == "copy_")  # no copy left to do


@pytest.mark.parametrize("backend", BACKENDS)
def test_weight_gradients_overlap_the_rest_of_the_step_and_still_match_eager(backend, monkeypatch):
    monkeypatch.setattr(overlap, "OVERLAP_MIN_MACS", 0)  # the small MLP's products count as big
    graph = train_both(mlp, (12, 8), backend=backend)
    planned = Executor(graph).overlap
    assert planned and all(n.op == "Matmul" and n.shape in ((16, 8), (16, 16), (3, 16)) for n in planned)


# -- signatures and the cache ---------------------------------------------------------------------------
def test_decorator_forms_and_caching_by_signature(capsys):
    skip_if_kernels_cannot_run()
    calls = []

    @mg.compile
    def f(x, scale):
        calls.append(1)
        return (x * scale).tanh() + 1

    x = mg.randn(4, 3)
    for _ in range(3):
        assert_close(f(x, 2.0), (x * 2.0).tanh() + 1)
    assert len(calls) == 1  # traced once, replayed twice
    f(mg.randn(5, 3), 2.0)  # a new shape
    f(x, 3.0)  # a non-tensor argument is a constant of its signature
    f(x.to(mg.float64), 2.0)
    with mg.no_grad():
        f(x, 2.0)  # grad mode is part of the signature
        f(mg.randn(4, 3, requires_grad=True), 2.0)  # and so is requires_grad
    assert len(calls) == len(f.graphs) == 6
    assert f.__name__ == "f" and "fused" in str(next(iter(f.graphs.values())))

    g = mg.compile(verbose=True)(lambda x: (x * 2).exp().sum())
    g(x)
    out = capsys.readouterr().out
    assert "fuse_elementwise" in out and "eliminate_dead_code" in out


def test_a_module_compiles_its_forward_and_still_answers_as_the_module():
    skip_if_kernels_cannot_run()
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    compiled = mg.compile(model)
    assert len(list(compiled.parameters())) == 4
    x = mg.randn(3, 4)
    with mg.no_grad():
        for _ in range(2):
            assert_close(compiled(x), model(x))
        model.eval()  # train/eval is part of the signature
        compiled(x)
    assert len(compiled.graphs) == 2


def test_inside_another_trace_the_ops_are_recorded():
    compiled = mg.compile(lambda x: (x * 2).tanh())
    traced = trace(lambda x: compiled(x) + 1, mg.randn(3))
    assert [n.op for n in traced.graph][1:4] == ["Mul", "Tanh", "Add"]


def test_dropout_draws_a_fresh_mask_on_every_replay():
    compiled = mg.compile(lambda x: nn.functional.dropout(x.exp(), 0.5) * 2)
    x = mg.ones(200)
    first, second, third = (compiled(x).numpy() for _ in range(3))
    assert not np.array_equal(second, third)
    np.testing.assert_allclose(third[third != 0], 2 * 2 * np.e, rtol=1e-6)  # kept values scaled by 1 / (1 - p)


# -- falling back to eager -------------------------------------------------------------------------------
def test_outputs_that_need_autograd_run_eagerly():
    W = mg.randn(3, 2, requires_grad=True)
    compiled = mg.compile(lambda x: (x @ W).tanh())
    x = mg.randn(4, 3)
    with pytest.warns(CompileWarning, match="outputs require grad"):
        compiled(x)
    y = compiled(x)  # eager: the caller can backpropagate through it
    y.sum().backward()
    assert W.grad is not None and list(compiled.graphs.values()) == [None]


def test_ops_that_would_freeze_a_traced_value_run_eagerly_and_are_named():
    compiled = mg.compile(lambda x, i: x[i] * 2)
    x = mg.randn(5)
    with pytest.warns(CompileWarning, match="GetItem would freeze a traced value"):
        compiled(x, mg.tensor([0, 2]))
    assert_close(compiled(x, mg.tensor([1, 3])), x[mg.tensor([1, 3])] * 2)


def test_writes_the_tracer_cannot_replay_run_eagerly():
    W = mg.randn(3)

    def f(x):
        y = x * W
        with mg.no_grad():
            W.zero_()  # a write without an op
        return y

    compiled = mg.compile(f)
    with pytest.warns(CompileWarning, match="changed in place"):
        compiled(mg.ones(3))
    W.array[:] = 2.0
    assert_close(compiled(mg.ones(3)), mg.full((3,), 2.0))  # eager again: it reads W and zeroes it
    assert W.abs().sum().item() == 0


def test_the_cache_is_bounded():
    compiled = mg.compile(lambda x: x * 2, cache_size_limit=2)
    compiled(mg.randn(1))
    compiled(mg.randn(2))
    with pytest.warns(CompileWarning, match="cache_size_limit"):
        assert compiled(mg.randn(3)).shape == (3,)
