"""``minigrad.utils.data``: ``minigrad.data`` under PyTorch's name ``torch.utils.data``, plus the
``DistributedSampler`` that torch keeps here (minigrad's lives in ``minigrad.distributed``).

Chapter 01 builds the data package as ``minigrad.data``; this module only re-exports it, so
``from minigrad.utils.data import DataLoader`` and ``minigrad.data.DataLoader`` are one class.
"""

from minigrad.data import *  # noqa: F401,F403
from minigrad.data import __all__ as _data_all
from minigrad.distributed.sampler import DistributedSampler  # noqa: F401

__all__ = [*_data_all, "DistributedSampler"]
