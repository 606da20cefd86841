"""Which stored entities one index point stands for: every text of one identity shares its vector, so the index
holds one point per (identity, vector), labelled by its smallest entity id, and a search is read back as if each
text had its own point.

At 100k entries the 52,702 stored texts of bench_store_scale are 647 identities: searching one point per identity
is exact search over 647 vectors instead of hnswlib over 52,702 points, most of them exact duplicates (which also
cost hnswlib recall). Entities of format v1 name no identity and keep a point each.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Hashable, Sequence

import numpy as np

Identity = tuple[str, str]  # (core, head) of a stored entity of format v2


@dataclass(frozen=True)
class EntityPoints:
    """Entities as the change log reads them: ids, vectors, and each one's identity (None: format v1)."""

    ids: np.ndarray
    vectors: np.ndarray
    identities: Sequence[Identity | None]

    def __len__(self) -> int:
        return int(self.ids.size)

    def subset(self, keep: np.ndarray) -> "EntityPoints":
        """Only the rows where `keep` is true."""
        rows = np.flatnonzero(keep)
        return EntityPoints(self.ids[rows], self.vectors[rows], [self.identities[i] for i in rows.tolist()])


def points_of(rows: Sequence[tuple], dim: int) -> EntityPoints:
    """EntityPoints of manifest rows (id, vector bytes, core, head); rows whose vector is not `dim` floats are
    skipped (malformed)."""
    rows = [r for r in rows if isinstance(r[1], (bytes, memoryview)) and dim > 0 and len(bytes(r[1])) == 4 * dim]
    if not rows:
        return EntityPoints(np.zeros(0, np.int64), np.zeros((0, max(dim, 0)), np.float32), [])
    ids = np.fromiter((r[0] for r in rows), np.int64, len(rows))
    vectors = np.frombuffer(b"".join(bytes(r[1]) for r in rows), dtype=np.float32).reshape(len(rows), dim).copy()
    return EntityPoints(ids, vectors, [(r[2] or "", r[3]) if r[3] else None for r in rows])


@dataclass
class Edit:
    """What a change to the points does to the index: labels to remove, then (labels, vectors) to add."""

    removed: list[int] = field(default_factory=list)
    added: dict[int, np.ndarray] = field(default_factory=dict)

    def arrays(self, dim: int) -> tuple[np.ndarray, np.ndarray]:
        """The additions as (labels, vectors) arrays."""
        if not self.added:
            return np.zeros(0, np.int64), np.zeros((0, dim), np.float32)
        labels = np.fromiter(self.added, np.int64, len(self.added))
        return labels, np.stack(list(self.added.values())).astype(np.float32, copy=False)


class PointMap:
    """Entity ids grouped into index points, and the point each group is searched under."""

    def __init__(self) -> None:
        self._group: dict[int, Hashable] = {}       # entity id -> its group's key
        self._members: dict[Hashable, set[int]] = {}
        self._label: dict[Hashable, int] = {}      # group key -> the label of its point (smallest member id)
        self._vector: dict[Hashable, np.ndarray] = {}
        self._size: dict[int, int] = {}            # point label -> how many entities it stands for

    def __len__(self) -> int:
        return len(self._label)

    def labels(self) -> set[int]:
        """The labels the index should hold."""
        return set(self._size)

    def size(self, label: int) -> int:
        """How many stored entities the point `label` stands for (0: not a point)."""
        return self._size.get(label, 0)

    @staticmethod
    def _key(entity_id: int, vector: np.ndarray, identity: Identity | None) -> Hashable:
        # The vector is part of the key (as a 16-byte digest, not its 1.5 kB) so that a point never stands for a
        # text of another vector.
        if identity is None:
            return ("v1", entity_id)
        return identity, hashlib.blake2b(np.ascontiguousarray(vector).tobytes(), digest_size=16).digest()

    def add(self, points: EntityPoints) -> Edit:
        """Take in entities (ones already here as they are are left alone; an id that now names another
        identity or vector moves); the index edit that follows."""
        edit = Edit()
        for eid, vector, identity in zip(points.ids.tolist(), points.vectors, points.identities):
            key = self._key(eid, vector, identity)
            known = self._group.get(eid)
            if known == key:
                continue
            if known is not None:
                self._drop(eid, edit)
            self._group[eid] = key
            members = self._members.setdefault(key, set())
            members.add(eid)
            old = self._label.get(key)
            if old is None or eid < old:
                self._relabel(key, old, eid, vector, edit)
            else:
                self._size[old] += 1
        return edit

    def remove(self, ids: Sequence[int]) -> Edit:
        """Let entities go (unknown ids are ignored); the index edit that follows."""
        edit = Edit()
        for eid in ids:
            if int(eid) in self._group:
                self._drop(int(eid), edit)
        return edit

    def _drop(self, eid: int, edit: Edit) -> None:
        key = self._group.pop(eid)
        members = self._members[key]
        members.discard(eid)
        label = self._label[key]
        if not members:
            del self._members[key], self._label[key], self._vector[key], self._size[label]
            edit.added.pop(label, None)
            edit.removed.append(label)
        elif label == eid:
            self._relabel(key, label, min(members), self._vector[key], edit)
        else:
            self._size[label] -= 1

    def _relabel(self, key: Hashable, old: int | None, new: int, vector: np.ndarray, edit: Edit) -> None:
        if old is not None:
            del self._size[old]
            edit.added.pop(old, None)
            edit.removed.append(old)
        # A copy: `vector` is a row of the change log's whole read, which a view would keep alive.
        self._label[key], self._vector[key] = new, np.array(vector, dtype=np.float32, copy=True)
        self._size[new] = len(self._members[key])
        edit.added[new] = self._vector[key]

    def nearest_texts(self, labels: np.ndarray, sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The points among the k nearest stored texts, from a search of at least k points: each row is cut
        after the point that brings its count of texts to k (the rest is padding, -1 and -inf)."""
        labels, sims = labels.copy(), sims.copy()
        for row in range(labels.shape[0]):
            total = 0
            for col, label in enumerate(labels[row].tolist()):
                if label < 0:
                    break
                total += max(self._size.get(label, 1), 1)
                if total >= k:
                    labels[row, col + 1:], sims[row, col + 1:] = -1, -np.inf
                    break
        return labels, sims
