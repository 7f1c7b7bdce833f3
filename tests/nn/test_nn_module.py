"""nn.Module semantics: registration, names, state_dict, hooks, modes, dtype moves, containers, utils."""

import copy
import math

import numpy as np
import pytest

import minigrad as mg
from helpers import shares_memory, to_numpy
from minigrad import nn


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)
        self.scale = nn.Parameter(mg.ones(1))
        self.register_buffer("steps", mg.zeros(()))
        self.register_buffer("scratch", mg.zeros(2), persistent=False)

    def forward(self, x):
        return self.bn(self.fc(x)).relu() * self.scale


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))

    def forward(self, x):
        return self.head(self.block(x))


# -- registration and names --------------------------------------------------------------------------
def test_attribute_assignment_registers_parameters_buffers_and_modules():
    b = Block()
    assert list(b._parameters) == ["scale"]
    assert list(b._buffers) == ["steps", "scratch"]
    assert list(b._modules) == ["fc", "bn"]
    assert "fc" not in b.__dict__ and b.fc is b._modules["fc"]
    b.fc = None
    assert b._modules["fc"] is None and b.fc is None


def test_nested_names():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == [
        "block.scale", "block.fc.weight", "block.fc.bias", "block.bn.weight", "block.bn.bias",
        "head.0.weight", "head.0.bias", "head.2.weight", "head.2.bias",
    ]
    assert [n for n, _ in net.named_buffers()] == [
        "block.steps", "block.scratch", "block.bn.running_mean", "block.bn.running_var", "block.bn.num_batches_tracked",
    ]
    assert [n for n, _ in net.named_modules()] == ["", "block", "block.fc", "block.bn", "head", "head.0", "head.1", "head.2"]
    assert [n for n, _ in net.named_children()] == ["block", "head"]
    assert len(list(net.modules())) == 8
    assert len(list(net.parameters(recurse=False))) == 0
    assert net.get_submodule("head.2") is net.head[2]
    assert net.get_parameter("block.fc.bias") is net.block.fc.bias


def test_shared_parameters_are_listed_once():
    a = nn.Linear(3, 3)
    seq = nn.Sequential(a, nn.ReLU(), a)
    assert len(list(seq.parameters())) == 2
    assert list(seq.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]  # as torch


