"""Convolution and pooling ops (minigrad.ops.conv) and layers (minigrad.nn.conv): forward and
gradients against PyTorch, finite differences in float64, gradients of gradients, bad inputs."""

import numpy as np
import pytest

import minigrad
from minigrad.autograd import gradcheck, gradgradcheck
from minigrad.errors import DTypeError, ShapeError
from minigrad.ops import adaptive_avg_pool2d, avg_pool2d, conv1d, conv2d, conv_transpose2d, max_pool2d

rng = np.random.default_rng(0)


def _arr(*shape):
    return rng.standard_normal(shape)


def _against_torch(mg_fn, torch_fn, *arrays, atol=1e-10):
    """Run both on float64 copies of ``arrays``; compare outputs and every input's gradient."""
    torch = pytest.importorskip("torch")
    ms = [minigrad.Tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    my, ty = mg_fn(*ms), torch_fn(*ts)
    np.testing.assert_allclose(my.detach().numpy(), ty.detach().numpy(), atol=atol)
    gy = _arr(*ty.shape)
    my.backward(minigrad.Tensor(gy))
    ty.backward(torch.tensor(gy))
    for m, t in zip(ms, ts):
        np.testing.assert_allclose(m.grad.numpy(), t.grad.numpy(), atol=atol)


CONV_CASES = [  # input shape, weight shape, keyword arguments
    ((2, 3, 7, 6), (4, 3, 3, 3), {}),
    ((2, 3, 9, 8), (5, 3, 3, 2), dict(stride=(2, 1), padding=(1, 2))),
    ((1, 4, 9, 10), (6, 2, 3, 2), dict(stride=2, padding=1, dilation=(2, 1), groups=2)),
    ((2, 4, 8, 7), (8, 1, 3, 3), dict(padding=1, groups=4)),  # depthwise, channel multiplier 2
    ((2, 2, 6, 7), (3, 2, 2, 4), dict(padding="same", dilation=(1, 3))),  # odd total: asymmetric
    ((2, 2, 6, 7), (3, 2, 3, 3), dict(padding="valid", stride=3)),
    ((3, 5, 5), (2, 3, 3, 3), {}),  # unbatched
    *(WIDE_CASES := [  # wide enough that im2col's rows wrap past the output's width (ops.conv._conv_columns)
        ((2, 3, 5, 40), (4, 3, 3, 3), dict(padding=1)),
        ((2, 2, 7, 34), (3, 2, 4, 4), dict(stride=2, padding=1)),  # a phase per stride offset
        ((1, 4, 6, 81), (6, 2, 3, 3), dict(stride=2, padding=(0, 2), dilation=2, groups=2)),
    ]),
]


@pytest.mark.filterwarnings("ignore:Using padding=.same.")
@pytest.mark.parametrize("xs, ws, kw", CONV_CASES)
def test_conv2d_matches_torch(xs, ws, kw):
    F = pytest.importorskip("torch.nn.functional")
    x, w, b = _arr(*xs), _arr(*ws), _arr(ws[0])
    _against_torch(lambda x, w, b: conv2d(x, w, b, **kw), lambda x, w, b: F.conv2d(x, w, b, **kw), x, w, b)


def test_conv2d_float32_and_no_bias():
    torch = pytest.importorskip("torch")
    x, w = _arr(4, 3, 10, 10).astype(np.float32), _arr(8, 3, 3, 3).astype(np.float32)
    y = conv2d(minigrad.Tensor(x), minigrad.Tensor(w), stride=2)
    assert y.dtype == minigrad.float32 and y.is_contiguous()
    ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), stride=2).numpy()
    np.testing.assert_allclose(y.numpy(), ref, atol=1e-5)


def test_conv1d_and_conv_transpose2d_match_torch():
    F = pytest.importorskip("torch.nn.functional")
    _against_torch(lambda x, w, b: conv1d(x, w, b, stride=2, padding=1, dilation=2),
                   lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1, dilation=2),
                   _arr(2, 4, 11), _arr(3, 4, 3), _arr(3))
    kw = dict(stride=2, padding=1, output_padding=1, groups=2, dilation=(1, 2))
    _against_torch(lambda x, w, b: conv_transpose2d(x, w, b, **kw),
                   lambda x, w, b: F.conv_transpose2d(x, w, b, **kw),
                   _arr(2, 4, 5, 4), _arr(4, 3, 3, 2), _arr(6))


