"""CUDA kernels for fused groups: one ``cupy.ElementwiseKernel`` (or ``ReductionKernel``) per group (chapter 03).

On a GPU each eager op is a kernel launch that reads its inputs from device memory and writes its
result back. A fused group becomes one launch in which every thread carries its element through
the whole chain in registers: ``float v3 = x0 * x0; ... y = v9 * v12;``. A group that ends in a
sum, mean, max or min becomes a ``ReductionKernel`` whose ``map_expr`` is the chain, written as a
``__device__`` function in the kernel's preamble; other reductions, and the matmul or conv of an
epilogue, run their own op first or last with the chain's kernel beside them. This module only
writes the CUDA source: cupy is imported when a kernel first runs, and compiles it then (NVRTC).
"""

from __future__ import annotations

from typing import Any

from minigrad.backend import cpu, selected
from minigrad.graph.codegen.program import Dialect, Program, expression, program
from minigrad.graph.codegen.numpy_blocks import NodeForward
from minigrad.graph.ir import Graph, GraphError, Node, op_kind

__all__ = ["CudaKernel", "generate", "supports"]

_C_TYPES = {"bool": "bool", "int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
            "uint8": "unsigned char", "float16": "float16", "float32": "float", "float64": "double"}

# An op's C expression is its class's ``cuda`` declaration: a format string of its arguments {0},
# {1}, ... (in forward's order) and {T}, the C type the op computes in (``program.expression``), so that
# constants stay in that precision ((float)0.5, not a double); or a function of (args, T, out_type).
# A branch of ``?:`` that computes a new value is cast back to {T}: cupy's float16 converts to and
# from float implicitly, which would make ``c ? half : float`` ambiguous. A reduction declares its
# ReductionKernel pieces in ``cuda_reduce``: (reduce_expr, identity, post_map_expr).
_INFINITY = {"float": "__int_as_float(0x7f800000)", "double": "__longlong_as_double(0x7ff0000000000000LL)"}


def supports(node: Node) -> bool:
    """Whether a GPU group can evaluate this elementwise op inside its kernel: its class declares
    a ``cuda`` expression for the dtype kinds at hand (``cuda_kinds``)."""
    kinds = getattr(node.fn, "cuda_kinds", None)
    if getattr(node.fn, "cuda", None) is None or (kinds is not None and node.dtype.kind not in kinds):
        return False
    return not node.meta.get("kwargs") and all(str(n.dtype) in _C_TYPES for n in (node, *node.inputs))


class CudaKernel:
    """A fused group as CUDA source for cupy: ``kernel(*arrays) -> array``. ``source`` shows the
    kernel (built on the first call, when cupy is imported); ``params`` holds its pieces."""

    def __init__(self, prog: Program, kind: str, params: dict[str, str], leaves: list[int]) -> None:
        self.name, self.kind, self.params, self._prog, self._leaves = prog.name, kind, params, prog, leaves
        self._anchor = NodeForward(prog.anchor) if prog.anchor is not None else None
        self._reduce = NodeForward(prog.reduction) if prog.reduction is not None else None
        self._kernel: Any = None
        self._device = prog.root.meta.get("device") or cpu  # the GPU the group's values live on
        args = ",\n".join(f"    {k}={_quote(v)}" for k, v in params.items())
        self.source = f"cupy.{kind}(\n{args},\n)\n"

    def __call__(self, *arrays: Any) -> Any:
        import cupy

        if self._kernel is None:
            self._kernel = getattr(cupy, self.kind)(**self.params)
        with selected(self._device):  # cupy allocates and launches on the current GPU: the group's
            return self._run(cupy, arrays)

    def _run(self, cupy: Any, arrays: tuple) -> Any:
        prog = self._prog
        leaves = [arrays[k] for k in self._leaves]
        if self._anchor is not None:  # the product first; the kernel is its epilogue
            leaves.append(self._anchor(*[arrays[prog.inputs.index(i)] for i in prog.anchor.inputs]))
        if self.kind == "ReductionKernel":
            red = prog.reduction
            return self._kernel(*leaves, axis=red.attrs["dims"], keepdims=red.attrs["keepdim"])
        out = cupy.empty(prog.shape, prog.ops[-1].dtype)
        self._kernel(*leaves, out)
        return self._reduce(out) if self._reduce is not None else out

    def __repr__(self) -> str:
        return f"<CudaKernel {self.name}: {self.kind}>"


