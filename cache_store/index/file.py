"""The vector index file: a checksummed container around the labels and the exact vectors or hnswlib graph.

On-disk format (one file, replaced atomically): 8-byte magic, little-endian u64 header length, a UTF-8 JSON
header, then sections whose byte lengths and CRC32s the header records: the live labels (<i8), then either the
row-major vectors (<f4, exact backend) or the bytes hnswlib's ``save_index`` wrote (hnsw backend). No pickle.
An hnsw graph is parsed and checked (hnsw_check) before hnswlib ever sees it.
"""
from __future__ import annotations

import json
import os
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .backends import _as_unit_rows, _Exact, _Hnsw
from .hnsw_check import HnswFormatError, check_hnsw_graph

FORMAT_NAME = "chai-vector-index"
FORMAT_VERSION = 1
_MAGIC = b"CHAIVIDX"
_U64 = struct.Struct("<Q")
_MAX_HEADER = 1 << 20
_CHUNK = 1 << 22


class IndexLoadError(RuntimeError):
    """A saved index is missing, truncated, corrupt or does not match the requested dimension or format."""


def _temp_path(path: Path, suffix: str) -> Path:
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix + ".tmp", dir=path.parent)
    os.close(fd)
    return Path(name)


def _write_container(path: Path, header: dict[str, Any], label_bytes: bytes, payload: bytes | Path) -> None:
    """Write magic, header and the two sections to a temp file, fsync it, then rename it over ``path``."""
    if isinstance(payload, Path):
        with open(payload, "rb") as src:
            crc, size = 0, 0
            while chunk := src.read(_CHUNK):
                crc, size = zlib.crc32(chunk, crc), size + len(chunk)
    else:
        crc, size = zlib.crc32(payload), len(payload)
    header = dict(header, sections=[
        {"name": "labels", "bytes": len(label_bytes), "crc32": zlib.crc32(label_bytes)},
        {"name": header["backend"], "bytes": size, "crc32": crc},
    ])
    head = json.dumps(header, sort_keys=True).encode("utf-8")
    tmp = _temp_path(path, "")
    try:
        with open(tmp, "wb") as out:
            out.write(_MAGIC + _U64.pack(len(head)) + head + label_bytes)
            if isinstance(payload, Path):
                with open(payload, "rb") as src:
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)
            else:
                out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable; not every platform lets a directory be opened
        dfd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _read_container(f: BinaryIO, path: Path) -> tuple[dict[str, Any], list[dict[str, int]]]:
    """Parse and check magic, header and section sizes; return the header and the sections with offsets."""
    lead = f.read(len(_MAGIC) + _U64.size)
    if len(lead) != len(_MAGIC) + _U64.size or lead[: len(_MAGIC)] != _MAGIC:
        raise IndexLoadError(f"{path} is not a CHAI vector index (bad magic or truncated)")
    (head_len,) = _U64.unpack(lead[len(_MAGIC):])
    if head_len > _MAX_HEADER:
        raise IndexLoadError(f"{path} has an implausible header length {head_len}")
    raw = f.read(head_len)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IndexLoadError(f"{path} has an unreadable header: {e}") from e
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise IndexLoadError(f"{path} is not a CHAI vector index")
    if header.get("version") != FORMAT_VERSION:
        raise IndexLoadError(f"{path} has format version {header.get('version')!r}, expected {FORMAT_VERSION}")
    secs = header.get("sections")
    if not isinstance(secs, list) or len(secs) != 2:
        raise IndexLoadError(f"{path} has a malformed section table")
    offset = len(lead) + head_len
    out = []
    for s in secs:
        if not (isinstance(s, dict) and isinstance(s.get("bytes"), int) and isinstance(s.get("crc32"), int)
                and s["bytes"] >= 0):
            raise IndexLoadError(f"{path} has a malformed section table")
        out.append({"offset": offset, "bytes": s["bytes"], "crc32": s["crc32"]})
        offset += s["bytes"]
    size = os.fstat(f.fileno()).st_size
    if size != offset:
        raise IndexLoadError(f"{path} is {size} bytes, its header describes {offset} (truncated or damaged)")
    return header, out


