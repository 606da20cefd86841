"""A stored entry's entities in its prompt's order (`lookup.mention_order`): kept by a write, read by the decision."""
from __future__ import annotations

import numpy as np

from comfyui_chai.cache_store.entities.embedders import FunctionEmbedder
from comfyui_chai.cache_store.entities.extract import Entity
from comfyui_chai.cache_store.lookup import mention_order
from comfyui_chai.cache_store.lookup.ranking import donor_side
from comfyui_chai.cache_store.service import ChaiCache
from comfyui_chai.cache_store.types import EmbeddedEntities
from store_helpers import DIM, SIGMAS, latents, vector

FP = "mention-order"


def test_the_order_rides_in_the_metadata_and_damage_reads_as_none():
    meta = mention_order.with_order({"other": 1}, ["cat", "dog"])
    assert meta == {"other": 1, "entity_order": ["cat", "dog"]}
    assert mention_order.with_order(meta, ["x"])["entity_order"] == ["cat", "dog"]  # the caller's is kept
    assert mention_order.order_of('{"entity_order": ["cat", "dog"]}') == ["cat", "dog"]
    for damaged in ("{not json", b"\xff", {"entity_order": "cat"}, {"entity_order": [1, 2]}, None, 7, {}):
        assert mention_order.order_of(damaged) is None
    assert mention_order.in_mention_order(["dog", "park", "cat"], ["cat", "dog"]) == [2, 0, 1]
    assert mention_order.in_mention_order(["dog", "cat"], None) == [0, 1]


def test_a_donor_reads_in_its_prompts_order_although_a_shared_row_is_older(tmp_path):
    emb = FunctionEmbedder("order", lambda phrases: np.stack([vector(p) for p in phrases]), dim=DIM, threshold=0.5)
    cache = ChaiCache(tmp_path / "c", budget_bytes=10**9, embedder=emb)
    dog, cat = Entity("dog", "object", "dog", "main"), Entity("cat", "object", "cat", "main")
    try:
        assert cache.write("a dog", cache.embed_entities([dog]), FP, latents(1), SIGMAS).stored
        written = cache.write("a cat chasing a dog", cache.embed_entities([cat, dog]), FP, latents(2), SIGMAS)
        side = donor_side(cache.store.manifest, written.insert.entry_id, DIM)
        assert [e.text for e in side.entities] == ["cat", "dog"]  # the dog's row was written first
        # every insert keeps the order, a direct one too
        bare = EmbeddedEntities((cat, dog), np.stack([vector("cat"), vector("dog")]), emb.identity)
        inserted = cache.store.insert("a cat and a dog", bare, FP, latents(3), SIGMAS)
        assert [e.text for e in donor_side(cache.store.manifest, inserted.entry_id, DIM).entities] == ["cat", "dog"]
        # an entry written without it (an older pack) keeps the ids' order
        with cache.store.manifest.write() as cur:
            cur.execute("UPDATE entries SET meta = '{}' WHERE id = ?", (inserted.entry_id,))
        assert [e.text for e in donor_side(cache.store.manifest, inserted.entry_id, DIM).entities] == ["dog", "cat"]
    finally:
        cache.close()


def test_a_manifest_rebuilt_from_the_latent_files_keeps_the_order(tmp_path):
    emb = FunctionEmbedder("order", lambda phrases: np.stack([vector(p) for p in phrases]), dim=DIM, threshold=0.5)
    dog, cat = Entity("dog", "object", "dog", "main"), Entity("cat", "object", "cat", "main")
    cache = ChaiCache(tmp_path / "c", budget_bytes=10**9, embedder=emb)
    try:
        assert cache.write("a dog", cache.embed_entities([dog]), FP, latents(1), SIGMAS).stored
        assert cache.write("a cat chasing a dog", cache.embed_entities([cat, dog]), FP, latents(2), SIGMAS).stored
    finally:
        cache.close()
    (tmp_path / "c" / "manifest.sqlite").unlink()
    cache = ChaiCache(tmp_path / "c", budget_bytes=10**9, embedder=emb)  # rebuilt from the latent files' headers
    try:
        (entry_id, meta), = cache.store.manifest.query("SELECT id, meta FROM entries WHERE prompt = ?",
                                                       ("a cat chasing a dog",))
        assert mention_order.order_of(meta) == ["cat", "dog"]
        assert [e.text for e in donor_side(cache.store.manifest, entry_id, DIM).entities] == ["cat", "dog"]
    finally:
        cache.close()
