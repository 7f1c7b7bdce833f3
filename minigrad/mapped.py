"""Memory-mapped weights: checkpoints and ``.safetensors`` files read by mapping, not copying (chapter 01).

A mapped array is a view of the file's pages: the operating system reads a page the first time
it is touched and may drop it again under memory pressure, so loading a model costs no more
resident memory than the parts used. Both formats store each tensor's bytes raw and contiguous,
which is all mapping needs: minigrad's checkpoint is a zip of *stored* (uncompressed) ``.npy``
members, and ``save`` pads each member's zip header (an extra field, as Android's zipalign does)
so the array data starts on a 64-byte boundary; a ``.safetensors`` file is an 8-byte length, a
JSON header, and the tensors' bytes. Maps are private (copy-on-write): writing to a loaded
tensor changes memory, never the file.

Checksums: a native checkpoint holds a SHA-256 digest per array. ``load(path, mmap=True)`` checks
them at load by streaming the file through ``read`` (the page cache, not the process's resident
memory), before any array is mapped, so a damaged file is refused as with an eager load. A file
changed on disk *after* that check shows through the map (pages not yet written); safetensors
files carry no digest at all. ``.safetensors`` is written by the ``safetensors`` package (the
optional ``safetensors`` extra) and read here, since its numpy loader copies every tensor.
"""

from __future__ import annotations

import hashlib
import json
import math
from mmap import ACCESS_COPY, mmap as Map
import os
import struct
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy  # the arrays are numpy views of the mapped file

from minigrad import backend
from minigrad.errors import CheckpointError, DTypeError

ALIGN = 64
_ZIPALIGN_ID = 0xD935  # the extra-field id Android's zipalign uses for padding
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # a zip local file header (30 bytes)


def aligned_member(name: str, offset: int) -> zipfile.ZipInfo:
    """A stored zip member whose data, written at file ``offset``, starts on a 64-byte boundary."""
    info = zipfile.ZipInfo(name)
    info.compress_type, info.external_attr = zipfile.ZIP_STORED, 0o600 << 16
    start = offset + _LOCAL_HEADER.size + len(name.encode()) + 6  # 6: the extra field's id, length, alignment
    pad = -start % ALIGN
    info.extra = struct.pack("<HHH", _ZIPALIGN_ID, 2 + pad, ALIGN) + bytes(pad)
    return info


def _check_digest(f: BinaryIO, start: int, length: int, digest: str, index: int) -> None:
    f.seek(start)
    h, left = hashlib.sha256(), length
    while left:
        chunk = f.read(min(left, 1 << 22))
        if not chunk:
            raise CheckpointError(f"array {index} is truncated")
        h.update(chunk)
        left -= len(chunk)
    if h.hexdigest() != digest:
        raise CheckpointError(f"array {index} does not match its checksum (the file was modified)")


