"""Issue 23 on a real PostgreSQL server: a restored schema never makes a worker serve by stale entity ids, and a
frozen server turns into misses within the configured timeout instead of blocking a lookup."""
from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from comfyui_chai.cache_store.config import StoreConfig
from comfyui_chai.cache_store.pg_store import PgCacheStore
from comfyui_chai.cache_store.server_url import ServerURL
from comfyui_chai.cache_store.service import ChaiCache
from pg_server import CHAI_PASSWORD, PgServer, find_binaries
from store_helpers import SIGMAS, ents, latents

FP, SHAPE, THR = "model-a", (1, 4, 2, 4, 4), 0.8


@pytest.fixture
def url(pg_server) -> ServerURL:
    return ServerURL(pg_server.url("chai", password=CHAI_PASSWORD), "CHAI_CACHE_URL")


def _worker(url: ServerURL, name: str, root, **config) -> PgCacheStore:
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


def _served(store: PgCacheStore, subject: str) -> str | None:
    res = store.lookup(ents(subject), FP, SHAPE, THR)
    return res.entry.prompt if res.hit else None


@pytest.mark.parametrize("reopen", [False, True])
def test_a_restored_schema_never_makes_a_worker_serve_another_subjects_entry(pg_server, url, tmp_path, reopen):
    name, root = "r" + uuid.uuid4().hex[:10], tmp_path / "worker"
    live = _worker(url, name, root)
    for i in range(5):
        live.insert(f"plant{i} in a scene", ents(f"plant{i}"), FP, latents(i), SIGMAS)
    dump = snapshot(pg_server, live.schema)
    for i in range(10, 15):  # after the backup: the live worker's index learns these entity ids
        live.insert(f"vehicle{i} in a scene", ents(f"vehicle{i}"), FP, latents(i), SIGMAS)
    assert _served(live, "vehicle12") == "vehicle12 in a scene"
    restore(pg_server, live.schema, dump)
    if reopen:
        live.close()
    # another worker writes to the restored cache: the server hands out the same entity ids again
    with _worker(url, name, tmp_path / "other") as other:
        for i in range(20, 25):
            other.insert(f"animal{i} in a scene", ents(f"animal{i}"), FP, latents(i), SIGMAS)
    if reopen:
        live = _worker(url, name, root)  # its saved index is the stale one
    for i in range(10, 15):  # gone with the restore: a miss, never the entry that now holds the id
        assert _served(live, f"vehicle{i}") is None
    for i in list(range(5)) + list(range(20, 25)):
        subject = f"plant{i}" if i < 5 else f"animal{i}"
        assert _served(live, subject) == f"{subject} in a scene"
    live.close()


# ------------------------------------------------------------------------------------------ a frozen server
@pytest.fixture
def own_server():
    if find_binaries() is None:
        pytest.skip("no PostgreSQL binaries (initdb, pg_ctl): install Debian's `postgresql` package")
    server = PgServer.start()
    yield server
    server.destroy()


def _server_pids(server: PgServer) -> list[int]:
    """The postmaster and every backend of this server (SIGSTOP freezes all, as a hung machine would)."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    children = [int(p) for p in os.popen(f"pgrep -P {postmaster}").read().split()]
    return [postmaster] + children


def test_a_frozen_server_is_a_miss_within_the_timeout_not_a_hang(own_server, tmp_path):
    url = ServerURL(own_server.url("chai", password=CHAI_PASSWORD), "CHAI_CACHE_URL")
    cache = ChaiCache(tmp_path, server=url, name="frozen", server_timeout_s=2.0)
    assert cache.write("a dog", ents("dog"), FP, latents(1), SIGMAS).stored
    assert cache.lookup(ents("dog"), FP, SHAPE, THR).hit
    pids = _server_pids(own_server)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        miss = cache.lookup(ents("dog"), FP, SHAPE, THR)
        took = time.monotonic() - start
        assert not miss.hit and "did not answer" in miss.reason, miss.reason
        assert took < 8, took
        start = time.monotonic()
        written = cache.write("a cat", ents("cat"), FP, latents(2), SIGMAS)
        assert not written.stored and "did not answer" in written.reason, written.reason
        assert time.monotonic() - start < 12
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert cache.lookup(ents("dog"), FP, SHAPE, THR).hit  # the server answers again: the cache works again
    cache.close()
