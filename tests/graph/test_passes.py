"""Graph passes: each pass alone on hand-built and traced graphs, then all of them on traced MLPs,
training steps, CNNs and random programs; after every pass the graph computes what it did before
(and what eager minigrad computes), and the input graph is left as it was."""

import copy
import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minigrad as mg
from minigrad import nn, optim
from minigrad.graph import Graph, trace
from minigrad.graph.passes import (PassManager, default_passes, eliminate_common_subexpressions, eliminate_dead_code,
                                   fold_batch_norm, fold_constants, simplify)
from minigrad.nn.fusion import fold_conv_bn, fuse_conv_bn_eval
from minigrad.graph.trace import TENSOR_ARG, run_graph
from minigrad.ops.elementwise import Cast, Exp, Log, Mul, Op
from helpers import to_numpy, training_step

PASSES = [eliminate_dead_code, fold_constants, functools.partial(fold_constants, freeze=True),
          eliminate_common_subexpressions, simplify, fold_batch_norm]


def randn(*shape, requires_grad=False):
    return mg.randn(*shape, dtype=mg.float64, requires_grad=requires_grad)


def ops(graph):
    return [n.op for n in graph.topological_order()]


def run(graph, *inputs):
    """The graph's outputs on these inputs, as numpy arrays."""
    return [to_numpy(a) for a in run_graph(graph, list(inputs))]


def array(values):
    """A float64 array on the suite's device, for a hand-built graph's constant."""
    return mg.tensor(values, dtype=mg.float64).array


def assert_same(graph, new, *inputs, rtol=1e-12):
    for a, b in zip(run(graph, *inputs), run(new, *inputs)):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=rtol)


def unchanged(fn):
    """Run ``fn(graph)`` and check the graph it was given is the same afterwards."""
    def check(graph):
        before = str(graph)
        new = fn(graph)
        assert str(graph) == before and new is not graph
        return new
    return check


def op_node(g, cls, inputs, shape, dtype, attrs=None, layout=None):
    meta = {"args": layout or (TENSOR_ARG,) * len(inputs), "kwargs": ()}
    return g.add_node(cls.__name__, inputs, attrs, shape=shape, dtype=dtype, fn=cls, meta=meta)


# -- dead code elimination --------------------------------------------------------------------------
def test_dce_drops_what_reaches_no_output_and_keeps_the_input_graph():
    g = Graph()
    x = g.add_node("placeholder", shape=(3,), dtype=np.dtype("float64"), name="%x")
    unused = g.add_node("placeholder", shape=(3,), dtype=np.dtype("float64"), name="%unused")
    e = op_node(g, Exp, [x], (3,), np.dtype("float64"))
    op_node(g, Log, [op_node(g, Exp, [x], (3,), np.dtype("float64"))], (3,), np.dtype("float64"))  # dead chain
    g.set_outputs([e])
    new = unchanged(eliminate_dead_code)(g)
    assert ops(new) == ["placeholder", "placeholder", "Exp", "output"]  # the signature keeps %unused
    assert len(g) == 6 and unused in g
    assert_same(g, new, randn(3), randn(3))


def test_dce_removes_a_recorded_python_test_but_keeps_random_ops():
    def f(x):
        if x.sum() > 0:  # recorded, but the replay no longer branches on it
            return x * 2
        return -x

    traced = trace(f, mg.ones(3, dtype=mg.float64))
    new = eliminate_dead_code(traced.graph)
    assert "Greater" not in ops(new) and "Mul" in ops(new)
    traced = trace(lambda x: (nn.functional.dropout(x, 0.5), x.exp())[1], randn(4))
    assert "Dropout" in ops(eliminate_dead_code(traced.graph))  # its draw moves the generator


# -- constant folding ----------------------------------------------------------------------------------
def test_constant_subgraphs_fold_into_one_constant():
    c = randn(3, 4)

    def f(x):
        return x * (c.exp() + 1).sum(0) + c.max(dim=0)[0]  # a tuple op read through getitem folds too

    traced = trace(f, randn(3, 4))
    new = unchanged(fold_constants)(traced.graph)
    assert ops(new).count("constant") == 2 and not {"Exp", "Sum", "MaxDim", "getitem"} & set(ops(new))
    x = randn(3, 4)
    assert_same(traced.graph, new, x)
    np.testing.assert_allclose(run(new, x)[0], f(x).numpy(), rtol=1e-12)


