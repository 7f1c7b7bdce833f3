"""What the ported programs import in place of ``torchvision``: ``transforms`` is minigrad's, and
``datasets.MNIST`` reads the MNIST test-set files shipped under /work/shared/data/mnist (the only
split there), giving the first ``TRAIN`` images as the "training" set and the next ``TEST`` as the
test set, so that a test runs the program unchanged on a few hundred images."""

from pathlib import Path

from minigrad.data import MNIST as _MNIST, Subset
from minigrad.data import transforms  # noqa: F401

ROOT = Path("/work/shared/data/mnist")
TRAIN, TEST = 160, 64


class datasets:  # noqa: N801  (a stand-in for the module torchvision.datasets)
    @staticmethod
    def MNIST(root, train=True, download=False, transform=None):  # noqa: N802
        full = _MNIST(ROOT, train=False, transform=transform, download=download)
        return Subset(full, range(TRAIN) if train else range(TRAIN, TRAIN + TEST))
