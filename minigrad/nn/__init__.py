"""``minigrad.nn``: modules, layers, losses, initialisation and ``functional``, with torch.nn's names.

A model is a tree of ``Module``s holding ``Parameter``s (``module.py``); layers are small Modules
whose ``forward`` calls ``functional``; ``init`` sets weights as PyTorch does. Chapter 02 builds
a training loop from these pieces.
"""

# -- core: Module, Parameter, containers -------------------------------------------------------
from minigrad.nn.module import Module, Parameter  # noqa: F401
from minigrad.nn.containers import ModuleDict, ModuleList, Sequential  # noqa: F401

# -- layers, losses, functional, init, utils (nn core) ---------------------------------------------
from minigrad.nn import functional, init, utils  # noqa: F401
from minigrad.nn.activation import (  # noqa: F401
    GELU, Hardswish, LeakyReLU, LogSoftmax, ReLU, SiLU, Sigmoid, Softmax, Tanh,
)
from minigrad.nn.dropout import Dropout, Dropout1d, Dropout2d, Dropout3d  # noqa: F401
from minigrad.nn.linear import Embedding, Flatten, Identity, Linear  # noqa: F401
from minigrad.nn.loss import (  # noqa: F401
    BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, HuberLoss, L1Loss, MSELoss, NLLLoss, SmoothL1Loss,
)
from minigrad.nn.normalization import BatchNorm1d, BatchNorm2d, LayerNorm  # noqa: F401

# -- convolution, pooling, recurrent and attention layers ------------------------------------------
from minigrad.nn.attention import MultiheadAttention, TransformerEncoderLayer  # noqa: F401
from minigrad.nn.conv import (  # noqa: F401
    AdaptiveAvgPool2d, AvgPool2d, Conv2d, ConvTranspose1d, ConvTranspose2d, MaxPool2d,
)
from minigrad.nn.rnn import LSTM, LSTMCell  # noqa: F401
from minigrad.nn.recurrent import GRU, GRUCell, RNN, RNNCell  # noqa: F401  (one-state recurrences)
from minigrad.nn.transformer import (  # noqa: F401
    Transformer, TransformerDecoder, TransformerDecoderLayer, TransformerEncoder,
)
from minigrad.compat.unsupported import module_getattr as _module_getattr


__getattr__ = _module_getattr(__name__)  # a PyTorch feature minigrad does not follow raises NotImplementedError
