"""ONNX export: a traced inference graph written out as a portable ONNX model (chapter 01, output).

ONNX describes a model as a graph of standard ops plus its weights (initializers), so a model
trained here runs in onnxruntime, TensorRT or a browser. ``export_onnx`` traces a Module in eval
mode under ``no_grad`` (or takes a graph already traced), freezes the parameters and folds what
depends on them alone (``fold_constants(freeze=True)``: BatchNorm's scale and shift become two
arrays), then walks the graph in topological order and emits every op as its class declares (``onnx``: the
ONNX op type, or a small emitter beside forward that calls the ``_Builder`` below). The ``onnx``
package is an optional extra, imported only when exporting.
"""

from __future__ import annotations

import importlib.metadata
import os
from itertools import chain
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from minigrad import backend
from minigrad.autograd import grad_mode
from minigrad.errors import DTypeError, ShapeError
from minigrad.graph.ir import Graph, Node
from minigrad.graph.passes.constant_folding import fold_constants
from minigrad.graph.passes.rewrite import reaching
from minigrad.graph.signature import positional_names
from minigrad.graph.onnx_dynamic import difference, grown_inputs, resolve_dynamic_axes, symbolic_dims
from minigrad.graph.trace import ARRAY_ARG, TENSOR_ARG, TracedFunction, trace
from minigrad.ops import all_ops
from minigrad.protocols import ModuleLike, is_module
from minigrad._tensor import Tensor

if TYPE_CHECKING:
    import onnx

__all__ = ["OnnxExporterError", "UnsupportedOperatorError", "export_onnx"]

MIN_OPSET = 13  # Softmax over one axis and ReduceSum's axes as an input start here


class OnnxExporterError(RuntimeError):
    """A graph that cannot be exported as asked (it writes state, or its inputs do not fit)."""


class UnsupportedOperatorError(OnnxExporterError):
    """An op (or a form of one) with no ONNX translation here; the message lists the ops that have one."""


