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
optional ``safetensors`` extra) and read here, since its numpy loader copies every tensor. Its
header is untrusted input held to a strict schema, as the native metadata is: exactly the keys
``dtype``, ``shape`` (at most ``MAX_DIMS`` integers, not floats or strings) and ``data_offsets``
per tensor, no repeated names, at most ``MAX_TENSORS`` tensors, shapes whose array numpy could
make, and only ``CheckpointError`` when it is not so (``DTypeError`` for a real safetensors dtype
minigrad does not hold, such as ``BF16``).

A file that shrinks while tensors map it cannot be read: the pages past its new end are gone, and
touching one kills the process with ``SIGBUS`` (as with ``torch.load(mmap=True)`` or the
safetensors package), which Python cannot catch. Do not truncate or rewrite a checkpoint in place
while a model maps it (``save`` never does: it writes a new file and renames it over the old,
which leaves the mapped pages of the old one intact). What can be caught is caught:
``check_mapped`` raises ``CheckpointError`` when the file behind a mapped tensor is now shorter
than its map, and ``Module.load_state_dict`` calls it before it copies or assigns a mapped tensor
(the first touch of its pages, in the usual way of loading); ``load`` itself refuses a file that
changed size while it was being mapped.
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
    whole = _mapped(f, file_size)
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


def _mapped(f: BinaryIO, size: int) -> Map | None:
    """A private map of the whole file, which must still be ``size`` bytes long."""
    if not size:
        return None
    whole = Map(f.fileno(), 0, access=ACCESS_COPY)
    if len(whole) != size:
        raise CheckpointError(f"the file changed size while it was loaded ({size} bytes, then {len(whole)})")
    return whole


def check_mapped(obj: Any) -> None:
    """Raise CheckpointError if a tensor or array in ``obj`` (or in a dict, list or tuple of them)
    maps a file that is now shorter than its map: reading it would kill the process (SIGBUS)."""
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for v in obj:
            check_mapped(v)
        return
    base = getattr(getattr(obj, "array", obj), "base", None)
    if isinstance(base, Map) and not base.closed and base.size() < len(base):
        raise CheckpointError(f"a mapped tensor's file is now {base.size()} bytes, shorter than the {len(base)} "
                              "that were mapped: it was truncated or rewritten in place since load(mmap=True), and "
                              "reading the tensor would crash the process (SIGBUS)")


def _view(whole: Map | None, shape: tuple, dtype: numpy.dtype, offset: int, order: str = "C") -> numpy.ndarray:
    if math.prod(shape) == 0:  # nothing to map (and numpy refuses an offset at the very end)
        return numpy.empty(shape, dtype)
    return numpy.ndarray(shape, dtype, buffer=whole, offset=offset, order=order)


# -- safetensors ---------------------------------------------------------------------------------
# safetensors' dtype names for the dtypes minigrad holds, and the others the format defines
_ST_DTYPES = {"F16": "float16", "F32": "float32", "F64": "float64", "I8": "int8", "U8": "uint8",
              "I16": "int16", "I32": "int32", "I64": "int64", "BOOL": "bool"}
_ST_OTHER_DTYPES = {"BF16", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64"}
MAX_HEADER_BYTES = 100 << 20  # the limit the safetensors package itself sets
MAX_TENSORS = 1 << 16  # models hold thousands; a million empty entries took 0.9 GiB and 17 s to refuse
MAX_DIMS = 64  # numpy's own limit
MAX_ARRAY_BYTES = 1 << 62  # what numpy can address, counting a 0 dimension as 1 (numpy does)


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
        try:
            whole = _mapped(f, size) if mmap else None
        except CheckpointError as e:
            raise CheckpointError(f"{path}: {e}") from None
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
    """``{name: (dtype, shape, offset)}`` and where the data starts, after checking the header
    against the schema and that the tensors tile the data section exactly, as the format requires."""
    if size < 8:
        raise CheckpointError(f"not a safetensors file ({size} bytes)")
    (n,) = struct.unpack("<Q", f.read(8))
    if n > min(MAX_HEADER_BYTES, size - 8):
        raise CheckpointError(f"header length {n} does not fit the {size}-byte file")
    raw = _parse_header(f.read(n))
    metadata = raw.pop("__metadata__", {})
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise CheckpointError(f"__metadata__ {str(metadata)[:60]} is not a map of strings to strings")
    header, spans = {}, []
    for name, entry in raw.items():
        dtype, shape, (begin, end) = _checked_entry(name, entry)
        header[name] = (dtype, shape, begin)
        spans.append((begin, end))
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            raise CheckpointError(f"tensor data overlaps or leaves a gap at byte {position}")
        position = end
    if 8 + n + position != size:
        raise CheckpointError(f"the tensors take {position} bytes but the file holds {size - 8 - n} after its header")
    return header, 8 + n


def _parse_header(raw: bytes) -> dict:
    """The header's JSON object, refused (CheckpointError) once it holds more objects than
    ``MAX_TENSORS`` entries need, so a hostile header costs bounded time and memory."""
    objects = 0

    def pairs(items: list) -> dict:
        nonlocal objects
        objects += 1
        if objects > MAX_TENSORS + 2:  # each tensor's entry, __metadata__ and the header itself
            raise CheckpointError(f"the header holds more than {MAX_TENSORS} tensors")
        out = dict(items)
        if len(out) != len(items):
            twice = next(k for i, (k, _) in enumerate(items) if any(k == j for j, _ in items[:i]))
            raise CheckpointError(f"the header names {twice!r} twice")
        return out

    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=pairs)
    except CheckpointError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"header is not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(header, dict):
        raise CheckpointError("header is not a JSON object")
    return header


def _checked_entry(name: str, entry: Any) -> tuple[numpy.dtype, tuple, tuple[int, int]]:
    """A tensor's dtype, shape and data offsets, once its entry is known to be one the format allows."""
    if not (isinstance(entry, dict) and set(entry) == {"dtype", "shape", "data_offsets"}):
        keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise CheckpointError(f"tensor {name!r}: malformed entry ({keys}; expected the keys "
                              "['data_offsets', 'dtype', 'shape'])")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype in _ST_OTHER_DTYPES:
        raise DTypeError(f"tensor {name!r} has safetensors dtype {dtype}; minigrad holds {sorted(_ST_DTYPES)}")
    if not isinstance(dtype, str) or dtype not in _ST_DTYPES:
        raise CheckpointError(f"tensor {name!r}: malformed entry (dtype {repr(dtype)[:40]} is not a safetensors dtype)")
    if not (isinstance(shape, list) and len(shape) <= MAX_DIMS and all(type(d) is int and d >= 0 for d in shape)):
        raise CheckpointError(f"tensor {name!r}: malformed entry (shape {str(shape)[:60]} is not a list of at most "
                              f"{MAX_DIMS} non-negative integers)")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise CheckpointError(f"tensor {name!r}: malformed entry (data_offsets {str(offsets)[:60]} are not two "
                              "integers 0 <= begin <= end)")
    dt = numpy.dtype(_ST_DTYPES[dtype])
    if math.prod(max(d, 1) for d in shape) * dt.itemsize > MAX_ARRAY_BYTES:
        raise CheckpointError(f"tensor {name!r}: shape {str(shape)[:60]} is too large for any array")
    begin, end = offsets
    if end - begin != dt.itemsize * math.prod(shape):
        raise CheckpointError(f"tensor {name!r}: shape {shape} of {dt} does not match data_offsets {[begin, end]}")
    return dt, tuple(shape), (begin, end)
