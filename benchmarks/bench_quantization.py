"""int8 quantization: size, accuracy and speed of float32, PTQ and QAT models, in minigrad and onnxruntime.

Two models: the shipped digits CNN (``minigrad.examples.train_digits``: two Conv+ReLU, a Linear;
8x8 images, 360 test images) and an MNIST MLP 784-256-128-10 trained on 8,000 images of the 10k
MNIST test split and tested on the other 2,000 (the IDX files in ``$MNIST_DIR``, or the first
``shared/data/mnist`` found above the repository; skipped with a message when absent). For each:
the state_dict and ONNX file sizes; test accuracy of the float32 model, of post-training static
quantization (min-max and histogram observers), of quantization-aware training (a short
fine-tune from the float weights) and of dynamic quantization; PyTorch's own eager PTQ on the same
weights where its CPU engine runs; and the time of one pass over the test set: minigrad float32,
minigrad int8, onnxruntime float32 and onnxruntime int8 (the QDQ file), with the ratio to minigrad
float32. numpy's int32 matrix products have no BLAS kernel, so minigrad int8 is not expected to
beat its float32; onnxruntime's int8 kernels are where the speed is.
``python benchmarks/bench_quantization.py [--repeats R] [--epochs E]``; figures are noisy on a
shared machine.
"""

from __future__ import annotations

import argparse
import gzip
import os
import tempfile
import warnings
from pathlib import Path

from common import THREADS, blas_info, interleaved, torch  # noqa: E402  (first: sets BLAS threads before numpy)

import numpy as np

import minigrad
import minigrad.quantization as Q
from minigrad import nn, optim
from minigrad.data import Digits
from minigrad.examples.train_digits import make_model, train
from minigrad.graph import export_onnx

try:
    import onnxruntime as ort
except ImportError:
    ort = None

ROOT = Path(__file__).resolve().parent.parent


def mnist_dir() -> Path | None:
    if os.environ.get("MNIST_DIR"):
        return Path(os.environ["MNIST_DIR"])
    for parent in ROOT.parents:
        if (parent / "shared/data/mnist/t10k-images-idx3-ubyte.gz").exists():
            return parent / "shared/data/mnist"
    return None