def export_onnx(graph_or_module: ModuleLike | Graph | TracedFunction | Callable, example_input: Tensor | Sequence[Tensor],
                path: str | os.PathLike, *, opset: int = 17, input_names: Sequence[str] | None = None,
                output_names: Sequence[str] | None = None,
                dynamic_axes: Mapping[str, Mapping[int, str] | Sequence[int]] | None = None) -> onnx.ModelProto:
    """Write ``graph_or_module`` as an ONNX model to ``path`` and return it.

    A Module (or any function of tensors) is traced on ``example_input`` in eval mode under
    ``no_grad``; a ``Graph`` or ``TracedFunction`` is exported as it is, ``example_input`` giving
    its input shapes and dtypes. Shapes are those of the example, except the input axes named in
    ``dynamic_axes`` as ``torch.onnx.export`` takes it (``{"x": {0: "batch"}}``): the model is
    traced again with each one longer, and reshapes that follow it compute their targets at run
    time (``minigrad.graph.onnx_dynamic``). Parameters and constants become initializers.
    A forward that reads a value computed from its input out as Python data (``.item()``,
    ``.numpy()``, ``.tolist()``) is refused with an ``OnnxExporterError`` naming the call: the
    graph would hold the example's values as a constant (PyTorch's tracer only warns).
    """
    onnx = _import_onnx()
    if not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        raise ValueError(f"export_onnx: opset must be between {MIN_OPSET} and {onnx.defs.onnx_opset_version()} "
                         f"(the newest this onnx knows), got {opset}")
    if not (isinstance(example_input, (Tensor, list, tuple))):
        raise TypeError(f"export_onnx: example_input must be a Tensor or a tuple of Tensors, the input(s) to trace "
                        f"the model on, got {type(example_input).__name__}")
    inputs = (example_input,) if isinstance(example_input, Tensor) else tuple(example_input)
    graph, named, default_names, title = _prepare(graph_or_module, inputs)
    in_names = _names(input_names, default_names, "input_names", len(graph.placeholders))
    n_out = len(graph.outputs)
    out_names = _names(output_names, ["output"] if n_out == 1 else [f"output{i}" for i in range(n_out)],
                       "output_names", n_out)
    if set(in_names) & set(out_names):
        raise ValueError(f"export_onnx: an input and an output cannot share a name, got {in_names} and {out_names}")
    axes, out_axes, sources, grown = [{} for _ in inputs], {}, {}, {}
    if dynamic_axes:
        if isinstance(graph_or_module, (Graph, TracedFunction)):
            raise OnnxExporterError("export_onnx: dynamic_axes needs the Module or function, to trace it again "
                                    "with the dynamic axes grown; a traced graph has its shapes fixed")
        axes, out_axes = resolve_dynamic_axes(dynamic_axes, in_names, out_names, inputs)
        sources = {s: (in_names[i], a) for i, named_axes in enumerate(axes) for a, s in named_axes.items()}
        grown = {s: _prepare(graph_or_module, grown_inputs(inputs, axes, s))[:2] for s in sources}
    order = graph.topological_order()
    sizes = {s: inputs[in_names.index(name)].shape[a] for s, (name, a) in sources.items()}
    dims = symbolic_dims(order, {s: g.topological_order() for s, (g, _) in grown.items()}, sizes)
    b = _build(onnx, opset, graph, named, in_names, out_names, dict(zip(order, dims)), sources)
    for s, (g, g_named) in grown.items():  # the same file from a trace with s grown, or s cannot be dynamic
        other = _build(onnx, opset, g, g_named, in_names, out_names, dict(zip(g.topological_order(), dims)), sources)
        why = difference(b.graph(title, [], []), other.graph(title, [], []))
        if why is not None:
            raise UnsupportedOperatorError(f"export_onnx: {s} cannot be dynamic: {why} (its size was baked in when "
                                           "the model was traced); build it from the input with ops instead")
    in_info = [_value_info(onnx, p, name, axes[i]) for i, (p, name) in enumerate(zip(graph.placeholders, in_names))]
    out_info = []
    for node, name in zip(graph.outputs, out_names):
        symbols = {a: s for a, (s, k, c) in dims[order.index(node)].items() if (k, c) == (1, 0)}
        for a, s in out_axes.get(name, {}).items():
            if symbols.get(a % max(len(node.shape), 1)) != s:
                raise OnnxExporterError(f"export_onnx: dynamic_axes asks for axis {a} of output {name!r} to be {s!r}, "
                                        f"but in the trace it is not {s} (output shape {node.shape})")
        out_info.append(_value_info(onnx, node, name, symbols))
    model = onnx.helper.make_model(b.graph(title, in_info, out_info), producer_name="minigrad",
                                   opset_imports=[onnx.helper.make_opsetid("", opset)], producer_version=_version())
    model.ir_version = onnx.helper.find_min_ir_version_for(model.opset_import)  # older runtimes load it too
    onnx.checker.check_model(model, full_check=True)  # full_check also infers and checks every shape
    onnx.save_model(model, os.fspath(path))
    return model


def _prepare(obj: Any, inputs: tuple) -> tuple[Graph, dict, list[str], str]:
    """The inference graph to export with its constants folded, names for its weights (by node
    name), default input names and a title."""
    graph, weight_names, default_names, title = _graph_of(obj, inputs)
    for node in graph.nodes:
        if node.op in ("copy_", "set_grad", "grad"):
            raise OnnxExporterError(f"export_onnx: exports inference graphs, but {node.name} ({node.op}) reads or "
                                    "writes state (a training step, or BatchNorm in training mode); trace the model "
                                    "in eval mode under no_grad")
    if not graph.outputs:
        raise OnnxExporterError("export_onnx: the graph returns no tensors, so there is nothing to export")
    named = {n.name: weight_names[_array_id(n)] for n in graph.nodes if _array_id(n) in weight_names}
    return fold_constants(graph, freeze=True), named, default_names, title


