"""What the ported programs import in place of ``torchvision``: ``transforms`` is minigrad's, and
``datasets.MNIST`` reads the MNIST test-set files shipped under /work/shared/data/mnist (the only
split there), giving the first ``TRAIN`` images as the "training" set and the next ``TEST`` as the
test set, so that a test runs the program unchanged on a few hundred images. ``utils.save_image``
writes a grid of images as torchvision's does (a PNG, by PIL), and ``from torchvision_shim.utils
import save_image`` works as ``from torchvision.utils import save_image`` does."""

import sys
import types
from pathlib import Path

import numpy as np

from minigrad.data import MNIST as _MNIST, Subset
from minigrad.data import transforms  # noqa: F401

ROOT = Path("/work/shared/data/mnist")
TRAIN, TEST = 160, 64


class datasets:  # noqa: N801  (a stand-in for the module torchvision.datasets)
    @staticmethod
    def MNIST(root, train=True, download=False, transform=None):  # noqa: N802
        full = _MNIST(ROOT, train=False, transform=transform, download=download)
        return Subset(full, range(TRAIN) if train else range(TRAIN, TRAIN + TEST))


def save_image(tensor, fp, nrow: int = 8, padding: int = 2, pad_value: float = 0.0) -> None:
    """torchvision.utils.save_image: a (B, C, H, W) batch in [0, 1] tiled nrow to a row, as a PNG."""
    from PIL import Image

    images = np.asarray(tensor.detach().cpu().numpy(), dtype=np.float32)
    if images.ndim == 3:
        images = images[None]
    b, c, h, w = images.shape
    cols, rows = min(nrow, b), -(-b // min(nrow, b))
    grid = np.full((c, rows * (h + padding) + padding, cols * (w + padding) + padding), pad_value, np.float32)
    for i, image in enumerate(images):
        y, x = padding + (i // cols) * (h + padding), padding + (i % cols) * (w + padding)
        grid[:, y:y + h, x:x + w] = image
    pixels = (np.clip(grid, 0, 1) * 255 + 0.5).astype(np.uint8)
    Image.fromarray(pixels[0] if c == 1 else pixels.transpose(1, 2, 0)).save(fp)


utils = types.ModuleType(__name__ + ".utils", "A stand-in for torchvision.utils.")
utils.save_image = save_image
sys.modules[utils.__name__] = utils
