"""Transforms: shapes, values, determinism under manual_seed, Tensor in -> Tensor out."""

import numpy as np
import pytest

import minigrad
from minigrad.data import transforms as T
from minigrad.errors import DTypeError, ShapeError


def _image(c=3, h=6, w=5, seed=0):
    return np.random.default_rng(seed).random((c, h, w)).astype(np.float32)


def test_to_tensor_uint8_hwc_and_hw():
    hwc = np.arange(24, dtype=np.uint8).reshape(2, 4, 3) * 10
    t = T.ToTensor()(hwc)
    assert isinstance(t, minigrad.Tensor) and t.shape == (3, 2, 4) and t.dtype == minigrad.float32
    np.testing.assert_allclose(t.numpy(), hwc.transpose(2, 0, 1) / 255, rtol=1e-6)
    hw = T.ToTensor()(np.full((5, 7), 255, np.uint8))
    assert hw.shape == (1, 5, 7) and hw.numpy().max() == 1.0
    kept = T.ToTensor()(np.zeros((2, 2), np.float64))  # torchvision scales uint8 only
    assert kept.dtype == minigrad.float64
    with pytest.raises(ShapeError):
        T.ToTensor()(np.zeros(3))


def test_normalize_per_channel():
    x = _image()
    out = T.Normalize([0.1, 0.2, 0.3], [0.5, 1.0, 2.0])(x)
    mean, std = np.array([0.1, 0.2, 0.3], np.float32), np.array([0.5, 1, 2], np.float32)
    expected = (x - mean[:, None, None]) / std[:, None, None]
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert out.dtype == np.float32
    t = minigrad.tensor(x)
    tout = T.Normalize(0.5, 0.25)(t)
    assert isinstance(tout, minigrad.Tensor)
    np.testing.assert_allclose(tout.numpy(), (x - 0.5) / 0.25, rtol=1e-6)
    y = x.copy()
    assert T.Normalize([0.0] * 3, [2.0] * 3, inplace=True)(y) is y
    np.testing.assert_allclose(y, x / 2)
    with pytest.raises(ValueError, match="zero"):
        T.Normalize([0.0], [0.0])
    with pytest.raises(ShapeError, match="2/2 values for an image with 3 channel"):
        T.Normalize([0.0, 0.0], [1.0, 1.0])(x)
    with pytest.raises(DTypeError):
        T.Normalize(0.0, 1.0)(np.zeros((1, 2, 2), np.uint8))


def test_normalize_matches_torch():
    torch = pytest.importorskip("torch")
    x = _image()
    mean, std = torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.5, 1.0, 2.0])
    expected = (torch.from_numpy(x) - mean[:, None, None]) / std[:, None, None]
    np.testing.assert_allclose(T.Normalize([0.1, 0.2, 0.3], [0.5, 1.0, 2.0])(x), expected.numpy(), rtol=1e-6)


def test_random_crop_is_a_window_of_the_padded_image():
    x = _image(h=6, w=5)
    minigrad.manual_seed(0)
    crop = T.RandomCrop((4, 3), padding=1)
    outs = [crop(x) for _ in range(20)]
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1)))
    for o in outs:
        assert o.shape == (3, 4, 3)
        windows = [padded[:, i:i + 4, j:j + 3] for i in range(5) for j in range(5)]
        assert any(np.array_equal(o, w) for w in windows)
    assert len({o.tobytes() for o in outs}) > 1
    minigrad.manual_seed(0)
    assert all(np.array_equal(a, crop(x)) for a in outs)  # the same draws again


def test_random_crop_padding_forms_and_modes():
    x = np.arange(4, dtype=np.float32).reshape(1, 2, 2)
    assert T.RandomCrop(2, padding=(1, 0))(x).shape == (1, 2, 2)
    full = T.RandomCrop((2, 4), padding=(1, 0))(x)  # (left/right, top/bottom) as torchvision
    np.testing.assert_array_equal(full, [[[0, 0, 1, 0], [0, 2, 3, 0]]])
    edge = T.RandomCrop((2, 3), padding=(1, 0, 0, 0), padding_mode="edge")(x)  # (l, t, r, b)
    np.testing.assert_array_equal(edge, [[[0, 0, 1], [2, 2, 3]]])
    filled = T.RandomCrop((4, 4), padding=1, fill=9)(x)
    assert filled[0, 0, 0] == 9 and filled[0, 1, 1] == 0
    assert T.RandomCrop(3, pad_if_needed=True)(x).shape == (1, 3, 3)
    with pytest.raises(ShapeError, match="larger"):
        T.RandomCrop(3)(x)
    with pytest.raises(ValueError, match="padding_mode"):
        T.RandomCrop(2, padding_mode="wrap")


