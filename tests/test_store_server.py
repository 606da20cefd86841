"""What only the PostgreSQL backend has: workers sharing one server, the change log, schema versions, restarts,
kills, concurrent writers. Every test runs against a real server (tests/pg_server.py); none is mocked."""
from __future__ import annotations

import logging
import random
import signal
import subprocess
import threading
import time
import uuid

import pytest
import torch

from comfyui_chai.cache_store.postgres import rows as pg_rows, schema as pg_schema
from comfyui_chai.cache_store.config import StoreConfig
from comfyui_chai.cache_store.errors import CacheUnavailableError, FormatVersionError
from comfyui_chai.cache_store.index.keeper import IndexKeeper
from comfyui_chai.cache_store.postgres.store import PgCacheStore
from comfyui_chai.cache_store.postgres.url import ServerURL
from comfyui_chai.cache_store.service import ChaiCache
from comfyui_chai.cache_store.lookup.rule import HitRule
from farm_worker import parse_log
from pg_server import CHAI_PASSWORD
from store_helpers import PYTHON, REPO, SIGMAS, ents, latents, subprocess_env

FP, SHAPE, THR = "model-a", (1, 4, 2, 4, 4), 0.8


@pytest.fixture
def url(pg_server) -> ServerURL:
    return ServerURL(pg_server.url("chai", password=CHAI_PASSWORD), "CHAI_CACHE_URL")


def fresh() -> str:
    return "s" + uuid.uuid4().hex[:10]


def worker(url: ServerURL, name: str, tmp_path, config: StoreConfig | None = None) -> PgCacheStore:
    """A store as one worker of a farm opens it: its own local index folder."""
    return PgCacheStore(url, name, config or StoreConfig(10**9), index_root=tmp_path / uuid.uuid4().hex[:8])


def state(store: PgCacheStore) -> dict:
    cols = ("budget_bytes", "total_bytes", "generation", "index_epoch", "log_seq")
    return dict(zip(cols, store.db.query(f"SELECT {', '.join(cols)} FROM state")[0]))


# ------------------------------------------------------------------------------------------ schema and versions
def test_workers_starting_together_create_the_schema_once(url, tmp_path):
    name, errors, stores = fresh(), [], []

    def open_one():
        try:
            stores.append(worker(url, name, tmp_path))
        except Exception as exc:  # collected: the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(stores) == 6
    assert stores[0].db.query("SELECT version, note FROM schema_version") == [(1, "created")]
    stores[0].insert("a dog", ents("dog"), FP, latents(1), SIGMAS)
    assert all(s.lookup(ents("dog"), FP, SHAPE, HitRule(THR)).hit for s in stores)
    for s in stores:
        s.close()


def test_a_newer_schema_is_refused_and_migrations_run_once(url, tmp_path, monkeypatch, pg_server):
    name = fresh()
    worker(url, name, tmp_path).close()
    schema = pg_schema.schema_name(name)
    monkeypatch.setattr(pg_schema, "SCHEMA_VERSION", 2)
    calls = []

    def v1_to_v2(cur):
        calls.append(1)
        cur.execute("ALTER TABLE entries ADD COLUMN note text NOT NULL DEFAULT ''")

    monkeypatch.setattr(pg_schema, "MIGRATIONS", {1: v1_to_v2})
    for _ in range(2):
        worker(url, name, tmp_path).close()
    assert calls == [1]
    assert pg_server.admin_sql(f'SELECT version, note FROM "{schema}".schema_version ORDER BY version',
                               "chai").split() == ["1|created", "2|migrated"]
    monkeypatch.setattr(pg_schema, "SCHEMA_VERSION", 1)
    with pytest.raises(FormatVersionError, match="newer than this CHAI pack.*update the pack"):
        worker(url, name, tmp_path)


