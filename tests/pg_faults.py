"""Faults of a PostgreSQL cache server, shared by tests/test_store_server_faults.py and bench/bench_store_faults.py:
a schema restored from a backup under a live worker (issue 23 item 1), a server frozen while connected (item 6)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterator

from comfyui_chai.cache_store.config import StoreConfig
from comfyui_chai.cache_store.lookup.rule import HitRule
from comfyui_chai.cache_store.postgres.store import PgCacheStore
from comfyui_chai.cache_store.postgres.url import ServerURL
from comfyui_chai.cache_store.service import ChaiCache
from pg_server import PgServer
from store_helpers import SIGMAS, ents, latents

FP, SHAPE, THR = "model-a", (1, 4, 2, 4, 4), 0.8


def pg_worker(url: ServerURL, name: str, root: Path, **config) -> PgCacheStore:
    """A store as one worker of a farm opens it, its entity index under `root`."""
    return PgCacheStore(url, name, StoreConfig(10**9, **config), index_root=root)


def snapshot(server: PgServer, schema: str) -> str:
    """The schema as pg_dump writes it (what a backup holds)."""
    return server._run("pg_dump", "-h", str(server.socket_dir), "-p", str(server.port), "-U", "postgres",
                       "-d", "chai", "-n", schema)


def restore(server: PgServer, schema: str, dump: str) -> None:
    """Replace the schema by the snapshot, as an administrator restoring a backup does."""
    path = server.base / f"restore-{uuid.uuid4().hex[:6]}.sql"
    path.write_text(dump)
    path.chmod(0o644)
    server.admin_sql(f'DROP SCHEMA "{schema}" CASCADE', database="chai")
    server._run("psql", "-h", str(server.socket_dir), "-p", str(server.port), "-U", "postgres", "-d", "chai",
                "-v", "ON_ERROR_STOP=1", "-q", "-f", str(path))
    path.unlink()


def served(store: PgCacheStore, subject: str) -> str | None:
    """The prompt of the entry a lookup of `subject` serves, or None for a miss."""
    res = store.lookup(ents(subject), FP, SHAPE, HitRule(THR))
    return res.entry.prompt if res.hit else None


def restored_under_a_worker(server: PgServer, url: ServerURL, tmp: Path, reopen: bool, n: int = 5) -> dict[str, int]:
    """Fill n entries, back up, add n more, restore the backup under a live worker, let another worker add n
    others (reissuing the entity ids); then ask the live (or reopened) worker for all 3n subjects."""
    name, root = "r" + uuid.uuid4().hex[:10], tmp / uuid.uuid4().hex[:8]
    live = pg_worker(url, name, root)
    for i in range(n):
        live.insert(f"plant{i} in a scene", ents(f"plant{i}"), FP, latents(i), SIGMAS)
    dump = snapshot(server, live.schema)
    for i in range(n, 2 * n):
        live.insert(f"vehicle{i} in a scene", ents(f"vehicle{i}"), FP, latents(i), SIGMAS)
    restore(server, live.schema, dump)
    if reopen:
        live.close()
    with pg_worker(url, name, tmp / uuid.uuid4().hex[:8]) as other:
        for i in range(2 * n, 3 * n):
            other.insert(f"animal{i} in a scene", ents(f"animal{i}"), FP, latents(i), SIGMAS)
    if reopen:
        live = pg_worker(url, name, root)
    out = {"asked": 0, "right": 0, "wrong": 0, "missed": 0}
    try:
        for i in range(3 * n):
            subject = ("plant", "vehicle", "animal")[i // n] + str(i)
            got = served(live, subject)
            out["asked"] += 1
            gone = n <= i < 2 * n  # lost with the restore: a miss is right
            if got is None:
                out["right" if gone else "missed"] += 1
            else:
                out["right" if got == f"{subject} in a scene" else "wrong"] += 1
    finally:
        live.close()
    return out


def server_pids(server: PgServer) -> list[int]:
    """The postmaster and every backend of this server (SIGSTOP freezes all, as a hung machine would)."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
    return [postmaster] + [int(p) for p in children]


@contextlib.contextmanager
def frozen(server: PgServer) -> Iterator[None]:
    """The whole server stopped (SIGSTOP) inside, resumed (SIGCONT) however the body ends."""
    pids = server_pids(server)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def frozen_while_connected(server: PgServer, url: ServerURL, tmp: Path, timeout_s: float,
                           lookups: int = 3) -> dict[str, float]:
    """Lookups and one write on a connected worker while the server is frozen: misses, not stored, seconds."""
    cache = ChaiCache(tmp / uuid.uuid4().hex[:8], server=url, name="f" + uuid.uuid4().hex[:8],
                      server_timeout_s=timeout_s)
    out = {"lookups": 0, "misses": 0, "max_s": 0.0, "not_stored": 0, "write_s": 0.0, "hit_after": 0}
    try:
        cache.write("a dog", ents("dog"), FP, latents(1), SIGMAS)
        with frozen(server):
            for _ in range(lookups):
                start = time.monotonic()
                res = cache.lookup(ents("dog"), FP, SHAPE, THR)
                out["max_s"] = max(out["max_s"], time.monotonic() - start)
                out["lookups"] += 1
                out["misses"] += not res.hit and "did not answer" in res.reason
            start = time.monotonic()
            out["not_stored"] += not cache.write("a cat", ents("cat"), FP, latents(2), SIGMAS).stored
            out["write_s"] = time.monotonic() - start
        out["hit_after"] = int(cache.lookup(ents("dog"), FP, SHAPE, THR).hit)
    finally:
        cache.close()
    return out
