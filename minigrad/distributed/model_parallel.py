"""Model (tensor) parallelism: one layer's weight split across ranks, Megatron-style (chapter 04).

``y = x W^T`` splits two ways. *Column-parallel*: rank r holds rows r of W (a block of output
features) and computes its block of y; an all-gather assembles y. *Row-parallel*: rank r holds a
block of W's columns (input features), multiplies its block of x, and an all-reduce sums the partial
products. Each communication has a mirror image in backward, so the four autograd ops
(``minigrad.distributed.parallel_ops``, re-exported here) come in pairs: copy (identity forward, all-reduce
backward) with reduce (all-reduce forward, identity backward), and gather with scatter. A
column-parallel layer followed by a row-parallel one (an MLP) needs a single all-reduce each way.
"""

from __future__ import annotations

import math
from typing import Any

from minigrad import creation
from minigrad.distributed.process_group import group
from minigrad.errors import ShapeError
from minigrad.nn import functional as F
from minigrad.nn import init
from minigrad.nn.linear import Linear
from minigrad.nn.module import Module, Parameter
from minigrad.distributed.parallel_ops import (copy_to_parallel, gather_from_parallel, reduce_from_parallel,
                                               scatter_to_parallel)
from minigrad._tensor import Tensor

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "copy_to_parallel", "gather_from_parallel",
           "reduce_from_parallel", "scatter_to_parallel"]


def _shard_size(features: int, what: str) -> int:
    n = group().size()
    if features % n:
        raise ShapeError(f"{what}: {features} features do not split evenly across {n} ranks")
    return features // n


def _init_uniform(t: Tensor, fan_in: int) -> None:
    # the full layer's scale (nn.Linear's default, U(-1/sqrt(fan_in), 1/sqrt(fan_in))), not the shard's
    bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
    init.uniform_(t, -bound, bound)


def _add_parameters(layer: Module, weight_shape: tuple, bias_size: int | None, fan_in: int) -> None:
    """A shard's weight (and bias), initialised as the full Linear's would be."""
    layer.weight = Parameter(creation.empty(*weight_shape))
    if bias_size is None:
        layer.register_parameter("bias", None)
    else:
        layer.bias = Parameter(creation.empty(bias_size))
    for t in (layer.weight, layer.bias):
        if t is not None:
            _init_uniform(t, fan_in)


class ColumnParallelLinear(Module):
    """``Linear(in_features, out_features)`` whose output features are split across ranks: this
    rank holds ``weight`` rows ``[r*k, (r+1)*k)``, ``k = out_features / N``. With
    ``gather_output`` the output is all-gathered to full width, else each rank keeps its block."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, gather_output: bool = True) -> None:
        super().__init__()
        k = _shard_size(out_features, "ColumnParallelLinear")
        self.in_features, self.out_features, self.gather_output = in_features, out_features, gather_output
        _add_parameters(self, (k, in_features), k if bias else None, in_features)

    @classmethod
    def from_linear(cls, linear: Linear, gather_output: bool = True) -> ColumnParallelLinear:
        """This rank's shard of an existing (full) ``Linear``."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, gather_output)
        r, k = group().rank(), layer.weight.shape[0]
        _copy_into(layer.weight, linear.weight.array[r * k:(r + 1) * k])
        if linear.bias is not None:
            _copy_into(layer.bias, linear.bias.array[r * k:(r + 1) * k])
        return layer

    def forward(self, input: Tensor) -> Tensor:
        y = F.linear(copy_to_parallel(input), self.weight, self.bias)
        return gather_from_parallel(y) if self.gather_output else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(this rank: {self.weight.shape[0]}), gather_output={self.gather_output}")


class RowParallelLinear(Module):
    """``Linear(in_features, out_features)`` whose input features are split across ranks: this
    rank holds ``weight`` columns ``[r*k, (r+1)*k)``, ``k = in_features / N``; the partial outputs
    are summed by an all-reduce and the bias added once. With ``input_is_parallel`` the input is
    already this rank's block (a ColumnParallelLinear's without gather_output)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, input_is_parallel: bool = False) -> None:
        super().__init__()
        k = _shard_size(in_features, "RowParallelLinear")
        self.in_features, self.out_features, self.input_is_parallel = in_features, out_features, input_is_parallel
        _add_parameters(self, (out_features, k), out_features if bias else None, in_features)

    @classmethod
    def from_linear(cls, linear: Linear, input_is_parallel: bool = False) -> RowParallelLinear:
        """This rank's shard of an existing (full) ``Linear``."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, input_is_parallel)
        r, k = group().rank(), layer.weight.shape[1]
        _copy_into(layer.weight, linear.weight.array[:, r * k:(r + 1) * k])
        if linear.bias is not None:
            _copy_into(layer.bias, linear.bias.array)
        return layer

    def forward(self, input: Tensor) -> Tensor:
        x = input if self.input_is_parallel else scatter_to_parallel(input)
        y = reduce_from_parallel(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (this rank: {self.weight.shape[1]}), "
                f"out_features={self.out_features}, input_is_parallel={self.input_is_parallel}")


def _copy_into(param: Parameter, values: Any) -> None:
    param.array[...] = values
    param._bump_version()
