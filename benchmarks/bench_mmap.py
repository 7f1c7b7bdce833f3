"""Lazy loading, measured: peak resident memory and time to the first forward of a model whose
weights are a sizeable share of memory, eager load vs meta device + mmap, native vs safetensors.

The model is ``layers`` Linear(width, width) layers (default 16 x 4096: 1.07 GB of float32). Each
case runs in its own subprocess, which reports its peak resident set (``VmHWM``, Linux) and the
time from start to the first forward's output:
- eager: build the model on the cpu (random init), ``load`` the file, ``load_state_dict`` (a copy);
- meta + mmap: build it on the meta device, ``load(path, mmap=True)``, ``load_state_dict(assign=True)``.
The native load checks every array's SHA-256 (streaming the file through read); safetensors has no
checksum. The files are written once, first, and are in the page cache for every case alike.

``python benchmarks/bench_mmap.py [--width W] [--layers L]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CASE = r"""
import json, sys, time
t0 = time.perf_counter()
import minigrad as mg
from minigrad import nn
width, layers, path, lazy = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
def build():
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
if lazy:
    with mg.device("meta"):
        model = build()
    model.load_state_dict(mg.load(path, mmap=True), assign=True)
else:
    model = build()
    model.load_state_dict(mg.load(path))
with mg.no_grad():
    y = model(mg.ones(1, width))
y.sum().item()
seconds = time.perf_counter() - t0
# VmHWM: this process's peak resident set since exec (ru_maxrss would keep the parent's from before exec)
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"seconds": seconds, "peak_mib": int(hwm.split()[1]) / 1024}))
"""


def run(width: int, layers: int, path: str, lazy: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", CASE, str(width), str(layers), path, "1" if lazy else "0"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=16)
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import minigrad as mg
    from minigrad import nn

    gb = args.layers * (args.width * args.width + args.width) * 4 / 1e9
    with tempfile.TemporaryDirectory() as tmp:
        with mg.device("meta"):
            model = nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(args.layers)])
        model.to_empty(device="cpu")
        paths = {"native": os.path.join(tmp, "model.ckpt"), "safetensors": os.path.join(tmp, "model.safetensors")}
        for p in paths.values():
            mg.save(model.state_dict(), p)
        del model
        print(f"model: {args.layers} x Linear({args.width}, {args.width}) = {gb:.2f} GB of float32")
        print(f"{'format':14}{'eager s':>10}{'lazy s':>10}{'lazy/eager':>12}{'eager peak MiB':>16}{'lazy peak MiB':>15}{'lazy/eager':>12}")
        for name, p in paths.items():
            eager, lazy = run(args.width, args.layers, p, False), run(args.width, args.layers, p, True)
            print(f"{name:14}{eager['seconds']:10.2f}{lazy['seconds']:10.2f}{lazy['seconds'] / eager['seconds']:11.2f}x"
                  f"{eager['peak_mib']:16.0f}{lazy['peak_mib']:15.0f}{lazy['peak_mib'] / eager['peak_mib']:11.2f}x")


if __name__ == "__main__":
    main()
