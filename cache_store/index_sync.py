"""The in-memory entity index of one process, kept in step with the manifest's index log and persisted."""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from . import latents as lat
from .index import IndexLoadError, VectorIndex
from .manifest import Manifest
from .validate import UNIT_TOLERANCE

log = logging.getLogger(__name__)

INDEX_STATE = "state.json"


def usable_vectors(labels: np.ndarray, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Only finite unit rows: a bad vector in an old manifest must not stop the index from loading."""
    if not len(labels):
        return labels, vectors
    ok = np.isfinite(vectors).all(axis=1)
    ok &= np.abs(np.linalg.norm(np.where(ok[:, None], vectors, 0), axis=1) - 1.0) <= UNIT_TOLERANCE
    if not ok.all():
        log.warning("[CHAI] %d entity vector(s) in the manifest are not finite unit vectors; they are not "
                    "searchable (repair drops them)", int((~ok).sum()))
    return labels[ok], vectors[ok]


class IndexKeeper:
    """Loads, replays, rebuilds and saves one cache's VectorIndex (the manifest is the truth)."""

    def __init__(self, manifest: Manifest, index_dir: Path, index_kwargs: Mapping[str, Any]) -> None:
        self.manifest = manifest
        self.index_dir = index_dir
        self._kwargs = dict(index_kwargs)
        self.lock = threading.RLock()
        self.index: VectorIndex | None = None
        self.seq, self.epoch, self.gen = 0, -1, -1
        self.unsaved = 0
        self.last_save = time.monotonic()

    def _dim(self) -> int | None:
        value = self.manifest.meta("dim")
        return int(value) if value and value.isdigit() and int(value) > 0 else None

    def load(self) -> None:
        """Load the persisted index if it checks out against the manifest, else rebuild it from the manifest."""
        with self.lock:
            dim = self._dim()
            epoch = int(self.manifest.meta("index_epoch", "0") or 0)
            self.index, self.seq, self.epoch, self.gen = None, 0, epoch, -1
            if dim is None:
                return
            try:
                self._load_saved(dim, epoch)
            except (OSError, ValueError, KeyError, TypeError, IndexLoadError) as exc:
                log.info("[CHAI] rebuilding the entity index from the manifest (%s)", exc)
                self.rebuild()

    def _load_saved(self, dim: int, epoch: int) -> None:
        state = json.loads((self.index_dir / INDEX_STATE).read_text())
        if state["epoch"] != epoch or state["dim"] != dim or state["embedder"] != self.manifest.meta("embedder"):
            raise IndexLoadError("index state belongs to another epoch or embedder")
        last = int(self.manifest.query("SELECT COALESCE(MAX(seq), 0) FROM index_log")[0][0])
        if not isinstance(state["seq"], int) or not 0 <= state["seq"] <= last:
            raise IndexLoadError("index state is ahead of the manifest (the manifest went back in time)")
        name = state["file"]
        if not lat.is_leaf_name(name) or name.startswith("."):
            raise IndexLoadError("invalid index file name")
        self.index = VectorIndex.load(self.index_dir / name, dim, **self._kwargs)
        self.seq = state["seq"]
        self.sync(force=True)
        ids, _ = usable_vectors(*self.manifest.entity_vectors())
        if set(self.index.labels().tolist()) != set(ids.tolist()):
            raise IndexLoadError("index labels disagree with the manifest's entities")

    def rebuild(self) -> None:
        """A fresh index of every usable entity vector in the manifest."""
        with self.lock:
            with self.manifest.read() as cur:
                seq = cur.execute("SELECT COALESCE(MAX(seq), 0) FROM index_log").fetchone()[0]
                meta = dict(cur.execute("SELECT key, value FROM meta WHERE key IN "
                                        "('generation', 'index_epoch')").fetchall())
            dim = self._dim()
            if dim is None:
                self.index = None
                return
            labels, vectors = usable_vectors(*self.manifest.entity_vectors())
            index = VectorIndex(dim, **self._kwargs)
            if len(labels):
                index.add(labels, vectors)
            self.index, self.seq = index, seq
            self.epoch, self.gen = int(meta.get("index_epoch", 0)), int(meta.get("generation", 0))
            self.unsaved = len(labels)

    def sync(self, force: bool = False) -> None:
        """Apply entity additions and deletions other processes (or this one) logged since the last sync."""
        with self.lock:
            with self.manifest.read() as cur:
                meta = dict(cur.execute("SELECT key, value FROM meta WHERE key IN "
                                        "('generation', 'index_epoch', 'dim')").fetchall())
                gen, epoch = int(meta.get("generation", 0)), int(meta.get("index_epoch", 0) or 0)
                if not force and gen == self.gen and epoch == self.epoch:
                    return
                if "dim" not in meta:
                    self.index, self.gen, self.epoch = None, gen, epoch
                    return
                first = cur.execute("SELECT MIN(seq) FROM index_log").fetchone()[0]
                rows = cur.execute("SELECT seq, entity_id, op FROM index_log WHERE seq > ? ORDER BY seq",
                                   (self.seq,)).fetchall()
            lagging = first is not None and first > self.seq + 1 and self.seq > 0
            if self.index is None or epoch != self.epoch or lagging:
                self.rebuild()
                return
            final = {row["entity_id"]: row["op"] for row in rows}
            removed = [eid for eid, op in final.items() if op == "del"]
            added = [eid for eid, op in final.items() if op == "add"]
            if removed:
                self.index.remove(removed)
            if added:
                labels, vectors = usable_vectors(*self.manifest.entity_vectors(added))
                if len(labels):
                    self.index.add(labels, vectors)
            if rows:
                self.seq = rows[-1]["seq"]
            self.unsaved += len(rows)
            self.gen = gen

    def save(self) -> None:
        """Persist the index with the log position it reflects (writer lock held)."""
        with self.lock:
            dim = self._dim()
            if self.index is None or dim is None:
                return
            name = f"entities-{self.epoch}-{self.seq}.idx"
            self.index.save(self.index_dir / name)
            state = {"file": name, "seq": self.seq, "epoch": self.epoch, "dim": dim,
                     "embedder": self.manifest.meta("embedder")}
            lat.write_atomic(self.index_dir, INDEX_STATE, json.dumps(state).encode())
            for old in self.index_dir.iterdir():
                if old.name.startswith("entities-") and old.name != name:
                    lat.remove_files(self.index_dir, [old.name])
            self.unsaved = 0
            self.last_save = time.monotonic()

    def query(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Top-k (labels, similarities), or None while the index is empty."""
        with self.lock:
            if self.index is None or len(self.index) == 0:
                return None
            return self.index.query(vectors, min(k, len(self.index)))
