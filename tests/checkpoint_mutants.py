"""Hostile and damaged checkpoint files, made from a valid one by a seeded mutator.

``mutants(valid, seed)`` yields ``(what, data)`` pairs: flipped bytes, truncations, edited zip
and ``.npy`` headers, rewritten metadata (with digests and CRCs made valid again, so only the
schema checks can catch it) and small zip bombs. ``test_serialization_fuzz.py`` loads each one;
the only acceptable outcomes are ``CheckpointError`` or the original checkpoint, unchanged.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import struct
import zipfile

import numpy as np

META = "metadata.json"


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {n: z.read(n) for n in z.namelist()}


def rezip(entries: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> bytes:
    """A zip of ``entries`` with valid CRCs."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compression) as z:
        for name, raw in entries.items():
            z.writestr(name, raw)
    return buf.getvalue()


def with_meta(entries: dict[str, bytes], meta_text: str | bytes, fix_digests: bool = True) -> bytes:
    """``entries`` with ``metadata.json`` replaced (and the digests recomputed when it parses)."""
    entries = dict(entries)
    raw = meta_text.encode() if isinstance(meta_text, str) else meta_text
    if fix_digests:
        try:
            meta = json.loads(raw)
        except (ValueError, RecursionError):
            meta = None
        if isinstance(meta, dict) and isinstance(meta.get("sha256"), list):
            n = sum(1 for name in entries if name.startswith("arr_"))
            meta["sha256"] = [hashlib.sha256(entries[f"arr_{i}.npy"]).hexdigest() for i in range(n)]
            raw = json.dumps(meta).encode()
    entries[META] = raw
    return rezip(entries)


def with_array(entries: dict[str, bytes], index: int, raw: bytes) -> bytes:
    """``entries`` with array ``index`` replaced by ``raw`` and its digest made to match."""
    entries = dict(entries)
    entries[f"arr_{index}.npy"] = raw
    meta = json.loads(entries[META])
    meta["sha256"][index] = hashlib.sha256(raw).hexdigest()
    entries[META] = json.dumps(meta).encode()
    return rezip(entries)


def npy_header(shape: tuple, descr: str = "<f8", fortran: bool = False) -> bytes:
    header = repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode()
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


def metadata_mutants(meta: dict) -> list[tuple[str, str | bytes]]:
    """Metadata a loader must refuse: wrong types, wrong shapes of the schema, deep nesting."""
    def edit(**changes):
        m = json.loads(json.dumps(meta))
        m.update(changes)
        return json.dumps(m)

    def drop(key):
        m = json.loads(json.dumps(meta))
        del m[key]
        return json.dumps(m)

    t = {"__tensor__": 0, "requires_grad": False}
    cases = [
        ("metadata is a list", "[1]"), ("metadata is null", "null"), ("metadata is a string", '"x"'),
        ("sha256 is a number", edit(sha256=5)), ("sha256 entries are numbers", edit(sha256=[1, 2])),
        ("sha256 is missing", drop("sha256")), ("tree is missing", drop("tree")),
        ("format is missing", drop("format")), ("version is true", edit(version=True)),
        ("version is 1.0", edit(version=1.0)), ("version is a string", edit(version="1")),
        ("an extra top-level key", edit(extra=1)),
        ("tensor index -1", edit(tree={"__tensor__": -1, "requires_grad": False})),
        ("tensor index true", edit(tree={"__tensor__": True, "requires_grad": False})),
        ("tensor index 1.0", edit(tree={"__tensor__": 0.0, "requires_grad": False})),
        ("tensor index out of range", edit(tree={"__tensor__": 10**6, "requires_grad": False})),
        ("tensor index a string", edit(tree={"__tensor__": "0", "requires_grad": False})),
        ("requires_grad is a string", edit(tree={"__tensor__": 0, "requires_grad": "no"})),
        ("requires_grad is missing", edit(tree={"__tensor__": 0})),
        ("requires_grad on an int16 array", edit(tree={**meta["tree"], "__dict__": [
            [k, {"__tensor__": v["__ndarray__"], "requires_grad": True} if isinstance(v, dict) and "__ndarray__" in v
             else v] for k, v in meta["tree"]["__dict__"]]})),
        ("tensor with an extra key", edit(tree={**t, "x": 1})),
        ("ndarray index -1", edit(tree={"__ndarray__": -1})),
        ("ndarray index a list", edit(tree={"__ndarray__": [0]})),
        ("tuple of a string", edit(tree={"__tuple__": "abc"})),
        ("tuple of a dict", edit(tree={"__tuple__": {"a": 1}})),
        ("dict of a string", edit(tree={"__dict__": "ab"})),
        ("dict pairs of three", edit(tree={"__dict__": [[1, 2, 3]]})),
        ("dict pair a string", edit(tree={"__dict__": ["ab"]})),
        ("dict key a list", edit(tree={"__dict__": [[[1], 2]]})),
        ("dict key a dict", edit(tree={"__dict__": [[{"__dict__": []}, 2]]})),
        ("plain dict node", edit(tree={"a": 1})),
        ("two markers in one node", edit(tree={"__tuple__": [], "__dict__": []})),
        ("array used twice", edit(tree=[t, t])),
        ("array never used", edit(tree=None)),
        ("100k nested lists", '{"format": "minigrad-checkpoint", "version": 1, "sha256": [], "tree": '
         + "[" * 100_000 + "]" * 100_000 + "}"),
        ("100k nested tuples", edit(tree=None).replace('"tree": null', '"tree": ' + '{"__tuple__": [' * 3000
                                                                     + "]}" * 3000)),
        ("not JSON", "{"), ("not UTF-8", b"\xff\xfe{}"),
        ("a huge integer", edit(tree=None).replace('"tree": null', '"tree": ' + "9" * 5000)),
        ("NaN literal version", edit(tree=None).replace('"version": 1', '"version": NaN')),
    ]
    return cases


