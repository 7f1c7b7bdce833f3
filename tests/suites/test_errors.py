"""Bad input raises a specific minigrad error whose message a student can act on: it names the
op, what was expected and what was given (DESIGN.md, principle 6)."""

from __future__ import annotations

import pytest

import minigrad
from minigrad.errors import AnomalyError, AutogradError, DeviceError, DTypeError, ShapeError


def test_error_types_subclass_the_builtins_torch_raises():
    assert issubclass(ShapeError, ValueError)
    assert issubclass(DTypeError, TypeError)
    assert issubclass(AutogradError, RuntimeError)
    assert issubclass(DeviceError, RuntimeError)
    assert issubclass(AnomalyError, RuntimeError)


# -- shapes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("op, name", [
    (lambda a, b: a + b, "Add"), (lambda a, b: a - b, "Sub"), (lambda a, b: a * b, "Mul"),
    (lambda a, b: a / b, "Div"), (lambda a, b: minigrad.ops.maximum(a, b), "Maximum"),
])
def test_broadcast_mismatch_names_the_op_and_both_shapes(op, name):
    with pytest.raises(ShapeError) as info:
        op(minigrad.ones(2, 3), minigrad.ones(4))
    message = str(info.value)
    assert name in message and "(2, 3)" in message and "(4,)" in message


@pytest.mark.parametrize("sa, sb", [((2, 3), (4, 5)), ((3,), (4,)), ((2, 3, 4), (5, 6)), ((2, 2, 3), (3, 3, 4))])
def test_matmul_mismatch_names_both_shapes(sa, sb):
    with pytest.raises(ShapeError) as info:
        minigrad.ones(*sa) @ minigrad.ones(*sb)
    message = str(info.value)
    assert "matmul" in message.lower() and str(sa) in message and str(sb) in message


def test_matmul_of_a_0d_tensor_is_rejected():
    with pytest.raises(ShapeError):
        minigrad.tensor(2.0) @ minigrad.ones(3)


@pytest.mark.parametrize("call, name, dim", [
    (lambda x: x.sum(dim=7), "sum", "7"),
    (lambda x: x.mean(dim=-9), "mean", "-9"),
    (lambda x: x.max(dim=5), "max", "5"),
    (lambda x: x.argmax(dim=6), "argmax", "6"),
    (lambda x: x.var(dim=8), "var", "8"),
    (lambda x: x.logsumexp(dim=-5), "logsumexp", "-5"),
    (lambda x: x.softmax(8), "softmax", "8"),
    (lambda x: x.transpose(0, 7), "transpose", "7"),
    (lambda x: x.permute(0, 5), "permute", "5"),
    (lambda x: x.unsqueeze(9), "unsqueeze", "9"),
    (lambda x: x.squeeze(5), "squeeze", "5"),
    (lambda x: x.flatten(0, 6), "flatten", "6"),
    (lambda x: x.flip((7,)), "flip", "7"),
    (lambda x: minigrad.ops.cat([x, x], dim=7), "cat", "7"),
    (lambda x: minigrad.ops.stack([x, x], dim=-8), "stack", "-8"),
    (lambda x: x.split(1, dim=6), "split", "6"),
    (lambda x: x.size(5), "size", "5"),
])
def test_bad_dim_names_the_op_and_the_dim(call, name, dim):
    with pytest.raises(ShapeError) as info:
        call(minigrad.ones(2, 2))
    message = str(info.value)
    assert name in message and dim in message, message


def test_reshape_to_a_wrong_size_names_both_shapes():
    with pytest.raises(ShapeError) as info:
        minigrad.ones(2, 3).reshape(4, 2)
    message = str(info.value)
    assert "reshape" in message and "(2, 3)" in message and "(4, 2)" in message


def test_view_with_two_inferred_dims():
    with pytest.raises(ShapeError):
        minigrad.ones(2, 3).view(-1, -1)


