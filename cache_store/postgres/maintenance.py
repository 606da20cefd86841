"""Maintenance of a PostgreSQL cache: a read-only verify; repair, set-aside and clear under the state lock."""
from __future__ import annotations

import logging
import time
from typing import Any, Iterator

import numpy as np

from .. import latents as lat
from ..errors import CacheError
from ..index.keeper import IndexKeeper
from ..types import VerifyReport, shape_key
from ..validate import UNIT_TOLERANCE, record_from_file
from .db import PgDb
from .rows import State, delete_entries, recount_bytes
from .schema import SCHEMA_VERSION

log = logging.getLogger(__name__)

BATCH = 64  # blobs read per round trip while checking


def _blob_problem(row: tuple, data: bytes | None) -> str | None:
    """Why an entry's stored bytes cannot serve it, or None when they are intact and match the row."""
    _, nbytes, checksum, shape, dtype = row
    if data is None:
        return "its latent bytes are missing"
    if len(data) != nbytes or lat.checksum(data) != checksum:
        return "its latent bytes fail their checksum or size (modified on the server)"
    try:
        record, _ = record_from_file(data, lat.VECTORS_KEY, lat.FILE_FORMAT)
    except CacheError as exc:
        return f"its latent bytes do not parse: {exc}"
    if shape_key(record.shape) != shape or record.dtype != dtype:
        return f"its latents are {record.dtype} {list(record.shape)}, the row says {dtype} {shape}"
    return None


def _entry_problems(cur: Any) -> Iterator[tuple[int, str]]:
    """(entry id, problem) for every entry whose bytes are missing, damaged or disagree with its row."""
    cur.execute("SELECT id, nbytes, checksum, shape, dtype FROM entries ORDER BY id")
    rows = cur.fetchall()
    for start in range(0, len(rows), BATCH):
        part = rows[start:start + BATCH]
        cur.execute("SELECT entry_id, data FROM blobs WHERE entry_id = ANY(%s)", ([r[0] for r in part],))
        blobs = {int(k): bytes(v) for k, v in cur.fetchall()}
        for row in part:
            problem = _blob_problem(row, blobs.get(int(row[0])))
            if problem:
                yield int(row[0]), problem


def _bad_vectors(cur: Any, dim: int | None) -> list[int]:
    cur.execute("SELECT id, vector FROM entities")
    bad = []
    for eid, blob in cur.fetchall():
        blob = bytes(blob)
        vec = np.frombuffer(blob, np.float32) if dim and len(blob) == 4 * dim else None
        if vec is None or not np.isfinite(vec).all() or abs(float(np.linalg.norm(vec)) - 1.0) > UNIT_TOLERANCE:
            bad.append(int(eid))
    return bad


def _count(cur: Any, sql: str) -> int:
    cur.execute(sql)
    return int(cur.fetchone()[0])


def verify(db: PgDb, name: str) -> VerifyReport:
    """Every problem of a cache on the server, read in one read-only snapshot; nothing is written or created."""
    report = VerifyReport()
    if db.query("SELECT to_regclass('schema_version')")[0][0] is None:
        report.problems.append(f"cache '{name}' does not exist on {db.server.label} (schema {db.schema} is "
                               "missing: never opened, or cleared by hand)")
        return report
    with db.transaction(readonly=True, snapshot=True, binary=True) as cur:
        version = _count(cur, "SELECT MAX(version) FROM schema_version")
        if version > SCHEMA_VERSION:
            report.problems.append(f"schema v{version} is newer than this pack's v{SCHEMA_VERSION}: update the pack")
            return report
        if version < SCHEMA_VERSION:
            report.problems.append(f"schema v{version} is older than v{SCHEMA_VERSION}: the next open migrates it")
        cur.execute("SELECT budget_bytes, total_bytes, dim, log_seq FROM state WHERE id = 1")
        budget, counter, dim, log_seq = cur.fetchone()
        report.checked = _count(cur, "SELECT COUNT(*) FROM entries")
        report.problems += [f"entry {eid}: {problem}" for eid, problem in _entry_problems(cur)]
        total = _count(cur, "SELECT COALESCE(SUM(nbytes), 0) FROM entries")
        if total != counter:
            report.problems.append(f"the byte counter says {counter}, the entries hold {total}")
        if total > budget:
            report.problems.append(f"the entries hold {total / 1e6:.2f} MB, over the budget of {budget / 1e6:.2f} MB "
                                   "(prune evicts down to it)")
        orphans = _count(cur, "SELECT COUNT(*) FROM entities e WHERE NOT EXISTS "
                              "(SELECT 1 FROM postings p WHERE p.entity_id = e.id)")
        if orphans:
            report.problems.append(f"{orphans} entities belong to no entry")
        stray = _count(cur, "SELECT COUNT(*) FROM blobs b WHERE NOT EXISTS (SELECT 1 FROM entries e "
                            "WHERE e.id = b.entry_id)")
        if stray:
            report.problems.append(f"{stray} latent blobs belong to no entry")
        bad = _bad_vectors(cur, dim)
        if bad:
            report.problems.append(f"{len(bad)} entity vector(s) are not finite unit vectors")
        last = _count(cur, "SELECT COALESCE(MAX(seq), 0) FROM index_log")
        if last > log_seq:
            report.problems.append(f"the change log reaches seq {last}, past the recorded position {log_seq}")
    return report


