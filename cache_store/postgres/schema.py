"""The PostgreSQL schema of one named cache: tables, the schema_version table and its migrations.

Each cache name is a schema of its own (`chai_<name>`), so several caches share one database and `clear`
touches one cache only. Creating or migrating a schema runs under a transaction-scoped advisory lock: workers
that start together create it once.
"""
from __future__ import annotations

import hashlib
import time
import uuid
from typing import Any, Callable

from ..config import DEFAULT_BUDGET_BYTES, DEFAULT_POLICY
from ..errors import FormatVersionError
from ..naming import validate_cache_name

SCHEMA_VERSION = 1
MAX_IDENTIFIER = 63  # PostgreSQL's NAMEDATALEN - 1

# Tables of one cache (unqualified: every connection's search_path is the cache's schema). `state` is one row:
# settings, counters and the log position; writers lock it (SELECT ... FOR UPDATE), which orders their commits,
# so log sequence numbers are handed out in commit order and a reader that caught up to N never misses one.
TABLES_V1 = [
    """CREATE TABLE state (
        id integer PRIMARY KEY CHECK (id = 1),
        name text NOT NULL,
        instance text NOT NULL,
        created double precision NOT NULL,
        budget_bytes bigint NOT NULL CHECK (budget_bytes > 0),
        policy text NOT NULL,
        embedder text,
        dim integer,
        total_bytes bigint NOT NULL DEFAULT 0,
        generation bigint NOT NULL DEFAULT 0,
        index_epoch bigint NOT NULL DEFAULT 0,
        log_seq bigint NOT NULL DEFAULT 0)""",
    "CREATE SEQUENCE ticks",  # the recency clock: a hit takes the next value without any lock
    """CREATE TABLE groups (
        id bigserial PRIMARY KEY,
        fingerprint text NOT NULL,
        shape text NOT NULL,
        UNIQUE (fingerprint, shape))""",
    """CREATE TABLE entries (
        id bigserial PRIMARY KEY,
        prompt text NOT NULL,
        fingerprint text NOT NULL,
        shape text NOT NULL,
        dtype text NOT NULL,
        nbytes bigint NOT NULL,
        checksum text NOT NULL,
        sigmas text NOT NULL,
        tensors text NOT NULL,
        meta text NOT NULL DEFAULT '{}',
        created double precision NOT NULL,
        last_used double precision NOT NULL,
        use_tick bigint NOT NULL,
        hits bigint NOT NULL DEFAULT 0,
        group_id bigint NOT NULL REFERENCES groups(id))""",
    "CREATE INDEX entries_lru ON entries (use_tick)",
    "CREATE INDEX entries_lfu ON entries (hits, use_tick)",
    # The latents: the same self-describing safetensors bytes a cache folder keeps in a file. Written before the
    # entry row in the same transaction (the key is checked at commit), so no row vouches for missing bytes.
    """CREATE TABLE blobs (
        entry_id bigint PRIMARY KEY REFERENCES entries(id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
        data bytea NOT NULL)""",
    "ALTER TABLE blobs ALTER COLUMN data SET STORAGE EXTERNAL",  # float latents do not compress: do not try
    """CREATE TABLE entities (
        id bigserial PRIMARY KEY,
        text text NOT NULL UNIQUE,
        kind text NOT NULL,
        vector bytea NOT NULL,
        head text NOT NULL DEFAULT '',
        core text NOT NULL DEFAULT '')""",
    """CREATE TABLE postings (
        group_id bigint NOT NULL,
        entity_id bigint NOT NULL REFERENCES entities(id),
        entry_id bigint NOT NULL REFERENCES entries(id) ON DELETE CASCADE,
        role text NOT NULL DEFAULT 'main',
        PRIMARY KEY (group_id, entity_id, entry_id))""",
    "CREATE INDEX postings_entry ON postings (entry_id)",
    "CREATE INDEX postings_entity ON postings (entity_id)",
    # What repair or a lookup set aside: the bytes stay for inspection (the folder backend's quarantine/).
    """CREATE TABLE quarantine (
        id bigserial PRIMARY KEY,
        entry_id bigint NOT NULL,
        prompt text NOT NULL,
        reason text NOT NULL,
        at double precision NOT NULL,
        data bytea)""",
    """CREATE TABLE index_log (
        seq bigint PRIMARY KEY,
        entity_id bigint NOT NULL,
        op text NOT NULL CHECK (op IN ('add', 'del')))""",
]

