"""Mixed precision: autocast's dtype rules per op, float32 gradients at float32 parameters,
nesting and the cast cache; GradScaler's update rule (against torch's), skipped steps, its state
machine and clipping; fp16 underflow fixed by loss scaling; an MLP on the digits."""

import math

import numpy as np
import pytest

import minigrad as mg
import minigrad.nn.functional as F
from minigrad import amp, nn, optim
from minigrad.autograd import mode
from minigrad.data import Digits
from minigrad.errors import DTypeError

f16, f32, f64 = mg.float16, mg.float32, mg.float64


def rand(*shape, dtype=f32, seed=0):
    return mg.tensor(np.random.default_rng(seed).standard_normal(shape), dtype=dtype)


def device_type() -> str:
    """The type of the device the test's tensors are made on (the suite may run on cuda)."""
    return mg.get_default_device().type


def autocast(**kwargs) -> mg.autocast:
    """An autocast region for the tensors the test makes: a region applies to one device type."""
    return mg.autocast(device_type(), **kwargs)


# -- autocast: the op lists ---------------------------------------------------------------------------
LOW = {  # float32 inputs -> float16 output
    "matmul": lambda: rand(4, 5) @ rand(5, 3),
    "mm": lambda: mg.mm(rand(4, 5), rand(5, 3)),
    "bmm": lambda: mg.bmm(rand(2, 4, 5), rand(2, 5, 3)),
    "linear": lambda: F.linear(rand(4, 5), rand(3, 5), rand(3)),
    "einsum": lambda: mg.einsum("ij,jk->ik", rand(4, 5), rand(5, 3)),
    "conv2d": lambda: F.conv2d(rand(2, 3, 6, 6), rand(4, 3, 3, 3), rand(4)),
    "conv_transpose2d": lambda: F.conv_transpose2d(rand(2, 3, 4, 4), rand(3, 2, 3, 3)),
}
FULL = {  # float16 inputs -> float32 output
    "softmax": lambda: mg.softmax(rand(4, 5, dtype=f16), 1),
    "log_softmax": lambda: mg.log_softmax(rand(4, 5, dtype=f16), 1),
    "sum": lambda: rand(4, 5, dtype=f16).sum(),
    "mean": lambda: rand(4, 5, dtype=f16).mean(0),
    "var": lambda: rand(4, 5, dtype=f16).var(1),
    "prod": lambda: rand(4, 5, dtype=f16).prod(1),
    "cumsum": lambda: rand(4, 5, dtype=f16).cumsum(1),
    "logsumexp": lambda: rand(4, 5, dtype=f16).logsumexp(1),
    "exp": lambda: rand(4, 5, dtype=f16).exp(),
    "log": lambda: (rand(4, 5, dtype=f16).abs() + 1).log(),
    "pow": lambda: rand(4, 5, dtype=f16) ** 2,
    "rsqrt": lambda: (rand(4, 5, dtype=f16).abs() + 1).rsqrt(),
    "softplus": lambda: mg.ops.softplus(rand(4, 5, dtype=f16)),
    "layer_norm": lambda: F.layer_norm(rand(4, 5, dtype=f16), (5,)),
    "cross_entropy": lambda: F.cross_entropy(rand(4, 5, dtype=f16), mg.tensor([0, 1, 2, 3])),
    "nll_loss": lambda: F.nll_loss(rand(4, 5, dtype=f16), mg.tensor([0, 1, 2, 3])),
    "mse_loss": lambda: F.mse_loss(rand(4, 5, dtype=f16), rand(4, 5, dtype=f16, seed=1)),
}
FOLLOW = {  # other ops: the widest float input's dtype
    "relu f16": (lambda: F.relu(rand(4, 5, dtype=f16)), f16),
    "tanh f16": (lambda: rand(4, 5, dtype=f16).tanh(), f16),
    "scalar mul f16": (lambda: rand(4, 5, dtype=f16) * 3.0, f16),
    "add f16 f32": (lambda: rand(4, 5, dtype=f16) + rand(4, 5), f32),
    "cat f16 f32": (lambda: mg.cat([rand(2, 5, dtype=f16), rand(3, 5)]), f32),
    "where f16 f32": (lambda: mg.where(rand(4, 5) > 0, rand(4, 5, dtype=f16), rand(4, 5)), f32),
    "relu f32": (lambda: F.relu(rand(4, 5)), f32),
}


