"""``save`` and ``load``: checkpoints as a zip of ``.npy`` arrays plus JSON metadata, never pickle.

A checkpoint (chapter 01's "outputs": epoch, model and optimizer state) is a nested structure of
dicts, lists, tuples, tensors, arrays, numbers, strings and None. ``save`` writes every array as a
``.npy`` entry of a zip file (so ``numpy.load`` can open it as an ``.npz``) and the structure as
``metadata.json``, with a SHA-256 digest per array. Loading reads arrays with
``allow_pickle=False``, so an untrusted file cannot run code. A file is untrusted input: ``load``
checks it before it allocates anything (members stored uncompressed and no larger than the file,
metadata against a strict schema, every digest, every ``.npy`` header against the bytes behind
it), so a truncated, tampered or hostile file raises ``CheckpointError`` naming the file and what
is wrong, and never takes more memory than its own size. Writes go to a temporary file, created
with the user's umask, that is renamed over the target only when complete: a crash mid-save
leaves the previous checkpoint intact, and the next save to that path removes the leftover.
An object that is not data (a whole model) is saved as a pickle member beside the arrays
(``minigrad.pickling``), which ``load`` unpickles only under ``weights_only=False`` or for the
classes ``safe_globals`` allows, as PyTorch does.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import io
import json
import os
import pickle
import re
import secrets
import socket
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import numpy  # file I/O on host arrays: .npy encoding is numpy's format

from minigrad import backend, mapped, pickling
from minigrad.pickling import add_safe_globals, clear_safe_globals, get_safe_globals, safe_globals  # noqa: F401
from minigrad._tensor import Tensor, _wrap
from minigrad.errors import CheckpointError, ShapeError

FORMAT = "minigrad-checkpoint"
VERSION = 1
_META = "metadata.json"


def save(obj: Any, f: str | os.PathLike | BinaryIO, pickle_module: Any = None, pickle_protocol: int = 2,
         _use_new_zipfile_serialization: bool = True) -> None:
    """Write ``obj`` (dicts, lists, tuples, Tensors, sparse COO tensors, arrays, numbers, strings,
    None) to the file named ``f`` (atomically), or into ``f`` itself when it is a writable binary
    file object such as ``io.BytesIO`` (as ``torch.save``). A path ending in ``.safetensors`` takes a flat
    ``{name: Tensor}`` state dict in that format. Data is written as arrays and JSON, never a
    pickle; any other object (a whole model, a dict holding one) is pickled, with ``pickle_protocol``
    (at least 2), its tensors still written as arrays, and loads only with ``weights_only=False``
    or the classes ``safe_globals`` allows. ``pickle_module`` is accepted and unused."""
    not_data = pickling.first_non_data(obj, "obj", MAX_DEPTH)
    if not_data is None:
        write = _write_checkpoint
    else:
        def write(obj: Any, out: BinaryIO) -> None:
            _write_whole_object(obj, out, pickle_protocol, not_data)
    if hasattr(f, "write"):  # written in one piece, so the stream need not be seekable
        buf = io.BytesIO()
        write(obj, buf)
        f.write(buf.getbuffer())
        return
    if str(f).endswith(".safetensors"):
        return mapped.save_safetensors(obj, f)
    path = Path(f)
    folder = path.parent
    _remove_stale_temporaries(path)
    tmp = folder / f"{path.name}.{_TMP_TAG}.{secrets.token_hex(4)}.tmp"
    # os.open applies the umask to 0o666, as open() does for any other file the user writes
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as out:
            write(obj, out)  # straight into the file: no second copy of it in memory
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_checkpoint(obj: Any, out: BinaryIO) -> None:
    """Write the checkpoint of ``obj`` into the seekable binary file ``out``: a zip of one .npy
    member per array (each aligned for ``mmap``) and the JSON metadata.

    ``_encode(obj, arrays, "obj")`` turns ``obj`` into a JSON tree, appending each array it holds
    to ``arrays`` (the tree refers to them by index). Write array ``i`` as member
    ``arr_{i}.npy`` (``numpy.lib.format.write_array``, C order, never pickled), stored
    uncompressed (``ZIP_STORED``) under the name ``mapped.aligned_member`` gives for the current
    offset, so ``load(mmap=True)`` can map it; then member ``_META``: JSON with ``"format"``
    (``FORMAT``), ``"version"`` (``VERSION``), ``"tree"``, and ``"sha256"``, the hex digest of
    each member's bytes in order, which ``load`` checks. ``load`` of what you write must give
    back equal values, dtypes and structure.
    """
    ### BEGIN SOLUTION chapter 01: saving a checkpoint
    arrays: list[numpy.ndarray] = []
    tree = _encode(obj, arrays, "obj")
    buffers = []
    for a in arrays:
        buf = io.BytesIO()
        # asarray, not ascontiguousarray, which turns a 0-d array into shape (1,)
        numpy.lib.format.write_array(buf, numpy.asarray(a, order="C"), allow_pickle=False)
        buffers.append(buf.getvalue())
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "tree": tree,
        "sha256": [hashlib.sha256(b).hexdigest() for b in buffers],
    }
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        for i, b in enumerate(buffers):
            z.writestr(mapped.aligned_member(f"arr_{i}.npy", out.tell()), b)
        z.writestr(_META, json.dumps(meta))
    ### END SOLUTION


def _write_whole_object(obj: Any, out: BinaryIO, protocol: int, not_data: tuple[str, str]) -> None:
    """A checkpoint whose object is pickled: its tensors as aligned .npy members (as
    ``_write_checkpoint`` writes them), the pickle as one more member, both digested."""
    arrays: list[numpy.ndarray] = []
    try:
        raw = pickling.dump(obj, arrays, protocol)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        where, kind = not_data
        raise TypeError(f"save: cannot save {where} of type {kind}: it is not data (dicts, lists, tuples, "
                        f"Tensors, arrays, numbers, strings, None), and pickling it failed "
                        f"({type(e).__name__}: {e})") from None
    buffers = []
    for a in arrays:
        buf = io.BytesIO()
        numpy.lib.format.write_array(buf, numpy.asarray(a, order="C"), allow_pickle=False)
        buffers.append(buf.getvalue())
    meta = {"format": FORMAT, "version": VERSION, "tree": None,
            "sha256": [hashlib.sha256(b).hexdigest() for b in buffers], "pickle": hashlib.sha256(raw).hexdigest()}
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        for i, b in enumerate(buffers):
            z.writestr(mapped.aligned_member(f"arr_{i}.npy", out.tell()), b)
        z.writestr(pickling.MEMBER, raw)
        z.writestr(_META, json.dumps(meta))


# Temporary files are named <target>.<host>-<pid>.<random>.tmp: a later save to the same target
# removes those whose writer, on this host, is no longer running (a save killed mid-write).
_TMP_TAG = f"{socket.gethostname().replace('.', '_')}-{os.getpid()}"


def _remove_stale_temporaries(path: Path) -> None:
    host = _TMP_TAG.rsplit("-", 1)[0]
    for tmp in path.parent.glob(glob.escape(path.name) + f".{glob.escape(host)}-*.tmp"):
        pid = tmp.name[len(path.name) + len(host) + 2:].split(".")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def load(f: str | os.PathLike | BinaryIO, map_location: Any = None, pickle_module: Any = None, *,
         weights_only: bool | None = None, mmap: bool | None = None, **pickle_load_args: Any) -> Any:
    """Read a checkpoint written by ``save`` from a file name or a readable binary file object;
    tensors go to ``map_location`` (default: cpu). A checkpoint of data is never unpickled, so
    ``weights_only`` does not matter for it. A whole object (``save(model, f)``) was pickled: it
    loads with ``weights_only=False``, which runs code named by the file (only for files you
    trust), and under the default ``weights_only=True`` only when every class in it is allowed
    by ``safe_globals`` / ``add_safe_globals``, else ``pickle.UnpicklingError`` says which class
    and what to do. ``pickle_module`` is accepted and unused.

    Everything in the file is checked before it is used: member sizes against the file size,
    the metadata against its schema, every array's digest and its ``.npy`` header against the
    bytes present. A file that fails any check raises ``CheckpointError`` saying what is wrong;
    nothing is allocated beyond the size of the file. With ``mmap=True`` the arrays are private
    (copy-on-write) maps of the file instead of copies (``minigrad.mapped``): the digests are
    checked by streaming the file once, and pages are read when a tensor is first used.
    A ``.safetensors`` path returns its ``{name: Tensor}`` dict (mapped too with ``mmap=True``).
    """
    device = backend.Device(map_location) if map_location is not None else backend.cpu
    if hasattr(f, "read"):  # a file object is read whole: there is no file to map
        path, data = getattr(f, "name", type(f).__name__), f.read()
        meta, arrays = _read_checked(io.BytesIO(data), len(data), path, False)
    else:
        path = Path(f)
        if path.suffix == ".safetensors":
            return mapped.load_safetensors(path, map_location, bool(mmap))
        with open(path, "rb") as file:  # a missing or unreadable file raises the usual OSError
            meta, arrays = _read_checked(file, os.fstat(file.fileno()).st_size, path, bool(mmap))
    if "pickle" in meta:
        raw = _pickle_member(io.BytesIO(data) if hasattr(f, "read") else path, meta["pickle"], path)
        return pickling.load(raw, arrays, device, weights_only is not False, path)
    try:
        return _decode(meta["tree"], arrays, device)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None


def _pickle_member(source: Any, digest: str, path: Any) -> bytes:
    """The pickle of a whole-object checkpoint, once it matches the digest in the metadata."""
    try:
        with zipfile.ZipFile(source) as z:
            raw = z.read(pickling.MEMBER)
    except zipfile.BadZipFile as e:  # zip's own CRC check, which a modified member also fails
        raise CheckpointError(f"{path}: {pickling.MEMBER} is damaged ({e})") from None
    if hashlib.sha256(raw).hexdigest() != digest:
        raise CheckpointError(f"{path}: {pickling.MEMBER} does not match its checksum (the file was modified)")
    return raw


def _read_checked(f: Any, file_size: int, path: Any, mmap: bool) -> tuple[dict, list]:
    """``_read`` (or, with ``mmap``, ``mapped.read_checkpoint``), with any failure raised as a
    CheckpointError that names the file."""
    try:
        return mapped.read_checkpoint(f, file_size, _checked_metadata) if mmap else _read(f, file_size)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    except Exception as e:  # whatever else zipfile or numpy raise on bytes they cannot parse
        raise CheckpointError(f"{path}: damaged or truncated checkpoint ({type(e).__name__}: {e})") from None


def _read(f: Any, file_size: int) -> tuple[dict, list]:
    """The metadata and the arrays of an open checkpoint file, each checked before it is read.

    ``f`` is the open file (a zip written by ``_write_checkpoint``), ``file_size`` its size.
    ``_checked_metadata(z, file_size)`` reads and checks the members and the metadata (raising
    ``CheckpointError`` for a damaged or foreign file); then each ``arr_{i}.npy`` is read only
    after its bytes match ``meta["sha256"][i]`` (a ``CheckpointError`` that names the array
    otherwise) and parsed by ``_read_npy``, which refuses pickled arrays. Return
    ``(meta, arrays)``.
    """
    ### BEGIN SOLUTION chapter 01: loading a checkpoint
    with zipfile.ZipFile(f) as z:
        meta = _checked_metadata(z, file_size)
        arrays = []
        for i, digest in enumerate(meta["sha256"]):
            raw = z.read(f"arr_{i}.npy")
            if hashlib.sha256(raw).hexdigest() != digest:
                raise CheckpointError(f"array {i} does not match its checksum (the file was modified)")
            arrays.append(_read_npy(raw, i))
    return meta, arrays
    ### END SOLUTION


def _checked_metadata(z: zipfile.ZipFile, file_size: int) -> dict:
    """The metadata of an open checkpoint, once its members are known to be those ``save`` writes."""
    infos = {i.filename: i for i in z.infolist()}
    if _META not in infos:
        raise CheckpointError(f"not a minigrad checkpoint (no {_META} inside)")
    for info in infos.values():
        _check_member(info, file_size)
    if infos[_META].file_size > MAX_METADATA_BYTES:
        raise CheckpointError(f"{_META} is {infos[_META].file_size} bytes, more than the "
                              f"{MAX_METADATA_BYTES} a checkpoint's metadata may take")
    meta = _parse_metadata(z.read(_META))
    expected = {_META} | {f"arr_{i}.npy" for i in range(len(meta["sha256"]))} | \
        ({pickling.MEMBER} if "pickle" in meta else set())
    if set(infos) != expected:
        raise CheckpointError(f"members {sorted(set(infos) ^ expected)} are missing or unexpected")
    return meta


def _check_member(info: zipfile.ZipInfo, file_size: int) -> None:
    """``save`` stores members uncompressed and unencrypted, so each one's size is bounded by the
    file's: anything else (a zip bomb, a flipped header bit) is refused before it is read."""
    if info.compress_type != zipfile.ZIP_STORED:
        raise CheckpointError(f"member {info.filename!r} is compressed (method {info.compress_type}); "
                              "checkpoints store their members uncompressed")
    if info.flag_bits & ~_ALLOWED_FLAGS:
        raise CheckpointError(f"member {info.filename!r} has unsupported zip flags {info.flag_bits:#x}")
    if info.file_size != info.compress_size or info.header_offset + info.compress_size > file_size:
        raise CheckpointError(f"member {info.filename!r} declares {info.file_size} bytes, more than "
                              f"the {file_size}-byte file holds")