def test_parameters_fold_only_when_frozen_and_freezing_takes_a_snapshot():
    W = randn(4, 4, requires_grad=True)
    traced = trace(lambda x: x @ (W.T * 2), randn(2, 4))
    live = fold_constants(traced.graph)
    frozen = fold_constants(traced.graph, freeze=True)
    assert "parameter" in ops(live) and "Permute" in ops(live)
    assert "parameter" not in ops(frozen) and ops(frozen) == ["placeholder", "constant", "Matmul", "output"]
    x = randn(2, 4)
    assert_same(traced.graph, frozen, x)
    with mg.no_grad():
        W.mul_(3.0)
    np.testing.assert_allclose(run(live, x)[0], run(traced.graph, x)[0], rtol=1e-12)  # sees the update
    assert not np.allclose(run(frozen, x)[0], run(traced.graph, x)[0])  # inference weights stay put


def test_random_ops_user_functions_and_returned_values_do_not_fold():
    c = randn(5)

    class Twice(mg.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

    traced = trace(lambda x: (x + nn.functional.dropout(c, 0.5) + Twice.apply(c), c * 3, c.max(0)[0]), randn(5))
    new = fold_constants(traced.graph)
    assert {"Dropout", "Twice", "Mul", "MaxDim"} <= set(ops(new))  # c * 3 is returned: folding would share its buffer
    np.testing.assert_allclose(run(new, randn(5))[2], c.max(0)[0].numpy())


def test_frozen_training_step_still_updates_its_parameters():
    """``freeze`` never freezes state the graph writes (copy_ targets, .grad)."""
    model, twin, data, steps = _sgd_setup()
    traced = trace(steps[0], *data[1])
    new = fold_constants(traced.graph, freeze=True)
    assert ops(new).count("copy_") == ops(traced.graph).count("copy_")
    _replay_and_compare(new, model, twin, steps[1], data)


def test_arrays_an_op_saved_fold_with_it():
    class Doubled(Op):  # forward keeps a mask for backward: the graph reads it through a saved node
        @staticmethod
        def forward(ctx, a):
            ctx.save_for_backward(a > 0)
            return a * 2

    g = Graph()
    f64 = np.dtype("float64")
    x = g.add_node("placeholder", shape=(4,), dtype=f64, name="%x")
    c = g.add_node("constant", attrs={"value": array([-1.0, 2.0, -3.0, 4.0])}, shape=(4,), dtype=f64)
    d = op_node(g, Doubled, [c], (4,), f64)
    mask = g.add_node("saved", [d], {"index": 0}, shape=(4,), dtype=np.dtype("bool"))
    g.set_outputs([op_node(g, Mul, [op_node(g, Mul, [x, d], (4,), f64), mask], (4,), f64)])
    new = fold_constants(g)
    assert ops(new) == ["placeholder", "constant", "constant", "Mul", "Mul", "output"]
    assert_same(g, new, randn(4))


def test_side_effects_keep_their_order_when_a_pass_adds_nodes():
    """Two writes to one buffer: the second must still come last after folding adds constants."""
    buf = mg.zeros(3, dtype=mg.float64)
    c = randn(3)

    def f(x):
        buf.mul_((c * 2).exp())
        buf.add_(x)
        return x.sum()

    traced = trace(f, randn(3))
    for p in (fold_constants, eliminate_common_subexpressions, simplify, eliminate_dead_code):
        new = p(traced.graph)
        assert [n.inputs[1].op for n in new.topological_order() if n.op == "copy_"] == ["Mul", "Add"]
        for graph in (traced.graph, new):
            with mg.no_grad():
                buf.copy_(mg.ones(3, dtype=mg.float64))
            x = randn(3)
            run(graph, x)
            np.testing.assert_allclose(buf.numpy(), np.exp(c.numpy() * 2) + x.numpy(), rtol=1e-12)


# -- common subexpressions --------------------------------------------------------------------------------
def test_cse_merges_duplicate_chains_and_equal_constants():
    a, b = mg.tensor([1.0, 2.0], dtype=mg.float64), mg.tensor([1.0, 2.0], dtype=mg.float64)

    def f(x):
        return (x.exp() + a).tanh() * (x.exp() + b).tanh() + x.sum(0) + x.sum(1, keepdim=True)

    traced = trace(f, randn(3, 2))
    new = unchanged(eliminate_common_subexpressions)(traced.graph)
    assert [ops(new).count(op) for op in ("Exp", "Add", "Tanh", "constant", "Sum")] == [1, 3, 1, 1, 2]
    assert_same(traced.graph, new, randn(3, 2))


def test_cse_keeps_random_ops_differing_attributes_and_two_returned_values_apart():
    def f(x):
        drop = nn.functional.dropout(x, 0.5) + nn.functional.dropout(x, 0.5)
        return drop + x * 2 + x * 2.0 + x * 2, x.exp(), x.exp()

    traced = trace(f, randn(8))
    new = eliminate_common_subexpressions(traced.graph)
    assert ops(new).count("Dropout") == 2 and ops(new).count("Exp") == 2
    assert ops(new).count("Mul") == 2  # x * 2 twice merges; x * 2.0 has another attribute type


# -- simplification --------------------------------------------------------------------------------------
def test_exact_identities_vanish():
    def f(x):
        y = ((1 * (x * 1) + 0) - 0) / 1
        return (-(-(y ** 1))).T.T.exp() + x.reshape(6, 2).reshape(4, 3).reshape(3, 4).tanh()

    traced = trace(f, randn(3, 4))
    new = unchanged(simplify)(traced.graph)
    assert ops(new) == ["placeholder", "Exp", "Tanh", "Add", "output"]
    assert_same(traced.graph, new, randn(3, 4))


def test_stacked_permutes_and_reshapes_become_one():
    traced = trace(lambda x: x.permute(1, 0, 2).permute(0, 2, 1).exp() + x.reshape(24).reshape(4, 6).sum(),
                   randn(2, 3, 4))
    new = simplify(traced.graph)
    assert ops(new).count("Permute") == 1 and ops(new).count("Reshape") == 1
    assert [n.attrs["dims"] for n in new if n.op == "Permute"] == [(1, 2, 0)]
    assert_same(traced.graph, new, randn(2, 3, 4))


def test_identities_that_change_shape_or_dtype_or_return_a_buffer_stay():
    ones = mg.ones(3, 4, dtype=mg.float64)
    traced = trace(lambda x, i: ((x * ones).exp(), (i * 1.0).exp(), x * 1), randn(4), mg.tensor([1, 2]))
    new = simplify(traced.graph)
    assert ops(new).count("Mul") == 2  # x * ones broadcasts x; x * 1 is returned
    assert "Cast" in ops(new)  # i * 1.0 is a cast of i to float, then a * 1 that goes
    assert_same(traced.graph, new, randn(4), mg.tensor([3, 4]))
    g = Graph()  # a Mul that promotes (int64 * 1.0 in a hand-built graph) is not an identity
    i = g.add_node("placeholder", shape=(2,), dtype=np.dtype("int64"), name="%i")
    m = op_node(g, Mul, [i], (2,), np.dtype("float64"), {"b": 1.0}, (TENSOR_ARG, "b"))
    g.set_outputs([op_node(g, Exp, [m], (2,), np.dtype("float64"))])
    assert "Mul" in ops(simplify(g))
    assert_same(g, simplify(g), mg.tensor([3, 4]))


def test_a_cast_to_the_same_dtype_vanishes():
    g = Graph()
    f64 = np.dtype("float64")
    x = g.add_node("placeholder", shape=(3,), dtype=f64, name="%x")
    c = op_node(g, Cast, [x], (3,), f64, {"dtype": f64}, (TENSOR_ARG, "dtype"))
    g.set_outputs([op_node(g, Exp, [c], (3,), f64)])
    assert ops(simplify(g)) == ["placeholder", "Exp", "output"]
    assert_same(g, simplify(g), randn(3))


def test_mul_by_a_constant_of_ones_vanishes_in_a_hand_built_graph():
    g = Graph()
    f64 = np.dtype("float64")
    x = g.add_node("placeholder", shape=(2, 3), dtype=f64, name="%x")
    one = g.add_node("constant", attrs={"value": array(np.ones((1, 3)))}, shape=(1, 3), dtype=f64)
    g.set_outputs([op_node(g, Exp, [op_node(g, Mul, [one, x], (2, 3), f64)], (2, 3), f64)])
    assert ops(simplify(g)) == ["placeholder", "Exp", "output"]


# -- BatchNorm folding ------------------------------------------------------------------------------------
def _cnn(bias=True):
    m = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1, bias=bias), nn.BatchNorm2d(6), nn.ReLU(),
                      nn.Conv2d(6, 4, 3, stride=2, groups=2), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                      nn.Linear(16, 5), nn.BatchNorm1d(5))
    for _ in range(3):  # running statistics that are not the initial 0 and 1
        m(mg.randn(8, 3, 6, 6) * 2 + 1)
    with mg.no_grad():
        for bn in (m[1], m[4], m[8]):
            bn.weight.copy_(mg.tensor(np.linspace(0.5, 2.0, bn.num_features)))
            bn.bias.copy_(mg.tensor(np.linspace(-1.0, 1.0, bn.num_features)))
    return m.eval()


