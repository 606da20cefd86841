"""Store semantics: insert, lookup, budget, eviction policies, persistence, embedder and shape guards.

Tests taking `opener` run on both backends (a cache folder, and a cache on a PostgreSQL server)."""
from __future__ import annotations

import errno
import json
import os
import random
import sqlite3

import pytest
import torch

from comfyui_chai.cache_store import latents as lat
from comfyui_chai.cache_store.config import StoreConfig, budget_from_gb
from comfyui_chai.cache_store.errors import (CacheNameError, CacheWriteError, EmbedderMismatchError, EntryTooLargeError,
                                FormatVersionError)
from comfyui_chai.cache_store.naming import cache_dir
from comfyui_chai.cache_store.index.keeper import IndexKeeper
from comfyui_chai.cache_store.folder.store import CacheStore
from comfyui_chai.cache_store.prepare import NothingToStoreError
from comfyui_chai.cache_store.lookup.rule import HitRule
from store_backends import stored_blobs, total_counter
from store_helpers import SIGMAS, ents, latents

FP = "model-a"
SHAPE = (1, 4, 2, 4, 4)
THR = 0.8


def entry_bytes(tmp_path) -> int:
    with CacheStore(tmp_path / "probe", StoreConfig(10**9)) as s:
        return s.insert("p", ents("dog"), FP, latents(), SIGMAS).nbytes


@pytest.fixture
def store(opener):
    s = opener("c", StoreConfig(budget_from_gb(1.0)))
    yield s
    s.close()


def test_hit_reports_matched_entity_donor_prompt_and_latents(store):
    lt = latents(1)
    store.insert("a red ball on a beach", ents("red ball", "beach"), FP, lt, SIGMAS)
    res = store.lookup(ents("blue ball", "forest"), FP, SHAPE, HitRule(THR))
    assert res.hit, res.reason
    assert res.entry.prompt == "a red ball on a beach"
    assert [(m.query, m.entity) for m in res.matches] == [("blue ball", "red ball")]
    assert res.matches[0].similarity >= THR
    assert set(res.latents) == {"step2", "step3", "step4"}
    assert torch.equal(res.latents["step3"], lt["step3"])
    assert res.entry.sigmas == tuple(SIGMAS)
    assert "red ball" in res.report() and "a red ball on a beach" in res.report()


def test_both_backends_implement_the_store_interface(store):
    from comfyui_chai.cache_store.backend import CacheBackend

    assert isinstance(store, CacheBackend)
    assert store.generation == 0 and store.budget_bytes == budget_from_gb(1.0)


def test_misses_say_why(store):
    assert store.lookup(ents("dog"), FP, SHAPE, HitRule(THR)).reason == "the cache is empty"
    store.insert("a dog", ents("dog"), FP, latents(), SIGMAS)
    assert not store.lookup(ents(), FP, SHAPE, HitRule(THR)).hit
    assert "no entities" in store.lookup(ents(), FP, SHAPE, HitRule(THR)).reason
    miss = store.lookup(ents("car"), FP, SHAPE, HitRule(THR))
    assert not miss.hit and "closest: 'car'~'dog'" in miss.reason
    other_model = store.lookup(ents("dog"), "model-b", SHAPE, HitRule(THR))
    assert not other_model.hit and "another model" in other_model.reason
    other_shape = store.lookup(ents("dog"), FP, (1, 4, 3, 4, 4), HitRule(THR))
    assert not other_shape.hit and "latent shape" in other_shape.reason
    other_emb = store.lookup(ents("dog", embedder="other@2"), FP, SHAPE, HitRule(THR))
    assert not other_emb.hit and "embedder" in other_emb.reason


def test_most_matched_entities_wins_then_summed_similarity(store):
    store.insert("dog only", ents("dog"), FP, latents(1), SIGMAS)
    both = store.insert("dog on beach", ents("dog", "beach"), FP, latents(2), SIGMAS).entry_id
    exact = store.insert("brown dog", ents("brown dog"), FP, latents(3), SIGMAS).entry_id
    assert store.lookup(ents("dog", "beach"), FP, SHAPE, HitRule(THR)).entry.id == both
    # one matched entity each: the higher similarity wins
    assert store.lookup(ents("brown dog"), FP, SHAPE, HitRule(THR)).entry.id == exact


