"""What follows from every text of one identity sharing one vector: stored vectors read back for a request
(lookup/stored_vectors.py) and ChaiCache skipping the encoder for them, a matched entity standing for all its
identity's texts, and the store's search width on a saved index."""
from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from comfyui_chai.cache_store.config import StoreConfig
from comfyui_chai.cache_store.entities.embedders import FunctionEmbedder
from comfyui_chai.cache_store.entities.extract import Entity
from comfyui_chai.cache_store.errors import CacheUnavailableError
from comfyui_chai.cache_store.folder.store import CacheStore
from comfyui_chai.cache_store.lookup.rule import HitRule
from comfyui_chai.cache_store.service import ChaiCache
from comfyui_chai.cache_store.types import EmbeddedEntities
from store_helpers import DIM, EMBEDDER, SIGMAS, latents, vector

FP = "tiny-model@1"
SHAPE = (1, 4, 2, 4, 4)
CAR = Entity("red sports car", "object", "car", "main", "sports car")
BEACH = Entity("beach", "scene", "beach", "scene")


def embedded(*entities: Entity, embedder: str = EMBEDDER) -> EmbeddedEntities:
    return EmbeddedEntities(entities, np.stack([vector(e.identity) for e in entities]), embedder)


def test_a_stored_identity_gives_back_its_vector_and_nothing_else(opener):
    with opener("c", StoreConfig(10**9)) as s:
        s.insert("a red sports car on a beach", embedded(CAR, BEACH), FP, latents(1), SIGMAS)
        found = s.stored_vectors(["sports car", "beach", "dog", "red sports car", "car"], EMBEDDER, DIM)
        assert sorted(found) == ["beach", "sports car"]  # by identity; the phrase and the bare head are not it
        assert np.array_equal(found["sports car"], vector("sports car"))
        assert s.stored_vectors(["sports car"], "another-embedder@2", DIM) == {}
        assert s.stored_vectors([], EMBEDDER, DIM) == {}


def test_the_earliest_entity_of_an_identity_is_the_one_read(opener):
    with opener("c", StoreConfig(10**9)) as s:
        s.insert("a red sports car", embedded(CAR), FP, latents(1), SIGMAS)
        blue = Entity("blue sports car", "object", "car", "main", "sports car")
        other = EmbeddedEntities((blue,), vector("sports car blue")[None], EMBEDDER)
        s.insert("a blue sports car", other, FP, latents(2), SIGMAS)
        assert np.array_equal(s.stored_vectors(["sports car"], EMBEDDER, DIM)["sports car"], vector("sports car"))


def test_rows_without_an_identity_or_with_a_malformed_vector_are_never_read(tmp_path):
    root = tmp_path / "c"
    with CacheStore(root, StoreConfig(10**9)) as s:
        s.insert("a red sports car on a beach", embedded(CAR, BEACH), FP, latents(1), SIGMAS)
    conn = sqlite3.connect(root / "manifest.sqlite")
    with conn:
        conn.execute("UPDATE entities SET head='' WHERE text='beach'")  # as a v1 row: what it is, unknown
        conn.execute("UPDATE entities SET vector=? WHERE text='red sports car'", (b"\0" * 12,))
    conn.close()
    with CacheStore(root, StoreConfig(10**9)) as s:
        assert s.stored_vectors(["sports car", "beach"], EMBEDDER, DIM) == {}


def test_a_cache_made_before_the_identity_index_gets_it_on_open(tmp_path):
    root = tmp_path / "c"
    with CacheStore(root, StoreConfig(10**9)) as s:
        s.insert("a beach", embedded(BEACH), FP, latents(1), SIGMAS)
    conn = sqlite3.connect(root / "manifest.sqlite")
    with conn:
        conn.execute("DROP INDEX entities_identity")
    conn.close()
    with CacheStore(root, StoreConfig(10**9)) as s:
        plan = s.manifest.query("EXPLAIN QUERY PLAN SELECT id FROM entities WHERE core = '' AND head IN ('beach')")
        assert "entities_identity" in " ".join(str(tuple(r)) for r in plan)
        assert "beach" in s.stored_vectors(["beach"], EMBEDDER, DIM)


def test_the_server_schema_gets_the_identity_index_on_open(opener):
    if opener.kind != "server":
        pytest.skip("the server backend's own check")
    with opener("c", StoreConfig(10**9)) as s:
        with s.db.transaction() as cur:
            cur.execute("DROP INDEX entities_identity")
    with opener("c", StoreConfig(10**9)) as s:
        assert s.db.query("SELECT indexname FROM pg_indexes WHERE indexname = 'entities_identity' "
                          "AND schemaname = current_schema()")