@pytest.mark.parametrize("bias", [True, False])
def test_fold_conv_bn_on_modules_matches_in_eval_mode(bias):
    m = _cnn(bias)
    folded = fold_conv_bn(m)
    assert not any(isinstance(x, (nn.BatchNorm1d, nn.BatchNorm2d)) for x in folded.modules())
    assert any(isinstance(x, nn.BatchNorm2d) for x in m.modules())  # the original is kept
    x = mg.randn(4, 3, 6, 6)
    with mg.no_grad():
        np.testing.assert_allclose(folded(x).numpy(), m(x).numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="training mode"):
        fold_conv_bn(m.train())


def test_fuse_conv_bn_eval_matches_torch():
    torch = pytest.importorskip("torch")
    m = _cnn()
    conv, bn = m[0], m[1]
    fused = fuse_conv_bn_eval(conv, bn)
    tconv, tbn = torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.BatchNorm2d(6)
    with torch.no_grad():
        tconv.weight.copy_(torch.tensor(to_numpy(conv.weight))), tconv.bias.copy_(torch.tensor(to_numpy(conv.bias)))
        for name in ("weight", "bias", "running_mean", "running_var"):
            getattr(tbn, name).copy_(torch.tensor(to_numpy(getattr(bn, name))))
    tfused = torch.nn.utils.fuse_conv_bn_eval(tconv.eval(), tbn.eval())
    np.testing.assert_allclose(to_numpy(fused.weight), tfused.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(to_numpy(fused.bias), tfused.bias.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bias", [True, False])
def test_fold_batch_norm_on_a_frozen_traced_cnn(bias):
    m = _cnn(bias)
    x = mg.randn(4, 3, 6, 6)
    traced = trace(lambda x: m(x), x)
    frozen = eliminate_dead_code(fold_constants(traced.graph, freeze=True))
    folded = eliminate_dead_code(unchanged(fold_batch_norm)(frozen))
    assert len(folded) < len(frozen) < len(traced.graph)
    assert ops(folded).count("Mul") == 0 and ops(folded).count("Add") == 0
    assert [op for op in ops(folded) if op not in ("constant", "placeholder", "output")] == \
        ["Conv2d", "Relu", "Conv2d", "Relu", "Reshape", "Linear"]
    for y in (x, mg.randn(4, 3, 6, 6)):
        with mg.no_grad():
            np.testing.assert_allclose(run(folded, y)[0], m(y).numpy(), rtol=1e-5, atol=1e-5)


def test_fold_batch_norm_leaves_other_patterns_alone():
    W = randn(3, 4)
    traced = trace(lambda x: nn.functional.linear(x, W) * x.sum(1, keepdim=True) + 1.0, randn(2, 4))
    new = fold_batch_norm(fold_constants(traced.graph, freeze=True))
    assert ops(new) == ops(fold_constants(traced.graph, freeze=True))  # the scale is not per channel


def test_fold_batch_norm_takes_a_subtracted_shift_but_not_a_subtraction_from_a_constant():
    W, b, s, t = randn(3, 4), randn(3), randn(3), randn(3)
    for fn, left in ((lambda x: nn.functional.linear(x, W, b) * s - t, []),
                     (lambda x: t - nn.functional.linear(x, W, b) * s, ["Sub"])):  # -x is no shift of x
        frozen = eliminate_dead_code(fold_constants(trace(fn, randn(2, 4)).graph, freeze=True))
        folded = eliminate_dead_code(fold_batch_norm(frozen))
        assert [op for op in ops(folded) if op not in ("constant", "placeholder", "output")] == ["Linear"] + left
        x = randn(5, 4)
        assert_same(frozen, folded, x, rtol=1e-10)


class Scale(Op):
    """A contributor's op that multiplies, not Mul: it declares its part in an affine map and folds."""
    kind = "elementwise"
    cuda = "{0} * {1}"
    onnx = "Mul"
    affine = "scale"

    @staticmethod
    def forward(ctx, a, b): return a * b
    @staticmethod
    def backward(ctx, g): return None, None


def test_fold_batch_norm_reads_the_affine_declaration_not_the_op_name():
    W, s = randn(3, 4), randn(3)
    frozen = fold_constants(trace(lambda x: Scale.apply(nn.functional.linear(x, W), s), randn(2, 4)).graph,
                            freeze=True)
    assert "Scale" in ops(frozen)
    folded = eliminate_dead_code(fold_batch_norm(frozen))
    assert [op for op in ops(folded) if op not in ("constant", "placeholder", "output")] == ["Linear"]
    assert_same(frozen, folded, randn(5, 4), rtol=1e-10)


# -- pass manager -------------------------------------------------------------------------------------------
def test_pass_manager_prints_one_line_per_pass_and_runs_to_a_fixed_point(capsys):
    c = randn(3)
    traced = trace(lambda x: (x * (c * 1).exp()).sum() + (x * (c * 1).exp()).sum(), randn(3))
    pm = PassManager([simplify, functools.partial(fold_constants, freeze=True), eliminate_common_subexpressions,
                      eliminate_dead_code], verbose=True, fixed_point=True)
    new = pm(traced.graph)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(pm.history) == 8  # a second round finds nothing more to do
    assert lines[1].startswith("fold_constants(freeze=True)") and " -> " in lines[1] and lines[1].endswith("ms")
    assert [r.nodes_before - r.nodes_after for r in pm.history[4:]] == [0, 0, 0, 0]
    assert ops(new) == ["placeholder", "constant", "Mul", "Sum", "Add", "output"]
    assert_same(traced.graph, new, randn(3))
    assert "fixed_point=True" in repr(pm)


# -- everything, on traced models --------------------------------------------------------------------------
def test_every_pass_preserves_a_traced_mlp_forward():
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)).to(mg.float64)
    traced = trace(lambda x: model(x).softmax(-1), randn(5, 4))
    x = randn(5, 4)
    eager = model(x).softmax(-1).detach().numpy()
    for p in PASSES + [PassManager(default_passes()), PassManager(default_passes(freeze=True))]:
        new = unchanged(p)(traced.graph)
        np.testing.assert_allclose(run(new, x)[0], eager, rtol=1e-12)


