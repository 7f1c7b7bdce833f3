"""Utilities around training (chapter 03): ``minigrad.utils.tensorboard`` logs to TensorBoard.
Submodules are imported by name, so their optional dependencies load only when used."""