def generate(group: Graph) -> CudaKernel:
    """The CUDA kernel of a fused group's sub-graph (source now, compiled by cupy on first call)."""
    prog = program(group)
    inner = [n.op for n in prog.ops if op_kind(n) == "reduction"]
    if inner:  # the fusion pass makes such groups only for the CPU (codegen.fuses_rows)
        raise GraphError(f"{prog.name}: {', '.join(inner)} inside the group needs whole rows per block, which only "
                         "CPU kernels have; on cuda a reduction ends its group")
    names = {p: f"x{k}" for k, p in enumerate(prog.inputs)}
    if prog.anchor is not None:
        names[prog.anchor] = "m"
    leaves = [p for p in prog.inputs if any(p in op.inputs for op in prog.ops)]
    params_of = leaves + ([prog.anchor] if prog.anchor is not None else [])
    in_params = ", ".join(f"{_dtype(p)} {names[p]}" for p in params_of)
    lines = []
    value = dict(names)
    # Values are named by their place in the recipe, never after the graph's nodes: cupy caches
    # compiled kernels by their source, so the same chain traced twice (another layer, another
    # step) must be the same text to be compiled once.
    for k, n in enumerate(prog.ops):
        value[n] = f"v{k}" if n is not prog.ops[-1] else "y"
        decl = "" if value[n] == "y" else _ctype(n) + " "
        lines.append(f"{decl}{value[n]} = {expression(n, value, _CUDA)};  // {n.op}")
    red = prog.reduction
    ctype = _ctype(prog.ops[-1])
    pieces = getattr(red.fn, "cuda_reduce", None) if red is not None else None
    if pieces is not None and ctype in ("float", "double") and red.dtype == prog.ops[-1].dtype:
        reduce_expr, identity, post = (s.format(T=ctype, lowest="-" + _INFINITY[ctype], highest=_INFINITY[ctype])
                                       for s in pieces)
        args = ", ".join(f"{_ctype(p)} {names[p]}" for p in params_of)
        body = "\n".join("    " + line.replace("y = ", "return ", 1) if line.startswith("y = ") else "    " + line
                         for line in lines)
        params = {"in_params": in_params, "out_params": f"{_dtype(red)} y",
                  "map_expr": f"{prog.name}_map({', '.join(names[p] for p in params_of)})",
                  "reduce_expr": reduce_expr, "post_map_expr": post, "identity": identity, "name": prog.name,
                  "preamble": f"__device__ {ctype} {prog.name}_map({args}) {{\n{body}\n}}\n"}
        return CudaKernel(prog, "ReductionKernel", params, [prog.inputs.index(p) for p in leaves])
    params = {"in_params": in_params, "out_params": f"{_dtype(prog.ops[-1])} y",
              "operation": "\n".join(lines) + "\n", "name": prog.name}
    return CudaKernel(prog, "ElementwiseKernel", params, [prog.inputs.index(p) for p in leaves])


def _spell(v: Any, ctype: str) -> str | None:
    """CUDA's own literals: a bool as true or false, NaN and the infinities built from their bits
    (NVRTC has no math.h macros)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v != v:
        return f"({ctype})(0.0 / 0.0)"
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return ("-" if v < 0 else "") + _INFINITY.get(ctype, "__int_as_float(0x7f800000)")
    return None


_CUDA = Dialect(_C_TYPES, lambda fn: fn.cuda, _spell)


def _ctype(node: Node) -> str:
    return _C_TYPES[str(node.dtype)]


def _dtype(node: Node) -> str:
    return str(node.dtype)


def _quote(text: str) -> str:
    return f"'''\n{text}'''" if "\n" in text else repr(text)