@pytest.mark.parametrize("name", LOW)
def test_allow_list_runs_in_float16(name):
    assert LOW[name]().dtype == f32  # outside autocast nothing changes
    with autocast():
        assert LOW[name]().dtype == f16


@pytest.mark.parametrize("name", FULL)
def test_deny_list_runs_in_float32(name):
    assert FULL[name]().dtype == f16
    with autocast():
        assert FULL[name]().dtype == f32


@pytest.mark.parametrize("name", FOLLOW)
def test_other_ops_follow_the_widest_input(name):
    fn, expected = FOLLOW[name]
    with autocast():
        assert fn().dtype == expected


def test_a_new_op_autocasts_by_its_declaration():
    """Hardswish declares no autocast policy, so it follows its input: float16 after a Linear,
    float32 again in the sum that follows (amp reads the op's class, not a list of ops)."""
    with autocast():
        h = F.hardswish(F.linear(rand(4, 5), rand(3, 5)))
        assert h.dtype == f16 and h.sum().dtype == f32
    assert F.hardswish(rand(4, 5)).dtype == f32


def test_float64_is_left_alone():
    with autocast():
        assert (rand(4, 5, dtype=f64) @ rand(5, 3, dtype=f64)).dtype == f64
        assert rand(4, 5, dtype=f64).sum().dtype == f64


def test_float16_results_match_a_manual_cast():
    a, b = rand(8, 16), rand(16, 4, seed=1)
    with autocast():
        out = a @ b
    np.testing.assert_array_equal(out.numpy(), a.numpy().astype(np.float16) @ b.numpy().astype(np.float16))


# -- gradients ----------------------------------------------------------------------------------------
def _mlp_grads(autocast_on, backward_inside=False):
    mg.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x, y = rand(8, 16), mg.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    with autocast(enabled=autocast_on):
        loss = F.cross_entropy(model(x), y)
        if backward_inside:
            loss.backward()
    if not backward_inside:
        loss.backward()
    return [p.grad for p in model.parameters()], list(model.parameters())


def test_gradients_arrive_in_float32_at_float32_parameters():
    grads, params = _mlp_grads(True)
    assert all(p.dtype == f32 and g.dtype == f32 for p, g in zip(params, grads))
    reference, _ = _mlp_grads(False)
    for g, r in zip(grads, reference):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=2e-2, atol=2e-3)


def test_backward_runs_in_the_forward_dtypes_wherever_it_is_called():
    outside, _ = _mlp_grads(True)
    inside, _ = _mlp_grads(True, backward_inside=True)
    for a, b in zip(outside, inside):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    w = mg.tensor(rand(5, 3).numpy(), requires_grad=True)
    with autocast():
        out = rand(4, 5) @ w
    with mg.profiler.profile() as prof:
        out.float().sum().backward()
    matmuls = [e for e in prof.events if e.name == "Matmul"]
    assert matmuls and all(e.phase == "backward" and set(e.input_dtypes) == {"float16"} for e in matmuls)