# ------------------------------------------------------------------------------------------ the change log
def test_a_worker_catches_up_by_sequence_number_and_rebuilds_when_the_log_was_truncated(url, tmp_path,
                                                                                         monkeypatch):
    name = fresh()
    a, b = worker(url, name, tmp_path), worker(url, name, tmp_path)
    a.insert("a dog", ents("dog"), FP, latents(1), SIGMAS)
    assert b.lookup(ents("dog"), FP, SHAPE, HitRule(THR)).hit
    assert b.keeper.seq == state(a)["log_seq"] == 1
    rebuilds = []
    real = IndexKeeper.rebuild
    monkeypatch.setattr(IndexKeeper, "rebuild", lambda self: (rebuilds.append(self), real(self))[1])
    a.insert("a cat", ents("cat"), FP, latents(2), SIGMAS)
    assert b.lookup(ents("cat"), FP, SHAPE, HitRule(THR)).hit and not rebuilds  # replayed seq 2, no rebuild
    monkeypatch.setattr(pg_rows, "LOG_KEEP", 3)  # keep 3 log rows, compacted at every write: b falls behind
    monkeypatch.setattr(pg_rows, "LOG_COMPACT_EVERY", 1)
    for i in range(8):
        a.insert(f"p{i}", ents(f"thing{i}"), FP, latents(i), SIGMAS)
    first = a.db.query("SELECT MIN(seq) FROM index_log")[0][0]
    assert first > b.keeper.seq + 1  # the log no longer reaches back to b's position
    res = b.lookup(ents("thing7"), FP, SHAPE, HitRule(THR))
    assert res.hit and res.entry.prompt == "p7"
    assert b.keeper in rebuilds and a.keeper not in rebuilds and b.keeper.seq == state(a)["log_seq"]
    a.close()
    b.close()


def test_a_restarted_worker_loads_its_saved_index_and_replays_only_the_news(url, tmp_path, monkeypatch):
    name, root = fresh(), tmp_path / "worker"
    with PgCacheStore(url, name, StoreConfig(10**9), index_root=root) as s:
        for i in range(5):
            s.insert(f"p{i}", ents(f"thing{i}", "dog"), FP, latents(i), SIGMAS)
    with worker(url, name, tmp_path) as other:  # another worker writes while this one is down
        other.insert("a cat", ents("cat"), FP, latents(9), SIGMAS)

    def no_rebuild(*a, **k):
        raise AssertionError("the saved index should have been loaded, not rebuilt")

    monkeypatch.setattr(IndexKeeper, "rebuild", no_rebuild)
    with PgCacheStore(url, name, StoreConfig(10**9), index_root=root) as s:
        assert s.lookup(ents("thing3"), FP, SHAPE, HitRule(THR)).entry.prompt == "p3"
        assert s.lookup(ents("cat"), FP, SHAPE, HitRule(THR)).entry.prompt == "a cat"