def _quarantine(cur: Any, entry_ids: list[int], reason: str | dict[int, str]) -> None:
    """Copy entries' bytes and prompts to the quarantine table (before they are deleted)."""
    for eid in entry_ids:
        why = reason if isinstance(reason, str) else reason[eid]
        cur.execute("INSERT INTO quarantine (entry_id, prompt, reason, at, data) SELECT e.id, e.prompt, %s, %s, "
                    "b.data FROM entries e LEFT JOIN blobs b ON b.entry_id = e.id WHERE e.id = %s",
                    (why, time.time(), eid))


def set_aside(db: PgDb, keeper: IndexKeeper, items: list[tuple[int, str]]) -> None:
    """Quarantine and drop entries a lookup could not load; a busy or unreachable server leaves them for later."""
    try:
        with db.write() as cur:
            cur.execute("SET LOCAL lock_timeout = '5s'")
            state = State.lock(cur)
            ids = [eid for eid, _ in items]
            cur.execute("SELECT id FROM entries WHERE id = ANY(%s)", (ids,))
            present = [int(r[0]) for r in cur.fetchall()]
            reasons = dict(items)
            _quarantine(cur, present, {eid: f"set aside by a lookup: {reasons[eid]}" for eid in present})
            delete_entries(cur, state, present)
            state.save(cur)
        keeper.sync()
    except CacheError as exc:
        log.warning("[CHAI] could not set damaged entries aside now: %s", exc)


def repair(db: PgDb, name: str) -> VerifyReport:
    """Verify, then fix under the state lock: drop (and quarantine) entries with bad bytes and those holding an
    invalid vector, orphan entities, stray blobs; recount; start a new index epoch so every worker rebuilds."""
    report = verify(db, name)
    with db.write() as cur:
        state = State.lock(cur)
        cur_bin = db.connection().cursor(binary=True)
        bad = dict(_entry_problems(cur_bin))
        if bad:
            _quarantine(cur, sorted(bad), bad)
            delete_entries(cur, state, sorted(bad))
            report.repaired += [f"dropped entry {eid}: {why}; its bytes are in the quarantine table"
                                for eid, why in sorted(bad.items())]
        vectors = _bad_vectors(cur_bin, state.dim)
        if vectors:
            cur.execute("SELECT DISTINCT entry_id FROM postings WHERE entity_id = ANY(%s)", (vectors,))
            held = sorted(int(r[0]) for r in cur.fetchall())
            _quarantine(cur, held, "its entry had an invalid entity vector")
            delete_entries(cur, state, held)
            cur.execute("DELETE FROM postings WHERE entity_id = ANY(%s)", (vectors,))
            cur.execute("DELETE FROM entities WHERE id = ANY(%s) RETURNING id", (vectors,))
            state.log(cur, [(int(r[0]), "del") for r in cur.fetchall()])
            report.repaired.append(f"removed {len(vectors)} invalid entity vectors and the {len(held)} entries "
                                   "holding them")
        cur.execute("DELETE FROM entities e WHERE NOT EXISTS (SELECT 1 FROM postings p WHERE p.entity_id = e.id) "
                    "RETURNING e.id")
        orphans = [int(r[0]) for r in cur.fetchall()]
        if orphans:
            state.log(cur, [(eid, "del") for eid in sorted(orphans)])
            report.repaired.append(f"removed {len(orphans)} entities that belonged to no entry")
        cur.execute("DELETE FROM blobs b WHERE NOT EXISTS (SELECT 1 FROM entries e WHERE e.id = b.entry_id)")
        if cur.rowcount:
            report.repaired.append(f"removed {cur.rowcount} latent blobs that belonged to no entry")
        before = state.total_bytes
        if recount_bytes(cur, state) != before:
            report.repaired.append(f"recounted the bytes: {before} -> {state.total_bytes}")
        state.index_epoch += 1
        state.generation += 1
        state.save(cur)
    return report


def clear(db: PgDb) -> int:
    """Delete every entry, blob, entity and posting of the cache (the quarantine table stays); a new epoch."""
    with db.write() as cur:
        state = State.lock(cur)
        n = _count(cur, "SELECT COUNT(*) FROM entries")
        for table in ("postings", "blobs", "entries", "entities", "index_log", "groups"):
            cur.execute(f"DELETE FROM {table}")
        state.total_bytes, state.embedder, state.dim = 0, None, None
        state.generation += 1
        state.index_epoch += 1
        state.save(cur)
    return n