_ALLOWED_FLAGS = 0x800 | 0x8  # UTF-8 names; sizes in a data descriptor (zipfile writes that to pipes)
MAX_METADATA_BYTES = 64 << 20
MAX_DEPTH = 100  # nesting of lists, tuples and dicts in a checkpoint


def _parse_metadata(raw: bytes) -> dict:
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{_META} is not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"not a minigrad checkpoint ({_META} holds a {type(meta).__name__})")
    if meta.get("format") != FORMAT or type(meta.get("version")) is not int or meta["version"] != VERSION:
        raise CheckpointError(f"unsupported checkpoint format {meta.get('format')!r} version "
                              f"{meta.get('version')!r}; expected {FORMAT!r} version {VERSION}")
    if set(meta) - {"pickle"} != {"format", "version", "tree", "sha256"}:
        raise CheckpointError(f"malformed metadata (keys {sorted(meta)}; expected ['format', 'sha256', "
                              "'tree', 'version'], and 'pickle' for a whole object)")
    digests = meta["sha256"]
    if not isinstance(digests, list) or not all(isinstance(d, str) and _HEX64.fullmatch(d) for d in digests):
        raise CheckpointError("malformed metadata ('sha256' must be a list of SHA-256 hex digests)")
    if "pickle" in meta:  # a whole object: its pickle refers to the arrays, checked as it loads
        if meta["tree"] is not None or not (isinstance(meta["pickle"], str) and _HEX64.fullmatch(meta["pickle"])):
            raise CheckpointError("malformed metadata (a pickled checkpoint has no tree and a SHA-256 'pickle')")
        return meta
    used: list[int] = []
    _check_node(meta["tree"], len(digests), used, 0)
    if sorted(used) != list(range(len(digests))):
        raise CheckpointError(f"malformed metadata (arrays referenced {sorted(used)}; each of the "
                              f"{len(digests)} arrays must be used exactly once)")
    return meta