def test_flips():
    x = _image()
    np.testing.assert_array_equal(T.RandomHorizontalFlip(p=1.0)(x), x[..., ::-1])
    assert T.RandomHorizontalFlip(p=0.0)(x) is x
    np.testing.assert_array_equal(T.RandomVerticalFlip(p=1.0)(x), x[..., ::-1, :])
    t = T.RandomHorizontalFlip(p=1.0)(minigrad.tensor(x))
    assert isinstance(t, minigrad.Tensor)
    np.testing.assert_array_equal(t.numpy(), x[..., ::-1])
    minigrad.manual_seed(3)
    flips = [T.RandomHorizontalFlip()(x) is not x for _ in range(200)]
    assert 60 < sum(flips) < 140


@pytest.mark.parametrize("size", [(5, 5), (6, 6)])
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_rotation_by_90_degrees_is_rot90(size, interpolation):
    x = _image(2, *size)
    rot = T.RandomRotation((90, 90), interpolation=interpolation)
    np.testing.assert_allclose(rot(x), np.rot90(x, 1, axes=(-2, -1)), atol=1e-6)  # counter-clockwise
    np.testing.assert_allclose(T.RandomRotation((-90, -90))(x), np.rot90(x, -1, axes=(-2, -1)))
    np.testing.assert_array_equal(T.RandomRotation(0)(x), x)


def test_rotation_fill_dtype_and_determinism():
    x = np.full((1, 9, 9), 200, np.uint8)
    out = T.RandomRotation((45, 45), fill=7)(x)
    assert out.dtype == np.uint8 and out[0, 4, 4] == 200 and out[0, 0, 0] == 7
    bil = T.RandomRotation((30, 30), interpolation="bilinear")(x.astype(np.float32))
    assert bil[0, 4, 4] == pytest.approx(200) and 0 <= bil.min() and bil.max() <= 200 + 1e-4
    rot = T.RandomRotation(20)
    minigrad.manual_seed(1)
    a = rot(_image())
    minigrad.manual_seed(1)
    np.testing.assert_array_equal(a, rot(_image()))
    with pytest.raises(ValueError):
        T.RandomRotation(-5)
    with pytest.raises(ValueError):
        T.RandomRotation(5, interpolation="cubic")


def test_compose_and_lambda():
    pipeline = T.Compose([T.ToTensor(), T.Lambda(lambda t: t * 2), T.Normalize([1.0], [1.0])])
    out = pipeline(np.full((2, 2), 255, np.uint8))
    assert out.shape == (1, 2, 2) and np.allclose(out.numpy(), 1.0)
    assert "ToTensor" in repr(pipeline) and "Normalize" in repr(pipeline)
    with pytest.raises(TypeError):
        T.Lambda(3)
    with pytest.raises(TypeError, match="expected a numpy array or a Tensor"):
        T.RandomHorizontalFlip()([1, 2])


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_rotation_matches_torch_grid_sample(interpolation):
    torch = pytest.importorskip("torch")
    x = _image(2, 7, 7)
    angle = 37.0  # no output pixel lands exactly half-way, where rounding conventions differ
    cos, sin = np.cos(np.radians(angle)), np.sin(np.radians(angle))
    # torchvision's rotate: the inverse rotation as an affine grid (y points down, centre at 0)
    theta = torch.tensor([[[cos, -sin, 0.0], [sin, cos, 0.0]]], dtype=torch.float32)
    grid = torch.nn.functional.affine_grid(theta, (1, 2, 7, 7), align_corners=False)
    expected = torch.nn.functional.grid_sample(torch.from_numpy(x)[None], grid, mode=interpolation,
                                               padding_mode="zeros", align_corners=False)[0]
    out = T.RandomRotation((angle, angle), interpolation=interpolation)(x)
    np.testing.assert_allclose(out, expected.numpy(), atol=1e-5)
