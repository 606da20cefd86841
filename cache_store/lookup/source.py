"""What a backend hands the shared lookup (lookup/flow.py): its entity index, the entries, and a `db` the ranking
queries run on.

The SQL contract. The ranking (lookup/ranking.py) runs plain SQL on `LookupSource.db`:

- `db.query(sql, params)` returns a list of row tuples; placeholders are `?` (the backend translates them);
- `db.PINNED_JOIN`: the join keyword that keeps the join order as written (SQLite "CROSS JOIN", else "JOIN");
- `db.POSTINGS_SCAN`: the postings table as the ranking joins it, aliased `p` (SQLite pins its primary key);
- `db.ID_LIST`: an aggregate format (`{}` the column) giving a group's integers as one comma-joined text;
- `db.INSTR`: the name of the function giving a substring's position in a text, 0 when absent ("instr", "strpos");
- `WITH ... AS (VALUES (?,?,?), ...)` common table expressions, `EXISTS` subqueries, `GROUP BY`, `LIMIT ?`;
- tables and the columns read:
  `groups(id, fingerprint, shape)`: one row per (model fingerprint, `types.shape_key` of the latent shape);
  `entries(id, prompt, fingerprint, shape, meta)`, `meta` the entry's JSON metadata (the decision reads the
  donor's prompt vector there: `lookup.prompt_vector`); `entities(id, text, kind, head, core, vector)`, `id` being
  the label the entity has in the vector index and `vector` its float32 bytes (read by the decision and
  `stored_vectors`; an index on `(core, head)` keeps the identity queries and the ranking's identity join fast);
  `postings(group_id, entity_id, entry_id, role)`, one row per entity of an entry, `role` one of
  `entities.roles.ROLES`; `WITH ... UNION ALL ...` and `||` string concatenation.

A backend that keeps no SQL would hand the lookup an object that answers these queries (or emulates the tables).
"""
from __future__ import annotations

from typing import Any, Protocol

from ..index.keeper import IndexKeeper
from ..types import EntryInfo
from .posting_cache import PostingCache


class LookupSource(Protocol):
    """What a backend offers the shared lookup (lookup/flow.py)."""

    keeper: IndexKeeper
    postings: PostingCache | None  # the ranking's postings held between lookups; None: SQL ranks every time

    @property
    def db(self) -> Any:
        """The object the ranking queries run on (the SQL contract in this module's docstring)."""

    def stored_embedder(self) -> str | None:
        """The embedder the cache's vectors come from (None while empty)."""

    def entry(self, entry_id: int) -> EntryInfo | None:
        """One entry, or None (gone or malformed)."""

    def read_entry(self, entry: EntryInfo) -> dict[str, Any]:
        """An entry's verified tensors; CacheEntryError when they cannot serve."""

    def touch_best_effort(self, entry: EntryInfo) -> EntryInfo:
        """Refresh recency if possible; the entry as it is now."""

    def set_aside(self, damaged: list[tuple[EntryInfo | int, str]]) -> None:
        """Remove entries that failed to load (and keep their bytes for inspection where the backend can)."""