_HEX64 = re.compile("[0-9a-f]{64}")


def _check_node(node: Any, n_arrays: int, used: list, depth: int) -> None:
    """Raise CheckpointError unless ``node`` is a tree ``_encode`` could have written."""
    if depth > MAX_DEPTH:
        raise CheckpointError(f"malformed metadata (nested deeper than {MAX_DEPTH} levels)")
    if node is None or isinstance(node, (bool, int, float, str)):
        return
    if isinstance(node, list):
        for v in node:
            _check_node(v, n_arrays, used, depth + 1)
        return
    if not isinstance(node, dict):
        raise CheckpointError(f"malformed metadata (unexpected {type(node).__name__})")
    keys = set(node)
    if keys in ({"__tensor__", "requires_grad"}, {"__ndarray__"}):
        index = node.get("__tensor__", node.get("__ndarray__"))
        if type(index) is not int or not 0 <= index < n_arrays:
            raise CheckpointError(f"malformed metadata (array index {index!r}; expected 0..{n_arrays - 1})")
        if "requires_grad" in node and type(node["requires_grad"]) is not bool:
            raise CheckpointError(f"malformed metadata (requires_grad {node['requires_grad']!r} is not a bool)")
        used.append(index)
    elif keys == {"__sparse__", "values", "size"}:
        index, values, size = node["__sparse__"], node["values"], node["size"]
        if type(index) is not int or not 0 <= index < n_arrays:
            raise CheckpointError(f"malformed metadata (array index {index!r}; expected 0..{n_arrays - 1})")
        if not (isinstance(values, dict) and "__tensor__" in values):
            raise CheckpointError(f"malformed metadata (sparse values {str(values)[:60]} are not a tensor)")
        if not (isinstance(size, list) and all(type(n) is int and n >= 0 for n in size)):
            raise CheckpointError(f"malformed metadata (sparse size {str(size)[:60]} is not a list of sizes)")
        used.append(index)
        _check_node(values, n_arrays, used, depth + 1)
    elif keys == {"__tuple__"} and isinstance(node["__tuple__"], list):
        _check_node(node["__tuple__"], n_arrays, used, depth)
    elif keys == {"__dict__"} and isinstance(node["__dict__"], list):
        for pair in node["__dict__"]:
            if not (isinstance(pair, list) and len(pair) == 2 and _is_key(pair[0])):
                raise CheckpointError(f"malformed metadata (dict entry {str(pair)[:60]} is not a [key, value] pair)")
            _check_node(pair[1], n_arrays, used, depth + 1)
    else:
        raise CheckpointError(f"malformed metadata (unknown entry {str(node)[:60]})")


