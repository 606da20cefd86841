"""The ranking's postings held in memory between lookups, per identity, following the cache's inserts and removals.

`ranking.rank` asks SQLite (or PostgreSQL) to aggregate the postings of every matched identity on each lookup: at
100,000 entries a popular identity ("umbrella") has 1,700 postings, and the two GROUP BYs over them were most of
`store.lookup` (bench_store_scale). An entry's postings are written with it and never change while it exists, and
every insert or removal bumps the cache's generation, which the entity index reads before each lookup anyway
(`IndexKeeper.sync`, on both backends, from any process). So this keeps each identity's postings as arrays, fetched
once. When the generation moves, the entries committed since are read by id (ids are never reused; where a lower id
can commit after a higher one, PostgreSQL, the skipped ids are watched until they appear) and their postings added;
entries removed since (evictions) are not looked for: the few ranked candidates are checked against `entries`
before they are returned. Another index epoch or a rebuilt index drops everything. It ranks with numpy: the same
order and the same scene clause as `ranking.rank` (tests/test_posting_cache.py checks both on random caches).
Matches of format-v1 entities (no identity) still go to `ranking.rank`.

The first ranking of a process reads every posting at once (`prime`), where they fit in half the bound: one identity
at a time, a fresh process paid a fetch for nearly every lookup's identities (about 1.5 ms of a 6 ms `store.lookup`
at 100,000 entries), and the bulk read costs about what 500 such fetches do. After a drop identities are fetched
one by one again, as before.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable

import numpy as np

from ..entities.roles import ROLES, SCENE
from .ranking import ranked_sim
from .rule import HitRule, IdentityFilter, SceneKeys

MAX_POSTINGS = 2_000_000  # held at most (about 50 MB); the least recently used identities go first
MAX_SIDES = 1_024         # donors' decision inputs held (a few MB); the least recently used go first
PRIME_SHARE = 2           # the first fill reads every posting when they are at most MAX_POSTINGS / PRIME_SHARE
SCAN_WINDOW = 64          # ranked entries checked (alive, scene) per query
MAX_NEW = 2_000           # entries committed since the last lookup that are added; more and everything is refetched
MAX_PENDING = 256         # skipped ids watched for a late commit (PostgreSQL); more and everything is refetched
REFRESH_AFTER = 5_000     # entries added since the last fetch: then the removed entries' postings are shed by a refetch
ROLE_CODE = {role: i for i, role in enumerate(ROLES)}
if len(ROLES) > 3:  # a posting is fetched as entry id * 4 + role code, 3 for a role this pack does not know
    raise RuntimeError("posting_cache codes roles in two bits; widen the code for more roles")
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
    """Per-identity postings of one cache, brought to its generation before each ranking (`rank`)."""

    def __init__(self, max_postings: int = MAX_POSTINGS, prime: bool = True) -> None:
        self.max_postings = max_postings
        self.prime = prime  # read every posting at the first fill (once; cleared when tried)
        self._lock = threading.Lock()
        self._base: Hashable = None
        self._generation = -1
        self._newest = 0  # the newest entry id whose postings are held (or were when it was fetched)
        self._pending: set[int] = set()  # ids below _newest not yet committed when it moved past them
        self._held: OrderedDict[tuple[int, str, str], IdentityPostings] = OrderedDict()
        self._size = 0
        self._added = 0  # entries added since the last drop
        self._followed = False  # the held postings outlived a change: entries may have been removed since
        self._alive: dict[int, bool] = {}  # entries checked against `entries` at this generation
        self._gone: set[int] = set()  # entries found removed (ids never come back) since the last drop
        self.fetches = 0  # identities read from the database (tests and the bench read it)
        self.appended = 0  # new entries whose postings were added to held identities instead of dropping them
        self.removed = 0  # ranked candidates found removed and left out
        self.primed = 0  # identities read at once by the first fill
        self.prime_seconds = 0.0  # what that read took (the bench prints it)
        self.primed_postings = 0  # and how many postings it held
        # Donors as the decision reads them (`ranking.donor_side`), by entry id: an entry's entities, roles,
        # vectors and prompt vector never change while it exists, and ids are never reused within a change log.
        self._sides: OrderedDict[tuple[int, int, str | None], Any] = OrderedDict()
        self._sides_base: Hashable = None
        self._sides_generation = -1
        self.side_reads = 0  # donors read from the database (tests read it)

    def side(self, base: Hashable, generation: int, key: tuple[int, int, str | None], read: Callable[[], Any]) -> Any:
        """A donor's decision inputs under `key` (entry id, dimension, embedder), read once per change log `base`;
        all are dropped when the generation goes back (a restored database may hand out ids again)."""
        with self._lock:
            if base != self._sides_base or generation < self._sides_generation:
                self._sides.clear()
                self._sides_base = base
            self._sides_generation = generation
            held = self._sides.get(key)
            if held is not None:
                self._sides.move_to_end(key)
                return held
        side = read()
        with self._lock:
            if base == self._sides_base:
                self._sides[key] = side
                while len(self._sides) > MAX_SIDES:
                    self._sides.popitem(last=False)
            self.side_reads += 1
        return side

    def rank(self, db: Any, base: Hashable, generation: int, group_id: int, matched: Any, rule: HitRule,
             scenes: SceneKeys | None, limit: int) -> list[int]:
        """`ranking.rank` over identity matches (`matched.identities`) from the held postings, brought to the
        cache's `generation` first (`base` names the change log they follow: another one drops them)."""
        parts_entry, parts_q, parts_sim = [], [], []
        allowed = np.zeros(len(ROLES) + 1, bool)  # the last slot is code -1
        allowed[[ROLE_CODE[r] for r in rule.roles]] = True
        with self._lock:
            self._follow(db, base, generation)
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
            check = self._followed
        if not check and (scenes is None or not rule.scenes_must_agree):
            return [int(e) for e in order[:limit]]
        return self._passing(db, generation, order, scenes if rule.scenes_must_agree else None, limit, check)

    def _follow(self, db: Any, base: Hashable, generation: int) -> None:
        """Bring the held postings to `generation` (the lock held): add the entries committed since, or drop all
        when the change log is another one, the generation went back, or more changed than is worth following."""
        if base == self._base and generation == self._generation:
            return
        if base == self._base and generation > self._generation and self._held and self._added < REFRESH_AFTER:
            new = self._committed_since(db)
            if new is not None:
                self._append(db, new)
                self._generation, self._followed, self._alive = generation, True, {}
                self._added += len(new)
                self.appended += len(new)
                return
        self._held.clear()
        self._pending, self._gone, self._alive = set(), set(), {}
        self._size, self._added, self._followed = 0, 0, False
        self._base, self._generation = base, generation
        newest = db.query("SELECT MAX(id) FROM entries")
        self._newest = int(newest[0][0] or 0) if newest else 0
        if self.prime:  # after _newest: an entry committed in between is read twice, which ranks the same
            self.prime = False
            started = time.perf_counter()
            self._prime(db)
            self.prime_seconds = time.perf_counter() - started

    def _prime(self, db: Any) -> None:
        """Hold every identity's postings, read in two statements (the lock held); nothing when there are more than
        the share of the bound allows."""
        limit = self.max_postings // PRIME_SHARE
        # One comma-joined text of (group, entity, entry * 4 + role) triples: a row per posting cost Python 2-3x
        # what the database took to produce them.
        triple = f"p.group_id || ',' || p.entity_id || ',' || (p.entry_id * 4 + {_ROLE_SQL})"
        joined = db.query(f"SELECT {db.ID_LIST.format('flat.x')} FROM (SELECT {triple} AS x FROM postings p "
                          "LIMIT ?) flat", (limit + 1,))
        text = str(joined[0][0] or "") if joined else ""
        values = np.fromstring(text, np.int64, sep=",") if text else np.zeros(0, np.int64)
        if not text or len(values) != text.count(",") + 1 or len(values) % 3 or len(values) // 3 > limit:
            return
        flat = values.reshape(-1, 3)
        known = db.query("SELECT id, core, head, text, kind FROM entities")
        ids = np.array([int(r[0]) for r in known], np.int64)
        by_id = np.argsort(ids)
        ids = ids[by_id]
        at = np.minimum(np.searchsorted(ids, flat[:, 1]), max(len(ids) - 1, 0))
        keep = ids[at] == flat[:, 1] if len(ids) else np.zeros(len(flat), bool)  # an entity removed in between
        flat, at = flat[keep], by_id[at[keep]]
        if not len(flat):
            return
        names: dict[tuple[str, str], int] = {}
        identity = np.array([names.setdefault((str(r[1]), str(r[2])), len(names)) for r in known], np.int64)
        group, code, entity, coded = flat[:, 0], identity[at], at, flat[:, 2]
        order = np.lexsort((entity, code, group))
        group, code, entity, coded = group[order], code[order], entity[order], coded[order]
        starts = np.flatnonzero(np.r_[True, (group[1:] != group[:-1]) | (code[1:] != code[:-1])])
        core_head = list(names)
        for start, end in zip(starts.tolist(), np.r_[starts[1:], len(group)].tolist()):
            rows_here, which = np.unique(entity[start:end], return_inverse=True)
            role = coded[start:end] % 4
            core, head = core_head[int(code[start])]
            self._held[(int(group[start]), core, head)] = IdentityPostings(
                tuple(str(known[r][3]) for r in rows_here.tolist()),
                np.array([known[r][4] == "object" for r in rows_here.tolist()], bool),
                which.astype(np.int64).reshape(-1), coded[start:end] // 4, np.where(role == 3, -1, role))
        self._size = self.primed_postings = len(flat)
        self.primed = len(starts)

    def _committed_since(self, db: Any) -> list[int] | None:
        """Ids of the entries committed since the held postings last followed (None: too many to follow)."""
        watched = sorted(self._pending)
        sql = "SELECT id FROM entries WHERE id > ?" + (f" OR id IN ({','.join('?' * len(watched))})" if watched else "")
        found = sorted({int(r[0]) for r in db.query(sql, (self._newest, *watched))})
        if len(found) > MAX_NEW:
            return None
        newer = [i for i in found if i > self._newest]
        if newer and getattr(db, "LATE_IDS", True):
            if newer[-1] - self._newest > MAX_NEW + MAX_PENDING:
                return None
            self._pending = (self._pending - set(found)) | (set(range(self._newest + 1, newer[-1])) - set(newer))
            if len(self._pending) > MAX_PENDING:
                return None
        else:
            self._pending -= set(found)
        if newer:
            self._newest = newer[-1]
        return found

    def _append(self, db: Any, new: list[int]) -> None:
        """Add new entries' postings to the identities held (the others are fetched whole when asked for)."""
        by_name: dict[tuple[int, str, str], list[tuple]] = {}
        for start in range(0, len(new), 500):
            part = new[start:start + 500]
            for group_id, core, head, text, kind, role, entry_id in db.query(
                    "SELECT p.group_id, e.core, e.head, e.text, e.kind, p.role, p.entry_id FROM postings p JOIN "
                    f"entities e ON e.id = p.entity_id WHERE p.entry_id IN ({','.join('?' * len(part))})", part):
                if (int(group_id), str(core), str(head)) in self._held:
                    by_name.setdefault((int(group_id), str(core), str(head)), []).append((text, kind, role, entry_id))
        for name, rows in by_name.items():
            held = self._held[name]
            texts, objects = list(held.texts), list(held.objects)
            slot = {t: i for i, t in enumerate(texts)}
            for text, kind, _, _ in rows:
                if text not in slot:
                    slot[text] = len(texts)
                    texts.append(text)
                    objects.append(kind == "object")
                else:  # a text whose entity went with its last entry and came back: its kind is the new one's
                    objects[slot[text]] = kind == "object"
            self._held[name] = IdentityPostings(
                tuple(texts), np.array(objects, bool),
                np.concatenate([held.entity, np.array([slot[t] for t, _, _, _ in rows], np.int64)]),
                np.concatenate([held.entry, np.array([int(e) for _, _, _, e in rows], np.int64)]),
                np.concatenate([held.role, np.array([ROLE_CODE.get(str(r), -1) for _, _, r, _ in rows], np.int64)]))
            self._size += len(rows)

    def _passing(self, db: Any, generation: int, order: np.ndarray, scenes: SceneKeys | None, limit: int,
                 check: bool) -> list[int]:
        """The first `limit` entries in order that still exist (when `check`) and name no scene or one of `scenes`
        (`HitRule.scenes_sql`), read `SCAN_WINDOW` at a time."""
        kept: list[int] = []
        start, window = 0, SCAN_WINDOW
        while start < len(order) and len(kept) < limit:
            part = [int(e) for e in order[start:start + window]]
            start, window = start + window, 500
            if check:
                with self._lock:  # removed entries never come back; the living are known for this generation
                    alive = {e: False for e in part if e in self._gone}
                    if generation == self._generation:
                        alive.update((e, self._alive[e]) for e in part if e in self._alive)
                unknown = [e for e in part if e not in alive]
                if unknown:
                    found = {int(r[0]) for r in db.query(
                        f"SELECT id FROM entries WHERE id IN ({','.join('?' * len(unknown))})", unknown)}
                    fresh = {e: e in found for e in unknown}
                    alive.update(fresh)
                    with self._lock:
                        if generation == self._generation:
                            self._alive.update(fresh)
                            self._gone.update(e for e, ok in fresh.items() if not ok)
                        self.removed += sum(not ok for ok in fresh.values())
                part = [e for e in part if alive[e]]
            if scenes is not None and part:
                part = _scene_passing(db, part, scenes)
            kept += part[:limit - len(kept)]
        return kept

    def _postings(self, db: Any, group_id: int, core: str, head: str) -> IdentityPostings:
        """One identity's postings, held or fetched (the lock held)."""
        name = (group_id, core, head)
        held = self._held.get(name)
        if held is not None:
            self._held.move_to_end(name)
            return held
        # One row per stored text, its postings as one comma-joined list of entry id * 4 + role code: a lookup right
        # after an eviction fetches every identity it matches, and a row per posting cost Python more than the SQL
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


def _scene_passing(db: Any, part: list[int], scenes: SceneKeys) -> list[int]:
    """The entries of `part`, in order, that name no scene or one of `scenes` (`HitRule.scenes_sql`)."""
    seen: dict[int, bool] = {}
    for entry_id, core, head, eid, text in db.query(
            "SELECT sp.entry_id, se.core, se.head, se.id, se.text FROM postings sp JOIN entities se "
            f"ON se.id = sp.entity_id WHERE sp.role = ? AND sp.entry_id IN ({','.join('?' * len(part))})",
            [SCENE, *part]):
        agrees = scenes.admits(core, head, int(eid), text)
        seen[int(entry_id)] = seen.get(int(entry_id), False) or agrees
    return [e for e in part if seen.get(e, True)]
