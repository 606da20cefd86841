"""Checks every entry passes before it is committed, whether it comes from an insert or from a file on disk.

Anything committed must keep open, lookup, verify and repair working, so the same rules apply to a new insert
and to a latent file adopted into the manifest: unit-norm finite entity vectors, finite float latents of one
shape and dtype (read from the tensors themselves), finite sigmas, UTF-8 encodable texts of bounded size.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping, Sequence

import numpy as np

from . import regular_files
from .entities.roles import ROLES
from .errors import EmbedderMismatchError, InvalidEntryError

UNIT_TOLERANCE = 1e-3
MAX_TEXT = 100_000       # characters of a prompt
MAX_ENTITY_TEXT = 500
MAX_ENTITIES = 256
MAX_TENSORS = 64
MAX_NDIM = 8
MAX_SIGMAS = 1000
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class EntryRecord:
    """Everything the manifest stores about one entry, validated."""

    prompt: str
    entities: tuple[tuple[str, str, str, str, str], ...]   # (text, kind, role, head, core)
    vectors: np.ndarray                     # (n, dim) float32, unit rows
    embedder: str
    fingerprint: str
    shape: tuple[int, ...]
    dtype: str
    sigmas: tuple[float, ...]
    tensors: tuple[str, ...]
    extra: Mapping[str, Any] = field(default_factory=dict)


def check_text(value: object, what: str, limit: int, empty_ok: bool = False) -> str:
    """A (non-empty unless `empty_ok`), UTF-8 encodable string of at most `limit` characters."""
    if not isinstance(value, str) or not (empty_ok or value.strip()):
        raise InvalidEntryError(f"{what} must be a non-empty string")
    if len(value) > limit:
        raise InvalidEntryError(f"{what} is longer than {limit} characters")
    if "\0" in value:  # texts a user typed arrive escaped (naming.encodable_text); this is a name or an id
        raise InvalidEntryError(f"{what} holds a NUL character, which no backend can store alike; remove it")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidEntryError(f"{what} is not valid Unicode (a lone surrogate at position {exc.start})") from exc
    return value


def check_vectors(vectors: Any, n: int, dim: int | None = None) -> np.ndarray:
    """(n, dim) float32 rows, each finite with unit length (an all-zero row has no direction)."""
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim != 2 or arr.shape[0] != n or arr.shape[1] < 1 or (dim is not None and arr.shape[1] != dim):
        want = f"({n}, {dim if dim is not None else 'dim'})"
        raise InvalidEntryError(f"entity vectors have shape {tuple(arr.shape)}, expected {want}")
    if not np.isfinite(arr).all():
        raise InvalidEntryError("entity vectors contain NaN or infinity")
    norms = np.linalg.norm(arr, axis=1)
    if (np.abs(norms - 1.0) > UNIT_TOLERANCE).any():
        raise InvalidEntryError(f"entity vectors are not unit length (norms {norms.min():.3g}-{norms.max():.3g})")
    return np.ascontiguousarray(arr)


def check_entities(entities: Sequence[Sequence[str]]) -> tuple[tuple[str, str, str, str, str], ...]:
    """1..MAX_ENTITIES (text, kind[, role, head, core]) rows of bounded, encodable text; a row without a role
    (an entry written before roles existed) may carry a hit as before ("main")."""
    if not 0 < len(entities) <= MAX_ENTITIES:
        raise InvalidEntryError(f"an entry needs 1-{MAX_ENTITIES} entities, got {len(entities)}")
    rows = []
    for row in entities:
        if not isinstance(row, (tuple, list)) or not 2 <= len(row) <= 5:
            raise InvalidEntryError(f"an entity row must be (text, kind, role, head, core), got {row!r}")
        text, kind, role, head, core = [*row] + [None] * (5 - len(row))
        text = check_text(text, "entity text", MAX_ENTITY_TEXT)
        role = "main" if role is None else role
        if role not in ROLES:
            raise InvalidEntryError(f"entity role must be one of {', '.join(ROLES)}, got {role!r}")
        rows.append((text, check_text(kind, "entity kind", 64), role,
                     check_text(head or "", "entity head", MAX_ENTITY_TEXT, empty_ok=True),
                     check_text(core or "", "entity core", MAX_ENTITY_TEXT, empty_ok=True)))
    return tuple(rows)


def check_sigmas(sigmas: Sequence[Any]) -> tuple[float, ...]:
    """Finite noise levels."""
    try:
        out = tuple(float(s) for s in sigmas)
    except (TypeError, ValueError) as exc:
        raise InvalidEntryError(f"sigmas must be numbers: {exc}") from exc
    if len(out) > MAX_SIGMAS or not all(math.isfinite(s) for s in out):
        raise InvalidEntryError("sigmas must be at most 1000 finite numbers")
    return out


def _finite(tensor: Any, dtype: str) -> bool:
    """Whether every value is finite: through numpy where it has the dtype (a torch call costs about 25 us of
    dispatch, most of a lookup's check on small latents), else through torch."""
    if dtype != "bfloat16" and getattr(tensor, "device", None) is not None and tensor.device.type == "cpu":
        try:
            return bool(np.isfinite(tensor.detach().numpy()).all())
        except (TypeError, RuntimeError):  # a tensor numpy cannot view (conjugated, a subclass)
            pass
    return bool(tensor.isfinite().all())


def check_latents(tensors: Mapping[str, Any], shape: Sequence[int] | None = None) -> tuple[tuple[int, ...], str]:
    """The common (shape, dtype) of finite float latent tensors with valid names."""
    if not 0 < len(tensors) <= MAX_TENSORS:
        raise InvalidEntryError(f"an entry needs 1-{MAX_TENSORS} latent tensors, got {len(tensors)}")
    seen: set[tuple[tuple[int, ...], str]] = set()
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not name or len(name) > 128 or name.startswith("chai."):
            raise InvalidEntryError(f"invalid latent tensor name {name!r} (1-128 characters, not 'chai.*')")
        dims = tuple(int(s) for s in tensor.shape)
        dtype = str(tensor.dtype).replace("torch.", "")
        if dtype not in FLOAT_DTYPES or not 0 < len(dims) <= MAX_NDIM or min(dims) < 1:
            raise InvalidEntryError(f"latent {name!r} is {dtype} of shape {dims}: need a non-empty float tensor")
        if not _finite(tensor, dtype):
            raise InvalidEntryError(f"latent {name!r} contains NaN or infinity")
        seen.add((dims, dtype))
    if len(seen) != 1:
        raise InvalidEntryError(f"latent tensors differ in shape or dtype: {sorted(seen)}")
    dims, dtype = seen.pop()
    if shape is not None and tuple(int(s) for s in shape) != dims:
        raise InvalidEntryError(f"latents have shape {dims}, the entry says {tuple(shape)}")
    return dims, dtype


def check_record(prompt: object, entities: Sequence[Sequence[str]], vectors: Any, embedder: object,
                 fingerprint: object, tensors: Mapping[str, Any], sigmas: Sequence[Any],
                 shape: Sequence[int] | None = None, extra: Mapping[str, Any] | None = None,
                 dim: int | None = None) -> EntryRecord:
    """Validate a whole entry; raise InvalidEntryError naming the first problem."""
    ents = check_entities(entities)
    dims, dtype = check_latents(tensors, shape)
    try:
        extra_json = json.loads(json.dumps(dict(extra or {})))
    except (TypeError, ValueError) as exc:
        raise InvalidEntryError(f"entry metadata is not JSON: {exc}") from exc
    return EntryRecord(
        prompt=check_text(prompt, "prompt", MAX_TEXT, empty_ok=True), entities=ents, vectors=check_vectors(vectors, len(ents), dim),
        embedder=check_text(embedder, "embedder", 256), fingerprint=check_text(fingerprint, "fingerprint", 1024),
        shape=dims, dtype=dtype, sigmas=check_sigmas(sigmas), tensors=tuple(sorted(tensors)), extra=extra_json)


MAX_HEADER = 100_000_000  # bytes of a safetensors JSON header (safetensors' own limit)


def safetensors_head(limit: int | None) -> Callable[[BinaryIO, int], None]:
    """A check of a file's size and safetensors header (8-byte little-endian length, then JSON whose tensors end
    exactly at the end of the file), so that a file no entry could be is refused before it is read whole."""
    def check(fh: BinaryIO, size: int) -> None:
        if limit is not None and size > limit:
            raise InvalidEntryError(f"it is {size} bytes, larger than any entry of this cache can be ({limit})")
        n = int.from_bytes(fh.read(8), "little") if size >= 8 else 0
        if not 2 <= n <= min(size - 8, MAX_HEADER):
            raise InvalidEntryError(f"not a safetensors file (header length {n} in a file of {size} bytes)")
        try:
            header = json.loads(fh.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except Exception as exc:  # json, key and type errors: the same verdict
            raise InvalidEntryError(f"not a safetensors file (unreadable header: {type(exc).__name__})") from exc
        if 8 + n + end != size:
            raise InvalidEntryError(f"its safetensors header describes {8 + n + end} bytes, the file has {size}")
    return check


def read_regular_file(path: Path, limit: int | None = None) -> bytes:
    """Bytes of a regular file, refusing links, folders, FIFOs and devices without blocking (OSError otherwise);
    a file larger than `limit` or without a consistent safetensors header is refused unread (InvalidEntryError)."""
    return regular_files.read_bytes(path, safetensors_head(limit))


def record_from_file(data: bytes, vectors_key: str, file_format: str) -> tuple[EntryRecord, dict[str, Any]]:
    """The validated record a latent file describes, with its tensors; shape and dtype come from the tensors."""
    from safetensors.torch import load

    try:
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + header_len])
        meta = json.loads(header["__metadata__"]["chai"])
        tensors = load(data)
    except Exception as exc:  # safetensors and json raise several types; each is the same verdict
        raise InvalidEntryError(f"not a readable CHAI latent file ({type(exc).__name__}: {exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != file_format:
        raise InvalidEntryError("not a CHAI latent file (metadata format missing or unknown)")
    digest = meta.get("data_sha256")
    if digest is not None and hashlib.sha256(data[8 + header_len:]).hexdigest() != digest:
        raise InvalidEntryError("the tensor bytes fail the checksum the file carries (modified or damaged)")
    vectors = tensors.pop(vectors_key, None)
    if vectors is None:
        raise InvalidEntryError("the file carries no entity vectors")
    raw_ents = meta.get("entities")
    if not isinstance(raw_ents, list) or not all(isinstance(e, dict) for e in raw_ents):
        raise InvalidEntryError("the metadata's entity list is malformed")
    ents = [(e.get("text"), e.get("kind", "object"), e.get("role", "main"), e.get("head", ""), e.get("core", ""))
            for e in raw_ents]
    shape = meta.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) for s in shape):
        raise InvalidEntryError("the metadata's shape is malformed")
    if meta.get("dtype") is not None and tensors:
        actual = str(next(iter(tensors.values())).dtype).replace("torch.", "")
        if meta["dtype"] != actual:
            raise InvalidEntryError(f"the metadata says dtype {meta['dtype']}, the tensors are {actual}")
    sigmas = meta.get("sigmas", [])
    if not isinstance(sigmas, list):
        raise InvalidEntryError("the metadata's sigmas are malformed")
    extra = meta.get("extra", {})
    record = check_record(meta.get("prompt"), ents, vectors.numpy(), meta.get("embedder"), meta.get("fingerprint"),
                          tensors, sigmas, shape=shape, extra=extra if isinstance(extra, dict) else {})
    return record, tensors


def check_embedder(stored: str | None, stored_dim: int | None, record: EntryRecord) -> None:
    """EmbedderMismatchError unless the cache is empty (`stored` None) or holds vectors of this embedder and
    dimension (every backend checks a write with this)."""
    dim = int(record.vectors.shape[1])
    if stored is not None and (stored != record.embedder or (stored_dim is not None and stored_dim != dim)):
        raise EmbedderMismatchError(
            f"this cache holds {stored_dim}-d vectors of embedder {stored!r}; it cannot store {dim}-d vectors of "
            f"{record.embedder!r}. Use the same embedder, or another cache name")
