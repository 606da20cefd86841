"""The change log of a PostgreSQL cache: what a worker's IndexKeeper reads from the server."""
from __future__ import annotations

from typing import Any, Sequence

from ..index.keeper import LogHead
from ..index.points import EntityPoints, points_of
from .db import PgDb

FULL_READ_MIN_S, FULL_READ_FACTOR = 60.0, 12  # the time limit of reading every entity vector
# The head, with the mark of the row at log_seq: a worker tells by it that the log still holds its history.
_HEAD = ("SELECT generation, index_epoch, dim, embedder, (SELECT MIN(seq) FROM index_log), log_seq, "
         "(SELECT mark FROM index_log WHERE seq = state.log_seq) FROM state WHERE id = 1")


def _head(row: Sequence[Any]) -> LogHead:
    generation, epoch, dim, embedder, first, last, mark = row
    return LogHead(int(generation), int(epoch), int(dim) if dim and int(dim) > 0 else None, embedder,
                   None if first is None else int(first), int(last), mark)


class PgChangeLog:
    """The server's change log as an IndexKeeper reads it (one round trip when nothing changed)."""

    def __init__(self, db: PgDb) -> None:
        self.db = db

    def head(self) -> LogHead:
        return _head(self.db.query(_HEAD)[0])

    def changes(self, since: int, gen: int, epoch: int) -> tuple[LogHead, list[tuple[int, int, str]] | None]:
        head = self.head()
        if head.generation == gen and head.epoch == epoch:
            return head, None
        with self.db.read() as cur:
            cur.execute(_HEAD)
            head = _head(cur.fetchone())
            cur.execute("SELECT seq, entity_id, op FROM index_log WHERE seq > %s ORDER BY seq", (since,))
            return head, [(int(s), int(e), str(o)) for s, e, o in cur.fetchall()]

    def mark_at(self, seq: int) -> str | None:
        """The mark of the log row at `seq` (None: no such row, or seq 0)."""
        rows = self.db.query("SELECT mark FROM index_log WHERE seq = ?", (int(seq),)) if seq > 0 else []
        return str(rows[0][0]) if rows else None

    def entity_points(self, ids: Sequence[int] | None = None) -> EntityPoints:
        dim = self.head().dim or 0
        limit = self.db.timeout_s
        if ids is None and limit is not None:  # every vector (a rebuild): 100,000 of them are 150 MB
            limit = max(FULL_READ_MIN_S, FULL_READ_FACTOR * limit)
        with self.db.limited(limit), self.db.transaction(readonly=True, binary=True) as cur:
            if ids is None:
                cur.execute("SELECT id, vector, core, head FROM entities ORDER BY id")
            else:
                cur.execute("SELECT id, vector, core, head FROM entities WHERE id = ANY(%s) ORDER BY id",
                            ([int(i) for i in ids],))
            rows = cur.fetchall()
        return points_of(rows, dim)
