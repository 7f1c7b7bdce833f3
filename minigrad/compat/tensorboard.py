"""TensorBoard logging with PyTorch's ``SummaryWriter`` interface (chapter 03, debugging tools).

TensorBoard reads *event files*: a sequence of records (length, CRC, a serialized ``Event``
protobuf, CRC), each event a step's scalars, a histogram, an image or the model's graph. The
writing is done by tensorboardX, chosen over the ``tensorboard`` package by dependency weight: a
writer needs protobuf and the record format, not the server. ``tensorboard`` pulls 12 wheels
besides numpy (grpcio, tensorboard-data-server, pillow, werkzeug, markdown, absl-py...: about 27 MB
of downloads), tensorboardX 2 (protobuf, packaging: about 0.6 MB); images are PNGs encoded with
Pillow, which the course has through matplotlib. The writer here calls tensorboardX's summary
builders and its record writer directly, synchronously. ``add_graph`` writes minigrad's traced IR as a
``GraphDef``; ``read_events`` and ``scalars`` read a log back, checking every record's CRC.
"""

from __future__ import annotations

import functools
import os
import socket
import struct
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from minigrad.graph.ir import Graph
from minigrad._tensor import Tensor

__all__ = ["SummaryWriter", "read_events", "scalars"]


def _tensorboardx() -> Any:
    try:
        import tensorboardX
    except ImportError as e:
        raise ImportError("minigrad.utils.tensorboard needs tensorboardX: pip install 'minigrad[tensorboard]'") from e
    return tensorboardX


def _numpy(value: Any) -> Any:
    return value.detach().numpy() if isinstance(value, Tensor) else value


class SummaryWriter:
    """Write TensorBoard event files under ``log_dir`` (default ``runs/<date>_<host><comment>``), as
    ``torch.utils.tensorboard.SummaryWriter`` does; values may be Tensors, arrays or numbers.

    Unlike PyTorch's (and tensorboardX's own) writer, it writes synchronously, with no background
    thread: ``flush()`` has put every event on disk when it returns, so a notebook can read the
    log straight back. ``purge_step``: TensorBoard hides the events of this directory's earlier
    runs from that step on (a restart after a crash)."""

    def __init__(self, log_dir: str | os.PathLike | None = None, comment: str = "", purge_step: int | None = None,
                 filename_suffix: str = "") -> None:
        _tensorboardx()
        if log_dir is None:
            log_dir = Path("runs", datetime.now().strftime("%b%d_%H-%M-%S") + "_" + socket.gethostname() + comment)
        self.log_dir = os.fspath(log_dir)
        self._suffix, self._purge_step = filename_suffix, purge_step
        self._runs: dict[str, Any] = {}
        self._run("")

    def _run(self, name: str) -> Any:
        """The event file of the run ``name`` (a subdirectory; "" is ``log_dir`` itself)."""
        if name not in self._runs:
            from tensorboardX.event_file_writer import EventsWriter
            from tensorboardX.proto.event_pb2 import Event, SessionLog

            directory = Path(self.log_dir, name)
            directory.mkdir(parents=True, exist_ok=True)
            self._runs[name] = EventsWriter(os.fspath(directory / "events"), self._suffix)
            if self._purge_step is not None:
                self._runs[name].write_event(Event(step=self._purge_step, wall_time=time.time(),
                                                   session_log=SessionLog(status=SessionLog.START)))
        return self._runs[name]

    def _write(self, summary: Any, step: int | None, walltime: float | None, run: str = "") -> None:
        from tensorboardX.proto.event_pb2 import Event

        event = Event(summary=summary, wall_time=time.time() if walltime is None else walltime)
        if step is not None:
            event.step = int(step)
        self._run(run).write_event(event)

    def add_scalar(self, tag: str, scalar_value: Any, global_step: int | None = None,
                   walltime: float | None = None) -> None:
        """One value of the curve ``tag`` at ``global_step``."""
        from tensorboardX import summary

        self._write(summary.scalar(tag, float(_numpy(scalar_value))), global_step, walltime)

    def add_scalars(self, main_tag: str, tag_scalar_dict: dict[str, Any], global_step: int | None = None,
                    walltime: float | None = None) -> None:
        """Several curves drawn on one chart ``main_tag``, each in its own run, ``main_tag/tag``."""
        from tensorboardX import summary

        for tag, value in tag_scalar_dict.items():
            self._write(summary.scalar(main_tag, float(_numpy(value))), global_step, walltime, f"{main_tag}/{tag}")

    def add_histogram(self, tag: str, values: Any, global_step: int | None = None, bins: str | Sequence = "tensorflow",
                      walltime: float | None = None) -> None:
        """The distribution of ``values`` (weights, gradients, activations) at ``global_step``;
        ``bins``: TensorFlow's buckets (edges 1.1 times apart), or any of ``numpy.histogram``'s."""
        from tensorboardX import summary

        bins = _tensorflow_bins() if isinstance(bins, str) and bins == "tensorflow" else bins
        self._write(summary.histogram(tag, _numpy(values), bins), global_step, walltime)

    def add_image(self, tag: str, img_tensor: Any, global_step: int | None = None, walltime: float | None = None,
                  dataformats: str = "CHW") -> None:
        """An image, floats in [0, 1] or uint8, laid out as ``dataformats`` says (CHW, HWC, HW)."""
        from tensorboardX import summary

        self._write(summary.image(tag, _numpy(img_tensor), dataformats=dataformats), global_step, walltime)

    def add_graph(self, model: Callable | Graph, input_to_model: Tensor | Sequence[Tensor] | None = None,
                  verbose: bool = False) -> None:
        """The graph of ``model`` traced on ``input_to_model`` under ``no_grad`` (or a traced
        ``Graph``), for TensorBoard's Graphs tab; parameters are named after the model's
        (``body.0.weight`` is ``weight`` inside the box ``body/0``). ``verbose`` prints the graph."""
        from tensorboardX.proto.event_pb2 import Event

        graph = model if isinstance(model, Graph) else _trace(model, input_to_model)
        if verbose:
            print(graph)
        names = {}
        if hasattr(model, "named_parameters"):
            for name, p in [*model.named_parameters(), *model.named_buffers()]:
                names[id(p.array)] = name.replace(".", "/")
        self._run("").write_event(Event(graph_def=_graph_def(graph, names).SerializeToString(), wall_time=time.time()))

    def flush(self) -> None:
        """Put every event written so far on disk."""
        for run in self._runs.values():
            run.flush()

    def close(self) -> None:
        """Flush and close the event files; the writer takes no more events."""
        for run in self._runs.values():
            run.close()
        self._runs = {}

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@functools.lru_cache(maxsize=1)
def _tensorflow_bins() -> list[float]:
    """The bucket edges TensorBoard's histograms expect: +-1e-12 * 1.1**k up to 1e20, and 0."""
    edges = [1e-12]
    while edges[-1] * 1.1 < 1e20:
        edges.append(edges[-1] * 1.1)
    return [-e for e in reversed(edges)] + [0.0] + edges