def mse_times_one(y, t):
    return ((y - t) ** 2).mean() * 1.0 + 0.0  # an identity for simplify to remove


def _sgd_setup():
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1)).to(mg.float64)
    twin = copy.deepcopy(model)
    opts = [optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, twin)]
    data = [(randn(6, 3), randn(6, 1)) for _ in range(5)]

    steps = [training_step(model, opts[0], mse_times_one), training_step(twin, opts[1], mse_times_one)]
    for s in steps:  # warm-up: the momentum buffers exist before tracing
        s(*data[0])
    return model, twin, data, steps


def _replay_and_compare(graph, model, twin, eager_step, data):
    eager_step(*data[1])  # the trace ran this step on the model for real
    for x, t in data[2:]:
        (loss,) = run(graph, x, t)
        np.testing.assert_allclose(loss, eager_step(x, t).item(), rtol=1e-10)
    for p, q in zip(model.parameters(), twin.parameters()):
        np.testing.assert_allclose(to_numpy(p), to_numpy(q), rtol=1e-10)


@pytest.mark.parametrize("passes", [[p] for p in PASSES] + [default_passes()], ids=lambda ps: ",".join(
    getattr(p, "__name__", "fold_constants(freeze)") for p in ps))
def test_passes_preserve_a_traced_training_step_and_its_effects(passes):
    model, twin, data, steps = _sgd_setup()
    traced = trace(steps[0], *data[1])
    new = PassManager(passes)(traced.graph)
    effects = [(n.op, n.inputs[0].meta.get("target") is not None) for n in new if n.op in ("copy_", "set_grad")]
    assert effects == [(n.op, True) for n in traced.graph if n.op in ("copy_", "set_grad")]
    _replay_and_compare(new, model, twin, steps[1], data)


