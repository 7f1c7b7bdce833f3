"""The GPU backend: ``minigrad.cuda``, moving tensors and modules, the default device, errors
without cupy or without a GPU, and a training step (layers, losses, optimizers) on each device.

Tests taking ``device`` run on the cpu and, where a GPU is present, on cuda. Tests named
``test_simulated_*`` run the cuda code path on the cpu through ``fake_cupy`` (see there): they
check minigrad's dispatch, bookkeeping and error messages, not a GPU, and are skipped where a
real GPU is present.
"""

import copy
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import conftest
import minigrad as mg
from minigrad import backend, nn, optim
from minigrad.errors import DeviceError


def host(t):
    return np.array(t.detach().cpu().numpy())  # a copy: on the cpu numpy() shares memory


@pytest.fixture
def no_cuda_devices(monkeypatch):
    """Forget the cuda devices made so far, so the next one asks cupy again."""
    kept = {k: v for k, v in mg.Device._cache.items() if not k.startswith("cuda")}
    monkeypatch.setattr(mg.Device, "_cache", kept)
    monkeypatch.setattr(mg.backend, "_allocator", None)
    monkeypatch.setattr(backend, "_default_device", backend.cpu)


def _expect_cuda_unusable(match: str) -> None:
    assert not mg.cuda.is_available() and mg.cuda.device_count() == 0
    for ask in (lambda: mg.zeros(2, device="cuda"), lambda: mg.ones(2).cuda(), lambda: mg.ones(2).to("cuda:0"),
                lambda: nn.Linear(2, 2).cuda(), lambda: mg.set_default_device("cuda"), mg.cuda.current_device,
                mg.cuda.synchronize, mg.cuda.memory_allocated, mg.cuda.max_memory_allocated,
                mg.cuda.reset_peak_memory_stats, mg.cuda.empty_cache, lambda: mg.memory.track("cuda")):
        with pytest.raises(DeviceError, match=match):
            ask()
    mg.cuda.manual_seed(0)  # seeding the GPU is silently skipped, as in torch
    mg.cuda.manual_seed_all(0)
    assert mg.get_default_device() == "cpu"


# -- without cupy, or with cupy and no GPU ---------------------------------------------------------
def test_import_never_needs_cupy():
    code = ("import sys; sys.modules['cupy'] = None\n"  # `import cupy` now fails, as when it is not installed
            "import minigrad, minigrad.cuda\n"
            "print(minigrad.cuda.is_available(), minigrad.cuda.device_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "0"]


def test_errors_without_cupy(monkeypatch, no_cuda_devices):
    monkeypatch.setitem(sys.modules, "cupy", None)
    _expect_cuda_unusable(r"device cuda:0 needs cupy, which is not installed; install the 'cuda' extra")


@pytest.mark.parametrize("runtime", ["no driver", "no device"])
def test_errors_with_cupy_but_no_gpu(monkeypatch, no_cuda_devices, runtime):
    def count():
        if runtime == "no driver":
            raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")
        return 0

    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(
        getDeviceCount=count))))
    if runtime == "no driver":
        _expect_cuda_unusable(r"cupy is installed but no CUDA GPU is usable \(cudaErrorInsufficientDriver")
    else:
        _expect_cuda_unusable(r"device cuda:0: only 0 CUDA device\(s\) present")


def test_installed_cupy_on_a_machine_without_gpu(no_cuda_devices):
    """The real cupy, where it is installed on a machine without a GPU."""
    pytest.importorskip("cupy", reason="cupy is not installed")
    if conftest.HAS_CUDA:
        pytest.skip("cuda is usable here (a GPU, or the simulation)")
    _expect_cuda_unusable("cupy is installed but no CUDA GPU is usable")


def test_cuda_cases_are_skipped_with_a_reason_without_gpu(monkeypatch):
    monkeypatch.setattr(conftest, "HAS_CUDA", False)
    assert conftest.require("cpu") == "cpu"
    with pytest.raises(pytest.skip.Exception, match=r"no CUDA GPU \(cupy not installed or no device\)"):
        conftest.require("cuda")


def test_default_device_and_device_context():
    assert mg.get_default_device() is conftest.TEST_DEVICE
    mg.set_default_device("cpu")
    assert mg.zeros(1).device == "cpu"
    with mg.device("cpu") as d:
        assert d is mg.get_default_device() is mg.device("cpu")
    mg.set_default_device(None)
    assert mg.get_default_device() is backend.cpu
    with pytest.raises(DeviceError, match="unknown device 'tpu'"):
        mg.set_default_device("tpu")


# -- on each device (cuda where there is a GPU) ----------------------------------------------------
def test_transfers_are_differentiable(device):
    x = mg.randn(3, 4, requires_grad=True, device="cpu")
    y = x.to(device) * 2
    assert y.device == device and y.requires_grad
    z = y.cpu()
    assert z.device == "cpu"
    (z * z).sum().backward()
    assert x.grad.device == "cpu"
    np.testing.assert_allclose(x.grad.numpy(), 8 * x.detach().numpy(), rtol=1e-6)
    assert x.to(device, mg.float64).dtype == mg.float64