class Counting:
    """An embedding function that records what it was asked to embed."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, phrases: list[str]) -> np.ndarray:
        self.asked += phrases
        return np.stack([vector(p) for p in phrases])


def test_chai_cache_embeds_only_what_the_cache_does_not_already_hold(tmp_path):
    fn = Counting()
    emb = FunctionEmbedder("counting", fn, dim=DIM, threshold=0.5)
    cache = ChaiCache(tmp_path / "c", budget_bytes=10**9, embedder=emb)
    try:
        first = cache.embed_entities([CAR, BEACH])
        assert fn.asked == ["sports car", "beach"]  # an empty cache holds nothing
        assert cache.write("a red sports car on a beach", first, FP, latents(1), SIGMAS).stored
        fn.asked.clear()
        dog = Entity("dog", "object", "dog")
        blue = Entity("blue sports car", "object", "car", "main", "sports car")
        again = cache.embed_entities([blue, dog, BEACH])
        assert fn.asked == ["dog"]
        assert np.array_equal(again.vectors[0], first.vectors[0]) and np.array_equal(again.vectors[2], first.vectors[1])
        assert cache.lookup(again, FP, SHAPE).hit

        other = FunctionEmbedder("other", Counting(), dim=DIM, threshold=0.5)
        assert other.fn.asked == [] and len(cache.embed_entities([blue], other)) == 1
        assert other.fn.asked == ["sports car"]  # the cache's vectors are another embedder's: embedded afresh
    finally:
        cache.close()


def test_chai_cache_embeds_afresh_when_the_store_cannot_answer(tmp_path, monkeypatch):
    fn = Counting()
    emb = FunctionEmbedder("counting", fn, dim=DIM, threshold=0.5)
    cache = ChaiCache(tmp_path / "c", budget_bytes=10**9, embedder=emb)
    try:
        cache.write("a beach", cache.embed_entities([BEACH]), FP, latents(1), SIGMAS)

        def away(*_args, **_kw):
            raise CacheUnavailableError("the server is restarting")

        monkeypatch.setattr(cache.store, "stored_vectors", away)
        fn.asked.clear()
        out = cache.embed_entities([BEACH, BEACH])
        assert fn.asked == ["beach"] and out.vectors.shape == (2, DIM)
    finally:
        cache.close()


def test_entries_past_the_nearest_neighbours_of_one_identity_are_still_ranked(opener):
    """Every text of one identity shares its vector, so the index's 16 nearest can all be other texts of it: the
    entry that also shares the scene must still win over those that share only the car."""
    beach = EmbeddedEntities((BEACH,), vector("beach")[None], EMBEDDER)
    with opener("c", StoreConfig(10**9)) as s:
        for i in range(40):  # entries that are only a car
            car = Entity(f"car number{i}", "object", "car", "main")
            s.insert(f"car {i}", EmbeddedEntities((car,), vector("car")[None], EMBEDDER), FP, latents(i + 1), SIGMAS)
        both = Entity("old car", "object", "car", "main")
        s.insert("an old car on a beach", EmbeddedEntities((both, BEACH), np.stack([vector("car"), vector("beach")]),
                                                             EMBEDDER), FP, latents(0), SIGMAS)
        s.insert("a beach at noon", beach, FP, latents(99), SIGMAS)  # newest: it would win a tie
        request = EmbeddedEntities((Entity("red car", "object", "car", "main"), BEACH),
                                   np.stack([vector("car"), vector("beach")]), EMBEDDER)
        hit = s.lookup(request, FP, SHAPE, HitRule(0.5))
        assert hit.hit and hit.entry.prompt == "an old car on a beach"
        assert sorted(m.entity for m in hit.matches) == ["beach", "old car"]


def test_a_store_searches_a_saved_index_at_the_default_width_not_the_width_it_was_saved_with(tmp_path):
    pytest.importorskip("hnswlib")
    from comfyui_chai.cache_store.index.vector_index import DEFAULT_EF

    config = StoreConfig(10**9, index_backend="hnsw")
    with CacheStore(tmp_path / "c", config, index_kwargs={"ef": 16}) as s:
        for i in range(5):
            s.insert(f"thing {i}", embedded(Entity(f"thing{i}", "object", f"thing{i}")), FP, latents(i), SIGMAS)
        s.keeper.save()
        assert s.keeper.index.ef == 16
    with CacheStore(tmp_path / "c", config) as s:
        assert s.keeper.index.backend == "hnsw" and s.keeper.index.ef == DEFAULT_EF


def test_a_scene_agrees_by_identity_past_the_index_neighbours(opener, monkeypatch):
    """The scene clause matches what the request's scene is, not the stored texts the index happened to return:
    the donor's scene text lies past the neighbours (many texts share the beach vector), and the scene still
    agrees; the newer donor of the same subject in a forest is still refused."""
    from comfyui_chai.cache_store.lookup import ranking

    monkeypatch.setattr(ranking, "NEIGHBOURS", 2)

    def scene(text: str, head: str) -> Entity:
        return Entity(text, "scene", head, "scene")

    dog = Entity("dog", "object", "dog", "main")
    with opener("c", StoreConfig(10**9)) as s:
        for i in range(6):
            s.insert(f"a cat {i}", EmbeddedEntities((Entity("cat", "object", "cat", "main"),
                     scene(f"number{i} beach", "beach")), np.stack([vector("cat"), vector("beach")]), EMBEDDER),
                     FP, latents(i + 1), SIGMAS)
        s.insert("a dog on a sunny beach", EmbeddedEntities((dog, scene("sunny beach", "beach")),
                 np.stack([vector("dog"), vector("beach")]), EMBEDDER), FP, latents(0), SIGMAS)
        s.insert("a dog in a forest", EmbeddedEntities((dog, scene("forest", "forest")),
                 np.stack([vector("dog"), vector("forest")]), EMBEDDER), FP, latents(9), SIGMAS)
        request = EmbeddedEntities((dog, scene("beach", "beach")), np.stack([vector("dog"), vector("beach")]),
                                   EMBEDDER)
        labels, _ = s.keeper.query(request.vectors, ranking.NEIGHBOURS)
        texts = {eid: text for eid, text in s.db.query("SELECT id, text FROM entities")}
        assert "sunny beach" not in {texts.get(int(x)) for x in labels[1]}  # the donor's scene is past them
        hit = s.lookup(request, FP, SHAPE, HitRule(0.5, decision=None), touch=False)
        assert hit.hit and hit.entry.prompt == "a dog on a sunny beach"
        assert sorted(m.entity for m in hit.matches) == ["dog", "sunny beach"]
