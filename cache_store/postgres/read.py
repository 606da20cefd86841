"""Reads of a PostgreSQL cache's entries."""
from __future__ import annotations

import json
from typing import Any, Sequence

from ..types import EntryInfo

# An entry row with its entity phrases (sorted, as the folder backend lists them).
ENTRY_SQL = ("SELECT e.id, e.prompt, e.fingerprint, e.shape, e.dtype, e.nbytes, e.sigmas, e.tensors, e.created, "
             "e.last_used, e.hits, ARRAY(SELECT n.text FROM postings p JOIN entities n ON n.id = p.entity_id "
             "WHERE p.entry_id = e.id ORDER BY n.text) FROM entries e")


def entry_from_row(row: Sequence[Any]) -> EntryInfo | None:
    """EntryInfo of an ENTRY_SQL row (None when a hand-edited row does not parse)."""
    try:
        (entry_id, prompt, fingerprint, shape, dtype, nbytes, sigmas, tensors, created, last_used, hits,
         texts) = row
        return EntryInfo(id=int(entry_id), prompt=prompt, entities=tuple(texts or ()), fingerprint=fingerprint,
                         shape=tuple(json.loads(shape)), dtype=dtype, nbytes=int(nbytes),
                         sigmas=tuple(json.loads(sigmas)), tensors=tuple(json.loads(tensors)),
                         created=float(created), last_used=float(last_used), hits=int(hits),
                         file=f"blob {int(entry_id)}")
    except (TypeError, ValueError):
        return None
