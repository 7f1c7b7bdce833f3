"""ONNX export: a traced inference graph written out as a portable ONNX model (chapter 01, output).

ONNX describes a model as a graph of standard ops plus its weights (initializers), so a model
trained here runs in onnxruntime, TensorRT or a browser. ``export_onnx`` traces a Module in eval
mode under ``no_grad`` (or takes a graph already traced), freezes the parameters and folds what
depends on them alone (``fold_constants(freeze=True)``: BatchNorm's scale and shift become two
arrays), then walks the graph in topological order and emits every op with the small function
``EMITTERS`` lists for it. The ``onnx`` package is an optional extra, imported only when exporting.
"""

from __future__ import annotations

import math
import operator
import os
from itertools import chain
from typing import TYPE_CHECKING, Any, Callable, Sequence

from minigrad import __version__, backend
from minigrad.autograd import grad_mode
from minigrad.errors import DTypeError, ShapeError
from minigrad.graph.ir import Graph, Node
from minigrad.graph.passes.constant_folding import fold_constants
from minigrad.graph.passes.rewrite import reaching
from minigrad.graph.helpers import positional_names
from minigrad.graph.trace import ARRAY_ARG, TENSOR_ARG, TracedFunction, trace
from minigrad.nn.module import Module
from minigrad.tensor import Tensor

if TYPE_CHECKING:
    import onnx

__all__ = ["EMITTERS", "OnnxExporterError", "UnsupportedOperatorError", "export_onnx"]

MIN_OPSET = 13  # Softmax over one axis and ReduceSum's axes as an input start here


class OnnxExporterError(RuntimeError):
    """A graph that cannot be exported as asked (it writes state, or its inputs do not fit)."""


class UnsupportedOperatorError(OnnxExporterError):
    """An op (or a form of one) with no ONNX translation here; the message lists the ops that have one."""


def export_onnx(graph_or_module: Module | Graph | TracedFunction | Callable, example_input: Tensor | Sequence[Tensor],
                path: str | os.PathLike, *, opset: int = 17, input_names: Sequence[str] | None = None,
                output_names: Sequence[str] | None = None) -> onnx.ModelProto:
    """Write ``graph_or_module`` as an ONNX model to ``path`` and return it.

    A Module (or any function of tensors) is traced on ``example_input`` in eval mode under
    ``no_grad``; a ``Graph`` or ``TracedFunction`` is exported as it is, ``example_input`` giving
    its input shapes and dtypes. Shapes are those of the example: reshapes in a traced graph bake
    in the batch size. Parameters and constants become initializers.
    """
    onnx = _import_onnx()
    if not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        raise ValueError(f"export_onnx: opset must be between {MIN_OPSET} and {onnx.defs.onnx_opset_version()} "
                         f"(the newest this onnx knows), got {opset}")
    inputs = (example_input,) if isinstance(example_input, Tensor) else tuple(example_input)
    graph, weight_names, default_names, title = _graph_of(graph_or_module, inputs)
    for node in graph.nodes:
        if node.op in ("copy_", "set_grad", "grad"):
            raise OnnxExporterError(f"export_onnx: exports inference graphs, but {node.name} ({node.op}) reads or "
                                    "writes state (a training step, or BatchNorm in training mode); trace the model "
                                    "in eval mode under no_grad")
    if not graph.outputs:
        raise OnnxExporterError("export_onnx: the graph returns no tensors, so there is nothing to export")
    named = {n.name: weight_names[_array_id(n)] for n in graph.nodes if _array_id(n) in weight_names}
    graph = fold_constants(graph, freeze=True)
    in_names = _names(input_names, default_names, "input_names", len(graph.placeholders))
    n_out = len(graph.outputs)
    out_names = _names(output_names, ["output"] if n_out == 1 else [f"output{i}" for i in range(n_out)],
                       "output_names", n_out)
    if set(in_names) & set(out_names):
        raise ValueError(f"export_onnx: an input and an output cannot share a name, got {in_names} and {out_names}")
    b = _Builder(onnx, opset, reaching(graph.outputs), set(in_names) | set(out_names))  # dead nodes are not emitted
    for node, name in zip(graph.placeholders, in_names):
        b.values[node] = name
        b.dtypes[name] = node.dtype
    for node in graph.topological_order():
        if node in b.live and node.op != "placeholder":
            b.base = named.get(node.name, node.name.lstrip("%"))
            b.values[node] = _emit(b, node)
            if node.dtype is not None:
                b.dtypes[b.values[node]] = node.dtype
    for node, name in zip(graph.outputs, out_names):
        b.name_output(b.values[node], name)
    info = onnx.helper.make_tensor_value_info
    model = onnx.helper.make_model(
        onnx.helper.make_graph(
            b.nodes, title,
            [info(name, _onnx_dtype(onnx, n.dtype), list(n.shape)) for n, name in zip(graph.placeholders, in_names)],
            [info(name, _onnx_dtype(onnx, n.dtype), list(n.shape)) for n, name in zip(graph.outputs, out_names)],
            b.initializers),
        opset_imports=[onnx.helper.make_opsetid("", opset)], producer_name="minigrad", producer_version=__version__)
    model.ir_version = onnx.helper.find_min_ir_version_for(model.opset_import)  # older runtimes load it too
    onnx.checker.check_model(model, full_check=True)  # full_check also infers and checks every shape
    onnx.save_model(model, os.fspath(path))
    return model