def _build(onnx: Any, opset: int, graph: Graph, named: dict, in_names: list[str], out_names: list[str],
           dims: dict, sources: dict) -> _Builder:
    """Emit every live node of ``graph`` (dead nodes are not emitted) in topological order."""
    b = _Builder(onnx, opset, reaching(graph.outputs), set(in_names) | set(out_names), dims, sources)
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
    return b


def _value_info(onnx: Any, node: Node, name: str, symbols: dict[int, str]) -> Any:
    shape = [symbols.get(a, d) for a, d in enumerate(node.shape)]
    return onnx.helper.make_tensor_value_info(name, _onnx_dtype(onnx, node.dtype), shape)


# -- from what was given to a graph ---------------------------------------------------------------
def _import_onnx() -> Any:
    try:
        import onnx
    except ImportError as e:
        raise ImportError("export_onnx needs the onnx package: pip install 'minigrad[onnx]'") from e
    return onnx


def _version() -> str:
    """minigrad's version, from the installed package's metadata (the package itself sits above graph)."""
    try:
        return importlib.metadata.version("minigrad")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that pip never installed
        return "unknown"


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
    a_module = is_module(obj)
    was_training = a_module and obj.training
    if was_training:
        obj.eval()
    try:
        with grad_mode.no_grad():
            traced = trace(obj, *inputs)
    finally:
        if was_training:
            obj.train()
    for how, node in traced.values_read:
        if any(n.op == "placeholder" for n in reaching([node])):  # a parameter is a constant of the export
            raise OnnxExporterError(f"export_onnx: forward calls {how} on {node.name} ({node.op}), a value computed from "
                                    "the input; the exported graph would hold the example input's values as a "
                                    "constant. Compute with tensor ops instead")
    graph = traced.graph
    weights = chain(obj.named_parameters(), obj.named_buffers()) if a_module else ()
    names = {id(t.array): name for name, t in weights}
    fn = obj.forward if a_module else obj
    title = type(obj).__name__ if a_module else getattr(obj, "__name__", "fn")
    return graph, names, list(positional_names(fn, len(inputs), 0, "input")), title