# Every change-log row carries a random mark, so a worker can tell that the row at the position its index
# reflects is still the row it applied: a schema restored from a backup (or a primary promoted from a lagging
# replica) hands out those sequence numbers and entity ids again for other entities. Added on open when missing
# (older packs keep writing rows: the default marks them), so it needs no schema version of its own.
LOG_MARK_COLUMN = ("ALTER TABLE index_log ADD COLUMN mark text NOT NULL "
                   "DEFAULT md5(random()::text || clock_timestamp()::text)")

# What each entity is (core, else head): lookups read stored vectors back by it (lookup/stored_vectors.py). Added
# on open when missing, like the mark column, so older packs keep working on the same schema.
IDENTITY_INDEX = "CREATE INDEX entities_identity ON entities (core, head)"

TABLES = ("schema_version", "state", "groups", "entries", "blobs", "entities", "postings", "quarantine", "index_log")

# Migrations: {from_version: function(cursor)} run in order, each in the transaction that records its version.
MIGRATIONS: dict[int, Callable[[Any], None]] = {}


def schema_name(name: str) -> str:
    """The schema of cache `name`: chai_<name>, shortened with a hash when PostgreSQL's 63 bytes are too few."""
    name = validate_cache_name(name)
    full = f"chai_{name}"
    if len(full.encode()) <= MAX_IDENTIFIER:
        return full
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"chai_{name[:MAX_IDENTIFIER - 14]}_{digest}"


def lock_key(schema: str) -> int:
    """A signed 64-bit advisory lock key for this schema."""
    return int.from_bytes(hashlib.sha256(b"chai-schema:" + schema.encode()).digest()[:8], "big", signed=True)


def ensure(cur: Any, sql: Any, schema: str, name: str, budget_bytes: int | None, policy: str | None) -> str:
    """Create the cache's schema if it is missing, or migrate it; return what was done ("created", "migrated
    from vN", or "")."""
    cur.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(schema),))
    cur.execute("SELECT to_regclass(%s)", (f'"{schema}".schema_version',))
    if cur.fetchone()[0] is None:
        cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        cur.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
        cur.execute("CREATE TABLE schema_version (version integer PRIMARY KEY, applied double precision NOT NULL, "
                    "note text NOT NULL)")
        for statement in TABLES_V1:
            cur.execute(statement)
        cur.execute("INSERT INTO state (id, name, instance, created, budget_bytes, policy) "
                    "VALUES (1, %s, %s, %s, %s, %s)",
                    (name, uuid.uuid4().hex, time.time(), budget_bytes or DEFAULT_BUDGET_BYTES,
                     policy or DEFAULT_POLICY))
        cur.execute("INSERT INTO schema_version VALUES (1, %s, 'created')", (time.time(),))
        version = start = 1
        done = "created"
    else:
        cur.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
        cur.execute("SELECT MAX(version) FROM schema_version")
        version = start = cur.fetchone()[0] or 0
        done = ""
        if version > SCHEMA_VERSION:
            raise FormatVersionError(
                f"cache '{name}' on the server uses schema v{version}, newer than this CHAI pack (v{SCHEMA_VERSION}); "
                "update the pack on this worker, or use another cache name")
    while version < SCHEMA_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise FormatVersionError(f"cache '{name}' on the server uses schema v{version}, which this pack cannot "
                                     "migrate; clear it or use another cache name")
        step(cur)
        version += 1
        cur.execute("INSERT INTO schema_version VALUES (%s, %s, %s)", (version, time.time(), "migrated"))
        done = f"migrated from v{start}"
    cur.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = %s AND table_name = 'index_log' "
                "AND column_name = 'mark'", (schema,))
    if cur.fetchone() is None:
        cur.execute(LOG_MARK_COLUMN)
    cur.execute("SELECT 1 FROM pg_indexes WHERE schemaname = %s AND indexname = 'entities_identity'", (schema,))
    if cur.fetchone() is None:
        cur.execute(IDENTITY_INDEX)
    return done
