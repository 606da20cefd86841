"""The SQLite manifest: the store's source of truth (entries, entities, postings, index change log)."""
from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from .. import regular_files
from ..errors import FormatVersionError, ManifestDamagedError, ManifestError
from ..index.points import EntityPoints, points_of
from ..types import EntryInfo

FORMAT_VERSION = 2  # v2: entities carry head and core, postings the entity's role in the entry
MANIFEST_NAME = "manifest.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    prompt TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    shape TEXT NOT NULL,
    dtype TEXT NOT NULL,
    file TEXT NOT NULL UNIQUE,
    nbytes INTEGER NOT NULL,
    checksum TEXT NOT NULL,
    sigmas TEXT NOT NULL,
    tensors TEXT NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    last_used REAL NOT NULL,
    use_tick INTEGER NOT NULL,
    hits INTEGER NOT NULL DEFAULT 0,
    group_id INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_key ON entries(fingerprint, shape);
CREATE TABLE IF NOT EXISTS groups (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    fingerprint TEXT NOT NULL,
    shape TEXT NOT NULL,
    UNIQUE (fingerprint, shape)
);
CREATE INDEX IF NOT EXISTS entries_lru ON entries(use_tick);
CREATE INDEX IF NOT EXISTS entries_lfu ON entries(hits, use_tick);
CREATE TABLE IF NOT EXISTS entities (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    text TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    vector BLOB NOT NULL,
    head TEXT NOT NULL DEFAULT '',
    core TEXT NOT NULL DEFAULT ''
);
-- Postings carry the entry's (model fingerprint, latent shape) group so a lookup ranks compatible entries with
-- one range scan per matched entity, without joining entries.
-- What each entity is (core, else head): lookups read stored vectors back by it (lookup/stored_vectors.py).
CREATE INDEX IF NOT EXISTS entities_identity ON entities(core, head);
CREATE TABLE IF NOT EXISTS postings (
    group_id INTEGER NOT NULL,
    entity_id INTEGER NOT NULL,
    entry_id INTEGER NOT NULL,
    role TEXT NOT NULL DEFAULT 'main',
    PRIMARY KEY (group_id, entity_id, entry_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS postings_entry ON postings(entry_id);
CREATE INDEX IF NOT EXISTS postings_entity ON postings(entity_id);
CREATE TABLE IF NOT EXISTS index_log (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    entity_id INTEGER NOT NULL,
    op TEXT NOT NULL
);
"""

TABLES = ("meta", "entries", "groups", "entities", "postings", "index_log")
REPAIR_HINT = "run `python -m comfyui_chai.cache_store --root <root> --name <name> repair`"


def advice(exc: sqlite3.Error) -> str:
    """What a user should do about an SQLite error, in one sentence."""
    text = str(exc)
    low = text.lower()
    if "full" in low:
        return f"the disk holding the cache is full ({text}): free space, or lower the budget with prune --budget-gb"
    if "readonly" in low or "read-only" in low or "permission" in low:
        return f"the cache folder is read-only ({text}): make it writable, or open a cache elsewhere"
    if "locked" in low or "busy" in low:
        return f"another process kept the cache busy ({text}); try again"
    return f"the cache manifest is damaged or unreadable ({text}); {REPAIR_HINT}"


def _v1_to_v2(cur: sqlite3.Cursor) -> None:
    """Entities get head and core (unknown: ''), postings a role; entries of v1 keep matching as before
    (every entity may carry a hit), so an upgraded cache loses nothing."""
    cur.execute("ALTER TABLE entities ADD COLUMN head TEXT NOT NULL DEFAULT ''")
    cur.execute("ALTER TABLE entities ADD COLUMN core TEXT NOT NULL DEFAULT ''")
    cur.execute("ALTER TABLE postings ADD COLUMN role TEXT NOT NULL DEFAULT 'main'")


# Migrations from older on-disk formats: {from_version: callable(cursor)}. Version 1 is the first release.
_MIGRATIONS: dict[int, object] = {1: _v1_to_v2}

def _remove_unfilled(path: Path) -> None:
    """Remove a manifest this open created and could not fill (a full disk: no schema yet), -wal and -shm too."""
    for part in (path, Path(str(path) + "-wal"), Path(str(path) + "-shm")):
        try:
            part.unlink(missing_ok=True)
        except OSError:
            pass


def _entry_from_row(row: sqlite3.Row, entities: Sequence[str] = ()) -> EntryInfo:
    return EntryInfo(
        id=row["id"], prompt=row["prompt"], entities=tuple(entities), fingerprint=row["fingerprint"],
        shape=tuple(json.loads(row["shape"])), dtype=row["dtype"], nbytes=row["nbytes"],
        sigmas=tuple(json.loads(row["sigmas"])), tensors=tuple(json.loads(row["tensors"])),
        created=row["created"], last_used=row["last_used"], hits=row["hits"], file=row["file"],
        checksum=row["checksum"],
    )


class Manifest:
    """Thread-safe wrapper over one SQLite connection in WAL mode."""

    PINNED_JOIN = "CROSS JOIN"  # SQLite keeps the join order a CROSS JOIN names (ranking relies on it)
    INSTR = "instr"  # ranking.rank: the position of a substring, 0 when absent
    ID_LIST = "group_concat({})"  # ranking: a group's values as one comma-joined text
    # ranking.rank's postings, set at open: pinned to the primary key (group, entity, entry), whose rows hold the
    # role. Left to itself SQLite reads them through postings_entity and fetches each row's role again from the
    # table, a third more time at 100k entries (bench_store_scale).
    POSTINGS_SCAN = "postings p"
    LATE_IDS = False  # entry ids (AUTOINCREMENT, never reused) are drawn inside the one write transaction: in order

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        self.readonly = readonly
        self._lock = threading.RLock()
        self._connect()

    def _connect(self) -> None:
        path, readonly = self.path, self.readonly
        for part in (path, Path(str(path) + "-wal"), Path(str(path) + "-shm")):
            why = regular_files.refusal(part)
            if why:  # SQLite would block reading a FIFO, or write through a link out of the cache
                raise ManifestDamagedError(f"cannot open the cache manifest {path}: {why}")
        created = not readonly and not path.exists()
        try:
            if readonly:
                # immutable when no -wal exists: a read-only open must not create -wal/-shm files either
                wal = Path(str(path) + "-wal").exists()
                uri = f"{path.resolve().as_uri()}?{'mode=ro' if wal else 'immutable=1'}"
                self.conn = sqlite3.connect(uri, uri=True, timeout=60.0, isolation_level=None,
                                            check_same_thread=False)
            else:
                self.conn = sqlite3.connect(str(path), timeout=60.0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise ManifestDamagedError(f"cannot open the cache manifest {path}: {advice(exc)}") from exc
        self.conn.row_factory = sqlite3.Row
        try:
            self.conn.execute("PRAGMA busy_timeout=60000")
            if readonly:
                self._check_readable()
            else:
                self.conn.execute("PRAGMA journal_mode=WAL")
                # FULL: the commit that vouches for a latent file is on disk when insert returns (one WAL fsync)
                self.conn.execute("PRAGMA synchronous=FULL")
                self._init_schema()
                self._check_readable()
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            if "full" in str(exc).lower():  # a full disk is no damage: say so, and rebuild nothing over it
                if created:
                    _remove_unfilled(path)
                raise ManifestError(f"cannot open the cache manifest {path}: {advice(exc)}") from exc
            raise ManifestDamagedError(f"cache manifest {path} is unreadable: {exc}") from exc
        except Exception:
            self.conn.close()
            raise

    def _check_readable(self) -> None:
        """Raise ManifestDamagedError unless every table exists and the meta counters parse."""
        names = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        missing = [t for t in TABLES if t not in names]
        if missing:
            raise ManifestDamagedError(f"cache manifest {self.path} lacks table(s) {', '.join(missing)}")
        version = self._read_version()
        if version is None or version > FORMAT_VERSION:
            raise FormatVersionError(f"cache manifest {self.path} has format v{version}, this pack reads "
                                     f"v{FORMAT_VERSION}")
        meta = dict(self.conn.execute("SELECT key, value FROM meta").fetchall())
        for key in ("generation", "tick", "index_epoch", "total_bytes"):
            try:
                int(meta[key])
            except (KeyError, ValueError) as exc:
                raise ManifestDamagedError(f"cache manifest {self.path}: meta {key!r} is missing or not "
                                           "an integer") from exc
        self.conn.execute("SELECT id, file, nbytes FROM entries LIMIT 1").fetchall()
        pk = [r[1] for r in self.conn.execute("PRAGMA index_list(postings)").fetchall() if r[3] == "pk"]
        self.POSTINGS_SCAN = f'postings p INDEXED BY "{pk[0]}"' if pk else "postings p"

    def _init_schema(self) -> None:
        version = self._read_version()
        if version is None and self.conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]:
            raise ManifestDamagedError(f"{self.path} is an SQLite database with other tables, not a CHAI manifest")
        if version is None:
            with self.write() as cur:
                if self._read_version() is None:
                    for stmt in _SCHEMA.split(";"):
                        if stmt.strip():
                            cur.execute(stmt)
                    now = str(time.time())
                    for key, value in (("format_version", str(FORMAT_VERSION)), ("generation", "0"),
                                       ("tick", "0"), ("index_epoch", "0"), ("total_bytes", "0"), ("created", now)):
                        cur.execute("INSERT OR IGNORE INTO meta(key, value) VALUES (?, ?)", (key, value))
            return
        if version > FORMAT_VERSION:
            raise FormatVersionError(
                f"cache manifest {self.path} uses on-disk format v{version}, newer than this CHAI pack (v{FORMAT_VERSION}); "
                "update the pack, or open a cache under another name"
            )
        while version < FORMAT_VERSION:
            step = _MIGRATIONS.get(version)
            if step is None:
                raise FormatVersionError(
                    f"cache manifest {self.path} uses on-disk format v{version}, which cannot be migrated; "
                    "clear it with `python -m cache_store --root <root> --name <name> clear` or choose another name"
                )
            with self.write() as cur:
                step(cur)  # type: ignore[operator]
                version += 1
                cur.execute("UPDATE meta SET value=? WHERE key='format_version'", (str(version),))
        if not self.readonly and not self.conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='index' AND name='entities_identity'").fetchone():
            with self.write() as cur:  # a cache made before the index: one pass over its entities, once
                cur.execute("CREATE INDEX IF NOT EXISTS entities_identity ON entities(core, head)")

    def _read_version(self) -> int | None:
        has_meta = self.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
        if not has_meta:
            return None
        row = self.conn.execute("SELECT value FROM meta WHERE key='format_version'").fetchone()
        if row is None:
            raise ManifestDamagedError(f"cache manifest {self.path} has no format version; it was not written "
                                       "by CHAI")
        try:
            return int(row[0])
        except (TypeError, ValueError) as exc:
            raise ManifestDamagedError(f"cache manifest {self.path} has format version {row[0]!r}, "
                                       "not a number") from exc

    @contextlib.contextmanager
    def write(self, durable: bool = True) -> Iterator[sqlite3.Cursor]:
        """A write transaction (BEGIN IMMEDIATE), committed on success and rolled back on error.

        `durable=False` commits without waiting for the disk (synchronous=NORMAL for this one transaction): for
        what a power cut may lose harmlessly, such as a hit's recency. The manifest stays consistent either way,
        and the next durable commit carries it to disk too.
        """
        with self._lock:
            try:
                if not durable:
                    self.conn.execute("PRAGMA synchronous=NORMAL")
                cur = self.conn.cursor()
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                self._durable_again(durable)
                raise ManifestError(advice(exc)) from exc
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException as exc:
                if self.conn.in_transaction:
                    try:
                        cur.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                if isinstance(exc, sqlite3.Error):
                    raise ManifestError(advice(exc)) from exc
                raise
            finally:
                self._durable_again(durable)

    def _durable_again(self, durable: bool) -> None:
        """Back to synchronous=FULL after a transaction that was not durable."""
        if not durable:
            try:
                self.conn.execute("PRAGMA synchronous=FULL")
            except sqlite3.Error:
                pass

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Cursor]:
        """A consistent read snapshot."""
        with self._lock:
            try:
                cur = self.conn.cursor()
                cur.execute("BEGIN")
            except sqlite3.Error as exc:
                raise ManifestError(advice(exc)) from exc
            try:
                yield cur
            except sqlite3.Error as exc:
                raise ManifestError(advice(exc)) from exc
            finally:
                if self.conn.in_transaction:
                    try:
                        cur.execute("COMMIT")
                    except sqlite3.Error:
                        pass

    def query(self, sql: str, params: Sequence = ()) -> list[sqlite3.Row]:
        """Run one read statement."""
        with self._lock:
            try:
                return self.conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise ManifestError(advice(exc)) from exc

    def meta(self, key: str, default: str | None = None) -> str | None:
        """One value of the meta table."""
        rows = self.query("SELECT value FROM meta WHERE key=?", (key,))
        return rows[0][0] if rows else default

    @staticmethod
    def set_meta(cur: sqlite3.Cursor, key: str, value: str) -> None:
        """Set a meta value inside a write transaction."""
        cur.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                    (key, value))

    @staticmethod
    def bump(cur: sqlite3.Cursor, key: str) -> int:
        """Increment an integer meta counter inside a write transaction and return the new value."""
        cur.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key=?", (key,))
        return int(cur.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()[0])

    def entry(self, entry_id: int) -> EntryInfo | None:
        """One entry with its entity phrases, or None."""
        with self.read() as cur:
            row = cur.execute("SELECT * FROM entries WHERE id=?", (entry_id,)).fetchone()
            if row is None:
                return None
            ents = [r[0] for r in cur.execute(
                "SELECT e.text FROM postings p JOIN entities e ON e.id=p.entity_id WHERE p.entry_id=? ORDER BY e.text",
                (entry_id,))]
        try:
            return _entry_from_row(row, ents)
        except (TypeError, ValueError):  # a malformed row (hand-edited or damaged): not an entry
            return None

    def entries(self, limit: int | None = None) -> list[EntryInfo]:
        """Entries, most recently used first."""
        sql = "SELECT * FROM entries ORDER BY use_tick DESC" + (" LIMIT ?" if limit else "")
        rows = self.query(sql, (limit,) if limit else ())
        return [e for e in (self.entry(r["id"]) for r in rows) if e is not None]

    def entity_vectors(self, ids: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, vectors) of all entities, or of the given ids."""
        points = self.entity_points(ids)
        return points.ids, points.vectors

    def entity_points(self, ids: Sequence[int] | None = None) -> EntityPoints:
        """Ids, vectors and identities ((core, head); None for rows of format v1) of all entities, or of the given
        ids, in one read transaction."""
        sql = "SELECT id, vector, core, head FROM entities"
        with self.read() as cur:
            if ids is None:
                rows = cur.execute(sql + " ORDER BY id").fetchall()
            else:
                rows = []
                for chunk in range(0, len(ids), 500):
                    part = [int(i) for i in ids[chunk:chunk + 500]]
                    rows += cur.execute(f"{sql} WHERE id IN ({','.join('?' * len(part))})", part).fetchall()
            dim = cur.execute("SELECT value FROM meta WHERE key = 'dim'").fetchone()
        return points_of(rows, int(dim[0]) if dim and str(dim[0]).isdigit() else 0)

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self.conn.close()

    def reopen(self) -> None:
        """Connect again to the manifest file (after repair rebuilt it): every holder of this object follows."""
        with self._lock:
            self._connect()
