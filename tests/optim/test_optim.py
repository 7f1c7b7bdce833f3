"""Optimizers and schedulers: update rules equal PyTorch's over 10 steps; state_dict round trips."""

import numpy as np
import pytest

import minigrad as mg
from minigrad import optim
from minigrad.optim import lr_scheduler


def _loss(lib, p, x):
    return ((x * p).tanh() ** 2).sum() + (p * p * p).sum() * 0.1


def _run(make, p, x, lib, steps=10):
    opt = make([p])
    for _ in range(steps):
        opt.zero_grad()
        _loss(lib, p, x).backward()
        opt.step()
    return opt


CASES = {
    "sgd": dict(lr=0.1),
    "sgd_momentum": dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "sgd_nesterov": dict(lr=0.1, momentum=0.9, nesterov=True),
    "sgd_maximize": dict(lr=0.01, momentum=0.5, maximize=True),
    "adam": dict(lr=0.05),
    "adam_wd_amsgrad": dict(lr=0.05, weight_decay=0.1, amsgrad=True, betas=(0.8, 0.9)),
    "adamw": dict(lr=0.05, weight_decay=0.1),
    "rmsprop": dict(lr=0.01),
    "rmsprop_centered_momentum": dict(lr=0.01, momentum=0.9, centered=True, weight_decay=0.01),
    "adadelta": dict(),
    "adadelta_wd_maximize": dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.1, maximize=True),
}


def _classes(name):
    base = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "rmsprop": "RMSprop", "adadelta": "Adadelta"}
    key = "adamw" if name.startswith("adamw") else name.split("_")[0]
    return base[key]


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch_over_10_steps(name):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    w0, x0 = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    cls = _classes(name)
    pm = mg.tensor(w0, dtype=mg.float64, requires_grad=True)
    pt = torch.tensor(w0, requires_grad=True)
    _run(lambda ps: getattr(optim, cls)(ps, **CASES[name]), pm, mg.tensor(x0, dtype=mg.float64), mg)
    _run(lambda ps: getattr(torch.optim, cls)(ps, **CASES[name]), pt, torch.tensor(x0), torch)
    np.testing.assert_allclose(pm.detach().numpy(), pt.detach().numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["sgd_momentum", "adam_wd_amsgrad", "rmsprop_centered_momentum", "adadelta_wd_maximize"])
def test_state_dict_round_trip_gives_identical_next_step(name, tmp_path):
    rng = np.random.default_rng(1)
    w0, x = rng.standard_normal((3, 4)), mg.tensor(rng.standard_normal((3, 4)), dtype=mg.float64)
    cls = getattr(optim, _classes(name))
    p1 = mg.tensor(w0, dtype=mg.float64, requires_grad=True)
    opt1 = _run(lambda ps: cls(ps, **CASES[name]), p1, x, mg, steps=3)
    mg.save({"param": p1.detach(), "opt": opt1.state_dict()}, tmp_path / "ck")

    ck = mg.load(tmp_path / "ck")
    p2 = mg.tensor(ck["param"].numpy(), dtype=mg.float64, requires_grad=True)
    opt2 = cls([p2], lr=123.0)  # hyper-parameters come back from the state dict
    opt2.load_state_dict(ck["opt"])
    assert opt2.param_groups[0]["lr"] == CASES[name]["lr"]
    for p, opt in ((p1, opt1), (p2, opt2)):
        opt.zero_grad()
        _loss(mg, p, x).backward()
        opt.step()
    np.testing.assert_array_equal(p1.detach().numpy(), p2.detach().numpy())


