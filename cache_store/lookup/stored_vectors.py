"""The vectors a cache already holds for what a request's entities are: read back instead of recomputed.

Every entity row keeps the vector its embedder made of its identity (`Entity.identity`: its core, else its head;
manifest v2 on), so a request whose entity is the same kind of thing as a stored one can take that vector and
skip the encoder's forward. Rows of an older format (no head) are never read. Works on any backend through the
SQL contract of `lookup.source`.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

# One query per lookup; SQLite allows 32,766 parameters, so a prompt's few phrases never come near it.
MAX_PHRASES = 256


def stored_vectors(src: Any, phrases: Sequence[str], embedder: str, dim: int) -> dict[str, np.ndarray]:
    """{phrase: stored unit vector} for the phrases some stored entity is, when the cache's vectors come from
    `embedder`; the earliest such entity's vector, so the answer does not depend on which rows came later."""
    wanted = sorted({p for p in phrases if p})[:MAX_PHRASES]
    if not wanted or src.stored_embedder() != embedder:
        return {}
    marks = ",".join("?" * len(wanted))
    rows = src.db.query(
        "SELECT core, head, vector FROM entities WHERE id IN ("
        f"SELECT MIN(id) FROM entities WHERE core IN ({marks}) AND head <> '' GROUP BY core) "
        "UNION ALL SELECT core, head, vector FROM entities WHERE id IN ("
        f"SELECT MIN(id) FROM entities WHERE core = '' AND head IN ({marks}) GROUP BY head)",
        wanted + wanted)
    found: dict[str, np.ndarray] = {}
    for core, head, blob in rows:
        blob = bytes(blob)
        if len(blob) != 4 * dim:  # malformed or of another size: embed afresh
            continue
        vec = np.frombuffer(blob, dtype=np.float32)
        if not np.all(np.isfinite(vec)) or abs(float(vec @ vec) - 1.0) > 1e-3:
            continue
        found[core or head] = vec
    return found


def with_stored(phrases: Sequence[str], known: dict[str, np.ndarray],
                embed: Callable[[list[str]], np.ndarray]) -> np.ndarray:
    """One vector per phrase: the stored one where the cache holds it, else `embed`'s (each new phrase once)."""
    vectors = dict(known)
    fresh = [p for p in dict.fromkeys(phrases) if p not in vectors]
    if fresh:
        vectors.update(zip(fresh, embed(fresh)))
    return np.stack([vectors[p] for p in phrases])
