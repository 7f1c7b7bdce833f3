"""minigrad: a compact, readable deep-learning framework (autograd, nn, optim, data, and more).

The public API mirrors PyTorch's names: ``minigrad.tensor`` (a function; the class is
``minigrad.Tensor``, defined in ``minigrad._tensor``), ``minigrad.randn``, ``Tensor.backward``,
``minigrad.no_grad``. Chapter 01 of the course starts here.
"""

from minigrad.backend import (
    Device, bfloat16, bool_, float16, float32, float64, get_default_device, get_default_dtype, int8, int16, int32,
    int64, manual_seed, set_default_device, set_default_dtype, uint8,
)
from minigrad.backend import device  # noqa: F401  (a function: minigrad.device("cuda"))
from minigrad._tensor import Tensor
from minigrad import ops as _ops  # noqa: F401  (binds the operators on Tensor)
from minigrad.autograd import enable_grad, grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from minigrad.creation import (
    BoolTensor, ByteTensor, CharTensor, DoubleTensor, FloatTensor, HalfTensor, IntTensor, LongTensor, ShortTensor,
    arange, empty, empty_like, eye, from_numpy, full, full_like, linspace, ones, ones_like, rand, rand_like,
    randint, randn, randn_like, randperm, tensor, zeros, zeros_like,
)
from minigrad.backend import Generator
from minigrad.tensor_types import Size

from minigrad.ops import (  # the torch.* functions; each is also a Tensor method where torch has one
    abs, add, all, allclose, amax, amin, argmax, argmin, bmm, broadcast_to, cat, chunk, clamp, clip, cos, cumsum, div,
    dot, einsum, equal, erf, exp, flatten, flip, gather, index_select, any, log, log_softmax, logsumexp, matmul,
    masked_fill, max, maximum, mean, min, minimum, mm, mul, multinomial, narrow, neg, norm, outer, permute, pow, prod, relu,
    reshape, roll, rsqrt, sigmoid, sign, sin, softmax, split, sqrt, squeeze, stack, std, sub, sum, tanh, topk,
    transpose, tril, triu, unbind, unsqueeze, var, where,
)
from minigrad.ops.compare import (  # noqa: E402  (torch.le(a, b) and friends, as functions)
    eq, ge, gt, le, logical_and, logical_not, logical_or, lt, ne,
)
from minigrad.ops.layout import (  # noqa: E402  (storage and memory formats, chapter 01 lesson 05)
    as_strided, channels_last, contiguous_format, preserve_format,
)
from minigrad.serialization import load, save
from minigrad.ops import sparse  # noqa: E402  (minigrad.sparse.mm; COO tensors, chapter 01 lesson 06)
from minigrad.ops.sparse import sparse_coo_tensor  # noqa: E402
from minigrad import autograd, data, nn, optim  # noqa: E402,F401  (minigrad.nn.Linear after `import minigrad`)
from minigrad import func  # noqa: E402,F401  (minigrad.func.grad, .vmap, .jacrev: the torch.func transforms)
from minigrad.func import vmap  # noqa: E402  (torch.vmap)
from minigrad.backend import cuda  # noqa: E402,F401  (minigrad.cuda.is_available(); cupy is imported only on use)
from minigrad import memory  # noqa: E402,F401  (minigrad.memory.checkpoint, .track)
from minigrad.memory.stats import empty_cache, memory_stats, memory_summary  # noqa: E402  (cpu or cuda)
from minigrad import amp  # noqa: E402,F401  (minigrad.amp.GradScaler("cuda", ...), as torch.amp)
from minigrad.amp import autocast, GradScaler  # noqa: E402
from minigrad.compat import accelerator, backends, utils  # noqa: E402,F401  (torch's names: torch.utils.data...)
from minigrad import profiler  # noqa: E402,F401  (minigrad.profiler.profile())
from minigrad import distributed  # noqa: E402,F401  (MPI is imported only by init_process_group)
from minigrad.graph.compile import compile  # noqa: E402  (minigrad.compile, chapter 03)
from minigrad.compat.unsupported import module_getattr as _module_getattr  # noqa: E402
from minigrad.compat import torch_paths as _torch_paths  # noqa: E402

_torch_paths.install()  # every public torch module path imports (minigrad.utils.data.dataloader...)

half, float, double, long, int, bool = float16, float32, float64, int64, int32, bool_  # torch's aliases

__version__ = "0.1.0"


__getattr__ = _module_getattr(__name__)  # a PyTorch feature minigrad does not follow raises NotImplementedError
