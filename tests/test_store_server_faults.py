"""Issue 23 on a real PostgreSQL server: a restored schema never makes a worker serve by stale entity ids, and a
frozen server turns into misses within the configured timeout instead of blocking a lookup."""
from __future__ import annotations

import time
import uuid

import pytest

from comfyui_chai.cache_store.postgres.url import ServerURL
from comfyui_chai.cache_store.service import ChaiCache
from pg_faults import FP, SHAPE, THR, frozen, pg_worker, restore, restored_under_a_worker, served, snapshot
from pg_server import CHAI_PASSWORD
from store_helpers import SIGMAS, ents, latents


@pytest.fixture
def url(pg_server) -> ServerURL:
    return ServerURL(pg_server.url("chai", password=CHAI_PASSWORD), "CHAI_CACHE_URL")


@pytest.mark.parametrize("reopen", [False, True])
def test_a_restored_schema_never_makes_a_worker_serve_another_subjects_entry(pg_server, url, tmp_path, reopen):
    """Before the fix a live worker served 'vehicle5' with entry 'animal10 in a scene' (the entity id it knew
    for vehicle5 was handed to animal10 after the restore); reopened, it loaded the same stale index."""
    out = restored_under_a_worker(pg_server, url, tmp_path, reopen)
    assert out == {"asked": 15, "right": 15, "wrong": 0, "missed": 0}


def test_a_fresh_worker_and_the_restored_schema_agree_after_the_rebuild(pg_server, url, tmp_path):
    name = "r" + uuid.uuid4().hex[:10]
    with pg_worker(url, name, tmp_path / "a") as live:
        live.insert("plant0 in a scene", ents("plant0"), FP, latents(0), SIGMAS)
        dump = snapshot(pg_server, live.schema)
        live.insert("vehicle1 in a scene", ents("vehicle1"), FP, latents(1), SIGMAS)
        seq = live.keeper.seq
        restore(pg_server, live.schema, dump)
        assert served(live, "vehicle1") is None and live.keeper.seq < seq  # rebuilt at the restored position
        live.insert("animal2 in a scene", ents("animal2"), FP, latents(2), SIGMAS)
        with pg_worker(url, name, tmp_path / "b") as fresh:
            for subject in ("plant0", "animal2"):
                assert served(fresh, subject) == served(live, subject) == f"{subject} in a scene"


# ------------------------------------------------------------------------------------------ a frozen server
def test_a_frozen_server_is_a_miss_within_the_timeout_not_a_hang(own_server, tmp_path):
    url = ServerURL(own_server.url("chai", password=CHAI_PASSWORD), "CHAI_CACHE_URL")
    cache = ChaiCache(tmp_path, server=url, name="frozen", server_timeout_s=2.0)
    assert cache.write("a dog", ents("dog"), FP, latents(1), SIGMAS).stored
    assert cache.lookup(ents("dog"), FP, SHAPE, THR).hit
    with frozen(own_server):
        start = time.monotonic()
        miss = cache.lookup(ents("dog"), FP, SHAPE, THR)
        took = time.monotonic() - start
        assert not miss.hit and "did not answer" in miss.reason, miss.reason
        assert took < 8, took
        start = time.monotonic()
        written = cache.write("a cat", ents("cat"), FP, latents(2), SIGMAS)
        assert not written.stored and "did not answer" in written.reason, written.reason
        assert time.monotonic() - start < 12
    assert cache.lookup(ents("dog"), FP, SHAPE, THR).hit  # the server answers again: the cache works again
    cache.close()
