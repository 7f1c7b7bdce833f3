"""minigrad.utils.tensorboard: what SummaryWriter writes is read back from the event file
(scalars, scalar groups, histograms, PNG images, the traced graph); damaged files and a missing
tensorboardX raise clear errors."""

import io
import sys

import numpy as np
import pytest

tensorboardX = pytest.importorskip("tensorboardX")

import minigrad as mg  # noqa: E402
from minigrad import nn  # noqa: E402
from minigrad.utils.tensorboard import SummaryWriter, read_events, scalars  # noqa: E402


def events(log_dir):
    (path,) = log_dir.glob("events.out.tfevents.*")
    return list(read_events(path))


def summaries(log_dir, tag):
    return [(e.step, v) for e in events(log_dir) for v in e.summary.value if v.tag == tag]


def test_scalars_and_groups_read_back_by_step(tmp_path):
    with SummaryWriter(tmp_path) as w:
        for step in range(4):
            w.add_scalar("loss", mg.tensor(1.0 / (step + 1)), step)
            w.add_scalars("accuracy", {"train": 0.5 + 0.1 * step, "val": np.float32(0.4)}, step)
    curves = scalars(tmp_path)
    assert [s for s, _ in curves["loss"]] == [0, 1, 2, 3]
    np.testing.assert_allclose([v for _, v in curves["loss"]], [1, 1 / 2, 1 / 3, 1 / 4], rtol=1e-6)
    np.testing.assert_allclose([v for _, v in curves["accuracy/train/accuracy"]], [0.5, 0.6, 0.7, 0.8], rtol=1e-6)
    assert [v for _, v in curves["accuracy/val/accuracy"]] == pytest.approx([0.4] * 4)


def test_histogram_counts_every_value(tmp_path):
    values = mg.randn(1000)
    with SummaryWriter(tmp_path) as w:
        w.add_histogram("weights", values, 7)
    ((step, v),) = summaries(tmp_path, "weights")
    x = values.numpy()
    assert step == 7 and v.histo.num == 1000 and sum(v.histo.bucket) == 1000
    assert v.histo.min == pytest.approx(x.min()) and v.histo.max == pytest.approx(x.max())
    assert v.histo.sum == pytest.approx(x.sum(), abs=1e-3)


def test_image_is_a_png_of_the_pixels(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    img = mg.tensor(np.linspace(0, 1, 3 * 4 * 5, dtype=np.float32).reshape(3, 4, 5))
    with SummaryWriter(tmp_path) as w:
        w.add_image("sample", img, 2)
        w.add_image("hw", img[0], 3, dataformats="HW")
    ((step, v),) = summaries(tmp_path, "sample")
    assert step == 2 and (v.image.height, v.image.width, v.image.colorspace) == (4, 5, 3)
    pixels = np.asarray(Image.open(io.BytesIO(v.image.encoded_image_string)))
    np.testing.assert_allclose(pixels, img.numpy().transpose(1, 2, 0) * 255, atol=1)
    ((_, hw),) = summaries(tmp_path, "hw")
    assert (hw.image.height, hw.image.width) == (4, 5)


def test_graph_has_the_traced_ops_named_parameters_and_shapes(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    with SummaryWriter(tmp_path) as w:
        w.add_graph(model, mg.randn(5, 3))
    (event,) = [e for e in events(tmp_path) if e.WhichOneof("what") == "graph_def"]
    graph = tensorboardX.proto.graph_pb2.GraphDef.FromString(event.graph_def)
    nodes = {n.name: n for n in graph.node}
    assert [n.op for n in graph.node if n.op not in ("parameter", "placeholder", "output")] == \
        ["Linear", "Relu", "Linear"]
    first = next(n for n in graph.node if n.op == "Linear")
    assert list(first.input)[1:] == ["0/weight", "0/bias"]
    assert [d.size for d in nodes["0/weight"].attr["_output_shapes"].list.shape[0].dim] == [4, 3]
    assert [d.size for d in first.attr["_output_shapes"].list.shape[0].dim] == [5, 4]


def test_graph_needs_an_example_input(tmp_path):
    with SummaryWriter(tmp_path) as w, pytest.raises(TypeError, match="input_to_model"):
        w.add_graph(nn.Linear(2, 2))


def test_flush_writes_before_close(tmp_path):
    w = SummaryWriter(tmp_path)
    w.add_scalar("x", 1.5, 0)
    w.flush()
    assert scalars(tmp_path) == {"x": [(0, 1.5)]}
    w.close()


def test_a_damaged_record_is_refused(tmp_path):
    with SummaryWriter(tmp_path) as w:
        w.add_scalar("x", 1.0, 0)
    (path,) = tmp_path.glob("events.out.tfevents.*")
    data = bytearray(path.read_bytes())
    data[-6] ^= 0xFF  # inside the last record's body
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="CRC"):
        list(read_events(path))
    path.write_bytes(bytes(data[:-3]))
    with pytest.raises(ValueError, match="damaged record"):
        list(read_events(path))


def test_missing_tensorboardx_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ImportError, match=r"minigrad\[tensorboard\]"):
        SummaryWriter(tmp_path)