def test_creation_functions_take_a_device(device):
    made = [mg.zeros(2, 3, device=device), mg.ones(2, device=device), mg.empty(2, device=device),
            mg.full((2,), 1.5, device=device), mg.arange(5, device=device), mg.linspace(0, 1, 5, device=device),
            mg.eye(3, device=device), mg.rand(2, device=device), mg.randn(2, device=device),
            mg.randint(0, 5, (4,), device=device), mg.randperm(6, device=device), mg.tensor([1.0, 2.0], device=device)]
    made += [mg.zeros_like(made[0]), mg.randn_like(made[0]), mg.full_like(made[0], 2.0)]
    assert all(t.device == device for t in made)
    assert sorted(host(made[10]).tolist()) == list(range(6))
    with mg.device(device):
        assert mg.zeros(1).device == mg.tensor([1]).device == mg.get_default_device() == device


@pytest.mark.parametrize("make_optimizer", [
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    lambda ps: optim.Adam(ps, lr=0.01, amsgrad=True),
    lambda ps: optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    lambda ps: optim.RMSprop(ps, lr=0.01, momentum=0.5),
], ids=["SGD", "Adam", "AdamW", "RMSprop"])
def test_training_steps_on_device_match_the_cpu(device, make_optimizer):
    """A small CNN, its loss and its optimizer, moved with Module.to after the optimizer was built.

    The convolution has no bias: BatchNorm subtracts it again, so its true gradient is 0 and what
    backward computes is rounding noise (1e-9), which Adam and RMSprop divide by its own size into
    steps of ``lr``: the cpu's C log-softmax and the device's numpy lines differ there by an ulp."""
    with mg.device("cpu"):
        model = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1, bias=False), nn.BatchNorm2d(3), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(12, 3))
    twin = copy.deepcopy(model)
    x = np.random.default_rng(0).standard_normal((5, 1, 4, 4))
    y = np.array([0, 2, 1, 1, 0])
    results = []
    for m, dev in ((model, "cpu"), (twin, device)):
        opt = make_optimizer(m.parameters())
        m.to(dev)
        for _ in range(3):
            opt.zero_grad()
            loss = nn.CrossEntropyLoss()(m(mg.tensor(x, dtype=mg.float32, device=dev)), mg.tensor(y, device=dev))
            loss.backward()
            nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
        assert all(p.device == dev for p in m.parameters())
        results.append([loss.item()] + [host(p) for p in m.parameters()] + [host(b) for b in m.buffers()])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_autocast_float16_and_grad_scaler_on_device(device):
    model = nn.Linear(4, 3).to(device)
    opt = optim.SGD(model.parameters(), lr=0.1)
    scaler = mg.amp.GradScaler(init_scale=2.0 ** 8)
    with mg.autocast(device_type=mg.device(device).type):
        out = model(mg.randn(5, 4, device=device))
        loss = out.float().pow(2).mean()
    assert out.dtype == mg.float16 and out.device == device
    scaler.scale(loss).backward()
    assert model.weight.grad.dtype == mg.float32 and model.weight.grad.device == device
    before = host(model.weight)
    scaler.step(opt)
    scaler.update()
    assert not np.array_equal(host(model.weight), before)


# -- the cuda path, simulated on the cpu (fake_cupy: not a GPU) ------------------------------------
def test_simulated_ops_across_devices_name_both_devices(simulated_cuda):
    a, b = mg.ones(2, 2, device="cpu"), mg.ones(2, 2, device="cuda")
    both = r"expected all tensors on the same device, got (cpu and cuda:0|cuda:0 and cpu)"
    for op in (lambda: a + b, lambda: a @ b, lambda: mg.where(a > 0, a, b), lambda: b.unsqueeze(0) * a):
        with pytest.raises(DeviceError, match=both):
            op()
    with pytest.raises(DeviceError, match="cat: tensor 1 is on cuda:0 but tensor 0 is on cpu"):
        mg.cat([a, b])
    with pytest.raises(DeviceError, match="the value is on cpu but the tensor is on cuda:0"):
        b[0] = a[0]


def test_simulated_device_api(simulated_cuda):
    assert mg.cuda.is_available() and mg.cuda.device_count() == 2 and mg.cuda.current_device() == 0
    mg.cuda.synchronize()
    mg.cuda.synchronize(0)
    assert simulated_cuda.cuda.synchronized == 2
    x = mg.tensor(np.arange(6.0).reshape(2, 3), device="cuda")
    assert x.device is mg.device("cuda:0") is mg.device("cuda") and type(x.array) is simulated_cuda.ndarray
    assert mg.tensor(x.array).device == "cuda"  # an array already on a GPU stays there
    assert repr(x).endswith("device='cuda:0')") and x.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert x.sum().item() == 15.0 and float(x[1, 2]) == 5.0
    with pytest.raises(DeviceError, match="expected a cuda device, got cpu"):
        mg.cuda.memory_allocated("cpu")