def test_checkpoint_style_recompute_inside_backward_is_autocast():
    """A region entered inside a backward rule (as a checkpoint's recompute does) applies there."""
    seen = []

    class Recompute(mg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            with autocast():
                seen.append((rand(2, 3) @ rand(3, 2)).dtype)
            return g

    x = mg.tensor([1.0, 2.0], requires_grad=True)
    with autocast():
        Recompute.apply(x).sum().backward()
    assert seen == [f16]


# -- regions: nesting, decorator, device type, errors ---------------------------------------------------
def test_nesting_and_disabling():
    a, b = rand(4, 5), rand(5, 3)
    with autocast():
        assert (a @ b).dtype == f16 and amp.is_autocast_enabled(device_type())
        with autocast(enabled=False):
            assert (a @ b).dtype == f32 and not amp.is_autocast_enabled(device_type())
            with autocast():
                assert (a @ b).dtype == f16
            assert (a @ b).dtype == f32
        assert (a @ b).dtype == f16
    assert (a @ b).dtype == f32 and mode.current_modes() == () and not amp.is_autocast_enabled(device_type())


def test_decorator_and_exception_restore_the_state():
    @autocast()
    def product(a, b):
        return a @ b

    assert product(rand(4, 5), rand(5, 3)).dtype == f16
    with pytest.raises(ZeroDivisionError):
        with autocast():
            1 / 0
    assert mode.current_modes() == ()  # the autocast mode, and its cast cache, are gone


def test_device_type_selects_which_tensors_are_autocast():
    other = "cpu" if device_type() == "cuda" else "cuda"
    with mg.autocast(other):  # a region for the other device's tensors leaves these alone
        assert (rand(4, 5) @ rand(5, 3)).dtype == f32
        assert amp.is_autocast_enabled(other) and not amp.is_autocast_enabled(device_type())


def test_bad_arguments():
    with pytest.raises(DTypeError, match="bfloat16"):
        mg.autocast(dtype="bfloat16")
    with pytest.raises(DTypeError, match="float16"):
        mg.autocast(dtype=f64)
    with pytest.raises(ValueError, match="device_type"):
        mg.autocast("tpu")


# -- the cast cache -------------------------------------------------------------------------------------
def _cast_node(out):
    """The node that produced the (cast) weight feeding a Matmul output."""
    return out.grad_fn.next_functions[1][0]


def test_a_parameter_is_cast_once_per_region():
    w = nn.Parameter(rand(5, 3))
    x = rand(4, 5)
    with autocast():
        first, second = x @ w, x @ w
        assert _cast_node(first) is _cast_node(second)
        with mg.no_grad():
            w.add_(1.0)  # an in-place update makes the cached copy stale
        third = x @ w
        assert _cast_node(third) is not _cast_node(first)
        np.testing.assert_array_equal(third.detach().numpy(),
                                      x.numpy().astype(np.float16) @ w.detach().numpy().astype(np.float16))
    assert mode.active(amp.AutocastMode) is None
    with autocast(cache_enabled=False):
        assert _cast_node(x @ w) is not _cast_node(x @ w)
    (first.float().sum() + second.float().sum()).backward()  # two uses of one cast: gradients add up
    np.testing.assert_allclose(w.grad.numpy(), 2 * x.numpy().sum(0)[:, None].repeat(3, 1), rtol=5e-3)


# -- GradScaler ---------------------------------------------------------------------------------------
def _param_step(scaler, opt, p, x, inf=False):
    """One iteration on loss = sum(p * x); an inf in x gives an inf gradient."""
    opt.zero_grad()
    if inf:
        x = x.clone()
        x.array[0] = math.inf
    scaler.scale((p * x).sum()).backward()
    result = scaler.step(opt)
    scaler.update()
    return result


def test_scale_backs_off_on_overflow_and_grows_after_growth_interval():
    p = nn.Parameter(mg.ones(3))
    opt = optim.SGD([p], lr=0.1)
    scaler = mg.GradScaler(init_scale=1024.0, growth_interval=3)
    scales = []
    for inf in [False, False, True, False, False, False, False]:
        _param_step(scaler, opt, p, mg.ones(3), inf)
        scales.append(scaler.get_scale())
    assert scales == [1024.0, 1024.0, 512.0, 512.0, 512.0, 1024.0, 1024.0]
    assert scaler.state_dict()["_growth_tracker"] == 1


def test_skipped_steps_leave_parameters_and_optimizer_state_untouched():
    p = nn.Parameter(mg.tensor([1.0, 2.0, 3.0]))
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    scaler = mg.GradScaler()
    _param_step(scaler, opt, p, mg.ones(3))
    before, buf = p.detach().numpy().copy(), opt.state[p]["momentum_buffer"].numpy().copy()
    assert _param_step(scaler, opt, p, mg.ones(3), inf=True) is None
    np.testing.assert_array_equal(p.detach().numpy(), before)
    np.testing.assert_array_equal(opt.state[p]["momentum_buffer"].numpy(), buf)
    assert scaler.get_scale() == 2.0**15


def test_scale_and_unscale_values():
    scaler = mg.GradScaler(init_scale=8.0)
    assert scaler.get_scale() == 8.0 and scaler.is_enabled()
    t = mg.tensor([1.0, 2.0])
    a, (b, c) = scaler.scale(t), scaler.scale((t, [t]))
    assert a.tolist() == b.tolist() == [8.0, 16.0]
    assert isinstance(c, list) and c[0].tolist() == [8.0, 16.0]
    assert scaler.scale(t.half()).dtype == f16  # the scale keeps the output's dtype, as torch
    p = nn.Parameter(mg.tensor([1.0, -1.0]))
    opt = optim.SGD([p], lr=1.0)
    scaler.scale((p * mg.tensor([3.0, 5.0])).sum()).backward()
    scaler.unscale_(opt)
    np.testing.assert_array_equal(p.grad.numpy(), [3.0, 5.0])


def test_clipping_after_unscale_sees_the_true_gradients():
    p = nn.Parameter(mg.tensor([0.0, 0.0]))
    opt = optim.SGD([p], lr=1.0)
    scaler = mg.GradScaler()
    scaler.scale((p * mg.tensor([3.0, 4.0])).sum()).backward()
    scaler.unscale_(opt)
    norm = nn.utils.clip_grad_norm_([p], max_norm=1.0)
    assert norm.item() == pytest.approx(5.0)
    scaler.step(opt)  # does not unscale a second time
    scaler.update()
    np.testing.assert_allclose(p.detach().numpy(), [-0.6, -0.8], rtol=1e-5)


def test_state_machine_errors():
    p = nn.Parameter(mg.ones(2))
    opt = optim.SGD([p], lr=0.1)
    scaler = mg.GradScaler()
    with pytest.raises(RuntimeError, match="scale"):
        scaler.update()
    scaler.scale(p.sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="[Cc]losure"):
        scaler.step(opt, closure=lambda: None)
    scaler.update()
    scaler.scale(p.sum()).backward()
    scaler.step(opt)  # a new iteration after update()
    p.grad = p.grad.half()
    fresh = optim.SGD([p], lr=0.1)
    with pytest.raises(ValueError, match="FP16"):
        scaler.unscale_(fresh)
    with pytest.raises(ValueError, match="growth factor"):
        mg.GradScaler(growth_factor=1.0)


def test_disabled_scaler_passes_through():
    p = nn.Parameter(mg.ones(2))
    opt = optim.SGD([p], lr=0.5)
    scaler = mg.GradScaler(enabled=False)
    loss = p.sum()
    assert scaler.scale(loss) is loss and scaler.get_scale() == 1.0 and not scaler.is_enabled()
    loss.backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    np.testing.assert_array_equal(p.detach().numpy(), [0.5, 0.5])
    assert scaler.state_dict() == {}


def test_state_dict_round_trip():
    p = nn.Parameter(mg.ones(2))
    opt = optim.SGD([p], lr=0.1)
    scaler = mg.GradScaler(init_scale=64.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=5)
    for inf in (False, True, False, False):
        _param_step(scaler, opt, p, mg.ones(2), inf)
    state = scaler.state_dict()
    assert state == {"scale": 16.0, "growth_factor": 4.0, "backoff_factor": 0.25, "growth_interval": 5,
                     "_growth_tracker": 2}
    other = mg.GradScaler()
    other.load_state_dict(state)
    assert other.state_dict() == state
    for s in (scaler, other):
        for _ in range(3):
            _param_step(s, opt, p, mg.ones(2))
    assert scaler.get_scale() == other.get_scale() == 64.0
    scaler.update(new_scale=3.0)
    assert scaler.get_scale() == 3.0


def test_scale_trajectory_matches_torch():
    torch = pytest.importorskip("torch")
    kw = dict(init_scale=1000.0, growth_factor=3.0, backoff_factor=0.3, growth_interval=2)
    infs = [False, False, False, True, True, False, False, False, False, True, False, False, False]
    x0 = np.array([0.5, -1.5, 2.0], dtype=np.float32)
    p = nn.Parameter(mg.tensor(x0))
    opt = optim.SGD([p], lr=0.1, momentum=0.5)
    scaler = mg.GradScaler(**kw)
    tp = torch.nn.Parameter(torch.tensor(x0))
    topt = torch.optim.SGD([tp], lr=0.1, momentum=0.5)
    tscaler = torch.amp.GradScaler("cpu", **kw)
    for step, inf in enumerate(infs):
        x = np.array([1.0, 2.0, 3.0], dtype=np.float32) * (step + 1)
        if inf:
            x[1] = np.inf
        _param_step(scaler, opt, p, mg.tensor(x))
        topt.zero_grad()
        tscaler.scale((tp * torch.tensor(x)).sum()).backward()
        tscaler.step(topt)
        tscaler.update()
        assert scaler.get_scale() == tscaler.get_scale(), step
        assert scaler.state_dict() == tscaler.state_dict(), step
        # the SGD updates themselves round differently in the last bit (torch fuses p - lr * g)
        np.testing.assert_allclose(p.detach().numpy(), tp.detach().numpy(), rtol=1e-6)


# -- training -------------------------------------------------------------------------------------------
def _toy(scaled, steps):
    """A linear regression whose loss carries a weight of 1e-7 (as a small auxiliary term might):
    the gradient reaching the float16 product is about 1e-8, below float16's smallest subnormal."""
    x, w_true = rand(64, 8), rand(8, 1, seed=1)
    target = x @ w_true
    w = nn.Parameter(mg.zeros(8, 1))
    opt = optim.SGD([w], lr=1e6)  # an effective step of 0.1 on the unweighted loss
    scaler = mg.GradScaler(enabled=scaled)
    first = None
    for _ in range(steps):
        opt.zero_grad()
        with autocast():
            loss = F.mse_loss((x @ w).float(), target)
        first = loss.item() if first is None else first
        scaler.scale(loss * 1e-7).backward()
        scaler.step(opt)
        scaler.update()
    return w, first, F.mse_loss(x @ w, target).item()


def test_float16_gradients_underflow_without_scaling_and_train_with_it():
    w, first, last = _toy(scaled=False, steps=20)
    assert not w.grad.numpy().any() and not w.detach().numpy().any() and last == first
    w, first, last = _toy(scaled=True, steps=30)
    assert w.grad.numpy().any() and last < 1e-3 * first


def _digits_accuracy(mixed, epochs=4):
    train, test = Digits(train=True), Digits(train=False)
    x, y = mg.tensor(train.data.reshape(len(train), -1)), mg.tensor(train.targets)
    mg.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = mg.GradScaler(enabled=mixed)
    order = np.random.default_rng(0)
    for _ in range(epochs):
        perm = order.permutation(len(train))
        for i in range(0, len(perm), 32):
            idx = mg.tensor(perm[i:i + 32])
            opt.zero_grad()
            with autocast(enabled=mixed):
                loss = F.cross_entropy(model(x[idx]), y[idx])
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    with mg.no_grad(), autocast(enabled=mixed):
        pred = model(mg.tensor(test.data.reshape(len(test), -1))).argmax(1).numpy()
    return 100 * (pred == test.targets).mean(), scaler.get_scale()


def test_mlp_on_digits_reaches_float32_accuracy_under_autocast_and_scaling():
    full, _ = _digits_accuracy(False)
    mixed, scale = _digits_accuracy(True)
    assert full > 90
    assert abs(mixed - full) <= 0.5
    assert 1.0 <= scale < math.inf


def test_layer_after_layer_stays_float16():
    """A layer fed by a float16 activation must still run as one float16 op (torch's behaviour)."""
    mlp = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.Flatten(), nn.Linear(16, 3))
    with autocast():
        assert mlp(rand(2, 8)).dtype == f16
        out = cnn(rand(2, 1, 6, 6))
        assert out.dtype == f16
    out.float().sum().backward()
    assert all(p.grad.dtype == f32 for p in cnn.parameters())
