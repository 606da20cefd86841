"""Rows of a PostgreSQL cache, written inside a transaction that holds the cache's state row lock.

Every write (insert, eviction, prune, clear, repair) first locks the one `state` row. That lock is the farm's
single serialisation point for what must be exact: the byte total against the budget (two writers can never
both fit into the same free space or evict the same entry), and the change log's sequence numbers (handed out
in commit order). It is held only for the metadata: the latent bytes are uploaded before it is taken.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..config import POLICIES
from ..types import LOG_KEEP, shape_key
from ..validate import EntryRecord, check_embedder

LOG_COMPACT_EVERY = 1000  # sequence numbers between two compactions of the change log (keeping LOG_KEEP rows)
STATE_COLUMNS = ("budget_bytes", "policy", "embedder", "dim", "total_bytes", "generation", "index_epoch", "log_seq")


@dataclass
class State:
    """The cache's state row as one writer sees and changes it (written back by `save`)."""

    budget_bytes: int
    policy: str
    embedder: str | None
    dim: int | None
    total_bytes: int
    generation: int
    index_epoch: int
    log_seq: int

    @classmethod
    def lock(cls, cur: Any) -> "State":
        """Read the state row FOR UPDATE: from here to commit this transaction is the cache's only writer."""
        cur.execute(f"SELECT {', '.join(STATE_COLUMNS)} FROM state WHERE id = 1 FOR UPDATE")
        row = cur.fetchone()
        if row is None:
            raise ValueError("the cache's state row is missing")
        state = cls(*row)
        if state.policy not in POLICIES:
            state.policy = "lru"
        return state

    def save(self, cur: Any) -> None:
        """Write the changed counters and settings back (same transaction)."""
        cur.execute(f"UPDATE state SET {', '.join(f'{c} = %s' for c in STATE_COLUMNS)} WHERE id = 1",
                    [getattr(self, c) for c in STATE_COLUMNS])

    def log(self, cur: Any, ops: Sequence[tuple[int, str]]) -> None:
        """Append entity additions/deletions to the change log with the next sequence numbers."""
        if not ops:
            return
        first = self.log_seq + 1
        cur.executemany("INSERT INTO index_log (seq, entity_id, op) VALUES (%s, %s, %s)",
                        [(first + i, int(eid), op) for i, (eid, op) in enumerate(ops)])
        before, self.log_seq = self.log_seq, self.log_seq + len(ops)
        if self.log_seq // LOG_COMPACT_EVERY != before // LOG_COMPACT_EVERY and self.log_seq > LOG_KEEP:
            # other workers that far behind rebuild their index instead of replaying
            cur.execute("DELETE FROM index_log WHERE seq <= %s", (self.log_seq - LOG_KEEP,))


def insert_entry(cur: Any, state: State, record: EntryRecord, entry_id: int, nbytes: int, digest: str) -> None:
    """Add one validated entry (its blob is already written under `entry_id`) with entities and postings."""
    check_embedder(state.embedder, state.dim, record)
    if state.embedder is None:
        state.embedder, state.dim = record.embedder, int(record.vectors.shape[1])
    key = shape_key(record.shape)
    cur.execute("INSERT INTO groups (fingerprint, shape) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (record.fingerprint, key))
    cur.execute("SELECT id FROM groups WHERE fingerprint = %s AND shape = %s", (record.fingerprint, key))
    group_id = cur.fetchone()[0]
    now = time.time()
    cur.execute(
        "INSERT INTO entries (id, prompt, fingerprint, shape, dtype, nbytes, checksum, sigmas, tensors, meta, "
        "created, last_used, use_tick, hits, group_id) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, nextval('ticks'), 0, %s)",
        (entry_id, record.prompt, record.fingerprint, key, record.dtype, nbytes, digest,
         json.dumps(list(record.sigmas)), json.dumps(list(record.tensors)), json.dumps(dict(record.extra)), now,
         now, group_id))
    state.total_bytes += nbytes
    rows: dict[str, tuple] = {}
    for (text, kind, role, head, core), vector in zip(record.entities, record.vectors):
        rows.setdefault(text, (kind, role, head, core, vector))
    cur.execute("SELECT text, id FROM entities WHERE text = ANY(%s)", (list(rows),))
    known = dict(cur.fetchall())
    added: list[tuple[int, str]] = []
    for text, (kind, role, head, core, vector) in rows.items():
        entity_id = known.get(text)
        if entity_id is None:
            cur.execute("INSERT INTO entities (text, kind, vector, head, core) VALUES (%s, %s, %s, %s, %s) "
                        "RETURNING id",
                        (text, kind, np.ascontiguousarray(vector, np.float32).tobytes(), head, core))
            entity_id = cur.fetchone()[0]
            added.append((entity_id, "add"))
        cur.execute("INSERT INTO postings (group_id, entity_id, entry_id, role) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT DO NOTHING", (group_id, entity_id, entry_id, role))
    state.log(cur, added)
    state.generation += 1


def delete_entries(cur: Any, state: State, entry_ids: Sequence[int]) -> list[int]:
    """Delete entries (their blobs and postings go with them) and entities no entry holds any more; return the
    ids that were there."""
    ids = [int(i) for i in entry_ids]
    if not ids:
        return []
    cur.execute("SELECT DISTINCT entity_id FROM postings WHERE entry_id = ANY(%s)", (ids,))
    candidates = [r[0] for r in cur.fetchall()]
    cur.execute("DELETE FROM entries WHERE id = ANY(%s) RETURNING id, nbytes", (ids,))
    gone = cur.fetchall()
    state.total_bytes -= sum(max(int(n), 0) for _, n in gone)
    if candidates:
        cur.execute("DELETE FROM entities e WHERE e.id = ANY(%s) AND NOT EXISTS "
                    "(SELECT 1 FROM postings p WHERE p.entity_id = e.id) RETURNING e.id", (candidates,))
        state.log(cur, [(r[0], "del") for r in sorted(cur.fetchall())])
    if gone:
        state.generation += 1
    return [int(r[0]) for r in gone]


def victims(cur: Any, need: int, policy: str) -> list[int]:
    """Entries to evict, in policy order, freeing at least `need` bytes (the caller holds the state lock)."""
    order = "hits, use_tick" if policy == "lfu" else "use_tick"
    out: list[int] = []
    freed = 0
    while freed < need:
        cur.execute(f"SELECT id, nbytes FROM entries WHERE NOT (id = ANY(%s)) ORDER BY {order} LIMIT 64", (out,))
        rows = cur.fetchall()
        if not rows:
            break
        for entry_id, nbytes in rows:
            if freed >= need:
                break
            out.append(int(entry_id))
            freed += max(int(nbytes), 0)
    return out


def recount_bytes(cur: Any, state: State) -> int:
    """Make the byte total agree with the rows (repair)."""
    cur.execute("SELECT COALESCE(SUM(GREATEST(nbytes, 0)), 0) FROM entries")
    state.total_bytes = int(cur.fetchone()[0])
    return state.total_bytes
