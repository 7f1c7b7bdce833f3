"""Optimizers and learning-rate schedules with PyTorch's names, arguments and update rules."""

from minigrad.optim import lr_scheduler
from minigrad.optim.adadelta import Adadelta
from minigrad.optim.adam import Adam, AdamW
from minigrad.optim.lbfgs import LBFGS
from minigrad.optim.optimizer import Optimizer
from minigrad.optim.rmsprop import RMSprop
from minigrad.optim.sgd import SGD
from minigrad.optim.sparse_adam import SparseAdam

__all__ = ["Adadelta", "Adam", "AdamW", "LBFGS", "Optimizer", "RMSprop", "SGD", "SparseAdam", "lr_scheduler"]