def test_cat_and_stack_mismatches():
    with pytest.raises(ShapeError, match="cat"):
        minigrad.ops.cat([minigrad.ones(2, 3), minigrad.ones(2, 4)], dim=0)
    with pytest.raises(ShapeError, match="stack"):
        minigrad.ops.stack([minigrad.ones(2, 3), minigrad.ones(3, 2)])


def test_expand_to_an_incompatible_shape():
    with pytest.raises(ShapeError, match="expand"):
        minigrad.ones(3, 2).expand(3, 4)


def test_index_out_of_range_raises_index_error():
    with pytest.raises(IndexError):
        minigrad.ones(3)[5]


# -- dtypes ----------------------------------------------------------------------------------------
def test_requires_grad_on_an_integer_tensor():
    with pytest.raises(DTypeError, match="int64"):
        minigrad.tensor([1, 2, 3]).requires_grad_()
    with pytest.raises(DTypeError):
        minigrad.zeros(3, dtype=minigrad.int32, requires_grad=True)


@pytest.mark.parametrize("make", [
    lambda: minigrad.zeros(2, dtype="float7"),
    lambda: minigrad.tensor([1.0], dtype="complex64"),
    lambda: minigrad.ones(2).to("not_a_dtype"),
    lambda: minigrad.tensor(["a", "b"]),
    lambda: minigrad.set_default_dtype(minigrad.int64),
])
def test_unknown_or_unsupported_dtype(make):
    with pytest.raises(DTypeError):
        make()


def test_where_needs_a_bool_condition():
    with pytest.raises(DTypeError, match="where"):
        minigrad.ops.where(minigrad.ones(2), minigrad.ones(2), minigrad.zeros(2))


# -- autograd --------------------------------------------------------------------------------------
def test_backward_on_a_non_scalar_needs_a_gradient():
    y = minigrad.ones(2, 3, requires_grad=True) * 2
    with pytest.raises(AutogradError) as info:
        y.backward()
    message = str(info.value)
    assert "scalar" in message and "(2, 3)" in message


def test_backward_with_a_gradient_of_the_wrong_shape():
    y = minigrad.ones(2, 3, requires_grad=True) * 2
    with pytest.raises(ShapeError) as info:
        y.backward(minigrad.ones(3, 2))
    message = str(info.value)
    assert "(3, 2)" in message and "(2, 3)" in message


def test_backward_on_a_tensor_that_does_not_require_grad():
    with pytest.raises(AutogradError, match="grad"):
        minigrad.ones(1).sum().backward()


def test_numpy_of_a_tensor_that_requires_grad_says_detach():
    with pytest.raises(AutogradError, match="detach"):
        minigrad.ones(2, requires_grad=True).numpy()


def test_in_place_on_a_leaf_that_requires_grad():
    x = minigrad.ones(2, requires_grad=True)
    with pytest.raises(AutogradError, match="no_grad"):
        x.mul_(2)


def test_custom_function_returning_too_few_gradients():
    class Bad(minigrad.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            return a * b

        @staticmethod
        def backward(ctx, g):
            return g

    a, b = minigrad.ones(2, requires_grad=True), minigrad.ones(2, requires_grad=True)
    with pytest.raises(AutogradError, match="Bad"):
        Bad.apply(a, b).sum().backward()


def test_custom_function_returning_a_gradient_of_the_wrong_shape():
    class Bad(minigrad.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return minigrad.ones(5)

    with pytest.raises(ShapeError, match="Bad"):
        Bad.apply(minigrad.ones(2, 3, requires_grad=True)).sum().backward()


# -- devices ---------------------------------------------------------------------------------------
def test_unknown_device():
    with pytest.raises(DeviceError, match="tpu"):
        minigrad.zeros(2, device="tpu")


def _has_cuda() -> bool:
    try:
        minigrad.device("cuda")
    except DeviceError:
        return False
    return True


@pytest.mark.skipif(not _has_cuda(), reason="mixing devices needs a CUDA GPU (cupy)")
def test_mixing_devices_names_both():
    a, b = minigrad.ones(2, device="cpu"), minigrad.ones(2, device="cuda")
    with pytest.raises(DeviceError, match="cpu.*cuda"):
        a + b
