"""Latent files: one safetensors file per entry, written atomically, verified by checksum on read."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any, Mapping

from .errors import CacheEntryError, CacheWriteError

FILE_FORMAT = "chai-cache-entry/1"
VECTORS_KEY = "chai.entity_vectors"  # entity vectors travel with the latents so a lost manifest can be rebuilt
TMP_PREFIX = ".tmp-"


def new_entry_file_name() -> str:
    """A fresh random file name for an entry."""
    return uuid.uuid4().hex + ".safetensors"


def checksum(data: bytes) -> str:
    """Checksum recorded in the manifest for a latent file's bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def encode_entry(tensors: Mapping[str, Any], entity_vectors: Any, metadata: Mapping[str, Any]) -> bytes:
    """Serialise latents, the entity vectors and JSON metadata to safetensors bytes."""
    import torch
    from safetensors.torch import save

    if not tensors:
        raise ValueError("an entry needs at least one latent tensor")
    for name in tensors:
        if not isinstance(name, str) or not name or name.startswith("chai."):
            raise ValueError(f"invalid latent tensor name {name!r} (non-empty, not starting with 'chai.')")
    header = {"chai": json.dumps({"format": FILE_FORMAT, **metadata}, sort_keys=True)}
    payload = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    payload[VECTORS_KEY] = torch.as_tensor(entity_vectors, dtype=torch.float32).contiguous()
    return save(payload, metadata=header)


def write_atomic(directory: Path, name: str, data: bytes) -> None:
    """Write `data` to directory/name via a temporary file, fsync and rename; no partial file is ever visible."""
    tmp = directory / f"{TMP_PREFIX}{uuid.uuid4().hex}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, directory / name)
    except OSError as exc:
        _unlink_quiet(tmp)
        hint = "the disk is full; free space or lower the budget" if exc.errno == errno.ENOSPC else str(exc)
        raise CacheWriteError(f"could not write cache entry in {directory}: {hint}; the cache is unchanged") from exc
    fsync_dir(directory)


def fsync_dir(directory: Path) -> None:
    """Make a rename durable (no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_verified(path: Path, expected: str) -> dict[str, Any]:
    """Load an entry's tensors after checking its checksum; raise CacheEntryError otherwise."""
    from safetensors.torch import load

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CacheEntryError(f"latent file {path.name} is missing or unreadable ({exc.strerror})") from exc
    if checksum(data) != expected:
        raise CacheEntryError(f"latent file {path.name} fails its checksum (truncated or modified)")
    try:
        tensors = load(data)
    except Exception as exc:  # safetensors raises its own error types
        raise CacheEntryError(f"latent file {path.name} is not a valid safetensors file: {exc}") from exc
    tensors.pop(VECTORS_KEY, None)
    return tensors


def read_for_recovery(path: Path) -> tuple[dict[str, Any], dict[str, Any], bytes] | None:
    """Tensors, metadata and raw bytes of a file written by this store, or None if it is not one."""
    from safetensors import safe_open
    from safetensors.torch import load

    try:
        data = path.read_bytes()
        with safe_open(str(path), framework="pt") as fh:
            meta = json.loads((fh.metadata() or {}).get("chai", "null"))
        tensors = load(data)
    except Exception:
        return None
    if not isinstance(meta, dict) or meta.get("format") != FILE_FORMAT:
        return None
    return tensors, meta, data


def _unlink_quiet(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def is_leaf_name(name: object) -> bool:
    """True for a bare file name that cannot address anything outside its directory."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and "\0" not in name)


def remove_files(directory: Path, names: list[str]) -> list[str]:
    """Delete files of `directory` by bare name (anything else is ignored); return those that could not go."""
    failed = []
    for name in names:
        if not is_leaf_name(name):
            continue
        try:
            os.unlink(directory / name)
        except FileNotFoundError:
            pass
        except OSError:
            failed.append(name)
    return failed