# ------------------------------------------------------------------------------------------ concurrency, kills
def _spawn(url: ServerURL, name, tmp_path, start, count, budget, log, shape="1x4x2x4x4") -> subprocess.Popen:
    return subprocess.Popen([PYTHON, str(REPO / "tests" / "farm_worker.py"), url.url, name,
                             str(tmp_path / f"w{start}"), str(start), str(count), str(budget), str(log), shape],
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_concurrent_writers_never_exceed_the_budget_nor_evict_an_entry_twice(url, tmp_path):
    name = fresh()
    with worker(url, name, tmp_path) as probe:
        size = probe.insert("probe", ents("probe"), FP, latents(0), SIGMAS).nbytes
        probe.clear()
    budget = size * 8 + size // 2
    seen, stop = [], threading.Event()
    monitor = worker(url, name, tmp_path, StoreConfig(budget))

    def watch():
        while not stop.is_set():
            seen.append(monitor.db.query("SELECT COALESCE(SUM(nbytes), 0), (SELECT total_bytes FROM state) "
                                         "FROM entries")[0])

    watcher = threading.Thread(target=watch)
    watcher.start()
    logs = [tmp_path / f"log{k}" for k in range(4)]
    procs = [_spawn(url, name, tmp_path, 1000 * (k + 1), 12, budget, logs[k]) for k in range(4)]
    outputs = [p.communicate(timeout=300)[0].decode() for p in procs]
    stop.set()
    watcher.join()
    assert all(p.returncode == 0 for p in procs), outputs
    done, evicted = {}, []
    for log in logs:
        d, e, unfinished = parse_log(log)
        assert not unfinished
        done.update(d)
        evicted += [x for ids in e.values() for x in ids]
    assert len(evicted) == len(set(evicted))                      # no entry evicted twice
    remaining = {e.id for e in monitor.entries()}
    assert remaining | set(evicted) == set(done.values()) and not remaining & set(evicted)
    assert seen and max(total for total, _ in seen) <= budget      # never over budget, as any reader saw it
    assert all(total == counter for total, counter in seen)        # the counter moves with the rows
    assert monitor.verify().ok
    monitor.close()


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="SIGKILL is POSIX (Windows has no such signal)")
def test_a_worker_killed_mid_insert_loses_nothing_committed_and_serves_nothing_corrupted(url, tmp_path):
    name, log = fresh(), tmp_path / "kills.log"
    shape = (1, 4, 8, 32, 32)  # ~400 kB per entry: most of an insert's time is spent on its bytes
    rng = random.Random(3)
    mid_insert = 0
    for kill in range(4):
        proc = _spawn(url, name, tmp_path, 100_000 * kill, 100_000, 10**10, log, "x".join(map(str, shape)))
        deadline = time.monotonic() + 120
        while f"done {100_000 * kill} " not in (log.read_text() if log.exists() else ""):  # started inserting
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-2000:]
            time.sleep(0.05)
        time.sleep(rng.uniform(0.05, 0.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        mid_insert += log.read_text().splitlines()[-1].startswith("begin")
    done, _, unfinished = parse_log(log)
    assert done and mid_insert >= 1
    with worker(url, name, tmp_path) as s:
        present = {int(e.prompt.split("=")[1]): e.id for e in s.entries()}
        assert all(present.get(seed) == entry_id for seed, entry_id in done.items())  # nothing committed lost
        assert set(present) <= set(done) | set(unfinished)  # an unreported one committed just before the kill
        for seed, entry_id in present.items():
            tensors, _ = s.load_latents(entry_id)
            assert all(torch.equal(tensors[k], v) for k, v in latents(seed, shape).items())
        report = s.verify()
        assert report.ok, report.report()
        assert s.db.query("SELECT COUNT(*) FROM blobs")[0][0] == len(present)  # no bytes without their row


# ------------------------------------------------------------------------------------------ the server restarting
def test_a_server_restart_turns_into_misses_with_a_clear_report_then_the_cache_works_again(own_server, tmp_path,
                                                                                         caplog):
    url = ServerURL(own_server.url("chai", password=CHAI_PASSWORD), "CHAI_CACHE_URL")
    cache = ChaiCache(tmp_path, server=url, name="farm")
    assert cache.write("a dog", ents("dog"), FP, latents(1), SIGMAS).stored
    assert cache.lookup(ents("dog"), FP, SHAPE, THR).hit
    own_server.stop()
    caplog.set_level(logging.DEBUG)
    miss = cache.lookup(ents("dog"), FP, SHAPE, THR)
    assert not miss.hit and "cache server postgresql://chai@" in miss.reason and "unreachable" in miss.reason
    assert "misses" in miss.reason
    written = cache.write("a cat", ents("cat"), FP, latents(2), SIGMAS)
    assert not written.stored and "unreachable" in written.reason
    with pytest.raises(CacheUnavailableError):
        cache.store.stats()
    # a worker that starts while the server is down opens anyway: misses until the server answers
    late = ChaiCache(tmp_path / "late", server=url, name="farm")
    assert not late.lookup(ents("dog"), FP, SHAPE, THR).hit
    own_server.resume()
    assert cache.lookup(ents("dog"), FP, SHAPE, THR).hit
    assert late.lookup(ents("dog"), FP, SHAPE, THR).hit
    assert cache.write("a cat", ents("cat"), FP, latents(2), SIGMAS).stored
    assert late.lookup(ents("cat"), FP, SHAPE, THR).hit
    assert CHAI_PASSWORD not in caplog.text
    cache.close()
    late.close()