def mutants(valid: bytes, seed: int = 0, flips: int = 150, cuts: int = 60):
    """Yield ``(what, data)``: damaged or hostile variants of the checkpoint ``valid``."""
    rng = random.Random(seed)
    entries = members(valid)
    meta = json.loads(entries[META])
    for _ in range(flips):
        data = bytearray(valid)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        yield "flipped bits", bytes(data)
    for _ in range(cuts):
        yield "truncated", valid[: rng.randrange(len(valid))]
    yield "empty file", b""
    # zip headers: every field of every local and central header, set to hostile values
    for sig, fields in ((b"PK\x03\x04", (6, 8, 18, 22, 26, 28)), (b"PK\x01\x02", (8, 10, 20, 24, 28, 30, 42))):
        pos = valid.find(sig)
        while pos >= 0:
            for off in fields:
                for value in (0, 1, 0xFFFF, 0xFFFFFFFF, 99, 12):
                    data = bytearray(valid)
                    width = 4 if off in (18, 22, 20, 24, 42) else 2
                    if pos + off + width <= len(data):
                        data[pos + off:pos + off + width] = value.to_bytes(8, "little")[:width]
                        yield f"zip header {sig[2:4].hex()}+{off}={value}", bytes(data)
            pos = valid.find(sig, pos + 4)
    for what, text in metadata_mutants(meta):
        yield f"metadata: {what}", with_meta(entries, text)
    yield "metadata: digest of another array", with_meta(entries, json.dumps(
        {**meta, "sha256": meta["sha256"][::-1]}), fix_digests=False)
    # .npy headers with correct digests: only the header can tell
    first = entries["arr_0.npy"]
    for what, raw in [
        ("shape 2**40", npy_header((2**40,)) + b"\0" * 64),
        ("shape (2**31, 2**31)", npy_header((2**31, 2**31)) + b"\0" * 64),
        ("negative shape", npy_header((-1,)) + b"\0" * 8),
        ("shape larger than data", npy_header((100,)) + b"\0" * 64),
        ("shape smaller than data", npy_header((1,)) + b"\0" * 64),
        ("object dtype", npy_header((1,), "|O") + b"\0" * 8),
        ("unknown dtype", npy_header((1,), "<q99") + b"\0" * 8),
        ("header not a dict", b"\x93NUMPY\x01\x00\x06\x00[1,2]\n"),
        ("header of 60k spaces", b"\x93NUMPY\x01\x00" + struct.pack("<H", 60000) + b" " * 59999 + b"\n"),
        ("no magic", b"garbage" + first),
        ("truncated header", first[:12]),
        ("version 9", first[:6] + b"\x09" + first[7:]),
    ]:
        yield f"npy: {what}", with_array(entries, 0, raw)
    # members: missing, extra, compressed, encrypted
    names = sorted(entries)
    yield "missing array member", rezip({n: b for n, b in entries.items() if n != "arr_0.npy"})
    yield "extra member", rezip({**entries, "evil.py": b"import os"})
    yield "deflated members", rezip(entries, zipfile.ZIP_DEFLATED)
    yield "encrypted flag", _set_flag(rezip(entries), 0x1)
    yield "lzma method", _set_method(rezip(entries), 14)
    yield "member path traversal", rezip({("../" + n if n == names[0] else n): b for n, b in entries.items()})
    yield from bombs(entries, meta)


def bombs(entries: dict[str, bytes], meta: dict, size: int = 16 << 20):
    """Small files that expand to ``size`` bytes: a deflated array of zeros, deflated metadata."""
    zeros = np.lib.format.header_data_from_array_1_0(np.zeros(size // 8))
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, zeros)
    raw = header.getvalue() + b"\0" * (size - len(header.getvalue()))
    e = dict(entries)
    e["arr_0.npy"] = raw
    m = dict(meta, sha256=list(meta["sha256"]))
    m["sha256"][0] = "0" * 64  # wrong digest: must be refused before the member is read
    e[META] = json.dumps(m).encode()
    yield "zip bomb: deflated zeros array", rezip(e, zipfile.ZIP_DEFLATED)
    e = dict(entries)
    e[META] = json.dumps(meta).encode() + b" " * size
    yield "zip bomb: deflated metadata of spaces", rezip(e, zipfile.ZIP_DEFLATED)


def _set_flag(data: bytes, bit: int) -> bytes:
    data = bytearray(data)
    for sig, off in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        pos = data.find(sig)
        while pos >= 0:
            data[pos + off] |= bit
            pos = data.find(sig, pos + 4)
    return bytes(data)


def _set_method(data: bytes, method: int) -> bytes:
    data = bytearray(data)
    for sig, off in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        pos = data.find(sig)
        while pos >= 0:
            data[pos + off:pos + off + 2] = method.to_bytes(2, "little")
            pos = data.find(sig, pos + 4)
    return bytes(data)