def npy_header(f: Any, index: int, end: int) -> tuple[tuple, bool, Any]:
    """The shape, Fortran order and dtype in the ``.npy`` header at ``f``'s position (left just
    after it), refused unless it is a version numpy writes, holds no Python objects, and
    describes exactly the bytes from there to the member's ``end``."""
    version = numpy.lib.format.read_magic(f)
    if version not in ((1, 0), (2, 0)):
        raise CheckpointError(f"array {index}: unsupported .npy version {version}")
    read_header = (numpy.lib.format.read_array_header_1_0 if version == (1, 0)
                   else numpy.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read_header(f)
    if dtype.hasobject:
        raise CheckpointError(f"array {index} holds Python objects, which a checkpoint never does")
    if dtype.itemsize * math.prod(shape) != end - f.tell():
        raise CheckpointError(f"array {index}: header declares shape {shape} of {dtype} "
                              f"({dtype.itemsize * math.prod(shape)} bytes) but {end - f.tell()} bytes follow it")
    return shape, fortran, dtype


def read_checkpoint(f: BinaryIO, file_size: int, checked_metadata: Callable) -> tuple[dict, list]:
    """The metadata and the arrays, as private maps, of an open native checkpoint.
    ``checked_metadata`` is serialization's check of the zip members and the metadata."""
    with zipfile.ZipFile(f) as z:
        meta = checked_metadata(z, file_size)
        infos = [z.getinfo(f"arr_{i}.npy") for i in range(len(meta["sha256"]))]
    whole = Map(f.fileno(), 0, access=ACCESS_COPY) if file_size else None
    arrays = []
    for i, (info, digest) in enumerate(zip(infos, meta["sha256"])):
        f.seek(info.header_offset)
        fields = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
        start = info.header_offset + _LOCAL_HEADER.size + fields[10] + fields[11]  # name and extra lengths
        _check_digest(f, start, info.compress_size, digest, i)
        f.seek(start)
        shape, fortran, dtype = npy_header(f, i, start + info.compress_size)
        arrays.append(_view(whole, shape, dtype, f.tell(), "F" if fortran else "C"))
    return meta, arrays


def _view(whole: Map | None, shape: tuple, dtype: numpy.dtype, offset: int, order: str = "C") -> numpy.ndarray:
    if math.prod(shape) == 0:  # nothing to map (and numpy refuses an offset at the very end)
        return numpy.empty(shape, dtype)
    return numpy.ndarray(shape, dtype, buffer=whole, offset=offset, order=order)


# -- safetensors ---------------------------------------------------------------------------------
# safetensors' dtype names for the dtypes minigrad holds
_ST_DTYPES = {"F16": "float16", "F32": "float32", "F64": "float64", "I8": "int8", "U8": "uint8",
              "I16": "int16", "I32": "int32", "I64": "int64", "BOOL": "bool"}
MAX_HEADER_BYTES = 100 << 20  # the limit the safetensors package itself sets


def save_safetensors(state_dict: dict, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Write a flat ``{name: Tensor}`` state dict as a ``.safetensors`` file (needs the package)."""
    try:
        from safetensors.numpy import save_file
    except ImportError:
        raise ImportError("save_safetensors needs the safetensors package: pip install 'minigrad[safetensors]'") from None
    arrays = {}
    for name, t in state_dict.items():
        if not hasattr(t, "detach"):
            raise TypeError(f"save_safetensors: {name!r} is a {type(t).__name__}; a state dict holds tensors")
        arrays[name] = numpy.asarray(t.detach().cpu().numpy(), order="C")  # keeps 0-d tensors 0-d
    save_file(arrays, str(path), metadata=metadata)


def load_safetensors(path: str | os.PathLike, device: Any = None, mmap: bool = True) -> dict:
    """A ``.safetensors`` file as ``{name: Tensor}``; on the cpu with ``mmap`` each tensor is a
    private map of the file. The header is checked against the file before anything is mapped."""
    from minigrad._tensor import Tensor, _wrap

    path = Path(path)
    device = backend.resolve_device(device if device is not None else "cpu")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            header, start = _safetensors_header(f, size)
        except CheckpointError as e:
            raise CheckpointError(f"{path}: {e}") from None
        whole = Map(f.fileno(), 0, access=ACCESS_COPY) if mmap else None
        out = {}
        for name, (dtype, shape, begin) in header.items():
            if mmap:
                array = _view(whole, shape, dtype, start + begin)
            else:  # read straight into the tensor's own array (a map then a copy would hold both)
                f.seek(start + begin)
                array = numpy.fromfile(f, dtype, math.prod(shape)).reshape(shape)
            out[name] = _wrap(array, device) if device is backend.cpu else Tensor(array, device=device)
    return out


def _safetensors_header(f: BinaryIO, size: int) -> tuple[dict, int]:
    """``{name: (dtype, shape, offset)}`` and where the data starts, after checking that the
    tensors tile the data section exactly, as the format requires."""
    if size < 8:
        raise CheckpointError(f"not a safetensors file ({size} bytes)")
    (n,) = struct.unpack("<Q", f.read(8))
    if n > min(MAX_HEADER_BYTES, size - 8):
        raise CheckpointError(f"header length {n} does not fit the {size}-byte file")
    try:
        raw = json.loads(f.read(n).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"header is not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise CheckpointError("header is not a JSON object")
    raw.pop("__metadata__", None)
    header, spans = {}, []
    for name, entry in raw.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], [int(d) for d in entry["shape"]], entry["data_offsets"]
        except (TypeError, KeyError, ValueError) as e:
            raise CheckpointError(f"tensor {name!r}: malformed entry ({type(e).__name__}: {e})") from None
        if dtype not in _ST_DTYPES:
            raise DTypeError(f"tensor {name!r} has safetensors dtype {dtype}; minigrad holds "
                             f"{sorted(_ST_DTYPES)}")
        dt = numpy.dtype(_ST_DTYPES[dtype])
        if min(shape, default=0) < 0 or not (isinstance(begin, int) and isinstance(end, int)) \
                or end - begin != dt.itemsize * math.prod(shape):
            raise CheckpointError(f"tensor {name!r}: shape {shape} of {dt} does not match data_offsets {[begin, end]}")
        header[name] = (dt, tuple(shape), begin)
        spans.append((begin, end))
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            raise CheckpointError(f"tensor data overlaps or leaves a gap at byte {position}")
        position = end
    if 8 + n + position != size:
        raise CheckpointError(f"the tensors take {position} bytes but the file holds {size - 8 - n} after its header")
    return header, 8 + n
