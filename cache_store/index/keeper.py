"""The in-memory entity index of one process, kept in step with a change log of entity additions and deletions.

The log is the cache's own (the SQLite manifest's index_log, or the PostgreSQL server's): the index is derived
state, caught up by sequence number before each lookup, rebuilt when the log no longer reaches back to it, and
persisted locally so a restart replays only what changed since the last save.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from .. import latents as lat
from .. import regular_files
from ..validate import UNIT_TOLERANCE
from .points import Edit, EntityPoints, PointMap
from .vector_index import IndexLoadError, VectorIndex

log = logging.getLogger(__name__)

INDEX_STATE = "state.json"


def usable_points(points: EntityPoints) -> EntityPoints:
    """Only finite unit rows: a bad vector in an old manifest must not stop the index from loading."""
    if not len(points):
        return points
    vectors = points.vectors
    ok = np.isfinite(vectors).all(axis=1)
    ok &= np.abs(np.linalg.norm(np.where(ok[:, None], vectors, 0), axis=1) - 1.0) <= UNIT_TOLERANCE
    if ok.all():
        return points
    log.warning("[CHAI] %d entity vector(s) in the manifest are not finite unit vectors; they are not "
                "searchable (repair drops them)", int((~ok).sum()))
    return points.subset(ok)


@dataclass(frozen=True)
class LogHead:
    """Where a cache's change log stands: generation, index epoch, vector dim (None while empty), log bounds."""

    generation: int
    epoch: int
    dim: int | None
    embedder: str | None
    first: int | None  # oldest sequence number still kept (None: empty log)
    last: int          # newest sequence number (0: nothing logged yet)
    mark: str | None = None  # the random mark of the row at `last` (PostgreSQL; None where the log has none)


class ChangeLog(Protocol):
    """What an IndexKeeper reads from its cache (the SQLite manifest or the PostgreSQL server)."""

    def head(self) -> LogHead:
        """The log's current position."""

    def changes(self, since: int, gen: int, epoch: int) -> tuple[LogHead, list[tuple[int, int, str]] | None]:
        """The head and, unless generation and epoch are unchanged, the (seq, entity id, op) rows after `since`,
        read in one snapshot."""

    def mark_at(self, seq: int) -> str | None:
        """The mark of the log row at `seq`, or None (no such row, or a log without marks)."""

    def entity_points(self, ids: Sequence[int] | None = None) -> EntityPoints:
        """Ids, vectors and identities of all entities, or of the given ids, in one snapshot."""


RECONCILE_FRACTION = 0.25  # a saved index further than this from the cache's points is rebuilt, not patched