def _read_section(f: BinaryIO, sec: dict[str, int], path: Path) -> bytes:
    f.seek(sec["offset"])
    data = f.read(sec["bytes"])
    if len(data) != sec["bytes"] or zlib.crc32(data) != sec["crc32"]:
        raise IndexLoadError(f"{path}: a section fails its checksum (corrupt file)")
    return data


def _labels_section(f: BinaryIO, sec: dict[str, int], count: int, path: Path) -> np.ndarray:
    if sec["bytes"] != 8 * count:
        raise IndexLoadError(f"{path}: label section does not hold {count} labels")
    labs = np.frombuffer(_read_section(f, sec, path), dtype="<i8").astype(np.int64)
    if labs.size and (labs.min() < 0 or np.unique(labs).size != labs.size):
        raise IndexLoadError(f"{path}: labels are negative or repeated")
    return labs


def _load_exact(f: BinaryIO, sec: dict[str, int], labs: np.ndarray, dim: int, path: Path) -> _Exact:
    if sec["bytes"] != 4 * dim * labs.size:
        raise IndexLoadError(f"{path}: vector section does not hold {labs.size} x {dim} float32")
    vecs = np.frombuffer(_read_section(f, sec, path), dtype="<f4").reshape(labs.size, dim).astype(np.float32)
    if not np.isfinite(vecs).all():
        raise IndexLoadError(f"{path}: stored vectors are not finite")
    impl = _Exact(dim, capacity=max(64, 2 * labs.size))
    if labs.size:
        try:
            impl.add(labs, _as_unit_rows(vecs, dim))
        except ValueError as e:
            raise IndexLoadError(f"{path}: {e}") from e
    return impl


def _load_hnsw(f: BinaryIO, sec: dict[str, int], header: dict[str, Any], labs: np.ndarray,
               idx: Any, path: Path) -> _Hnsw:
    import hnswlib

    element_count = header.get("element_count")
    max_elements = header.get("max_elements")
    if not (isinstance(element_count, int) and isinstance(max_elements, int)
            and labs.size <= element_count <= max_elements <= max(4096, 4 * element_count)):
        raise IndexLoadError(f"{path}: malformed hnsw header")
    graph = _read_section(f, sec, path)
    try:
        count, saved_max, slots = check_hnsw_graph(graph, idx.dim)
    except HnswFormatError as e:
        raise IndexLoadError(f"{path}: hnsw graph refused: {e}") from e
    if count != element_count or saved_max != max_elements:
        raise IndexLoadError(f"{path}: hnsw graph disagrees with its header")
    if np.unique(slots).size != slots.size or not set(labs.tolist()) <= set(slots.tolist()):
        raise IndexLoadError(f"{path}: graph labels are repeated or miss live labels")
    # hnswlib reads only from a path: write the checked graph to a temp file next to the index.
    try:
        tmp = _temp_path(path, ".hnsw")
    except OSError:
        fd, name = tempfile.mkstemp(suffix=".hnsw.tmp")
        os.close(fd)
        tmp = Path(name)
    try:
        tmp.write_bytes(graph)
        index = hnswlib.Index(space="cosine", dim=idx.dim)
        try:
            index.load_index(str(tmp), max_elements=max_elements, allow_replace_deleted=True)
        except (RuntimeError, ValueError, MemoryError) as e:
            raise IndexLoadError(f"{path}: hnswlib cannot read the graph: {e}") from e
    finally:
        tmp.unlink(missing_ok=True)
    if index.dim != idx.dim or index.element_count != element_count:
        raise IndexLoadError(f"{path}: hnsw graph disagrees with its header")
    return _Hnsw(idx.dim, M=idx.M, ef_construction=idx.ef_construction, ef=idx.ef,
                 num_threads=idx.num_threads, index=index, live=labs.tolist())