def test_conv2d_gradcheck_and_gradgradcheck():
    x = minigrad.Tensor(_arr(1, 2, 5, 4), requires_grad=True)
    w = minigrad.Tensor(_arr(4, 1, 2, 3), requires_grad=True)
    b = minigrad.Tensor(_arr(4), requires_grad=True)

    def fn(x, w, b):
        return conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(1, 2), groups=2)

    assert gradcheck(fn, (x, w, b))
    assert gradgradcheck(fn, (x, w, b))


@pytest.mark.parametrize("xs, ws, kw", WIDE_CASES)
def test_wide_columns_give_the_plain_ones_values_and_gradients(monkeypatch, xs, ws, kw):
    # the wrapped columns are computed and dropped (the output) or multiplied by zeros (the weight
    # gradient): values and gradients equal those of the plain im2col, and pass gradcheck
    from minigrad.ops import conv
    from minigrad.ops.conv import Geometry, _conv_columns

    x, w = _arr(*xs), _arr(*ws)
    pad = (kw["padding"],) * 2 if isinstance(kw["padding"], int) else kw["padding"]
    stride, dilation = kw.get("stride", 1), kw.get("dilation", 1)
    g = Geometry(ws[2:], (stride, stride), (pad[0], pad[0], pad[1], pad[1]), (dilation, dilation))
    oh, ow = g.out_size(*xs[2:])
    assert _conv_columns(np, x, g, kw.get("groups", 1)).shape[2] > xs[0] * oh * ow  # the wide form ran

    def run():
        xt, wt = minigrad.Tensor(x, requires_grad=True), minigrad.Tensor(w, requires_grad=True)
        y = conv2d(xt, wt, **kw)
        y.backward(minigrad.Tensor(np.cos(np.arange(y.numel())).reshape(y.shape)))
        return y.detach().numpy(), xt.grad.numpy(), wt.grad.numpy()

    wide = run()
    monkeypatch.setattr(conv, "_conv_columns", conv._im2col)
    for a, b in zip(wide, run()):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    monkeypatch.undo()
    xt, wt = minigrad.Tensor(x, requires_grad=True), minigrad.Tensor(w, requires_grad=True)
    assert gradcheck(lambda a, b: conv2d(a, b, **kw), (xt, wt))


@pytest.mark.parametrize("size", [5, 17])  # 17: the gradient's image is wide enough for wide columns
def test_conv_transpose2d_gradcheck_and_gradgradcheck(size):
    # its backward takes both gradients from one op (Conv2dAndWeight), whose own rule gives the
    # second derivatives
    x = minigrad.Tensor(_arr(2, 4, 3, size), requires_grad=True)
    w = minigrad.Tensor(_arr(4, 3, 4, 4), requires_grad=True)

    def fn(x, w):
        return conv_transpose2d(x, w, stride=2, padding=1, groups=2)

    assert gradcheck(fn, (x, w))
    assert gradgradcheck(fn, (x, w))


def test_conv2d_double_backward_matches_torch():
    """A gradient penalty: d/dw of |d(sum conv(x, w)^2)/dx|^2 needs the transposed conv's backward."""
    torch = pytest.importorskip("torch")
    x, w = _arr(2, 3, 6, 6), _arr(4, 3, 3, 3)
    grads = []
    for lib, make in ((minigrad, minigrad.Tensor), (torch, torch.tensor)):
        xt, wt = make(x, requires_grad=True), make(w, requires_grad=True)
        f = conv2d if lib is minigrad else torch.nn.functional.conv2d
        y = f(xt, wt, stride=2, padding=1)
        (gx,) = lib.autograd.grad((y * y).sum(), xt, create_graph=True) if lib is torch else \
            minigrad.grad((y * y).sum(), xt, create_graph=True)
        (gx * gx).sum().backward()
        grads.append((np.array(xt.grad.detach().numpy()), np.array(wt.grad.detach().numpy())))
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)


POOL_CASES = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 1)),
    dict(kernel_size=(3, 2), stride=1),  # overlapping windows: gradients add up
]


@pytest.mark.parametrize("kw", POOL_CASES + [dict(kernel_size=(2, 3), stride=(1, 2), padding=1, dilation=(2, 1))])
def test_max_pool2d_matches_torch(kw):
    F = pytest.importorskip("torch.nn.functional")
    x = _arr(2, 3, 9, 8)
    _against_torch(lambda x: max_pool2d(x, **kw), lambda x: F.max_pool2d(x, **kw), x)
    _, mi = max_pool2d(minigrad.Tensor(x), return_indices=True, **kw)
    _, ti = F.max_pool2d(__import__("torch").tensor(x), return_indices=True, **kw)
    assert mi.dtype == minigrad.int64
    np.testing.assert_array_equal(mi.numpy(), ti.numpy())


