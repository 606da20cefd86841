"""Manifest rows of entries: insert, delete and choose eviction victims, inside a caller's write transaction."""
from __future__ import annotations

import json
import sqlite3
import time
from typing import Any, Sequence

import numpy as np

from ..config import DEFAULT_POLICY, POLICIES
from ..errors import CacheWriteError
from ..types import LOG_KEEP, shape_key
from ..validate import EntryRecord, check_embedder
from .manifest import Manifest


def insert_entry(cur: sqlite3.Cursor, record: EntryRecord, file: str, nbytes: int, digest: str) -> int:
    """Add one validated entry with its entities and postings; return its id."""
    stored, stored_dim = stored_embedder(cur)
    check_embedder(stored, stored_dim, record)
    if stored is None:
        Manifest.set_meta(cur, "embedder", record.embedder)
        Manifest.set_meta(cur, "dim", str(record.vectors.shape[1]))
    tick = Manifest.bump(cur, "tick")
    now = time.time()
    key = shape_key(record.shape)
    cur.execute("INSERT OR IGNORE INTO groups(fingerprint, shape) VALUES (?, ?)", (record.fingerprint, key))
    group_id = cur.execute("SELECT id FROM groups WHERE fingerprint=? AND shape=?",
                           (record.fingerprint, key)).fetchone()[0]
    cur.execute(
        "INSERT INTO entries(prompt, fingerprint, shape, dtype, file, nbytes, checksum, sigmas, tensors, meta, "
        "created, last_used, use_tick, hits, group_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,0,?)",
        (record.prompt, record.fingerprint, key, record.dtype, file, nbytes, digest, json.dumps(list(record.sigmas)),
         json.dumps(list(record.tensors)), json.dumps(dict(record.extra)), now, now, tick, group_id))
    cur.execute("UPDATE meta SET value = CAST(value AS INTEGER) + ? WHERE key='total_bytes'", (nbytes,))
    entry_id = cur.lastrowid
    if entry_id is None:  # sqlite3 sets it after every INSERT; None would file the entities under no entry
        raise CacheWriteError("the manifest returned no id for the new entry")
    seen: set[str] = set()
    for (text, kind, role, head, core), vector in zip(record.entities, record.vectors):
        if text in seen:
            continue
        seen.add(text)
        row = cur.execute("SELECT id FROM entities WHERE text=?", (text,)).fetchone()
        if row is None:
            cur.execute("INSERT INTO entities(text, kind, vector, head, core) VALUES (?,?,?,?,?)",
                        (text, kind, np.ascontiguousarray(vector, np.float32).tobytes(), head, core))
            entity_id = cur.lastrowid
            cur.execute("INSERT INTO index_log(entity_id, op) VALUES (?, 'add')", (entity_id,))
        else:
            entity_id = row[0]
        cur.execute("INSERT OR IGNORE INTO postings(group_id, entity_id, entry_id, role) VALUES (?,?,?,?)",
                    (group_id, entity_id, entry_id, role))
    Manifest.bump(cur, "generation")
    return entry_id


def delete_entries(cur: sqlite3.Cursor, entry_ids: Sequence[int]) -> list[str]:
    """Delete entries, their postings and entities no entry holds any more; return their file names."""
    files: list[str] = []
    for start in range(0, len(entry_ids), 500):
        ids = list(entry_ids[start:start + 500])
        marks = ",".join("?" * len(ids))
        rows = cur.execute(f"SELECT file, nbytes FROM entries WHERE id IN ({marks})", ids).fetchall()
        files += [r[0] for r in rows]
        cur.execute("UPDATE meta SET value = CAST(value AS INTEGER) - ? WHERE key='total_bytes'",
                    (sum(int(r[1]) for r in rows if isinstance(r[1], int)),))
        cands = [r[0] for r in cur.execute(
            f"SELECT DISTINCT entity_id FROM postings WHERE entry_id IN ({marks})", ids)]
        cur.execute(f"DELETE FROM postings WHERE entry_id IN ({marks})", ids)
        cur.execute(f"DELETE FROM entries WHERE id IN ({marks})", ids)
        for c in range(0, len(cands), 500):
            part = cands[c:c + 500]
            pm = ",".join("?" * len(part))
            gone = [r[0] for r in cur.execute(
                f"SELECT id FROM entities WHERE id IN ({pm}) AND NOT EXISTS "
                "(SELECT 1 FROM postings WHERE postings.entity_id = entities.id)", part)]
            if gone:
                gm = ",".join("?" * len(gone))
                cur.execute(f"DELETE FROM entities WHERE id IN ({gm})", gone)
                cur.executemany("INSERT INTO index_log(entity_id, op) VALUES (?, 'del')", [(g,) for g in gone])
    if entry_ids:
        Manifest.bump(cur, "generation")
    return files


def total_bytes(cur: sqlite3.Cursor) -> int:
    """Bytes of all entries, kept in meta by every insert and delete (recounted on open)."""
    return int(cur.execute("SELECT value FROM meta WHERE key='total_bytes'").fetchone()[0])


def recount_bytes(cur: sqlite3.Cursor) -> int:
    """Make the byte counter agree with the rows; a scan, so only on open and repair."""
    total = int(cur.execute("SELECT COALESCE(SUM(MAX(nbytes, 0)), 0) FROM entries").fetchone()[0])
    Manifest.set_meta(cur, "total_bytes", str(total))
    return total


def victims(cur: sqlite3.Cursor, need: int, policy: str) -> list[int]:
    """Entries to evict, in policy order, freeing at least `need` bytes."""
    order = "hits, use_tick" if policy == "lfu" else "use_tick"
    out: list[int] = []
    freed = 0
    if need <= 0:
        return out
    for row in cur.execute(f"SELECT id, nbytes FROM entries ORDER BY {order}"):
        if freed >= need:
            break
        out.append(row[0])
        freed += max(int(row[1]), 0)
    return out


def compact_log(cur: sqlite3.Cursor) -> None:
    """Forget index-log rows older than LOG_KEEP (other processes that far behind rebuild instead)."""
    last = cur.execute("SELECT COALESCE(MAX(seq), 0) FROM index_log").fetchone()[0]
    if last % 1000 == 0 and last > LOG_KEEP:
        cur.execute("DELETE FROM index_log WHERE seq <= ?", (last - LOG_KEEP,))


def stored_setting(key: str, value: str | None) -> Any:
    """A stored budget (positive int) or policy, or None when absent or unreadable."""
    if value is None:
        return None
    if key == "policy":
        return value if value in POLICIES else None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if number > 0 else None


def policy_in(cur: sqlite3.Cursor) -> str:
    """The eviction policy as the current transaction sees it."""
    row = cur.execute("SELECT value FROM meta WHERE key='policy'").fetchone()
    return stored_setting("policy", row[0] if row else None) or DEFAULT_POLICY


def stored_embedder(cur: sqlite3.Cursor) -> tuple[str | None, int | None]:
    """The embedder and vector dimension the folder's vectors come from ((None, None) while empty)."""
    meta = dict(cur.execute("SELECT key, value FROM meta WHERE key IN ('embedder', 'dim')").fetchall())
    dim = meta.get("dim")
    return meta.get("embedder"), int(dim) if dim and dim.isdigit() else None