# -- from what was given to a graph ---------------------------------------------------------------
def _import_onnx() -> Any:
    try:
        import onnx
    except ImportError as e:
        raise ImportError("export_onnx needs the onnx package: pip install 'minigrad[onnx]'") from e
    return onnx


def _graph_of(obj: Any, inputs: tuple) -> tuple[Graph, dict, list[str], str]:
    """The graph to export, names for its weights (by array id), default input names, a title."""
    if isinstance(obj, TracedFunction):
        obj = obj.graph
    if isinstance(obj, Graph):
        _check_inputs(obj, inputs)
        return obj, {}, [p.name.lstrip("%") for p in obj.placeholders], "minigrad_graph"
    if not callable(obj):
        raise TypeError(f"export_onnx: expected a Module, a Graph, a TracedFunction or a function, "
                        f"got {type(obj).__name__}")
    is_module = isinstance(obj, Module)
    was_training = is_module and obj.training
    if was_training:
        obj.eval()
    try:
        with grad_mode.no_grad():
            graph = trace(obj, *inputs).graph
    finally:
        if was_training:
            obj.train()
    weights = chain(obj.named_parameters(), obj.named_buffers()) if is_module else ()
    names = {id(t.data): name for name, t in weights}
    fn = obj.forward if is_module else obj
    title = type(obj).__name__ if is_module else getattr(obj, "__name__", "fn")
    return graph, names, list(positional_names(fn, len(inputs), 0, "input")), title


def _check_inputs(graph: Graph, inputs: tuple) -> None:
    holders = graph.placeholders
    if len(inputs) != len(holders):
        raise TypeError(f"export_onnx: the graph has {len(holders)} input(s), got {len(inputs)} example input(s)")
    for i, (x, p) in enumerate(zip(inputs, holders)):
        if not isinstance(x, Tensor):
            raise TypeError(f"export_onnx: example input {i} must be a Tensor, got {type(x).__name__}")
        if tuple(x.shape) != p.shape:
            raise ShapeError(f"export_onnx: graph input {p.name} was traced with shape {p.shape}, "
                             f"example input {i} has shape {tuple(x.shape)}")
        if x.dtype != p.dtype:
            raise DTypeError(f"export_onnx: graph input {p.name} was traced with dtype {p.dtype}, "
                             f"example input {i} has dtype {x.dtype}")


def _names(given: Sequence[str] | None, default: list[str], what: str, n: int) -> list[str]:
    names = list(default if given is None else given)
    if len(names) != n or len(set(names)) != n:
        raise ValueError(f"export_onnx: {what} must be {n} distinct names, got {names}")
    return names


def _array_id(node: Node) -> int | None:
    if node.op == "parameter":
        return id(node.meta["target"].data)
    return id(node.attrs["value"]) if node.op == "constant" else None


def _onnx_dtype(onnx: Any, dtype: Any) -> int:
    return onnx.helper.np_dtype_to_tensor_dtype(backend.numpy.dtype(dtype))


