"""The change log of a cache folder: what an IndexKeeper reads from the SQLite manifest."""
from __future__ import annotations

from typing import Any, Sequence

from ..index.keeper import LogHead
from ..index.points import EntityPoints
from .manifest import Manifest


class ManifestLog:
    """The ChangeLog of an SQLite manifest (its meta counters and index_log table)."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest

    @staticmethod
    def _head(cur: Any) -> LogHead:
        meta = dict(cur.execute("SELECT key, value FROM meta WHERE key IN "
                                "('generation', 'index_epoch', 'dim', 'embedder')").fetchall())
        # Two scalar subqueries: SQLite answers a lone MIN or MAX from the primary key's b-tree, but MIN and MAX
        # in one SELECT scan the whole log (52k rows at 100k entries: most of a lookup's index stage).
        first, last = cur.execute("SELECT (SELECT MIN(seq) FROM index_log), "
                                  "(SELECT COALESCE(MAX(seq), 0) FROM index_log)").fetchone()
        dim = meta.get("dim")
        return LogHead(int(meta.get("generation", 0)), int(meta.get("index_epoch", 0) or 0),
                       int(dim) if dim and dim.isdigit() and int(dim) > 0 else None, meta.get("embedder"),
                       first, int(last))

    def head(self) -> LogHead:
        with self.manifest.read() as cur:
            return self._head(cur)

    def changes(self, since: int, gen: int, epoch: int) -> tuple[LogHead, list[tuple[int, int, str]] | None]:
        with self.manifest.read() as cur:
            meta = dict(cur.execute("SELECT key, value FROM meta WHERE key IN "
                                    "('generation', 'index_epoch')").fetchall())
            if int(meta.get("generation", 0)) == gen and int(meta.get("index_epoch", 0) or 0) == epoch:
                return self._head(cur), None
            rows = cur.execute("SELECT seq, entity_id, op FROM index_log WHERE seq > ? ORDER BY seq",
                               (since,)).fetchall()
            return self._head(cur), [(int(r[0]), int(r[1]), str(r[2])) for r in rows]

    def mark_at(self, seq: int) -> str | None:
        return None  # a folder's log is its own manifest: its rows carry no marks

    def entity_points(self, ids: Sequence[int] | None = None) -> EntityPoints:
        return self.manifest.entity_points(ids)
