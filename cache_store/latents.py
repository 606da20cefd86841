"""Latent files: one safetensors file per entry, written atomically, verified by checksum on read."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any, Mapping

from .errors import CacheEntryError, CacheWriteError, InvalidEntryError
from .validate import EntryRecord, read_regular_file, record_from_file

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
    payload = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    payload[VECTORS_KEY] = torch.as_tensor(entity_vectors, dtype=torch.float32).contiguous()
    # The file vouches for its own tensor bytes (a rebuild without the manifest can then detect a flipped bit):
    # the data section does not depend on the header, so hash it from a first serialisation.
    body = data_section(save(payload, metadata={"chai": "{}"}))
    record = {"format": FILE_FORMAT, **metadata, "data_sha256": hashlib.sha256(body).hexdigest()}
    return save(payload, metadata={"chai": json.dumps(record, sort_keys=True)})


def data_section(data: bytes) -> bytes:
    """The tensor bytes of a safetensors file (everything after its JSON header)."""
    return data[8 + int.from_bytes(data[:8], "little"):]


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


def read_entry_bytes(path: Path) -> bytes:
    """An entry file's bytes; CacheEntryError when it is missing, unreadable or no regular file (a symlink)."""
    try:
        return read_regular_file(path)
    except InvalidEntryError as exc:
        raise CacheEntryError(f"latent file {path.name} is damaged ({exc})") from exc
    except OSError as exc:
        raise CacheEntryError(f"latent file {path.name} is missing, unreadable or not a regular file "
                              f"({exc.strerror or exc})") from exc


def tensors_verified(data: bytes, expected: str, what: str) -> dict[str, Any]:
    """The latent tensors of an entry's bytes after checking their checksum; CacheEntryError naming `what`."""
    from safetensors.torch import load

    if checksum(data) != expected:
        raise CacheEntryError(f"{what} fails its checksum (truncated or modified)")
    try:
        tensors = load(data)
    except Exception as exc:  # safetensors raises its own error types
        raise CacheEntryError(f"{what} is not a valid safetensors file: {exc}") from exc
    tensors.pop(VECTORS_KEY, None)
    return tensors


def read_entry_file(path: Path, limit: int | None = None) -> tuple[EntryRecord, bytes]:
    """The validated record a latent file carries and its bytes; InvalidEntryError or OSError otherwise (a file
    over `limit` bytes, or whose header does not hold, is refused before it is read)."""
    data = read_regular_file(path, limit)
    record, _ = record_from_file(data, VECTORS_KEY, FILE_FORMAT)
    return record, data


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