# -- random programs ----------------------------------------------------------------------------------------
SHAPES = [(3, 4), (4,), (1, 4), (3, 1)]
UNARY = {"exp": lambda v: (v * 0.3).exp(), "tanh": lambda v: v.tanh(), "neg": lambda v: -v,
         "relu": lambda v: v.relu(), "sigmoid": lambda v: v.sigmoid(), "abs": lambda v: v.abs()}
BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
          "max": lambda a, b: mg.maximum(a, b)}
IDENTITY = {"mul1": lambda v: v * 1, "add0": lambda v: 0 + v, "div1": lambda v: v / 1,
            "tt": lambda v: v.mT.mT if v.ndim == 2 else -(-v), "reshape": lambda v: v.reshape(-1).reshape(v.shape),
            "scale": lambda v: v * 2.5}
REDUCE = {"sum0": lambda v: v.sum(0, keepdim=True) if v.ndim == 2 else v.sum(0),
          "mean1": lambda v: v.mean(1, keepdim=True) if v.ndim == 2 else v.mean(0)}

step = st.one_of(st.tuples(st.just("unary"), st.sampled_from(sorted(UNARY)), st.integers(0, 99)),
                 st.tuples(st.just("binary"), st.sampled_from(sorted(BINARY)), st.integers(0, 99), st.integers(0, 99)),
                 st.tuples(st.just("identity"), st.sampled_from(sorted(IDENTITY)), st.integers(0, 99)),
                 st.tuples(st.just("reduce"), st.sampled_from(sorted(REDUCE)), st.integers(0, 99)),
                 st.tuples(st.just("again"), st.integers(0, 99)))