def _is_key(node: Any) -> bool:
    """Keys are what ``_encode`` writes for a hashable key: scalars, strings and tuples of them."""
    if node is None or isinstance(node, (bool, int, float, str)):
        return True
    return (isinstance(node, dict) and set(node) == {"__tuple__"} and isinstance(node["__tuple__"], list)
            and all(_is_key(k) for k in node["__tuple__"]))


def _read_npy(raw: bytes, index: int) -> numpy.ndarray:
    """An array from its ``.npy`` bytes, once its header is known to describe exactly those bytes."""
    buf = io.BytesIO(raw)
    mapped.npy_header(buf, index, len(raw))
    buf.seek(0)
    return numpy.lib.format.read_array(buf, allow_pickle=False)


# -- the structure as JSON ---------------------------------------------------------------------
def _encode(obj: Any, arrays: list, where: str) -> Any:
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, float)):
        return obj
    if isinstance(obj, Tensor):
        arrays.append(obj.detach().cpu().numpy())
        return {"__tensor__": len(arrays) - 1, "requires_grad": obj.requires_grad}
    if getattr(obj, "is_sparse", False):  # a minigrad.sparse COO tensor (SGD's sparse momentum buffer)
        arrays.append(obj.indices().cpu().numpy())
        return {"__sparse__": len(arrays) - 1, "values": _encode(obj.values(), arrays, f"{where}.values()"),
                "size": list(obj.shape)}
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
        "Tensors (dense or sparse), numpy arrays, numbers, strings or None"
    )


