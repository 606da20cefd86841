"""A stored entry's entities in the order its prompt names them: how a write keeps it and a lookup reads it back.

The hit decision's subject rule (`decision.subject_shared`) asks for each prompt's first-named main subject. The
store reads a donor's entities by entity id, and entity rows are shared by text across entries, so id order is the
order in which texts were first written to the cache ("a cat chasing a dog" after an entry about a dog lists the
dog first). Every insert keeps the entry's entity texts in mention order in its JSON metadata (`prepare_entry`:
`entries.meta` on both backends, and the latent file's header), beside the prompt vector: no on-disk format
change. An entry without it (written by an older pack) keeps id order, as before.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .prompt_vector import as_mapping

KEY = "entity_order"


def with_order(meta: Mapping[str, Any] | None, texts: Sequence[str]) -> dict[str, Any]:
    """`meta` with the entity texts in mention order added (an order the caller already put there is kept)."""
    out = dict(meta or {})
    out.setdefault(KEY, [str(t) for t in texts])
    return out


def order_of(meta: Any) -> list[str] | None:
    """The entity texts in mention order of an entry's metadata (a JSON text or a mapping), or None when it is
    absent or damaged: the lookup then keeps id order, never fails."""
    meta = as_mapping(meta)
    value = meta.get(KEY) if meta is not None else None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        return None
    return value


def in_mention_order(texts: Sequence[str], order: Sequence[str] | None) -> list[int]:
    """Indices of `texts` sorted by their place in `order`; texts it does not name keep their order, after it."""
    if not order:
        return list(range(len(texts)))
    place = {t: n for n, t in enumerate(order)}
    return sorted(range(len(texts)), key=lambda i: (place.get(texts[i], len(place)), i))


__all__ = ["KEY", "in_mention_order", "order_of", "with_order"]