@pytest.mark.parametrize("kw", POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d_matches_torch(kw, count_include_pad):
    F = pytest.importorskip("torch.nn.functional")
    _against_torch(lambda x: avg_pool2d(x, count_include_pad=count_include_pad, **kw),
                   lambda x: F.avg_pool2d(x, count_include_pad=count_include_pad, **kw), _arr(2, 3, 9, 8))


def test_avg_pool2d_divisor_override_and_unbatched():
    F = pytest.importorskip("torch.nn.functional")
    _against_torch(lambda x: avg_pool2d(x, 3, 2, 1, divisor_override=4),
                   lambda x: F.avg_pool2d(x, 3, 2, 1, divisor_override=4), _arr(3, 7, 7))


@pytest.mark.parametrize("size", [1, (4, 3), (5, None), (7, 8)])
def test_adaptive_avg_pool2d_matches_torch(size):
    F = pytest.importorskip("torch.nn.functional")
    _against_torch(lambda x: adaptive_avg_pool2d(x, size), lambda x: F.adaptive_avg_pool2d(x, size), _arr(2, 3, 9, 7))


def test_pools_gradcheck_and_gradgradcheck():
    x = minigrad.Tensor(rng.permutation(60).reshape(1, 2, 5, 6) * 0.1, requires_grad=True)  # no ties
    for fn in (lambda x: max_pool2d(x, 3, 2, 1, ceil_mode=True),
               lambda x: avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
               lambda x: adaptive_avg_pool2d(x, (3, 4))):
        assert gradcheck(fn, (x,))
        assert gradgradcheck(fn, (x,))


def test_bad_inputs_name_expected_and_actual():
    x = minigrad.randn(2, 3, 8, 8)
    with pytest.raises(ShapeError, match=r"expected input with 4 channels.*\(2, 3, 8, 8\) with 3 channels"):
        conv2d(x, minigrad.randn(5, 4, 3, 3))
    with pytest.raises(ShapeError, match=r"expected input with 6 channels.*groups=2"):
        conv2d(x, minigrad.randn(4, 3, 3, 3), groups=2)
    with pytest.raises(ShapeError, match=r"3-D \(C, H, W\) or 4-D \(N, C, H, W\) input, got shape \(3, 8\)"):
        conv2d(minigrad.randn(3, 8), minigrad.randn(5, 3, 3, 3))
    with pytest.raises(ShapeError, match=r"spatial size \(8, 8\).*smaller than the \(dilated\) kernel size \(9, 9\)"):
        conv2d(x, minigrad.randn(5, 3, 3, 3), dilation=4)
    with pytest.raises(ShapeError, match=r"bias of shape \(5,\), got \(4,\)"):
        conv2d(x, minigrad.randn(5, 3, 3, 3), minigrad.randn(4))
    with pytest.raises(DTypeError, match="same dtype"):
        conv2d(x.double(), minigrad.randn(5, 3, 3, 3))
    with pytest.raises(ValueError, match="'same' is not supported for strided"):
        conv2d(x, minigrad.randn(5, 3, 3, 3), stride=2, padding="same")
    with pytest.raises(ValueError, match="stride must be an int >= 1"):
        conv2d(x, minigrad.randn(5, 3, 3, 3), stride=0)
    with pytest.raises(ValueError, match=r"at most half of the kernel size.*padding \(2, 2\)"):
        max_pool2d(x, 3, padding=2)
    with pytest.raises(ShapeError, match="too small for kernel"):
        avg_pool2d(minigrad.randn(1, 1, 2, 2), 3)


def test_conv_layers_match_torch_names_init_repr_and_values():
    torch = pytest.importorskip("torch")
    kw = dict(stride=2, padding=1, dilation=(1, 2), groups=2)
    mine, ref = minigrad.nn.Conv2d(4, 6, (3, 2), **kw), torch.nn.Conv2d(4, 6, (3, 2), **kw)
    assert repr(mine) == repr(ref)
    assert [(k, tuple(v.shape)) for k, v in mine.state_dict().items()] == \
           [(k, tuple(v.shape)) for k, v in ref.state_dict().items()]
    bound = 1 / np.sqrt(2 * 3 * 2)  # fan_in = in_channels / groups * kH * kW
    for p in mine.parameters():
        assert np.abs(p.detach().numpy()).max() <= bound
    for name, args, kwargs in [("Conv2d", (3, 8, 3), dict(padding="same", bias=False)), ("MaxPool2d", (2,), {}),
                               ("AvgPool2d", (3, 2, 1), {}), ("AdaptiveAvgPool2d", ((1, 1),), {})]:
        assert repr(getattr(minigrad.nn, name)(*args, **kwargs)) == repr(getattr(torch.nn, name)(*args, **kwargs))

    ref.double()
    mine.double().load_state_dict({k: minigrad.tensor(v.numpy()) for k, v in ref.state_dict().items()})
    model = minigrad.nn.Sequential(mine, minigrad.nn.MaxPool2d(2, ceil_mode=True), minigrad.nn.AdaptiveAvgPool2d(2))
    tmodel = torch.nn.Sequential(ref, torch.nn.MaxPool2d(2, ceil_mode=True), torch.nn.AdaptiveAvgPool2d(2))
    x = _arr(2, 4, 11, 9)
    y, ty = model(minigrad.tensor(x)), tmodel(torch.tensor(x))
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), atol=1e-12)
    y.sum().backward()
    ty.sum().backward()
    np.testing.assert_allclose(mine.weight.grad.numpy(), ref.weight.grad.numpy(), atol=1e-10)
    np.testing.assert_allclose(mine.bias.grad.numpy(), ref.bias.grad.numpy(), atol=1e-10)
    with pytest.raises(ValueError, match=r"in_channels \(3\) and out_channels \(6\) must both be divisible"):
        minigrad.nn.Conv2d(3, 6, 3, groups=2)