def load_mnist(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    with gzip.open(folder / "t10k-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(folder / "t10k-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return (images / 255.0 - 0.1307).astype("float32") / 0.3081, labels.astype("int64")


def fit(model: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int, lr: float, seed: int = 0) -> nn.Module:
    """Adam on shuffled batches of 64: the MLP's training and every QAT fine-tune."""
    opt, rng = optim.Adam(model.parameters(), lr=lr), np.random.default_rng(seed)
    model.train()
    for _ in range(epochs):
        for idx in np.array_split(rng.permutation(len(x)), len(x) // 64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(minigrad.tensor(x[idx])), minigrad.tensor(y[idx])).backward()
            opt.step()
    return model.eval()


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with minigrad.no_grad():
        return float((model(minigrad.tensor(x)).array.argmax(1) == y).mean())


def torch_ptq(model: nn.Module, calib: np.ndarray, x: np.ndarray, y: np.ndarray) -> str:
    """PyTorch eager PTQ (fuse, prepare, calibrate, convert) of the same weights, or why not."""
    if torch is None:
        return "skipped: torch is not installed"
    engines = [e for e in ("x86", "fbgemm", "qnnpack") if e in torch.backends.quantized.supported_engines]
    if not engines:
        return "skipped: this torch build has no CPU quantization engine"
    tq = torch.ao.quantization
    layers, fuse = [tq.QuantStub()], []
    for i, m in enumerate(model):
        if isinstance(m, nn.Conv2d):
            t = torch.nn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding)
        elif isinstance(m, nn.Linear):
            t = torch.nn.Linear(m.in_features, m.out_features)
        else:
            t = {"ReLU": torch.nn.ReLU, "Flatten": torch.nn.Flatten}.get(type(m).__name__)
            t = t() if t else torch.nn.MaxPool2d(m.kernel_size)
        if hasattr(m, "weight"):
            t.weight.data = torch.from_numpy(m.weight.detach().numpy())
            t.bias.data = torch.from_numpy(m.bias.detach().numpy())
        if type(m).__name__ == "ReLU" and isinstance(model[i - 1], (nn.Conv2d, nn.Linear)):
            fuse.append([str(i), str(i + 1)])  # indices shift by one: the QuantStub is first
        layers.append(t)
    net = torch.nn.Sequential(*layers, tq.DeQuantStub()).eval()
    with warnings.catch_warnings():  # torch.ao.quantization's deprecation notices (it moves to torchao)
        warnings.simplefilter("ignore")
        return _torch_ptq(tq, net, fuse, engines[0], calib, x, y)


def _torch_ptq(tq, net, fuse, engine, calib, x, y) -> str:
    try:
        torch.backends.quantized.engine = engine
        net.qconfig = tq.get_default_qconfig(engine)
        prepared = tq.prepare(tq.fuse_modules(net, fuse))
        with torch.no_grad():
            prepared(torch.from_numpy(calib))
            qnet = tq.convert(prepared)
            acc = float((qnet(torch.from_numpy(x)).argmax(1).numpy() == y).mean())
    except (RuntimeError, NotImplementedError) as e:
        return f"skipped: {engine} failed here ({str(e).splitlines()[0][:80]})"
    return f"{acc:.2%} (engine {engine})"


def session(path: Path) -> "ort.InferenceSession":
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def report(name: str, model: nn.Module, train_x, train_y, test_x, test_y, repeats: int, qat_epochs: int,
           qat_lr: float) -> None:
    calib = train_x[:512]
    ptq = {}
    for label, qconfig in (("PTQ min-max", Q.default_qconfig), ("PTQ histogram", Q.histogram_qconfig)):
        prepared = Q.prepare(Q.fuse_modules(model), qconfig)
        with minigrad.no_grad():
            prepared(minigrad.tensor(calib))
        ptq[label] = Q.convert(prepared)
    qat = fit(Q.prepare_qat(Q.fuse_modules(model)), train_x, train_y, qat_epochs, qat_lr, seed=1)
    ptq["QAT"] = Q.convert(qat)
    int8 = ptq["PTQ min-max"]
    drop = accuracy(model, test_x, test_y) - accuracy(int8, test_x, test_y)
    print(f"\n== {name}: {len(train_x)} training images, {len(test_x)} test images")
    print(f"accuracy   float32 {accuracy(model, test_x, test_y):.2%}   " + "   ".join(
        f"{k} {accuracy(m, test_x, test_y):.2%}" for k, m in ptq.items())
        + f"   dynamic {accuracy(Q.quantize_dynamic(model), test_x, test_y):.2%}")
    print(f"PyTorch eager PTQ (same weights, its default qconfig): {torch_ptq(model, calib, test_x, test_y)}")

    x = minigrad.tensor(test_x)
    with tempfile.TemporaryDirectory() as tmp:
        sizes = {}
        for label, m in (("float32", model), ("int8", int8)):
            minigrad.save(m.state_dict(), Path(tmp) / f"{label}.ckpt")
            sizes[label] = os.path.getsize(Path(tmp) / f"{label}.ckpt")
        runs = {"minigrad f32": lambda: model(x), "minigrad int8": lambda: int8(x)}
        if ort is not None:
            for label, m in (("float32", model), ("int8", int8)):
                export_onnx(m, x, Path(tmp) / f"{label}.onnx")
                sizes[f"onnx {label}"] = os.path.getsize(Path(tmp) / f"{label}.onnx")
            f32, i8, feed = session(Path(tmp) / "float32.onnx"), session(Path(tmp) / "int8.onnx"), {"input": test_x}
            with minigrad.no_grad():
                steps = np.abs(i8.run(None, feed)[0] - int8(x).array) / float(int8[-1].scale.array)
            runs.update({"ort f32": lambda: f32.run(None, feed), "ort int8": lambda: i8.run(None, feed)})
        print("size (bytes)  " + "   ".join(f"{k} {v:,}" for k, v in sizes.items())
              + f"   (minigrad int8 / float32 = {sizes['int8'] / sizes['float32']:.2f})")
        small = sizes["int8"] <= 0.35 * sizes["float32"]
        print(f"targets: int8 file <= 35% of float32 ({'met' if small else 'not met'}),"
              f" PTQ min-max within 1 point of float32 ({drop:+.2%} lost: {'met' if drop <= 0.01 else 'not met'})")
        with minigrad.no_grad():
            ms = interleaved(runs, repeats, 1)
    print("ms per pass over the test set  " + "   ".join(f"{k} {v:.2f}" for k, v in ms.items()))
    print("time / minigrad f32            " + "   ".join(f"{k} {v / ms['minigrad f32']:.2f}x" for k, v in ms.items()))
    if ort is None:
        print("onnxruntime is not installed (make onnx): minigrad's figures only")
    else:
        print(f"onnxruntime int8 vs minigrad int8 outputs: {(steps > 0.5).mean():.2%} differ, by at most "
              f"{steps.max():.0f} step(s) of the output grid")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=4, help="float training epochs (QAT fine-tunes for 1)")
    args = parser.parse_args()
    print(blas_info(), f"| onnxruntime {ort.__version__ if ort else 'not installed'}"
          f" | torch {torch.__version__ if torch else 'not installed'}")

    minigrad.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        train(epochs=args.epochs, checkpoint=Path(tmp) / "digits.ckpt", progress=False)
        cnn = make_model()
        cnn.load_state_dict(minigrad.load(Path(tmp) / "digits.ckpt")["model_state_dict"])
    digits_train, digits_test = Digits(train=True), Digits(train=False)
    report("digits CNN", cnn.eval(), digits_train.data, digits_train.targets, digits_test.data,
           digits_test.targets, args.repeats, 1, 1e-3)

    folder = mnist_dir()
    if folder is None:
        print("\n== MNIST MLP: skipped, no MNIST IDX files (set MNIST_DIR or put them in shared/data/mnist)")
        return
    images, labels = load_mnist(folder)
    minigrad.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    fit(mlp, images[:8000], labels[:8000], args.epochs, 1e-3)
    report("MNIST MLP 784-256-128-10", mlp, images[:8000], labels[:8000], images[8000:], labels[8000:],
           args.repeats, 1, 1e-4)


if __name__ == "__main__":
    main()
