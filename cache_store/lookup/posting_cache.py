"""The ranking's postings held in memory between lookups, per identity, until the cache's content changes.

`ranking.rank` asks SQLite (or PostgreSQL) to aggregate the postings of every matched identity on each lookup: at
100,000 entries a popular identity ("umbrella") has 1,700 postings, and the two GROUP BYs over them were most of
`store.lookup` (bench_store_scale). The postings only change when an entry is added or removed, and every such
change bumps the cache's generation, which the entity index reads before each lookup anyway (`IndexKeeper.sync`,
on both backends, from any process). So this keeps each identity's postings as arrays, fetched once, forgets all
of them when the generation (or the index epoch, or the log position) moves, and ranks with numpy: the same
order and the same scene clause as `ranking.rank` (tests/test_posting_cache.py checks both on random caches).
Matches of format-v1 entities (no identity) still go to `ranking.rank`.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable

import numpy as np

from ..entities.roles import ROLES, SCENE
from .ranking import ranked_sim
from .rule import HitRule, IdentityFilter, SceneKeys

MAX_POSTINGS = 2_000_000  # held at most (about 30 MB); the least recently used identities go first
SCAN_WINDOW = 64          # ranked entries whose scenes are read per query while the scene clause runs
ROLE_CODE = {role: i for i, role in enumerate(ROLES)}
assert len(ROLES) <= 3  # a posting is fetched as entry id * 4 + role code, 3 for a role this pack does not know
_ROLE_SQL = "CASE p.role " + " ".join(f"WHEN '{r}' THEN {i}" for i, r in enumerate(ROLES)) + " ELSE 3 END"


@dataclass(frozen=True)
class IdentityPostings:
    """One identity's stored texts and their postings in one (model, shape) group."""

    texts: tuple[str, ...]
    objects: np.ndarray   # bool per text: its kind is 'object'
    entity: np.ndarray    # per posting: the index of its text
    entry: np.ndarray     # per posting: the entry id
    role: np.ndarray      # per posting: the role's index in ROLES (-1: a role this pack does not know)

    def admitted(self, only: IdentityFilter) -> np.ndarray:
        """Per text, whether the filter lets it through (`IdentityFilter.admits`)."""
        if only == IdentityFilter():
            return np.ones(len(self.texts), bool)
        return np.fromiter((only.admits("object" if obj else "", text) for obj, text in zip(self.objects, self.texts)),
                           bool, len(self.texts))