def test_simulated_second_gpu(simulated_cuda):
    """cupy allocates on the current GPU: a tensor made for cuda:1 must be allocated there."""
    before = mg.cuda.memory_allocated(1)
    made = [mg.zeros(1000, device="cuda:1"), mg.randn(1000, device="cuda:1"), mg.tensor(np.ones(1000), device="cuda:1")]
    assert [t.array.device.id for t in made] == [1, 1, 1] and all(t.device == "cuda:1" for t in made)
    assert mg.cuda.memory_allocated(1) - before >= 3 * 4000
    moved = made[0].to("cuda:0")
    assert moved.device == "cuda:0" and moved.array.device.id == 0
    with mg.device("cuda:1"):
        assert mg.cuda.current_device() == 1 and mg.ones(2).array.device.id == 1
    assert mg.cuda.current_device() == 0


def test_simulated_default_device_and_modules(simulated_cuda):
    mg.set_default_device("cuda")
    assert mg.randn(2).device == mg.tensor([1.0]).device == nn.Linear(2, 2).weight.device == "cuda"
    with mg.device("cpu"):
        assert mg.zeros(1).device == "cpu"
    assert mg.zeros(1).device == "cuda"
    mg.set_default_device(None)
    m = nn.Linear(3, 2).cuda()
    assert m.weight.device == m.bias.device == "cuda"
    assert m.cpu().weight.device == "cpu"


def test_simulated_memory_pool_figures(simulated_cuda):
    start = mg.cuda.memory_allocated()
    x = mg.zeros(1000, device="cuda")  # 4000 bytes
    assert mg.cuda.memory_allocated() == start + 4000
    mg.cuda.reset_peak_memory_stats()
    y = x + 1
    del y
    assert mg.cuda.memory_allocated() == start + 4000
    assert mg.cuda.max_memory_allocated() == start + 8000  # y was alive for a moment
    mg.cuda.reset_peak_memory_stats()
    assert mg.cuda.max_memory_allocated() == start + 4000
    stats = mg.memory_stats("cuda")
    assert stats == mg.cuda.memory_stats()
    assert stats["allocated_bytes.all.current"] == start + 4000 == stats["allocated_bytes.all.peak"]
    assert stats["reserved_bytes.all.current"] == stats["allocated_bytes.all.current"] + stats["cached_bytes"]
    assert "allocated_bytes.all.current" in mg.memory_summary("cuda") and "cuda:0" in mg.cuda.memory_summary()
    mg.cuda.empty_cache()
    mg.empty_cache("cuda")


def test_simulated_memory_tracker_counts_the_pool(simulated_cuda):
    w = mg.randn(100, 100, device="cuda", requires_grad=True)
    with mg.memory.track("cuda") as mem:
        h = (w @ w).tanh()  # two 40 kB activations while computing, one kept by tanh for backward
        loss = h.sum()
        del h
    assert mem.peak - mem.start >= 80_000
    assert mem.activation_peak >= 40_000 and mem.current >= mem.start
    loss.backward()
    with mg.memory.track("cpu") as cpu_mem:  # the two kinds of counter can watch at the same time
        with mg.memory.track("cuda"):
            mg.ones(10, device="cpu") + mg.ones(10, device="cuda").cpu()
    assert cpu_mem.peak > cpu_mem.start


def test_simulated_random_numbers_on_the_device(simulated_cuda):
    mg.cuda.manual_seed(5)
    a = host(mg.randn(4, device="cuda"))
    mg.cuda.manual_seed_all(5)
    np.testing.assert_array_equal(host(mg.randn(4, device="cuda")), a)
    state = backend.get_rng_state("cuda")
    b = host(mg.rand(3, device="cuda"))
    backend.set_rng_state(state, "cuda")
    np.testing.assert_array_equal(host(mg.rand(3, device="cuda")), b)
    assert sorted(host(mg.randperm(10, device="cuda")).tolist()) == list(range(10))


def test_simulated_checkpoint_replays_dropout_on_the_device(simulated_cuda):
    x = mg.randn(4, 6, device="cuda", requires_grad=True)
    block = lambda t: nn.functional.dropout(t.tanh(), 0.5) * 3  # noqa: E731
    mg.manual_seed(1)
    mg.memory.checkpoint(block, x).sum().backward()
    g_checkpointed = host(x.grad)
    x.grad = None
    mg.manual_seed(1)
    block(x).sum().backward()
    np.testing.assert_array_equal(host(x.grad), g_checkpointed)


def test_simulated_scatter_add_of_int64_uses_the_uint64_kernel(simulated_cuda):
    """cupy's add.at has no int64 kernel (the simulation refuses it as cupy does)."""
    x = mg.zeros(4, dtype=mg.int64, device="cuda")
    out = x.index_add(0, mg.tensor([1, 3, 1], device="cuda"), mg.tensor([5, -7, 2**40], device="cuda"))
    assert out.tolist() == [0, 5 + 2**40, 0, -7]
    with pytest.raises(TypeError, match="cupy.add.at only supports"):
        simulated_cuda.add.at(simulated_cuda.zeros(2, dtype="int16"), simulated_cuda.asarray([0]), 1)