class IndexKeeper:
    """Loads, replays, rebuilds and saves one cache's VectorIndex (the change log's cache is the truth); its points
    are the cache's identities (`points.PointMap`)."""

    def __init__(self, log: ChangeLog, index_dir: Path, index_kwargs: Mapping[str, Any]) -> None:
        self.log = log
        self.index_dir = index_dir
        self._kwargs = dict(index_kwargs)
        self.lock = threading.RLock()
        self.index: VectorIndex | None = None
        self.points = PointMap()
        self.seq, self.epoch, self.gen = 0, -1, -1
        self.mark: str | None = None  # mark of the log row at self.seq: the history this index was built from
        self.unsaved = 0
        self.last_save = time.monotonic()
        self.resets = 0  # loads and rebuilds: state derived from the cache (held postings) is dropped when it moves

    def load(self) -> None:
        """Load the persisted index if it checks out against the log, else rebuild it from the log's cache."""
        with self.lock:
            self.resets += 1
            head = self.log.head()
            self.index, self.seq, self.epoch, self.gen, self.mark = None, 0, head.epoch, -1, None
            self.points = PointMap()
            if head.dim is None:
                return
            try:
                self._load_saved(head)
            except (OSError, ValueError, KeyError, TypeError, IndexLoadError) as exc:
                log.info("[CHAI] rebuilding the entity index from the manifest (%s)", exc)
                self.rebuild()

    def _load_saved(self, head: LogHead) -> None:
        state = json.loads(regular_files.read_text(self.index_dir / INDEX_STATE))
        if state["epoch"] != head.epoch or state["dim"] != head.dim or state["embedder"] != head.embedder:
            raise IndexLoadError("index state belongs to another epoch or embedder")
        if not isinstance(state["seq"], int) or not 0 <= state["seq"] <= head.last:
            raise IndexLoadError("index state is ahead of the manifest (the manifest went back in time)")
        if head.first is not None and head.first > state["seq"] + 1 and state["seq"] > 0:
            raise IndexLoadError("the change log was truncated past the saved index")
        name = state["file"]
        if not lat.is_leaf_name(name) or name.startswith("."):
            raise IndexLoadError("invalid index file name")
        if self.log.mark_at(state["seq"]) != state.get("mark"):
            raise IndexLoadError("the cache is not the one this index was built from (restored from a backup or "
                                 "failed over): its change log differs at the saved position")
        why = regular_files.refusal(self.index_dir / name)
        if why:
            raise IndexLoadError(why)
        if head.dim is None:  # load() only gets here with vectors in the log
            raise IndexLoadError("the change log holds no vectors to index")
        index = VectorIndex.load(self.index_dir / name, head.dim, **self._kwargs)
        # The cache as it is now (read after `head`, so replaying the log from there only repeats what it holds),
        # and the saved points patched to it when they are close: other processes wrote since the save.
        points = PointMap()
        pts = usable_points(self.log.entity_points())
        points.add(pts)
        saved, wanted = set(index.labels().tolist()), points.labels()
        stale, missing = saved - wanted, wanted - saved
        if len(stale) + len(missing) > RECONCILE_FRACTION * max(len(wanted), 1):
            raise IndexLoadError("index labels disagree with the manifest's entities")
        if stale:
            index.remove(sorted(stale))
        if missing:
            rows = np.isin(pts.ids, np.fromiter(missing, np.int64, len(missing)))
            index.add(pts.ids[rows], pts.vectors[rows])
        self.index, self.points = index, points
        self.seq, self.mark, self.epoch, self.gen = head.last, head.mark, head.epoch, head.generation
        self.unsaved = len(stale) + len(missing)

    def rebuild(self) -> None:
        """A fresh index of every usable entity vector in the cache."""
        with self.lock:
            self.resets += 1
            head = self.log.head()
            if head.dim is None:
                self.index = None
                self.points = PointMap()
                self.gen, self.epoch = head.generation, head.epoch
                return
            points = PointMap()
            edit = points.add(usable_points(self.log.entity_points()))
            index = VectorIndex(head.dim, **self._kwargs)
            self._apply(index, edit, head.dim)
            self.index, self.points, self.seq, self.mark = index, points, head.last, head.mark
            self.epoch, self.gen = head.epoch, head.generation
            self.unsaved = len(points)

    @staticmethod
    def _apply(index: VectorIndex, edit: Edit, dim: int) -> None:
        if edit.removed:
            index.remove(edit.removed)
        labels, vectors = edit.arrays(dim)
        if len(labels):
            index.add(labels, vectors)

    def sync(self, force: bool = False) -> None:
        """Apply entity additions and deletions other processes (or this one) logged since the last sync."""
        with self.lock:
            head, rows = self.log.changes(self.seq, -1 if force else self.gen, self.epoch)
            if rows is None:
                if head.last == self.seq and head.mark == self.mark:
                    return
                head, forced = self.log.changes(self.seq, -1, self.epoch)  # same counters, another history
                rows = forced or []
            if head.dim is None:
                self.index, self.gen, self.epoch, self.mark = None, head.generation, head.epoch, None
                return
            lagging = head.first is not None and head.first > self.seq + 1 and self.seq > 0
            if self.index is None or head.epoch != self.epoch or lagging or self._diverged(head):
                self.rebuild()
                return
            final = {entity_id: op for _, entity_id, op in rows}
            removed = [eid for eid, op in final.items() if op == "del"]
            added = [eid for eid, op in final.items() if op == "add"]
            if removed:
                self._apply(self.index, self.points.remove(removed), head.dim)
            if added:
                self._apply(self.index, self.points.add(usable_points(self.log.entity_points(added))), head.dim)
            if rows:
                self.seq = rows[-1][0]
                self.mark = head.mark if self.seq == head.last else self.log.mark_at(self.seq)
            self.unsaved += len(rows)
            self.gen = head.generation

    def _diverged(self, head: LogHead) -> bool:
        """True when the log no longer holds the history this index reflects: it went back (a schema restored
        from a backup, a primary promoted from a lagging replica), or the row at our position is another one."""
        if head.last < self.seq:
            log.warning("[CHAI] the cache's change log went back from %d to %d (restored or failed over): "
                        "rebuilding the entity index", self.seq, head.last)
            return True
        mark = head.mark if head.last == self.seq else self.log.mark_at(self.seq)
        if mark != self.mark:
            log.warning("[CHAI] the cache's change log differs at position %d (restored or failed over): "
                        "rebuilding the entity index", self.seq)
            return True
        return False

    def save(self) -> None:
        """Persist the index with the log position it reflects (writer lock held)."""
        with self.lock:
            head = self.log.head()
            if self.index is None or head.dim is None:
                return
            name = f"entities-{self.epoch}-{self.seq}.idx"
            self.index_dir.mkdir(parents=True, exist_ok=True)
            self.index.save(self.index_dir / name)
            state = {"file": name, "seq": self.seq, "epoch": self.epoch, "dim": head.dim,
                     "embedder": head.embedder, "mark": self.mark}
            lat.write_atomic(self.index_dir, INDEX_STATE, json.dumps(state).encode())
            for old in self.index_dir.iterdir():
                if old.name.startswith("entities-") and old.name != name:
                    lat.remove_files(self.index_dir, [old.name])
            self.unsaved = 0
            self.last_save = time.monotonic()

    def query(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The points among each query's k nearest stored texts, as (labels, similarities), or None while the
        index is empty; a label stands for every entity of its identity."""
        with self.lock:
            if self.index is None or len(self.index) == 0:
                return None
            labels, sims = self.index.query(vectors, min(k, len(self.index)))
            return self.points.nearest_texts(labels, sims, k)