def test_popular_entity_cannot_crowd_out_best_entry(opener, monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # durability is not what this test is about
    with opener("c", StoreConfig(10**9)) as s:
        for i in range(60):
            s.insert(f"dog {i}", ents("dog", f"thing{i}"), FP, latents(i), SIGMAS)
        target = s.insert("dog in forest", ents("dog", "forest"), FP, latents(99), SIGMAS).entry_id
        for i in range(60, 120):
            s.insert(f"dog {i}", ents("dog", f"thing{i}"), FP, latents(i), SIGMAS)
        assert s.lookup(ents("dog", "forest"), FP, SHAPE, HitRule(THR)).entry.id == target
        # one vector per distinct entity, however many entries hold it
        assert s.stats().entities == 1 + 120 + 1


def test_hit_refreshes_recency_and_counts(store):
    a = store.insert("a dog", ents("dog"), FP, latents(), SIGMAS).entry_id
    before = store.entry(a)
    store.lookup(ents("dog"), FP, SHAPE, HitRule(THR))
    after = store.entry(a)
    assert after.hits == before.hits + 1 and after.last_used >= before.last_used
    store.lookup(ents("dog"), FP, SHAPE, HitRule(THR), touch=False)
    assert store.entry(a).hits == after.hits


def _budget_for(tmp_path, n_entries: int) -> int:
    return entry_bytes(tmp_path) * n_entries + 100  # entries differ by a few metadata bytes


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_eviction_order(opener, tmp_path, policy):
    with opener(policy, StoreConfig(_budget_for(tmp_path, 3), policy)) as s:
        a = s.insert("a", ents("apple"), FP, latents(1), SIGMAS).entry_id
        b = s.insert("b", ents("boat"), FP, latents(2), SIGMAS).entry_id
        c = s.insert("c", ents("cat"), FP, latents(3), SIGMAS).entry_id
        for _ in range(3):
            assert s.lookup(ents("apple"), FP, SHAPE, HitRule(THR)).entry.id == a
        assert s.lookup(ents("cat"), FP, SHAPE, HitRule(THR)).entry.id == c   # c is now the most recent
        assert s.lookup(ents("boat"), FP, SHAPE, HitRule(THR)).entry.id == b   # b most recent, but used once
        d = s.insert("d", ents("duck"), FP, latents(4), SIGMAS)
        # LRU: a was used longest ago. LFU: c and b have one hit each, c's was longer ago.
        assert d.evicted == ((a,) if policy == "lru" else (c,))
        left = {e.id for e in s.entries()}
        assert left == ({b, c, d.entry_id} if policy == "lru" else {a, b, d.entry_id})


def test_eviction_removes_latents_postings_and_orphan_entity_vectors(opener, tmp_path):
    with opener("c", StoreConfig(_budget_for(tmp_path, 2))) as s:
        first = s.insert("a", ents("apple", "dog"), FP, latents(1), SIGMAS)
        s.insert("b", ents("dog"), FP, latents(2), SIGMAS)
        s.insert("c", ents("cat"), FP, latents(3), SIGMAS)
        assert first.entry_id not in {e.id for e in s.entries()}
        texts = {r[0] for r in s.db.query("SELECT text FROM entities")}
        assert texts == {"dog", "cat"}                 # apple's vector went with its last entry
        assert len(s._index) == 2
        assert not s.lookup(ents("apple"), FP, SHAPE, HitRule(0.99)).hit
        assert stored_blobs(s) == 2
        assert s.db.query("SELECT COUNT(*) FROM postings WHERE entry_id=?", (first.entry_id,))[0][0] == 0


def test_budget_never_exceeded_across_random_inserts(opener, tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # durability is tested elsewhere; keep this fast
    rng = random.Random(7)
    words = [f"w{i}" for i in range(40)]
    size = entry_bytes(tmp_path)
    budget = size * 25 + size // 2
    with opener("c", StoreConfig(budget, rng.choice(["lru", "lfu"]))) as s:
        for i in range(1500 if opener.kind == "folder" else 500):
            if rng.random() < 0.3:
                s.lookup(ents(rng.choice(words)), FP, SHAPE, HitRule(THR))
                continue
            shape = rng.choice([SHAPE, (1, 4, 3, 4, 4)])
            s.insert(f"p{i}", ents(*rng.sample(words, rng.randint(1, 4))), FP, latents(i, shape), SIGMAS)
            total = s.db.query("SELECT SUM(nbytes) FROM entries")[0][0]
            assert total <= budget
            assert total_counter(s) == total   # the counter inserts rely on
            if i % 100 == 0:
                n = s.db.query("SELECT COUNT(*) FROM entries")[0][0]
                assert stored_blobs(s) == n
                live = s.db.query("SELECT COUNT(DISTINCT entity_id) FROM postings")[0][0]
                assert s.stats().entities == live == len(s._index)
        assert s.verify().ok


def test_entry_larger_than_budget_is_refused(opener):
    with opener("c", StoreConfig(1000)) as s:
        with pytest.raises(EntryTooLargeError, match="raise the budget"):
            s.insert("big", ents("dog"), FP, latents(), SIGMAS)
        assert s.stats().entries == 0


def test_nothing_to_store_without_entities(store):
    with pytest.raises(NothingToStoreError):
        store.insert("the", ents(), FP, latents(), SIGMAS)


def test_mismatched_tensor_shapes_are_refused(store):
    lt = latents()
    lt["step4"] = torch.zeros(1, 4, 3, 4, 4)
    with pytest.raises(ValueError, match="shape"):
        store.insert("a dog", ents("dog"), FP, lt, SIGMAS)


def test_cache_built_with_one_embedder_refuses_another(store):
    store.insert("a dog", ents("dog"), FP, latents(), SIGMAS)
    with pytest.raises(EmbedderMismatchError, match="same embedder"):
        store.insert("a cat", ents("cat", embedder="other@2"), FP, latents(), SIGMAS)


def test_disk_full_leaves_cache_unchanged(tmp_path, monkeypatch):
    store = CacheStore(tmp_path / "c", StoreConfig(budget_from_gb(1.0)))
    store.insert("a dog", ents("dog"), FP, latents(), SIGMAS)
    real_open = open

    def full_disk_open(path, mode="r", *a, **k):
        if "w" in mode and lat.TMP_PREFIX in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *a, **k)

    monkeypatch.setattr("builtins.open", full_disk_open)
    with pytest.raises(CacheWriteError, match="disk is full"):
        store.insert("a cat", ents("cat"), FP, latents(), SIGMAS)
    monkeypatch.undo()
    assert store.stats().entries == 1
    assert [p.name for p in store.latent_dir.iterdir()] == [store.entries()[0].file]
    assert store.lookup(ents("dog"), FP, SHAPE, HitRule(THR)).hit
    store.close()


def test_persistence_across_reopen_uses_saved_index(tmp_path, monkeypatch):
    root = tmp_path / "c"
    with CacheStore(root, StoreConfig(10**9)) as s:
        ids = [s.insert(f"p{i}", ents(f"thing{i}", "dog"), FP, latents(i), SIGMAS).entry_id for i in range(5)]
        s.lookup(ents("thing3"), FP, SHAPE, HitRule(THR))
    state = json.loads((root / "index" / "state.json").read_text())
    assert (root / "index" / state["file"]).exists()

    def no_rebuild(*a, **k):
        raise AssertionError("the saved index should have been loaded, not rebuilt")

    monkeypatch.setattr(IndexKeeper, "rebuild", no_rebuild)
    with CacheStore(root, StoreConfig(10**9)) as s2:
        assert sorted(e.id for e in s2.entries()) == ids
        res = s2.lookup(ents("thing3"), FP, SHAPE, HitRule(THR))
        assert res.hit and res.entry.prompt == "p3" and res.entry.hits == 2


def test_two_handles_see_each_others_writes_and_evictions(opener, tmp_path):
    budget = _budget_for(tmp_path, 2)
    a, b = opener("c", StoreConfig(budget)), opener("c", StoreConfig(budget))
    try:
        first = a.insert("a dog", ents("dog"), FP, latents(1), SIGMAS).entry_id
        assert b.lookup(ents("dog"), FP, SHAPE, HitRule(THR)).entry.id == first
        b.insert("a cat", ents("cat"), FP, latents(2), SIGMAS)
        b.insert("a cow", ents("cow"), FP, latents(3), SIGMAS)   # evicts the dog (LRU)
        assert not a.lookup(ents("dog"), FP, SHAPE, HitRule(0.99)).hit
        assert a.lookup(ents("cow"), FP, SHAPE, HitRule(THR)).hit
        assert a.generation == b.generation
    finally:
        a.close()
        b.close()


def test_clear_and_prune(store, tmp_path):
    for i in range(4):
        store.insert(f"p{i}", ents(f"thing{i}"), FP, latents(i), SIGMAS)
    gen = store.generation
    size = store.entries()[0].nbytes
    evicted = store.prune(size * 2)
    assert len(evicted) == 2 and store.stats().bytes <= size * 2 and store.generation > gen
    assert store.clear() == 2
    stats = store.stats()
    assert stats.entries == 0 and stats.entities == 0 and stats.embedder is None
    assert stored_blobs(store) == 0
    store.insert("again", ents("dog", embedder="other@2"), FP, latents(), SIGMAS)  # a cleared cache takes any embedder
    assert store.lookup(ents("dog", embedder="other@2"), FP, SHAPE, HitRule(THR)).hit


def test_newer_format_is_refused_with_advice(tmp_path):
    root = tmp_path / "c"
    CacheStore(root, StoreConfig(10**9)).close()
    con = sqlite3.connect(root / "manifest.sqlite")
    con.execute("UPDATE meta SET value='99' WHERE key='format_version'")
    con.commit()
    con.close()
    with pytest.raises(FormatVersionError, match="update the pack"):
        CacheStore(root, StoreConfig(10**9))


@pytest.mark.parametrize("name", ["", "..", "../evil", "a/b", "a\\b", ".hidden", "x" * 65, "a..b"])
def test_cache_names_cannot_leave_the_root(tmp_path, name):
    with pytest.raises(CacheNameError):
        cache_dir(tmp_path, name)
    assert list(tmp_path.iterdir()) == []


def test_valid_cache_name_stays_inside_root(tmp_path):
    assert cache_dir(tmp_path, "studio-A_1.v2") == (tmp_path / "studio-A_1.v2").resolve()


def test_config_validation():
    with pytest.raises(ValueError):
        StoreConfig(0)
    with pytest.raises(ValueError):
        StoreConfig(10, policy="fifo")
    with pytest.raises(ValueError):
        budget_from_gb(float("nan"))
    assert budget_from_gb(1.5) == 1_500_000_000
