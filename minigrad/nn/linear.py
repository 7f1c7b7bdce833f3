"""Linear layers and shape helpers: ``Linear``, ``Identity``, ``Flatten``, ``Embedding``.

``Linear`` is ``x @ W.T + b`` with W stored as (out_features, in_features), PyTorch's layout, and
initialised exactly as PyTorch does (Kaiming-uniform with ``a=sqrt(5)``, bias uniform in
``±1/sqrt(fan_in)``), so a minigrad model starts from the same distribution as its torch twin.
``Embedding`` is a lookup table: row ``i`` of the weight is the vector of token ``i`` (chapter 02).
"""

from __future__ import annotations

from typing import Any

from minigrad import creation
from minigrad.nn import functional as F
from minigrad.nn import init
from minigrad.nn.module import Module, Parameter
from minigrad._tensor import Tensor

__all__ = ["Embedding", "Flatten", "Identity", "Linear"]


class Identity(Module):
    """Returns its input; a placeholder that keeps a model's structure (e.g. a removed head)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, input: Tensor) -> Tensor:
        return input


class Linear(Module):
    """``y = x @ weight.T + bias`` over the last dim: (*, in_features) -> (*, out_features)."""

    # its forward is ops.linalg.Linear on (input, weight, bias), so checkpointing may call that op's
    # backward in its place (minigrad.protocols.is_plain_linear; a subclass does not inherit this)
    forward_is_linear_op = True

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(creation.empty(out_features, in_features, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(creation.empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # a=sqrt(5) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in)), torch's long-standing default
        init.layer_default_(self.weight, self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Flatten(Module):
    """Flatten dims ``start_dim..end_dim`` into one (by default all but the batch dim)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, input: Tensor) -> Tensor:
        return input.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Embedding(Module):
    """A table of ``num_embeddings`` vectors of size ``embedding_dim``, indexed by integer tokens.

    The weight starts N(0, 1), with the ``padding_idx`` row zero and frozen (it gets no gradient).
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, _weight: Tensor | None = None, _freeze: bool = False,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx {padding_idx} must be within num_embeddings "
                                 f"({num_embeddings})")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        if _weight is None:
            self.weight = Parameter(creation.empty(num_embeddings, embedding_dim, device=device, dtype=dtype),
                                    requires_grad=not _freeze)
            self.reset_parameters()
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError(f"Embedding: _weight has shape {tuple(_weight.shape)}, expected "
                                 f"{(num_embeddings, embedding_dim)}")
            self.weight = Parameter(_weight, requires_grad=not _freeze)

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        if self.padding_idx is not None:
            self.weight.array[self.padding_idx] = 0

    def forward(self, input: Tensor) -> Tensor:
        return F.embedding(input, self.weight, self.padding_idx, self.max_norm, self.norm_type,
                           self.scale_grad_by_freq, self.sparse)

    @classmethod
    def from_pretrained(cls, embeddings: Tensor, freeze: bool = True, padding_idx: int | None = None,
                        max_norm: float | None = None, norm_type: float = 2.0,
                        scale_grad_by_freq: bool = False, sparse: bool = False) -> Embedding:
        """An Embedding holding (a shared view of) ``embeddings``, frozen unless ``freeze=False``."""
        if embeddings.ndim != 2:
            raise ValueError(f"Embedding.from_pretrained: embeddings must be 2-D, got shape {tuple(embeddings.shape)}")
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                   _weight=embeddings, _freeze=freeze)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        return s