def _check_inputs(graph: Graph, inputs: tuple) -> None:
    holders = graph.placeholders
    if len(inputs) != len(holders):
        raise TypeError(f"export_onnx: the graph has {len(holders)} input(s), got {len(inputs)} example input(s)")
    for i, (x, p) in enumerate(zip(inputs, holders)):
        if not isinstance(x, Tensor):
            raise TypeError(f"export_onnx: example input {i} must be a Tensor, got {type(x).__name__}")
        if tuple(x.shape) != p.shape:
            raise ShapeError(f"export_onnx: graph input {p.name} was traced with shape {tuple(p.shape)}, "
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
        return id(node.meta["target"].array)
    return id(node.attrs["value"]) if node.op == "constant" else None


def _onnx_dtype(onnx: Any, dtype: Any) -> int:
    return onnx.helper.np_dtype_to_tensor_dtype(backend.numpy.dtype(dtype))


# -- building the ONNX graph ----------------------------------------------------------------------
class _Builder:
    """The ONNX nodes and initializers made so far, and the ONNX value that holds each graph node."""

    def __init__(self, onnx: Any, opset: int, live: set[Node], reserved: set[str], dims: dict, sources: dict) -> None:
        self.onnx, self.opset, self.live = onnx, opset, live
        self.dims = dims  # node -> {axis: (symbol, k, c)} for the dims that follow a dynamic input axis
        self.sources = sources  # symbol -> (input name, axis) it is read from at run time
        self._sizes: dict[str, str] = {}
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

    def shape(self, node: Node, infer: bool = False) -> str:
        """``node``'s shape as an int64 tensor, for Reshape's and Expand's targets: constants, but
        a dim that follows a dynamic axis is ``-1`` (``infer``: Reshape works out one such dim) or
        read at run time, ``k * Gather(Shape(input), axis) + c``, and the parts joined by Concat."""
        dims = self.dims.get(node, {})
        if not dims:
            return self.ints(node.shape)
        if infer and len(dims) == 1:
            return self.ints([-1 if a in dims else d for a, d in enumerate(node.shape)])
        parts = [self._runtime_dim(*dims[a]) if a in dims else self.ints([d]) for a, d in enumerate(node.shape)]
        return self.add("Concat", parts, axis=0)

    def _runtime_dim(self, symbol: str, k: int, c: int) -> str:
        if symbol not in self._sizes:
            name, axis = self.sources[symbol]
            self._sizes[symbol] = self.add("Gather", [self.add("Shape", [name]), self.ints([axis])])
        size = self._sizes[symbol]
        size = size if k == 1 else self.add("Mul", [size, self.ints([k])])
        return size if c == 0 else self.add("Add", [size, self.ints([c])])

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

    def compare(self, op_type: str, x: Any, y: Any, negate: bool = False) -> str:
        """A comparison of ``x`` and ``y`` in their common dtype (``Not`` of it when ``negate``)."""
        dtype = backend.numpy.result_type(*[self.dtypes[v] for v in (x, y) if isinstance(v, str)])
        out = self.add(op_type, [self.operand(x, dtype), self.operand(y, dtype)])
        return self.add("Not", [out]) if negate else out

    def window(self, g: Any, dilation: bool = True) -> dict:
        """ONNX window attributes from a conv/pool ``Geometry``; pads are all begins, then all ends."""
        (kh, kw), (sh, sw), (pt, pb, pl, pr), (dh, dw) = g
        attrs = {"kernel_shape": [kh, kw], "strides": [sh, sw], "pads": [pt, pl, pb, pr]}
        return {**attrs, "dilations": [dh, dw]} if dilation else attrs

    def onnx_dtype(self, dtype: Any) -> int:
        return _onnx_dtype(self.onnx, dtype)

    def unsupported(self, message: str) -> UnsupportedOperatorError:
        """The error an emitter raises for a form of its op that ONNX cannot express."""
        return UnsupportedOperatorError(f"export_onnx: {message}")

    def graph(self, title: str, inputs: list, outputs: list) -> Any:
        return self.onnx.helper.make_graph(self.nodes, title, inputs, outputs, self.initializers)

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


# -- emitting a node: what its op class declares (``onnx``: an ONNX op type, or an emitter) --------
def _emit(b: _Builder, node: Node) -> Any:
    op = node.op
    if op in ("constant", "parameter"):
        return b.initializer(node.attrs["value"] if op == "constant" else node.meta["target"].array)
    if op == "getitem":
        value = b.values[node.inputs[0]][node.attrs["index"]]
        if value is None:
            raise UnsupportedOperatorError(f"export_onnx: output {node.attrs['index']} of {node.inputs[0].op} "
                                           f"({node.inputs[0].name}) has no ONNX equivalent")
        return value
    emit = getattr(node.fn, "onnx", None)
    if emit is None:
        supported = sorted(op.__name__ for op in all_ops() if op.onnx is not None)
        why = getattr(node.fn, "onnx_refused", None) or "no emitter written yet"
        raise UnsupportedOperatorError(f"export_onnx: op {op} ({node.name}) has no ONNX translation ({why}); "
                                       f"supported ops: {', '.join(supported)}")
    values = iter([b.values[i] for i in node.inputs])
    args = [next(values) if k in (TENSOR_ARG, ARRAY_ARG) else node.attrs[k] for k in node.meta["args"]]
    if isinstance(emit, str):  # the ONNX op of that name computes it from the same operands
        return b.add(emit, [b.operand(x, node.dtype) for x in args])
    return emit(b, node, *args, **{k: node.attrs[k] for k in node.meta["kwargs"]})