def test_empty_batch():
    x = minigrad.zeros(0, 3, 8, 8, requires_grad=True)
    w = minigrad.randn(4, 3, 3, 3, requires_grad=True)
    for fn in (lambda x: conv2d(x, w, padding=1), lambda x: max_pool2d(x, 2), lambda x: adaptive_avg_pool2d(x, 3)):
        y = fn(x)
        y.sum().backward()
        assert y.shape[0] == 0 and x.grad.shape == (0, 3, 8, 8)


@pytest.mark.parametrize("loops", [True, False], ids=["C loop", "numpy lines"])
def test_col2im_adds_every_window_back_where_im2col_took_it(monkeypatch, loops):
    # col2im sums each stride phase on its own; it must equal the plain scatter-add of every window
    # for any geometry: strides above, at and below the kernel, dilation, uneven padding, a
    # padded output larger than the windows cover (conv_transpose2d's output_padding); and the C
    # loop (ops.c_loops) must give the numpy lines' bits, in float32 and float64
    from minigrad.ops import c_loops
    from minigrad.ops.conv import Geometry, _col2im

    if loops and not c_loops.enabled():
        pytest.skip("no C compiler built the loops")
    if not loops:
        monkeypatch.setattr(c_loops, "_library", [False])

    r = np.random.default_rng(3)
    for _ in range(150):
        (kh, kw), (sh, sw), (dh, dw) = r.integers(1, 5, 2), r.integers(1, 4, 2), r.integers(1, 3, 2)
        pt, pb, pl, pr = (int(p) for p in r.integers(0, 3, 4))
        (oh, ow), (c, n) = r.integers(1, 5, 2), r.integers(1, 3, 2)
        hp = (oh - 1) * sh + (kh - 1) * dh + 1 + int(r.integers(0, 2))  # the padded output's size
        wp = (ow - 1) * sw + (kw - 1) * dw + 1 + int(r.integers(0, 2))
        h, w = hp - pt - pb, wp - pl - pr
        if h < 1 or w < 1:
            continue
        g = Geometry((int(kh), int(kw)), (int(sh), int(sw)), (pt, pb, pl, pr), (int(dh), int(dw)))
        cols = r.standard_normal((c, kh, kw, oh, ow, n))
        want = np.zeros((n, c, hp, wp))
        for u in range(kh):
            for v in range(kw):
                for i in range(oh):
                    for j in range(ow):
                        want[:, :, i * sh + u * dh, j * sw + v * dw] += cols[:, u, v, i, j].T
        got = _col2im(np, cols, g, h, w)
        np.testing.assert_allclose(got, want[:, :, pt:pt + h, pl:pl + w], rtol=1e-12, atol=1e-12, err_msg=str(g))
        if loops:
            for dtype in (np.float32, np.float64):
                fused = _col2im(np, cols.astype(dtype), g, h, w)
                with monkeypatch.context() as m:
                    m.setattr(c_loops, "_library", [False])
                    assert fused.tobytes() == _col2im(np, cols.astype(dtype), g, h, w).tobytes(), str(g)