class PostingCache:
    """Per-identity postings of one cache, valid for one state of its change log (`key`)."""

    def __init__(self, max_postings: int = MAX_POSTINGS) -> None:
        self.max_postings = max_postings
        self._lock = threading.Lock()
        self._key: Hashable = None
        self._held: OrderedDict[tuple[int, str, str], IdentityPostings] = OrderedDict()
        self._size = 0
        self.fetches = 0  # identities read from the database (tests and the bench read it)

    def rank(self, db: Any, key: Hashable, group_id: int, matched: Any, rule: HitRule,
             scenes: SceneKeys | None, limit: int) -> list[int]:
        """`ranking.rank` over identity matches (`matched.identities`) from the held postings."""
        parts_entry, parts_q, parts_sim = [], [], []
        allowed = np.zeros(len(ROLES) + 1, bool)  # the last slot is code -1
        allowed[[ROLE_CODE[r] for r in rule.roles]] = True
        with self._lock:
            if key != self._key:
                self._held.clear()
                self._size, self._key = 0, key
            for m in matched.identities:
                held = self._postings(db, group_id, m.core, m.head)
                keep = allowed[held.role] & held.admitted(m.only)[held.entity]
                if keep.any():
                    parts_entry.append(held.entry[keep])
                    parts_q.append(np.full(int(keep.sum()), m.q, np.int64))
                    parts_sim.append(np.full(int(keep.sum()), ranked_sim(m.sim), np.float64))
        if not parts_entry:
            return []
        order = _ordered(np.concatenate(parts_entry), np.concatenate(parts_q), np.concatenate(parts_sim))
        if scenes is None or not rule.scenes_must_agree:
            return [int(e) for e in order[:limit]]
        return _scene_passing(db, order, scenes, limit)

    def _postings(self, db: Any, group_id: int, core: str, head: str) -> IdentityPostings:
        """One identity's postings, held or fetched (the lock held)."""
        name = (group_id, core, head)
        held = self._held.get(name)
        if held is not None:
            self._held.move_to_end(name)
            return held
        # One row per stored text, its postings as one comma-joined list of entry id * 4 + role code: a lookup right
        # after an insert fetches every identity it matches, and a row per posting cost Python more than the SQL
        # aggregation did. The rows come in the identity index's order, so the GROUP BY needs no sort.
        rows = db.query(f"SELECT e.text, e.kind, {db.ID_LIST.format(f'p.entry_id * 4 + {_ROLE_SQL}')} FROM entities e "
                        f"{db.PINNED_JOIN} {db.POSTINGS_SCAN} ON p.group_id = ? AND p.entity_id = e.id "
                        "WHERE e.core = ? AND e.head = ? GROUP BY e.id, e.text, e.kind", (group_id, core, head))
        lists = [str(r[2]) for r in rows]
        counts = np.fromiter((s.count(",") + 1 for s in lists), np.int64, len(lists))
        coded = np.array(",".join(lists).split(","), np.int64) if lists else np.zeros(0, np.int64)
        role = coded % 4
        held = IdentityPostings(tuple(str(r[0]) for r in rows), np.array([r[1] == "object" for r in rows], bool),
                                np.repeat(np.arange(len(rows), dtype=np.int64), counts), coded // 4,
                                np.where(role == 3, -1, role))
        self.fetches += 1
        self._held[name] = held
        self._size += len(held.entry)
        while self._size > self.max_postings and len(self._held) > 1:
            _, old = self._held.popitem(last=False)
            self._size -= len(old.entry)
        return held


def _ordered(entry: np.ndarray, q: np.ndarray, sim: np.ndarray) -> np.ndarray:
    """Entries by matched query entities, then summed best similarity per query entity, then newest."""
    order = np.lexsort((-sim, q, entry))  # per (entry, q), the best similarity first
    entry, q, sim = entry[order], q[order], sim[order]
    first = np.ones(len(entry), bool)
    first[1:] = (entry[1:] != entry[:-1]) | (q[1:] != q[:-1])
    entry, sim = entry[first], sim[first]
    starts = np.flatnonzero(np.r_[True, entry[1:] != entry[:-1]])
    ids, n, s = entry[starts], np.diff(np.r_[starts, len(entry)]), np.add.reduceat(sim, starts)
    return ids[np.lexsort((-ids, -s, -n))]  # similarities are multiples of 2^-16: the sums are exact


def _scene_passing(db: Any, order: np.ndarray, scenes: SceneKeys, limit: int) -> list[int]:
    """The first `limit` entries in order that name no scene or one of `scenes` (`HitRule.scenes_sql`)."""
    wanted, ids = set(scenes.identities), set(scenes.ids)
    kept: list[int] = []
    start, window = 0, SCAN_WINDOW
    while start < len(order) and len(kept) < limit:
        part = [int(e) for e in order[start:start + window]]
        seen: dict[int, bool] = {}
        for entry_id, core, head, eid in db.query(
                "SELECT sp.entry_id, se.core, se.head, se.id FROM postings sp JOIN entities se ON se.id = sp.entity_id "
                f"WHERE sp.role = ? AND sp.entry_id IN ({','.join('?' * len(part))})", [SCENE, *part]):
            agrees = (core, head) in wanted or int(eid) in ids
            seen[int(entry_id)] = seen.get(int(entry_id), False) or agrees
        kept += [e for e in part if seen.get(e, True)][:limit - len(kept)]
        start, window = start + window, 500
    return kept