def _decode(node: Any, arrays: list, device: Any) -> Any:
    """The object a tree checked by ``_check_node`` stands for."""
    if isinstance(node, list):
        return [_decode(v, arrays, device) for v in node]
    if not isinstance(node, dict):
        return node
    if "__tensor__" in node:
        array = arrays[node["__tensor__"]]
        if array.dtype.name not in backend.DTYPES or (node["requires_grad"] and array.dtype.kind != "f"):
            raise CheckpointError(f"tensor of dtype {array.dtype} (requires_grad={node['requires_grad']}) "
                                  "is not one minigrad can hold")
        # the array is the tensor's own (read from the file, or a private map of it): no copy on the cpu
        t = _wrap(array, device) if device is backend.cpu else Tensor(array, device=device)
        return t.requires_grad_(True) if node["requires_grad"] else t
    if "__ndarray__" in node:
        return arrays[node["__ndarray__"]]
    if "__sparse__" in node:
        return _sparse(arrays[node["__sparse__"]], _decode(node["values"], arrays, device), node["size"])
    if "__tuple__" in node:
        return tuple(_decode(v, arrays, device) for v in node["__tuple__"])
    return {_hashable(_decode(k, arrays, device)): _decode(v, arrays, device) for k, v in node["__dict__"]}


def _sparse(indices: numpy.ndarray, values: Tensor, size: list[int]) -> Any:
    """A COO tensor from a file, refused unless its parts fit together as ``_encode`` wrote them."""
    from minigrad.ops.sparse import sparse_coo_tensor

    if indices.dtype != numpy.int64 or indices.ndim != 2 or values.ndim == 0 or \
            tuple(values.shape[1:]) != tuple(size[indices.shape[0]:]):
        raise CheckpointError(f"a sparse tensor's parts do not fit: indices {indices.dtype} {indices.shape}, "
                              f"values {tuple(values.shape)}, size {tuple(size)}")
    try:
        return sparse_coo_tensor(indices, values, size)
    except ShapeError as e:
        raise CheckpointError(f"a sparse tensor's parts do not fit: {e}") from None


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key