# -- building the ONNX graph ----------------------------------------------------------------------
class _Builder:
    """The ONNX nodes and initializers made so far, and the ONNX value that holds each graph node."""

    def __init__(self, onnx: Any, opset: int, live: set[Node], reserved: set[str]) -> None:
        self.onnx, self.opset, self.live = onnx, opset, live
        self.nodes: list = []
        self.initializers: list = []
        self.values: dict[Node, Any] = {}  # a name, or a list of names for an op with several outputs
        self.dtypes: dict[str, Any] = {}
        self.base = "v"  # the graph node being emitted names the values made for it
        self._taken = set(reserved)
        self._renamed: dict[str, str] = {}

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self._taken:
            name, k = f"{base}_{k}", k + 1
        self._taken.add(name)
        return name

    def add(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        out = out or self.fresh(self.base)
        name = self.fresh(f"{op_type}_{len(self.nodes)}")
        self.nodes.append(self.onnx.helper.make_node(op_type, inputs, [out], name=name, **attrs))
        return out

    def initializer(self, array: Any) -> str:
        array = backend.numpy.ascontiguousarray(backend.to_device(array, backend.cpu))
        name = self.fresh(self.base)
        self.initializers.append(self.onnx.numpy_helper.from_array(array, name))
        self.dtypes[name] = array.dtype
        return name

    def scalar(self, value: float, dtype: Any) -> str:
        return self.initializer(backend.numpy.asarray(value, dtype=dtype))

    def ints(self, values: Sequence[int]) -> str:
        return self.initializer(backend.numpy.asarray(list(values), dtype="int64"))

    def operand(self, value: Any, dtype: Any) -> str:
        """An operand of an op that computes in ``dtype``: a Python number becomes a constant,
        a value of another dtype is cast (ONNX does not promote types as numpy does)."""
        if not isinstance(value, str):
            return self.scalar(value, dtype)
        return value if self.dtypes.get(value) == dtype else self.add("Cast", [value], to=_onnx_dtype(self.onnx, dtype))

    def reduce(self, op_type: str, x: str, dims: Sequence[int] | None, keepdim: bool) -> str:
        """A reduction over ``dims`` (every axis for None); the axes became an input in opset 13
        for ReduceSum and in opset 18 for the others."""
        if dims is None:
            return self.add(op_type, [x], keepdims=int(keepdim))
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.add(op_type, [x, self.ints(dims)], keepdims=int(keepdim))
        return self.add(op_type, [x], axes=list(dims), keepdims=int(keepdim))

    def name_output(self, value: str, name: str) -> None:
        """Give a graph output its name: rename the value where an op here made it, or else (an
        input, an initializer, a value returned twice) copy it with an Identity."""
        if value in self._renamed or not any(value in p.output for p in self.nodes):
            value = self._renamed.get(value, value)
            self.add("Identity", [value], out=name)
            return
        for p in self.nodes:
            for names in (p.input, p.output):
                for i, v in enumerate(names):
                    if v == value:
                        names[i] = name
        self._renamed[value] = name


# -- one emitter per op: (builder, node, *the op's forward arguments) -> ONNX value(s) ------------
def _emit(b: _Builder, node: Node) -> Any:
    op = node.op
    if op in ("constant", "parameter"):
        return b.initializer(node.attrs["value"] if op == "constant" else node.meta["target"].data)
    if op == "getitem":
        value = b.values[node.inputs[0]][node.attrs["index"]]
        if value is None:
            raise UnsupportedOperatorError(f"export_onnx: output {node.attrs['index']} of {node.inputs[0].op} "
                                           f"({node.inputs[0].name}) has no ONNX equivalent")
        return value
    emit = EMITTERS.get(op)
    if emit is None:
        raise UnsupportedOperatorError(f"export_onnx: op {op} ({node.name}) has no ONNX translation; supported ops: "
                                       f"{', '.join(sorted(EMITTERS))}")
    values = iter([b.values[i] for i in node.inputs])
    args = [next(values) if k in (TENSOR_ARG, ARRAY_ARG) else node.attrs[k] for k in node.meta["args"]]
    return emit(b, node, *args, **{k: node.attrs[k] for k in node.meta["kwargs"]})


def _unary(op_type: str) -> Callable:
    return lambda b, node, a: b.add(op_type, [a])


def _binary(op_type: str) -> Callable:
    return lambda b, node, x, y: b.add(op_type, [b.operand(x, node.dtype), b.operand(y, node.dtype)])


def _compare(op_type: str, negate: bool = False) -> Callable:
    def emit(b: _Builder, node: Node, x: Any, y: Any) -> str:
        dtype = backend.numpy.result_type(*[b.dtypes[v] for v in (x, y) if isinstance(v, str)])
        out = b.add(op_type, [b.operand(x, dtype), b.operand(y, dtype)])
        return b.add("Not", [out]) if negate else out
    return emit


def _reduction(op_type: str) -> Callable:
    return lambda b, node, a, dims, keepdim: b.reduce(op_type, a, dims, keepdim)


def _window(g: Any, dilation: bool = True) -> dict:
    """ONNX window attributes from a conv/pool ``Geometry``; pads are all begins, then all ends."""
    (kh, kw), (sh, sw), (pt, pb, pl, pr), (dh, dw) = g
    attrs = {"kernel_shape": [kh, kw], "strides": [sh, sw], "pads": [pt, pl, pb, pr]}
    return {**attrs, "dilations": [dh, dw]} if dilation else attrs


def _linear(b: _Builder, node: Node, x: str, w: str, bias: str | None) -> str:
    if len(node.shape) == 2:  # one GEMM with the weight transposed in place and the bias added
        return b.add("Gemm", [x, w] + ([bias] if bias is not None else []), transB=1)
    y = b.add("MatMul", [x, b.add("Transpose", [w], perm=[1, 0])])
    return y if bias is None else b.add("Add", [y, bias])


def _conv(b: _Builder, node: Node, x: str, w: str, bias: str | None, g: Any, groups: int) -> str:
    return b.add("Conv", [x, w] + ([bias] if bias is not None else []), group=groups, **_window(g))


def _window_sum(b: _Builder, node: Node, x: str, g: Any, out_hw: Any) -> str:
    # the sum of a window is its mean (padding counted) times its size; avg_pool2d has no dilation
    mean = b.add("AveragePool", [x], count_include_pad=1, **_window(g, dilation=False))
    return b.add("Mul", [mean, b.scalar(g.kernel[0] * g.kernel[1], node.dtype)])


def _row_column_map(b: _Builder, node: Node, x: str, rows: str, cols: str) -> str:
    return b.add("MatMul", [b.add("MatMul", [rows, x]), b.add("Transpose", [cols], perm=[1, 0])])  # A @ x @ B.T


def _standardize(b: _Builder, node: Node, x: str, dims: tuple, eps: float) -> list:
    """LayerNormalization (its scale of ones: the graph's own Mul and Add apply the affine part)
    when it normalises the trailing dims and only the result is read; else the formula."""
    shape, dtype = node.inputs[0].shape, node.inputs[0].dtype
    used = {u.attrs["index"] for u in node.users if u in b.live}
    if b.opset >= 17 and tuple(dims) == tuple(range(len(shape) - len(dims), len(shape))) and used <= {0}:
        ones = b.initializer(backend.numpy.ones(shape[dims[0]:], dtype=dtype))
        return [b.add("LayerNormalization", [x, ones], axis=dims[0], epsilon=float(eps)), None, None]
    mean = b.reduce("ReduceMean", x, dims, True)
    d = b.add("Sub", [x, mean])
    var = b.reduce("ReduceMean", b.add("Mul", [d, d]), dims, True)
    return [b.add("Div", [d, b.add("Sqrt", [b.add("Add", [var, b.scalar(eps, dtype)])])]), mean, var]


def _gelu(b: _Builder, node: Node, a: str) -> str:
    if b.opset >= 20:
        return b.add("Gelu", [a])
    cdf = b.add("Add", [b.add("Erf", [b.add("Mul", [a, b.scalar(1 / math.sqrt(2), node.dtype)])]),
                        b.scalar(1.0, node.dtype)])
    return b.add("Mul", [b.add("Mul", [a, b.scalar(0.5, node.dtype)]), cdf])  # x * (1 + erf(x / sqrt 2)) / 2


def _softplus(b: _Builder, node: Node, a: str, beta: float, threshold: float) -> str:
    ba = b.add("Mul", [a, b.scalar(beta, node.dtype)])
    soft = b.add("Div", [b.add("Softplus", [ba]), b.scalar(beta, node.dtype)])
    return b.add("Where", [b.add("Greater", [ba, b.scalar(threshold, node.dtype)]), a, soft])


def _clamp(b: _Builder, node: Node, a: str, lo: float | None, hi: float | None) -> str:
    return b.add("Clip", [a] + ["" if v is None else b.scalar(v, node.dtype) for v in (lo, hi)])


def _getitem(b: _Builder, node: Node, a: str, index: tuple) -> str:
    """Basic indexing: one Slice for the ints and slices, then a Reshape drops the int dims and
    adds the None ones."""
    basic, advanced = index
    if advanced is not None:
        raise UnsupportedOperatorError(f"export_onnx: {node.name} (GetItem) indexes with integer or boolean "
                                       "tensors; only ints, slices, None and ... export")
    shape = node.inputs[0].shape
    items = basic if isinstance(basic, tuple) else (basic,)
    used = sum(i is not None and i is not Ellipsis for i in items)
    items = tuple(x for i in items for x in ((slice(None),) * (len(shape) - used) if i is Ellipsis else (i,)))
    starts, ends, axes, steps, axis = [], [], [], [], 0
    for item in items:
        if item is None:
            continue
        n = shape[axis]
        if isinstance(item, slice):
            start, stop, step = item.indices(n)
            if (start, stop, step) != (0, n, 1):  # a stop before 0 (a backward slice) is -n-1 in ONNX
                starts, ends, axes, steps = starts + [start], ends + [stop if stop >= 0 else -n - 1], \
                    axes + [axis], steps + [step]
        else:
            i = operator.index(item) % n
            starts, ends, axes, steps = starts + [i], ends + [i + 1], axes + [axis], steps + [1]
        axis += 1
    out = b.add("Slice", [a, b.ints(starts), b.ints(ends), b.ints(axes), b.ints(steps)]) if axes else a
    if all(isinstance(i, slice) for i in items):
        return out
    return b.add("Reshape", [out, b.ints(node.shape)])


def _pad(b: _Builder, node: Node, a: str, pairs: tuple, value: float) -> str:
    pads = [lo for lo, _ in pairs] + [hi for _, hi in pairs]
    return b.add("Pad", [a, b.ints(pads), b.scalar(value, node.dtype)], mode="constant")


def _identity(b: _Builder, node: Node, a: str, *_: Any) -> str:
    return a  # the node's value is its input's (Dropout's p is ignored)


# Op name (the Function class) -> emitter. Dropout is the identity: an exported graph is for inference.
EMITTERS: dict[str, Callable] = {
    **{op: _unary(op) for op in "Neg Exp Log Sqrt Abs Sign Sin Cos Tanh Sigmoid Relu Erf".split()},
    **{op: _binary(op) for op in "Add Sub Mul Div Pow".split()},
    "Maximum": _binary("Max"), "Minimum": _binary("Min"),
    **{op: _compare(op) for op in "Equal Less LessEqual Greater GreaterEqual".split()},
    "NotEqual": _compare("Equal", negate=True), "LogicalAnd": _binary("And"), "LogicalOr": _binary("Or"),
    "LogicalNot": _unary("Not"),
    "Rsqrt": lambda b, node, a: b.add("Reciprocal", [b.add("Sqrt", [a])]),
    "Clone": _identity, "Contiguous": _identity, "Dropout": _identity,
    "LeakyRelu": lambda b, node, a, slope: b.add("LeakyRelu", [a], alpha=float(slope)),
    "Gelu": _gelu, "Softplus": _softplus, "Clamp": _clamp,
    "Where": lambda b, node, c, x, y: b.add("Where", [c, b.operand(x, node.dtype), b.operand(y, node.dtype)]),
    "Cast": lambda b, node, a, dtype: b.add("Cast", [a], to=_onnx_dtype(b.onnx, node.dtype)),
    "Softmax": lambda b, node, a, dim: b.add("Softmax", [a], axis=dim),
    "LogSoftmax": lambda b, node, a, dim: b.add("LogSoftmax", [a], axis=dim),
    "Sum": _reduction("ReduceSum"), "Mean": _reduction("ReduceMean"), "Prod": _reduction("ReduceProd"),
    "Amax": _reduction("ReduceMax"), "Amin": _reduction("ReduceMin"), "Logsumexp": _reduction("ReduceLogSumExp"),
    "Standardize": _standardize,
    "Reshape": lambda b, node, a, shape: b.add("Reshape", [a, b.ints(node.shape)]),
    "BroadcastTo": lambda b, node, a, shape: b.add("Expand", [a, b.ints(node.shape)]),
    "Permute": lambda b, node, a, dims: b.add("Transpose", [a], perm=list(dims)),
    "Cat": lambda b, node, dim, *xs: b.add("Concat", list(xs), axis=dim),
    "Pad": _pad, "GetItem": _getitem,
    "Linear": _linear, "Matmul": lambda b, node, x, y: b.add("MatMul", [x, y]),
    "Einsum": lambda b, node, equation, *xs: b.add("Einsum", list(xs), equation=equation),
    "Conv2d": _conv, "MaxPool2d": lambda b, node, x, g, out_hw: [b.add("MaxPool", [x], **_window(g)), None],
    "WindowSum": _window_sum, "RowColumnMap": _row_column_map,
}
