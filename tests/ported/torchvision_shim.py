"""What the ported programs import in place of ``torchvision``: ``transforms`` is minigrad's, and
``datasets.MNIST`` reads the MNIST test-set files shipped in shared/data/mnist beside the repository (the only
split there), giving the first ``TRAIN`` images as the "training" set and the next ``TEST`` as the
test set, so that a test runs the program unchanged on a few hundred images. ``utils.save_image``
writes a grid of images as torchvision's does (a PNG, by PIL), and ``from torchvision_shim.utils
import save_image`` works as ``from torchvision.utils import save_image`` does (``.transforms``
likewise). ``datasets.FashionMNIST`` gives the same MNIST digits: the format is the same, and the
programs only need images of it."""

import sys
import types
from pathlib import Path

import numpy as np

from minigrad.data import MNIST as _MNIST, Subset
from minigrad.data import transforms  # noqa: F401

ROOT = Path(__file__).resolve().parents[3] / "shared" / "data" / "mnist"
TRAIN, TEST = 160, 64


LIB = "minigrad"  # harness.run sets "torch" while a program runs on PyTorch: images come as torch tensors


class _AsLibrary(Subset):
    """The shipped images, as tensors of the library the program runs on."""

    def __getitem__(self, i):
        image, label = super().__getitem__(i)
        if LIB == "torch":
            import torch

            image = torch.from_numpy(image.numpy().copy())
        return image, label


class datasets:  # noqa: N801  (a stand-in for the module torchvision.datasets)
    @staticmethod
    def MNIST(root, train=True, download=False, transform=None):  # noqa: N802
        # never downloads: the shipped files are read whatever `download` says
        full = _MNIST(ROOT, train=False, transform=transform, download=False)
        return _AsLibrary(full, range(TRAIN) if train else range(TRAIN, TRAIN + TEST))

    # FashionMNIST has MNIST's format (28x28 grey images, 10 classes): the shipped digits stand in
    FashionMNIST = MNIST


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
sys.modules[__name__ + ".transforms"] = transforms  # `from torchvision.transforms import ToTensor`
