"""``save`` and ``load``: checkpoints as a zip of ``.npy`` arrays plus JSON metadata, never pickle.

A checkpoint (chapter 01's "outputs": epoch, model and optimizer state) is a nested structure of
dicts, lists, tuples, tensors, arrays, numbers, strings and None. ``save`` writes every array as a
``.npy`` entry of a zip file (so ``numpy.load`` can open it as an ``.npz``) and the structure as
``metadata.json``, with a SHA-256 digest per array. Loading reads arrays with
``allow_pickle=False``, so an untrusted file cannot run code, and checks every digest, so a
truncated or tampered file raises ``CheckpointError`` naming the file. Writes go to a temporary
file that is renamed over the target only when complete: a crash mid-save leaves the previous
checkpoint intact.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy  # file I/O on host arrays: .npy encoding is numpy's format

from minigrad import backend
from minigrad.tensor import Tensor

FORMAT = "minigrad-checkpoint"
VERSION = 1
_META = "metadata.json"


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read back: damaged, truncated, tampered or not one at all."""


def save(obj: Any, path: str | os.PathLike) -> None:
    """Write ``obj`` (dicts, lists, tuples, Tensors, arrays, numbers, strings, None) to ``path``."""
    ### BEGIN SOLUTION chapter 01: saving a checkpoint
    path = Path(path)
    arrays: list[numpy.ndarray] = []
    tree = _encode(obj, arrays, "obj")
    buffers = []
    for a in arrays:
        buf = io.BytesIO()
        numpy.lib.format.write_array(buf, numpy.ascontiguousarray(a), allow_pickle=False)
        buffers.append(buf.getvalue())
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "tree": tree,
        "sha256": [hashlib.sha256(b).hexdigest() for b in buffers],
    }
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED) as z:
                for i, b in enumerate(buffers):
                    z.writestr(f"arr_{i}.npy", b)
                z.writestr(_META, json.dumps(meta))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    ### END SOLUTION


def load(path: str | os.PathLike, map_location: Any = None) -> Any:
    """Read a checkpoint written by ``save``; tensors go to ``map_location`` (default: cpu)."""
    ### BEGIN SOLUTION chapter 01: loading a checkpoint
    path = Path(path)
    device = backend.Device(map_location) if map_location is not None else backend.cpu
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            if _META not in names:
                raise CheckpointError(f"{path}: not a minigrad checkpoint (no {_META} inside)")
            meta = json.loads(z.read(_META))
            if meta.get("format") != FORMAT or meta.get("version") != VERSION:
                raise CheckpointError(
                    f"{path}: unsupported checkpoint format {meta.get('format')!r} version "
                    f"{meta.get('version')!r}; expected {FORMAT!r} version {VERSION}"
                )
            arrays = []
            for i, digest in enumerate(meta["sha256"]):
                raw = z.read(f"arr_{i}.npy")
                if hashlib.sha256(raw).hexdigest() != digest:
                    raise CheckpointError(f"{path}: array {i} does not match its checksum (the file was modified)")
                arrays.append(numpy.lib.format.read_array(io.BytesIO(raw), allow_pickle=False))
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise
    except (zipfile.BadZipFile, EOFError, KeyError, OSError, json.JSONDecodeError, ValueError) as e:
        raise CheckpointError(f"{path}: damaged or truncated checkpoint ({type(e).__name__}: {e})") from None
    return _decode(meta["tree"], arrays, device, path)
    ### END SOLUTION


# -- the structure as JSON ---------------------------------------------------------------------
def _encode(obj: Any, arrays: list, where: str) -> Any:
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, float)):
        return obj
    if isinstance(obj, Tensor):
        arrays.append(obj.detach().cpu().numpy())
        return {"__tensor__": len(arrays) - 1, "requires_grad": obj.requires_grad}
    if isinstance(obj, numpy.ndarray):
        if obj.dtype.hasobject:
            raise TypeError(f"save: {where} is an object array, which cannot be saved without pickle")
        arrays.append(obj)
        return {"__ndarray__": len(arrays) - 1}
    if isinstance(obj, numpy.generic):
        return obj.item()
    if isinstance(obj, (list, tuple)):
        items = [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else {"__tuple__": items}
    if isinstance(obj, dict):
        # keys may be ints (optimizer state is keyed by parameter index), so store pairs
        return {"__dict__": [[_encode(k, arrays, where), _encode(v, arrays, f"{where}[{k!r}]")]
                             for k, v in obj.items()]}
    raise TypeError(
        f"save: cannot save {where} of type {type(obj).__name__}; expected dicts, lists, tuples, "
        "Tensors, numpy arrays, numbers, strings or None"
    )


def _decode(node: Any, arrays: list, device: Any, path: Path) -> Any:
    if isinstance(node, list):
        return [_decode(v, arrays, device, path) for v in node]
    if not isinstance(node, dict):
        return node
    try:
        if "__tensor__" in node:
            t = Tensor(arrays[node["__tensor__"]], device=device)
            return t.requires_grad_(True) if node["requires_grad"] else t
        if "__ndarray__" in node:
            return arrays[node["__ndarray__"]]
        if "__tuple__" in node:
            return tuple(_decode(v, arrays, device, path) for v in node["__tuple__"])
        if "__dict__" in node:
            return {_hashable(_decode(k, arrays, device, path)): _decode(v, arrays, device, path)
                    for k, v in node["__dict__"]}
    except (IndexError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: malformed metadata ({type(e).__name__}: {e})") from None
    raise CheckpointError(f"{path}: malformed metadata (unknown entry {sorted(node)})")


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key
