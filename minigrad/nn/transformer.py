"""``Transformer``: an encoder stack and a decoder stack of attention blocks (Vaswani et al., 2017).

The encoder (``TransformerEncoder``: copies of ``TransformerEncoderLayer``, from ``attention.py``)
turns the source sequence into a *memory*. Each decoder layer (``TransformerDecoderLayer``) attends
to the target so far (self-attention, causally masked when generating), then to the memory
(cross-attention: queries from the target, keys and values from the source), then applies an MLP,
each step inside a residual connection with LayerNorm. Submodule and parameter names are torch's,
so a torch ``state_dict`` loads as is, and ``tests/test_transformer.py`` checks outputs and
gradients against torch on the same weights.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

from minigrad import creation
from minigrad.errors import ShapeError
from minigrad.nn import functional as F
from minigrad.nn import init
from minigrad.nn.attention import MultiheadAttention, TransformerEncoderLayer
from minigrad.nn.containers import ModuleList
from minigrad.nn.dropout import Dropout
from minigrad.nn.linear import Linear
from minigrad.nn.module import Module
from minigrad.nn.normalization import LayerNorm
from minigrad._tensor import Tensor

__all__ = ["Transformer", "TransformerDecoder", "TransformerDecoderLayer", "TransformerEncoder"]

Activation = str | Callable[[Tensor], Tensor]


def _activation(activation: Activation, layer: str) -> Callable[[Tensor], Tensor]:
    if not isinstance(activation, str):
        return activation
    if activation not in ("relu", "gelu"):
        raise ValueError(f"{layer}: activation should be 'relu' or 'gelu', got {activation!r}")
    return F.relu if activation == "relu" else F.gelu


def _clones(layer: Module, n: int) -> ModuleList:
    # independent copies: each layer of the stack trains its own weights, all starting equal
    return ModuleList([copy.deepcopy(layer) for _ in range(n)])


class TransformerDecoderLayer(Module):
    """Masked self-attention, cross-attention to the encoder's memory, then a feed-forward MLP,
    each in a residual connection with LayerNorm (after it by default, before it with ``norm_first``)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: Activation = "relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout, bias, batch_first=batch_first, **kw)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout, bias, batch_first=batch_first, **kw)
        self.linear1 = Linear(d_model, dim_feedforward, bias, **kw)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias, **kw)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, bias=bias, **kw)
        self.norm3 = LayerNorm(d_model, layer_norm_eps, bias=bias, **kw)
        self.dropout1, self.dropout2, self.dropout3 = Dropout(dropout), Dropout(dropout), Dropout(dropout)
        self.activation = _activation(activation, "TransformerDecoderLayer")

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                tgt_is_causal: bool = False, memory_is_causal: bool = False) -> Tensor:
        x = tgt
        if self.norm_first:
            x = x + self._self_attention(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._cross_attention(self.norm2(x), memory, memory_mask, memory_key_padding_mask,
                                          memory_is_causal)
            return x + self._feed_forward(self.norm3(x))
        x = self.norm1(x + self._self_attention(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._cross_attention(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
        return self.norm3(x + self._feed_forward(x))

    def _self_attention(self, x: Tensor, mask: Tensor | None, padding: Tensor | None, is_causal: bool) -> Tensor:
        out = self.self_attn(x, x, x, attn_mask=mask, key_padding_mask=padding, is_causal=bool(is_causal),
                             need_weights=False)[0]
        return self.dropout1(out)

    def _cross_attention(self, x: Tensor, memory: Tensor, mask: Tensor | None, padding: Tensor | None,
                         is_causal: bool) -> Tensor:
        out = self.multihead_attn(x, memory, memory, attn_mask=mask, key_padding_mask=padding,
                                  is_causal=bool(is_causal), need_weights=False)[0]
        return self.dropout2(out)

    def _feed_forward(self, x: Tensor) -> Tensor:
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoder(Module):
    """``num_layers`` copies of ``encoder_layer`` applied in turn, then ``norm`` if given.
    ``enable_nested_tensor`` and ``mask_check`` are accepted for torch's signature: they choose
    torch's padded-sequence fast path, which minigrad does not have (the result is the same)."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True) -> None:
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers, self.norm = num_layers, norm

    def forward(self, src: Tensor, mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool | None = None) -> Tensor:
        out = src
        for layer in self.layers:
            out = layer(out, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        return self.norm(out) if self.norm is not None else out


class TransformerDecoder(Module):
    """``num_layers`` copies of ``decoder_layer``, each attending to the same memory, then ``norm``."""

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm: Module | None = None) -> None:
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers, self.norm = num_layers, norm

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                tgt_is_causal: bool | None = None, memory_is_causal: bool = False) -> Tensor:
        out = tgt
        for layer in self.layers:
            out = layer(out, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                        tgt_key_padding_mask=tgt_key_padding_mask, memory_key_padding_mask=memory_key_padding_mask,
                        tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
        return self.norm(out) if self.norm is not None else out


class Transformer(Module):
    """The encoder-decoder model: ``forward(src, tgt)`` encodes ``src`` into a memory and decodes
    ``tgt`` against it; shapes (S, N, E) and (T, N, E), or batch first. Weight matrices start
    Xavier-uniform, as torch's ``Transformer`` initialises them."""

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6, num_decoder_layers: int = 6,
                 dim_feedforward: int = 2048, dropout: float = 0.1, activation: Activation = "relu",
                 custom_encoder: Module | None = None, custom_decoder: Module | None = None,
                 layer_norm_eps: float = 1e-5, batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            layer = TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                                            batch_first, norm_first, bias, **kw)
            norm = LayerNorm(d_model, layer_norm_eps, bias=bias, **kw)
            self.encoder = TransformerEncoder(layer, num_encoder_layers, norm)
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            layer = TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                                            batch_first, norm_first, bias, **kw)
            norm = LayerNorm(d_model, layer_norm_eps, bias=bias, **kw)
            self.decoder = TransformerDecoder(layer, num_decoder_layers, norm)
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                src_is_causal: bool | None = None, tgt_is_causal: bool | None = None,
                memory_is_causal: bool = False) -> Tensor:
        batch = 0 if self.batch_first else 1
        if src.ndim == 3 and src.shape[batch] != tgt.shape[batch]:
            raise ShapeError(f"Transformer: the batch number of src and tgt must be equal, got shapes "
                             f"{tuple(src.shape)} and {tuple(tgt.shape)} (batch_first={self.batch_first})")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ShapeError(f"Transformer: the feature number of src and tgt must be equal to d_model="
                             f"{self.d_model}, got shapes {tuple(src.shape)} and {tuple(tgt.shape)}")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device: Any = None, dtype: Any = None) -> Tensor:
        """The causal mask for ``sz`` positions: 0 on and below the diagonal, -inf above it, so
        position i attends only to positions up to i."""
        return creation.full((sz, sz), -math.inf, dtype=dtype, device=device).triu(1)