def _program(steps, consts, params):
    def f(x, y):
        values = [x, y, *consts, *params]
        history = []
        for s in steps:
            kind, pick = s[0], lambda i: values[i % len(values)]
            if kind == "again" and history:  # the same expression twice: work for CSE
                s = history[s[1] % len(history)]
                kind = s[0]
            if kind == "unary":
                values.append(UNARY[s[1]](pick(s[2])))
            elif kind == "binary":
                values.append(BINARY[s[1]](pick(s[2]), pick(s[3])))
            elif kind == "identity":
                values.append(IDENTITY[s[1]](pick(s[2])))
            elif kind == "reduce":
                values.append(REDUCE[s[1]](pick(s[2])))
            else:
                continue
            history.append(s)
        return values[-1] + values[-2] * 0.5, values[len(values) // 2].sum()
    return f


def random_program(steps, seed):
    """A traced random program, new inputs for it and what eager minigrad computes on them."""
    rng = np.random.default_rng(seed)
    consts = [mg.tensor(rng.standard_normal(s)) for s in SHAPES]
    params = [mg.tensor(rng.standard_normal((1, 4)), requires_grad=True)]
    f = _program(steps, consts, params)
    traced = trace(f, mg.tensor(rng.standard_normal((3, 4))), mg.tensor(rng.standard_normal((4,))))
    x2, y2 = mg.tensor(rng.standard_normal((3, 4))), mg.tensor(rng.standard_normal((4,)))
    with mg.no_grad():
        eager = [v.numpy() for v in f(x2, y2)]
    return traced, (x2, y2), eager


@settings(max_examples=40, deadline=None)
@given(st.lists(step, min_size=1, max_size=12), st.integers(0, 2**16))
def test_random_programs_compute_the_same_after_every_pass(steps, seed):
    traced, (x2, y2), eager = random_program(steps, seed)
    for p in PASSES + [PassManager(default_passes(freeze=True), fixed_point=True)]:
        new = p(traced.graph)
        for got, want in zip(run(new, x2, y2), eager):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