def _trace(model: Callable, inputs: Tensor | Sequence[Tensor] | None) -> Graph:
    from minigrad.autograd import grad_mode
    from minigrad.graph.trace import trace

    if inputs is None:
        raise TypeError("add_graph: give input_to_model, the example inputs to trace the model on")
    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    with grad_mode.no_grad():
        return trace(model, *inputs).graph


def _graph_def(graph: Graph, names: dict[int, str]) -> Any:
    """The IR as a TensorFlow ``GraphDef``: one ``NodeDef`` per node, its output shape in
    ``_output_shapes`` (TensorBoard labels the edges with it)."""
    from tensorboardX.proto.attr_value_pb2 import AttrValue as attr_value
    from tensorboardX.proto.graph_pb2 import GraphDef
    from tensorboardX.proto.node_def_pb2 import NodeDef
    from tensorboardX.proto.tensor_shape_pb2 import TensorShapeProto as shape_proto
    from tensorboardX.proto.versions_pb2 import VersionDef

    node_names: dict[Any, str] = {}
    nodes = []
    for node in graph.topological_order():
        target = node.meta.get("target")
        name = names.get(id(target.array), node.name) if node.op == "parameter" and target is not None else node.name
        node_names[node] = name.lstrip("%")
        attr = {}
        if node.shape is not None:
            dims = [shape_proto.Dim(size=int(d)) for d in node.shape]
            attr["_output_shapes"] = attr_value(list=attr_value.ListValue(shape=[shape_proto(dim=dims)]))
            attr["dtype"] = attr_value(s=str(node.dtype).encode())
        nodes.append(NodeDef(name=node_names[node], op=node.op, input=[node_names[i] for i in node.inputs], attr=attr))
    return GraphDef(node=nodes, versions=VersionDef(producer=22))


# -- reading a log back ------------------------------------------------------------------------------
def read_events(path: str | os.PathLike) -> Iterator[Any]:
    """The ``Event`` protobufs of one event file, in order; a damaged record raises ``ValueError``."""
    _tensorboardx()
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c

    data = Path(path).read_bytes()
    at = 0
    while at < len(data):
        if at + 12 > len(data):
            raise ValueError(f"{path}: truncated record header at byte {at}")
        header = data[at:at + 8]
        (length,), (header_crc,) = struct.unpack("<Q", header), struct.unpack("<I", data[at + 8:at + 12])
        body = data[at + 12:at + 12 + length]
        if header_crc != masked_crc32c(header) or len(body) != length or at + 16 + length > len(data):
            raise ValueError(f"{path}: damaged record at byte {at}")
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if body_crc != masked_crc32c(body):
            raise ValueError(f"{path}: record at byte {at} fails its CRC")
        yield Event.FromString(body)
        at += 16 + length


def scalars(log_dir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Every scalar curve logged under ``log_dir`` (``add_scalars`` runs included, as
    ``main_tag/tag/main_tag``), as ``{tag: [(step, value), ...]}`` sorted by step."""
    curves: dict[str, list[tuple[int, float]]] = {}
    root = Path(log_dir)
    for path in sorted(root.rglob("events.out.tfevents.*")):
        run = path.parent.relative_to(root).as_posix()
        for event in read_events(path):
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    tag = value.tag if run == "." else f"{run}/{value.tag}"
                    curves.setdefault(tag, []).append((event.step, value.simple_value))
    return {tag: sorted(points) for tag, points in curves.items()}
