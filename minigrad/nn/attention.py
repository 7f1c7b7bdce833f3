"""``MultiheadAttention`` and ``TransformerEncoderLayer``: attention as a few matrix products.

Each query position asks every key position how relevant it is (a dot product, scaled by
1/sqrt(head_dim)), turns those scores into weights with a softmax, and takes the weighted mean of
the values: ``softmax(Q K^T / sqrt(d)) V``. Several heads do this in parallel on slices of the
embedding, and a linear layer mixes their results. An encoder layer wraps attention and a
two-layer MLP in residual connections and LayerNorm. Parameter and submodule names are PyTorch's,
so a torch ``state_dict`` loads as is (chapter 02 checks this block's gradients against torch).
"""

from __future__ import annotations

from typing import Any, Callable

from minigrad import creation
from minigrad.errors import ShapeError
from minigrad.nn import functional as F
from minigrad.nn import init
from minigrad.nn.dropout import Dropout
from minigrad.nn.linear import Linear
from minigrad.nn.module import Module, Parameter
from minigrad.nn.normalization import LayerNorm
from minigrad._tensor import Tensor

__all__ = ["MultiheadAttention", "TransformerEncoderLayer"]


class MultiheadAttention(Module):
    """Attention with ``num_heads`` heads of size embed_dim / num_heads. Inputs are (L, N, E),
    or (N, L, E) with ``batch_first``, or unbatched (L, E); returns ``(output, weights)``."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True, *,
                 batch_first: bool = False, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible by num_heads "
                             f"({num_heads})")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.dropout, self.batch_first = dropout, batch_first
        self.in_proj_weight = Parameter(creation.empty(3 * embed_dim, embed_dim, device=device, dtype=dtype))
        if bias:
            self.in_proj_bias = Parameter(creation.empty(3 * embed_dim, device=device, dtype=dtype))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, device=device, dtype=dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None,
                average_attn_weights: bool = True, is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        unbatched = query.ndim == 2
        self._check(query, key, value, unbatched)
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            key_padding_mask = key_padding_mask.unsqueeze(0) if key_padding_mask is not None else None
        elif self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        (L, N, E), S, H = query.shape, key.shape[0], self.num_heads

        # project, then split the embedding into heads: (L, N, E) -> (N * H, L, head_dim)
        w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        b_q, b_k, b_v = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None,) * 3
        q, k, v = (F.linear(x, w, b).reshape(x.shape[0], N * H, self.head_dim).transpose(0, 1)
                   for x, w, b in ((query, w_q, b_q), (key, w_k, b_k), (value, w_v, b_v)))

        mask = self._merge_masks(attn_mask, key_padding_mask, L, S, N, q.dtype)
        p = self.dropout if self.training else 0.0
        # is_causal is torch's hint that attn_mask is causal; without a mask, minigrad builds it
        out, weights = F._attention(q, k, v, mask, p, is_causal and attn_mask is None, None, allowed_if_true=False)
        out = self.out_proj(out.transpose(0, 1).reshape(L, N, E))

        if need_weights:
            weights = weights.reshape(N, H, L, S)
            weights = weights.mean(1) if average_attn_weights else weights
            weights = weights.squeeze(0) if unbatched else weights
        else:
            weights = None
        if unbatched:
            return out.squeeze(1), weights
        return (out.transpose(0, 1) if self.batch_first else out), weights

    def _check(self, query: Tensor, key: Tensor, value: Tensor, unbatched: bool) -> None:
        ndim = 2 if unbatched else 3
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.ndim != ndim or t.shape[-1] != self.embed_dim:
                raise ShapeError(f"MultiheadAttention: expected {name} with {ndim} dims and last dim embed_dim="
                                 f"{self.embed_dim} (like query, shape {tuple(query.shape)}), got {tuple(t.shape)}")
        if key.shape != value.shape:
            raise ShapeError(f"MultiheadAttention: key and value must have the same shape, got "
                             f"{tuple(key.shape)} and {tuple(value.shape)}")
        batch = 0 if self.batch_first else 1
        if not unbatched and query.shape[batch] != key.shape[batch]:
            raise ShapeError(f"MultiheadAttention: query and key have different batch sizes, shapes "
                             f"{tuple(query.shape)} and {tuple(key.shape)}")

    def _merge_masks(self, attn_mask: Tensor | None, key_padding_mask: Tensor | None, L: int, S: int,
                     N: int, dtype: Any) -> Tensor | None:
        """One additive mask of shape (N * H, L, S), or broadcastable to it, from both masks."""
        mask = None
        if attn_mask is not None:
            if tuple(attn_mask.shape) not in ((L, S), (N * self.num_heads, L, S)):
                raise ShapeError(f"MultiheadAttention: attn_mask should have shape {(L, S)} or "
                                 f"{(N * self.num_heads, L, S)}, got {tuple(attn_mask.shape)}")
            mask = F._additive(attn_mask, dtype, "MultiheadAttention", "attn_mask", blocked_if_true=True)
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (N, S):
                raise ShapeError(f"MultiheadAttention: key_padding_mask should have shape {(N, S)}, "
                                 f"got {tuple(key_padding_mask.shape)}")
            pad = F._additive(key_padding_mask, dtype, "MultiheadAttention", "key_padding_mask",
                              blocked_if_true=True)
            pad = pad.reshape(N, 1, 1, S).expand(N, self.num_heads, 1, S).reshape(N * self.num_heads, 1, S)
            mask = pad if mask is None else mask + pad
        return mask


class TransformerEncoderLayer(Module):
    """Self-attention then a feed-forward MLP, each inside a residual connection with LayerNorm
    (after it by default; before it with ``norm_first``, which trains more stably when deep)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable[[Tensor], Tensor] = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout, bias, batch_first=batch_first, **kw)
        self.linear1 = Linear(d_model, dim_feedforward, bias, **kw)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias, **kw)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, bias=bias, **kw)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        if isinstance(activation, str):
            if activation not in ("relu", "gelu"):
                raise ValueError(f"TransformerEncoderLayer: activation should be 'relu' or 'gelu', got {activation!r}")
            activation = F.relu if activation == "relu" else F.gelu
        self.activation = activation

    def forward(self, src: Tensor, src_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        x = src
        if self.norm_first:
            x = x + self._attention_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._feed_forward_block(self.norm2(x))
        else:
            x = self.norm1(x + self._attention_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._feed_forward_block(x))
        return x

    def _attention_block(self, x: Tensor, mask: Tensor | None, padding_mask: Tensor | None, is_causal: bool) -> Tensor:
        x = self.self_attn(x, x, x, attn_mask=mask, key_padding_mask=padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _feed_forward_block(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))