def test_param_groups_and_errors():
    a, b = mg.randn(2, requires_grad=True), mg.randn(3, requires_grad=True)
    opt = optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1, momentum=0.9)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    assert opt.param_groups[1]["momentum"] == 0.9
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.Adam([])
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.SGD([{"params": [a]}, {"params": [a]}], lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        optim.SGD([a * 2], lr=0.1)
    with pytest.raises(ValueError, match="Nesterov"):
        optim.SGD([a], lr=0.1, nesterov=True)
    other = optim.SGD([a, b], lr=0.1)
    with pytest.raises(ValueError, match="group 0 has 1 parameter"):
        other.load_state_dict(optim.SGD([a], lr=0.1).state_dict())


def test_zero_grad_and_closure():
    p = mg.tensor([1.0, 2.0], requires_grad=True)
    opt = optim.SGD([p], lr=0.5)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert loss.item() == pytest.approx(5.0)
    np.testing.assert_allclose(p.detach().numpy(), [0.0, 0.0])
    (p * 3).sum().backward()
    opt.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(p.grad.numpy(), [0.0, 0.0])
    opt.zero_grad()
    assert p.grad is None


SCHEDULERS = {
    "StepLR": dict(step_size=3, gamma=0.5),
    "MultiStepLR": dict(milestones=[2, 5, 9], gamma=0.3),
    "ExponentialLR": dict(gamma=0.9),
    "CosineAnnealingLR": dict(T_max=7, eta_min=0.01),
    "LinearLR": dict(start_factor=0.25, total_iters=4),
    "LambdaLR": dict(lr_lambda=lambda e: 1 / (1 + e)),
    "OneCycleLR": dict(max_lr=1.0, total_steps=25),
    "OneCycleLR_3": dict(max_lr=1.0, total_steps=25, three_phase=True, anneal_strategy="linear"),
}


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
def test_schedulers_match_torch(name, opt_name):
    torch = pytest.importorskip("torch")
    cls = name.split("_")[0]
    kwargs = SCHEDULERS[name]
    hyper = dict(lr=0.1, momentum=0.9) if opt_name == "SGD" else dict(lr=0.1)
    om = getattr(optim, opt_name)([mg.zeros(1, requires_grad=True)], **hyper)
    ot = getattr(torch.optim, opt_name)([torch.zeros(1, requires_grad=True)], **hyper)
    sm = getattr(lr_scheduler, cls)(om, **kwargs)
    st = getattr(torch.optim.lr_scheduler, cls)(ot, **kwargs)
    for _ in range(24):
        assert sm.get_last_lr() == pytest.approx(st.get_last_lr(), rel=1e-6, abs=1e-9)
        key = "momentum" if opt_name == "SGD" else "betas"
        assert om.param_groups[0][key] == pytest.approx(ot.param_groups[0][key], rel=1e-6)
        om.step()
        ot.step()
        sm.step()
        st.step()


@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
def test_lbfgs_matches_torch_on_rosenbrock(line_search):
    torch = pytest.importorskip("torch")

    def rosenbrock(p):
        x, y = p[0], p[1]
        return (1 - x) ** 2 + 100 * (y - x * x) ** 2

    pm = mg.tensor([-1.5, 2.0], dtype=mg.float64, requires_grad=True)
    pt = torch.tensor([-1.5, 2.0], dtype=torch.float64, requires_grad=True)
    om = optim.LBFGS([pm], lr=1, max_iter=20, history_size=10, line_search_fn=line_search)
    ot = torch.optim.LBFGS([pt], lr=1, max_iter=20, history_size=10, line_search_fn=line_search)
    for p, o in ((pm, om), (pt, ot)):
        o.step(lambda p=p, o=o: _closure(rosenbrock, p, o))
    # one step = up to 20 iterations: the iterates follow torch's (rounding differences in the dot
    # products grow only near convergence, so compare after the first step)
    np.testing.assert_allclose(pm.detach().numpy(), pt.detach().numpy(), rtol=1e-6, atol=1e-8)
    for p, o in ((pm, om), (pt, ot)):
        for _ in range(4):
            o.step(lambda p=p, o=o: _closure(rosenbrock, p, o))
    np.testing.assert_allclose(pm.detach().numpy(), [1.0, 1.0], atol=1e-4)


def _closure(f, p, o):
    o.zero_grad()
    loss = f(p)
    loss.backward()
    return loss


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("name", ["adam", "adam_wd_amsgrad", "adamw", "adamw_amsgrad_maximize"])
def test_adam_on_arrays_and_on_tensors_is_bit_identical(name, dtype):
    # Adam's rule runs on the arrays when nobody records and on Tensors under a mode (a trace):
    # both must write the same bits into the weights and the moments, step after step
    from minigrad.autograd import mode

    kwargs = dict(CASES, adamw_amsgrad_maximize=dict(lr=0.05, weight_decay=0.3, amsgrad=True, maximize=True))[name]
    rng = np.random.default_rng(2)
    w0, grads = rng.standard_normal((3, 4)), rng.standard_normal((6, 3, 4))
    results = []
    for recorded in (False, True):
        p = mg.tensor(w0, dtype=getattr(mg, dtype), requires_grad=True)
        opt = getattr(optim, _classes(name))([p], **kwargs)
        for g in grads:
            p.grad = mg.tensor(g, dtype=getattr(mg, dtype))
            if recorded:
                with mode.Mode():  # any mode on the stack selects the Tensor binding
                    opt.step()
            else:
                opt.step()
        results.append([p.detach().numpy().copy()] + [s.numpy().copy() for s in opt.state[p].values()])
    assert len(results[0]) == len(results[1])
    for a, b in zip(*results):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"{name} {dtype}: the two bindings differ"
