"""A stored entry's whole-prompt vector: how a write keeps it in the entry's metadata and a lookup reads it back.

The hit decision asks how central the request's entities are to a donor's whole prompt (`decision.FEATURES`'s
`donor_prompt_best`): "ocean" is what "a dolphin jumping in the ocean at sunset" is about far less than what "a calm
ocean at dawn" is. The vector is embedded once, when the entry is written, so a lookup pays no encoder forward for
it. It rides in the entry's JSON metadata (`entries.meta`, and the latent file's header, which a lost manifest is
rebuilt from), as float16 bytes in base64 tagged with the embedder's identity: no on-disk format change, and packs
that do not know the key ignore it. Entries written without it (older packs, other writers) are decided by the
model fitted without the feature.
"""
from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

KEY = "prompt_vector"


def encoded(vector: Any, embedder: str) -> dict[str, str]:
    """The metadata value for one unit prompt vector of `embedder`."""
    data = np.asarray(vector, dtype=np.float32).reshape(-1).astype("<f2").tobytes()
    return {"embedder": embedder, "f16": base64.b64encode(data).decode("ascii")}


def with_prompt_vector(meta: Mapping[str, Any] | None, vector: Any, embedder: str) -> dict[str, Any]:
    """`meta` with the prompt vector added (a vector the caller already put there is kept)."""
    out = dict(meta or {})
    out.setdefault(KEY, encoded(vector, embedder))
    return out


def as_mapping(meta: Any) -> Mapping[str, Any] | None:
    """An entry's metadata as a mapping (from a JSON text or a mapping), or None when it is neither or damaged."""
    if isinstance(meta, (str, bytes)):
        try:
            meta = json.loads(meta)
        except ValueError:
            return None
    return meta if isinstance(meta, Mapping) else None


def decoded(meta: Any, embedder: str, dim: int) -> np.ndarray | None:
    """The unit prompt vector in an entry's metadata (a JSON text or a mapping), or None when it is absent, of
    another embedder or dimension, or damaged: a lookup then decides without it, never fails."""
    meta = as_mapping(meta)
    value = meta.get(KEY) if meta is not None else None
    if not isinstance(value, Mapping) or value.get("embedder") != embedder or not isinstance(value.get("f16"), str):
        return None
    try:
        raw = base64.b64decode(value["f16"], validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) != 2 * dim:
        return None
    vector = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    norm = float(np.linalg.norm(vector))
    if not np.isfinite(norm) or norm < 1e-6:
        return None
    return vector / norm


def as_stored(vector: Any) -> np.ndarray | None:
    """The vector as a lookup reads it back from an entry (float16, renormalised): what the benches feed the
    decision."""
    array = np.asarray(vector, dtype=np.float32).reshape(-1)
    return decoded(with_prompt_vector(None, array, "-"), "-", len(array))


__all__ = ["KEY", "as_mapping", "as_stored", "decoded", "encoded", "with_prompt_vector"]