def test_registration_errors():
    m = nn.Module()
    with pytest.raises(TypeError, match="parameter 'w'"):
        m.register_parameter("w", mg.ones(2))
    m.w = nn.Parameter(mg.ones(2))
    with pytest.raises(TypeError, match="cannot assign 'Tensor' as parameter 'w'"):
        m.w = mg.ones(2)
    with pytest.raises(KeyError, match="contain"):
        m.register_buffer("a.b", mg.ones(1))
    with pytest.raises(KeyError, match="already exists"):
        m.register_buffer("train", mg.ones(1))
    m.register_buffer("buf", mg.ones(1))
    with pytest.raises(TypeError, match="buffer 'buf'"):
        m.buf = 3

    class Forgetful(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(mg.ones(1))

    with pytest.raises(AttributeError, match="before Module.__init__"):
        Forgetful()
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        m.nope
    with pytest.raises(NotImplementedError, match="forward"):
        m(mg.ones(1))


def test_delattr_and_reassign_kind():
    m = nn.Module()
    m.x = nn.Parameter(mg.ones(1))
    del m.x
    assert "x" not in m._parameters
    m.x = nn.Linear(1, 1)
    m.x = nn.Parameter(mg.ones(1))  # a name lives in exactly one place
    assert "x" not in m._modules and "x" in m._parameters


# -- Parameter ------------------------------------------------------------------------------------
def test_parameter():
    t = mg.randn(2, 3)
    p = nn.Parameter(t)
    assert isinstance(p, mg.Tensor) and p.requires_grad and p.is_leaf
    assert shares_memory(p, t)
    assert repr(p).startswith("Parameter containing:\ntensor(")
    assert type(p * 2) is mg.Tensor
    assert not nn.Parameter(mg.ones(1), requires_grad=False).requires_grad
    q = copy.deepcopy(p)
    assert isinstance(q, nn.Parameter) and q is not p and not shares_memory(q, p)
    np.testing.assert_array_equal(to_numpy(q), to_numpy(p))


def test_deepcopy_of_a_model_is_independent():
    net = Net()
    net(mg.randn(4, 3)).sum().backward()
    twin = copy.deepcopy(net)
    assert all(p is not q and isinstance(q, nn.Parameter) for p, q in zip(net.parameters(), twin.parameters()))
    twin.zero_grad()
    twin(mg.randn(4, 3)).sum().backward()  # gradients land in the copy's parameters only
    assert net.head[2].weight.grad is not twin.head[2].weight.grad
    with mg.no_grad():
        twin.head[2].bias.add_(1)
    assert not np.allclose(to_numpy(twin.head[2].bias), to_numpy(net.head[2].bias))


# -- state_dict ----------------------------------------------------------------------------------
def test_state_dict_keys_values_and_detach():
    net = Net()
    sd = net.state_dict()
    assert list(sd) == [
        "block.scale", "block.steps", "block.fc.weight", "block.fc.bias", "block.bn.weight", "block.bn.bias",
        "block.bn.running_mean", "block.bn.running_var", "block.bn.num_batches_tracked",
        "head.0.weight", "head.0.bias", "head.2.weight", "head.2.bias",
    ]
    w = sd["head.0.weight"]
    assert not w.requires_grad and type(w) is mg.Tensor
    assert shares_memory(w, net.head[0].weight)
    assert sd["block.bn.num_batches_tracked"].dtype == mg.int64


def test_state_dict_round_trip_into_fresh_model():
    a, b = Net(), Net()
    x = mg.randn(5, 3)
    a(x)  # moves the BatchNorm running stats
    a.eval(), b.eval()
    assert not np.allclose(to_numpy(a(x)), to_numpy(b(x)))
    params_before = list(b.parameters())
    result = b.load_state_dict(a.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert all(p is q for p, q in zip(params_before, b.parameters()))  # copied in place
    np.testing.assert_array_equal(to_numpy(a(x)), to_numpy(b(x)))
    assert b.block.bn.num_batches_tracked.item() == 1


def test_load_state_dict_strict_errors():
    m = nn.Linear(3, 4)
    sd = m.state_dict()
    sd.pop("bias")
    sd["extra"] = mg.ones(1)
    with pytest.raises(RuntimeError) as e:
        m.load_state_dict(sd)
    msg = str(e.value)
    assert "Linear" in msg and 'Missing key(s) in state_dict: "bias"' in msg and 'Unexpected key(s) in state_dict: "extra"' in msg
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert missing == ["bias"] and unexpected == ["extra"]
    with pytest.raises(RuntimeError, match=r"size mismatch for weight: .*\(4, 4\).*\(4, 3\)"):
        m.load_state_dict({"weight": mg.ones(4, 4), "bias": mg.ones(4)}, strict=False)


def test_load_state_dict_from_torch(torch):
    torch.manual_seed(0)
    t = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    t(torch.randn(8, 3))
    t.eval()
    m = nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 2)).eval()
    assert list(m.state_dict()) == list(t.state_dict())
    m.load_state_dict({k: v.numpy() for k, v in t.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(to_numpy(m(mg.tensor(x))), t(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


# -- modes, dtypes, grads --------------------------------------------------------------------------
def test_train_eval_propagate():
    net = Net()
    assert net.training and net.head[1].training
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    with pytest.raises(ValueError):
        net.train("no")


def test_to_dtype_keeps_parameter_identity():
    net = Net()
    params = list(net.parameters())
    net(mg.randn(4, 3)).sum().backward()
    assert net.double() is net
    assert all(p is q for p, q in zip(params, net.parameters()))
    assert all(p.dtype == mg.float64 and p.grad.dtype == mg.float64 for p in params)
    assert net.block.bn.running_mean.dtype == mg.float64
    assert net.block.bn.num_batches_tracked.dtype == mg.int64  # integer buffers keep their dtype
    out = net(mg.randn(4, 3, dtype=mg.float64))
    assert out.dtype == mg.float64
    net.to(mg.float32)
    assert params[0].dtype == mg.float32
    net.to("cpu")
    assert params[0].device == "cpu"
    with pytest.raises(TypeError):
        net.to(mg.int64)


def test_zero_grad_and_requires_grad():
    m = nn.Linear(3, 2)
    m(mg.randn(4, 3)).sum().backward()
    assert m.weight.grad is not None
    g = m.weight.grad
    m.zero_grad(set_to_none=False)
    assert m.weight.grad is not None and not to_numpy(m.weight.grad).any()
    m.zero_grad()
    assert m.weight.grad is None and m.bias.grad is None
    m.requires_grad_(False)
    assert not any(p.requires_grad for p in m.parameters())
    assert g is not None


def test_apply_runs_on_every_module():
    net = Net()
    seen = []

    def init_linear(mod):
        seen.append(type(mod).__name__)
        if isinstance(mod, nn.Linear):
            nn.init.zeros_(mod.bias)

    assert net.apply(init_linear) is net
    assert seen[-1] == "Net" and seen.count("Linear") == 3
    assert not to_numpy(net.head[2].bias).any()


# -- hooks and call ---------------------------------------------------------------------------------
def test_forward_hooks():
    m = nn.Identity()
    calls = []
    pre = m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    post = m.register_forward_hook(lambda mod, args, out: calls.append((mod, args[0].item(), out.item())) or out + 1)
    assert m(mg.tensor(1.0)).item() == 3.0
    assert calls == [(m, 2.0, 2.0)]
    pre.remove()
    assert m(mg.tensor(1.0)).item() == 2.0
    post.remove()
    assert m(mg.tensor(1.0)).item() == 1.0
    with m.register_forward_pre_hook(lambda mod, args: args[0] * 10):  # a non-tuple return is wrapped
        assert m(mg.tensor(1.0)).item() == 10.0
    assert m(mg.tensor(1.0)).item() == 1.0
    order = []
    m.register_forward_hook(lambda *a: order.append("second"))
    m.register_forward_hook(lambda *a: order.append("first"), prepend=True)
    m(mg.tensor(1.0))
    assert order == ["first", "second"]


# -- repr ----------------------------------------------------------------------------------------
def test_repr_matches_torch(torch):
    t = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(), torch.nn.Dropout(0.2),
        torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.GELU(), torch.nn.Softmax(dim=1)),
        torch.nn.Embedding(10, 4, padding_idx=0), torch.nn.Flatten(), torch.nn.LeakyReLU(0.2),
        torch.nn.ModuleList([torch.nn.Tanh(), torch.nn.Identity()]),
        torch.nn.ModuleDict({"a": torch.nn.SiLU(), "b": torch.nn.Sigmoid()}), torch.nn.LogSoftmax(dim=-1),
    )
    m = nn.Sequential(
        nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Dropout(0.2),
        nn.Sequential(nn.LayerNorm(4), nn.GELU(), nn.Softmax(dim=1)),
        nn.Embedding(10, 4, padding_idx=0), nn.Flatten(), nn.LeakyReLU(0.2),
        nn.ModuleList([nn.Tanh(), nn.Identity()]),
        nn.ModuleDict({"a": nn.SiLU(), "b": nn.Sigmoid()}), nn.LogSoftmax(dim=-1),
    )
    assert repr(m) == repr(t)


def test_repr_of_custom_module():
    assert repr(Block()).splitlines() == [
        "Block(",
        "  (fc): Linear(in_features=3, out_features=4, bias=True)",
        "  (bn): BatchNorm1d(4, eps=1e-05, momentum=0.1, affine=True, bias=True, track_running_stats=True)",
        ")",
    ]


# -- containers ------------------------------------------------------------------------------------
def test_sequential():
    from collections import OrderedDict

    seq = nn.Sequential(OrderedDict([("fc", nn.Linear(2, 3)), ("act", nn.ReLU())]))
    assert seq.fc is seq[0] and seq[-1] is seq.act and len(seq) == 2
    assert isinstance(seq[:1], nn.Sequential) and list(seq[:1]) == [seq.fc]
    seq.append(nn.Linear(3, 1))
    assert seq(mg.randn(4, 2)).shape == (4, 1)
    del seq[1]
    assert [type(m).__name__ for m in seq] == ["Linear", "Linear"]
    with pytest.raises(IndexError):
        seq[5]


def test_module_list_and_dict():
    ml = nn.ModuleList([nn.Linear(1, 1) for _ in range(3)])
    assert len(ml) == 3 and len(list(ml.parameters())) == 6
    ml.insert(0, nn.ReLU())
    assert isinstance(ml[0], nn.ReLU) and list(ml._modules) == ["0", "1", "2", "3"]
    del ml[0]
    assert list(ml._modules) == ["0", "1", "2"] and isinstance(ml[0], nn.Linear)
    ml += [nn.Tanh()]
    assert isinstance(ml[-1], nn.Tanh)
    md = nn.ModuleDict({"a": nn.Linear(1, 2)})
    md["b"] = nn.ReLU()
    assert list(md) == ["a", "b"] and "a" in md and len(md) == 2
    assert [k for k, _ in md.named_parameters()] == ["a.weight", "a.bias"]
    assert md.pop("b").__class__ is nn.ReLU


# -- utils ------------------------------------------------------------------------------------------
def _grads(rng, shapes):
    return [rng.standard_normal(s) * 3 for s in shapes]


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
def test_clip_grad_norm_matches_torch(torch, norm_type):
    rng = np.random.default_rng(1)
    gs = _grads(rng, [(3, 4), (4,), (2, 2)])
    ps = [nn.Parameter(mg.zeros(g.shape, dtype=mg.float64)) for g in gs]
    ts = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True) for g in gs]
    for p, t, g in zip(ps, ts, gs):
        p.grad, t.grad = mg.tensor(g), torch.from_numpy(g.copy())
    total = nn.utils.clip_grad_norm_(ps, 1.5, norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(ts, 1.5, norm_type)
    np.testing.assert_allclose(total.item(), ttotal.item(), rtol=1e-12)
    for p, t in zip(ps, ts):
        np.testing.assert_allclose(to_numpy(p.grad), t.grad.numpy(), rtol=1e-10)


def test_clip_grad_norm_edge_cases():
    p = nn.Parameter(mg.ones(3))
    assert nn.utils.clip_grad_norm_([p], 1.0).item() == 0.0  # no gradients at all
    p.grad = mg.tensor([0.1, 0.2, 0.2])
    nn.utils.clip_grad_norm_(p, 10.0)  # a single tensor works too; under the limit nothing changes
    np.testing.assert_allclose(to_numpy(p.grad), [0.1, 0.2, 0.2], rtol=1e-6)
    p.grad = mg.tensor([float("inf"), 1.0, 1.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)


def _sparse_and_dense_grads():
    """An Embedding(sparse=True) looked up at index 1 twice (two uncoalesced rows that sum) and a
    Linear after it: one sparse and two dense gradients, and their dense numpy copies."""
    mg.manual_seed(0)
    emb, lin = nn.Embedding(5, 3, sparse=True, dtype=mg.float64), nn.Linear(3, 2, dtype=mg.float64)
    weights = mg.tensor([[1.0, -2.0], [3.0, 0.5], [-1.0, 2.0]], dtype=mg.float64)
    (lin(emb(mg.tensor([1, 1, 3]))) * weights).sum().backward()
    params = [emb.weight, lin.weight, lin.bias]
    assert emb.weight.grad.is_sparse and not emb.weight.grad.is_coalesced()
    return params, [to_numpy(p.grad.to_dense() if p.grad.is_sparse else p.grad) for p in params]


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("foreach", [None, True, False])
def test_clip_grad_norm_counts_and_scales_a_sparse_gradient(norm_type, foreach):
    params, dense = _sparse_and_dense_grads()
    expected = np.linalg.norm(np.concatenate([d.ravel() for d in dense]), ord=norm_type)  # repeats summed
    total = nn.utils.clip_grad_norm_(params, 0.5, norm_type, foreach=foreach)
    np.testing.assert_allclose(total.item(), expected, rtol=1e-12)
    coef = min(0.5 / (expected + 1e-6), 1.0)
    assert coef < 1.0 and params[0].grad.is_sparse
    for p, d in zip(params, dense):
        np.testing.assert_allclose(to_numpy(p.grad.to_dense() if p.grad.is_sparse else p.grad), coef * d,
                                   rtol=1e-12)


def test_clip_grad_norm_of_a_sparse_gradient_matches_torch_norm(torch):
    """torch 2.13's clip_grad_norm_ raises NotImplementedError on a sparse COO gradient (its
    linalg.vector_norm has no sparse kernel); torch.norm of one, which torch's clip_grad_norm_
    used until 1.12, coalesces first. minigrad clips as that norm says."""
    params, _ = _sparse_and_dense_grads()
    tgrads = [torch.sparse_coo_tensor(torch.from_numpy(p.grad.indices().numpy()),
                                      torch.from_numpy(p.grad.values().numpy()), p.grad.shape)
              if p.grad.is_sparse else torch.from_numpy(to_numpy(p.grad)) for p in params]
    for norm_type in (2.0, math.inf):
        ttotal = torch.norm(torch.stack([torch.norm(g, norm_type) for g in tgrads]), norm_type)
        total = nn.utils.clip_grad_norm_(params, 1e9, norm_type)  # under the limit: measures only
        np.testing.assert_allclose(total.item(), ttotal.item(), rtol=1e-12)


def test_clip_grad_norm_error_if_nonfinite_sees_a_sparse_gradient():
    p = nn.Parameter(mg.zeros((4, 2)))
    p.grad = mg.sparse_coo_tensor([[0, 2]], [[1.0, float("nan")], [2.0, 3.0]], (4, 2))
    nn.utils.clip_grad_norm_([p], 1.0)  # without the flag, torch scales by the non-finite norm
    p.grad = mg.sparse_coo_tensor([[0, 2]], [[1.0, float("inf")], [2.0, 3.0]], (4, 2))
    with pytest.raises(RuntimeError, match="non-finite"):
        nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True, foreach=False)


def test_clip_grad_value_clamps_a_sparse_gradient_after_summing_its_repeats():
    p, q = nn.Parameter(mg.zeros((5, 2))), nn.Parameter(mg.zeros(2))
    # row 1 twice: 0.8 + 0.8 = 1.6 is clamped to 1.0 (clamping each row alone would leave 1.6)
    p.grad = mg.sparse_coo_tensor([[1, 3, 1]], [[0.8, -0.5], [3.0, -0.2], [0.8, 0.1]], (5, 2))
    q.grad = mg.tensor([-4.0, 0.5])
    nn.utils.clip_grad_value_([p, q], 1.0, foreach=True)
    assert p.grad.is_sparse and p.grad.is_coalesced()
    np.testing.assert_allclose(to_numpy(p.grad.to_dense()), [[0, 0], [1.0, -0.4], [0, 0], [1.0, -0.2], [0, 0]],
                               rtol=1e-6)
    np.testing.assert_array_equal(to_numpy(q.grad), [-1.0, 0.5])


def test_clip_grad_value_and_vector_round_trip():
    m = nn.Linear(3, 2)
    m.weight.grad = mg.tensor(np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3))
    nn.utils.clip_grad_value_(m.parameters(), 1.0)
    assert to_numpy(m.weight.grad).max() == 1.0 and to_numpy(m.weight.grad).min() == -1.0
    vec = nn.utils.parameters_to_vector(m.parameters())
    assert vec.shape == (8,) and vec.requires_grad
    np.testing.assert_array_equal(to_numpy(vec)[:6], to_numpy(m.weight).ravel())
    new = mg.arange(8, dtype=mg.float32)
    nn.utils.vector_to_parameters(new, m.parameters())
    np.testing.assert_array_equal(to_numpy(m.bias), [6, 7])
    with pytest.raises(ValueError, match="8"):
        nn.utils.vector_to_parameters(mg.ones(5), m.parameters())


def test_replacing_a_child_or_parameter_keeps_its_place():
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    seq[0] = nn.Linear(2, 3)
    assert list(seq._modules) == ["0", "1", "2"]
    lin = nn.Linear(2, 2)
    lin.weight = nn.Parameter(mg.zeros(2, 2))
    assert [name for name, _ in lin.named_parameters()] == ["weight", "bias"]
