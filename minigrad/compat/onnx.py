"""``minigrad.onnx``: ``torch.onnx.export``'s call, answered by ``minigrad.graph.export_onnx``.

A training script ends with ``torch.onnx.export(model, dummy, "model.onnx", input_names=...,
dynamic_axes=...)``; here that call traces the model and writes the same kind of file, through
the exporter of chapter 03's deployment lesson (``minigrad/graph/onnx_export.py``). The
options that choose among torch's own exporters (``dynamo``, ``optimize``, ``report``...) have
no meaning for minigrad's one exporter and are accepted without effect; those that would change
the file in ways minigrad does not write raise NotImplementedError naming the option.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

__all__ = ["export", "is_in_onnx_export"]

# torch.onnx.export's options that select or tune torch's exporters, or only log: no effect here
_WITHOUT_EFFECT = {"verbose", "dynamo", "external_data", "report", "optimize", "verify", "profile",
                   "dump_exported_program", "artifacts_dir", "training", "operator_export_type",
                   "do_constant_folding", "custom_opsets", "export_modules_as_functions", "autograd_inlining",
                   "custom_translation_table"}
# options minigrad does not write, with the value that asks for nothing unusual
_DEFAULTS = {"kwargs": None, "export_params": True, "keep_initializers_as_inputs": False, "dynamic_shapes": None}


def export(model: Any, args: Any = (), f: str | os.PathLike | None = None, *,
           input_names: Sequence[str] | None = None, output_names: Sequence[str] | None = None,
           opset_version: int | None = None,
           dynamic_axes: Mapping[str, Mapping[int, str] | Sequence[int]] | None = None,
           **options: Any) -> Any:
    """Trace ``model`` (a Module or a function of tensors) on ``args`` (a tensor or a tuple of
    them) and write it as ONNX to ``f``; returns the ``onnx.ModelProto`` (torch returns an
    ``ONNXProgram``, or None from its older exporter). ``opset_version`` defaults to 17."""
    from minigrad.graph.onnx_export import export_onnx

    for name, value in options.items():
        if name in _DEFAULTS:
            if value != _DEFAULTS[name]:
                raise NotImplementedError(f"minigrad.onnx.export: {name}={value!r} is not supported; minigrad "
                                          f"writes the model with {name}={_DEFAULTS[name]!r}")
        elif name not in _WITHOUT_EFFECT:
            raise TypeError(f"export() got an unexpected keyword argument {name!r}")
    if f is None:
        raise ValueError("minigrad.onnx.export: f (the path to write) is required")
    example = args if not isinstance(args, tuple) else (args[0] if len(args) == 1 else list(args))
    return export_onnx(model, example, f, opset=17 if opset_version is None else opset_version,
                       input_names=input_names, output_names=output_names, dynamic_axes=dynamic_axes)


def is_in_onnx_export() -> bool:
    """False: minigrad traces models for export without running them in a special mode."""
    return False
