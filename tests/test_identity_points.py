"""The stores' entity index holds one point per identity: many texts, one point, the same hits (both backends)."""
from __future__ import annotations

import logging

import numpy as np

from comfyui_chai.cache_store.entities.extract import Entity
from comfyui_chai.cache_store.lookup.rule import HitRule
from comfyui_chai.cache_store.types import EmbeddedEntities
from store_helpers import EMBEDDER, SIGMAS, latents, vector

FP, SHAPE = "model-a", (1, 4, 2, 4, 4)
COLOURS = ["red", "old", "small", "blue", "green", "shiny"]


def things(*texts: str) -> EmbeddedEntities:
    """Entities whose vector is made of what they are (their head), as the product embeds them."""
    entities = tuple(Entity(t, "object", t.split()[-1]) for t in texts)
    return EmbeddedEntities(entities, np.stack([vector(e.identity) for e in entities]), EMBEDDER)


def same_worker(opener, tmp_path) -> dict:
    """Open arguments that let a server store find the index an earlier one saved (a folder keeps its own)."""
    return {} if opener.kind == "folder" else {"index_root": tmp_path / "worker"}


def points_of(store) -> set[int]:
    store.keeper.sync()
    return set(store.keeper.index.labels().tolist())


def test_texts_of_one_identity_are_one_point_and_still_serve(opener):
    with opener() as s:
        ids = [s.insert(f"a {c} car", things(f"{c} car"), FP, latents(i), SIGMAS).entry_id
               for i, c in enumerate(COLOURS)]
        s.insert("a dog", things("dog"), FP, latents(9), SIGMAS)
        assert len(s.keeper.index) == 2 and len(s.keeper.points) == 2
        assert s.stats().entities == len(COLOURS) + 1
        hit = s.lookup(things("rusty car"), FP, SHAPE, HitRule(0.8), touch=False, load=False)
        assert hit.hit and hit.entry.id == ids[-1]  # every text of the identity is a candidate: newest first
        assert hit.matches[0].entity == f"{COLOURS[-1]} car"
        first = points_of(s)
        total = s.stats().bytes
        s.prune(total - 1)  # the oldest entry goes, and with it the text the point was labelled by
        assert ids[0] not in {e.id for e in s.entries()}
        after = points_of(s)
        assert len(after) == 2 and after != first  # the point stays, under the next text of the identity
        dog = next(e for e in s.entries() if e.prompt == "a dog")
        s.prune(dog.nbytes)  # every car goes
        assert len(points_of(s)) == 1
        miss = s.lookup(things("rusty car"), FP, SHAPE, HitRule(0.8), touch=False, load=False)
        assert not miss.hit


def test_a_reopened_store_patches_its_saved_points_to_what_others_wrote(opener, caplog, tmp_path):
    worker = same_worker(opener, tmp_path)
    with opener(**worker) as s:
        for i in range(40):
            s.insert(f"p{i}", things(f"{COLOURS[i % 6]} thing{i % 20}"), FP, latents(i), SIGMAS)
        s.flush()
    with opener() as other:  # another process writes after the save
        new = other.insert("a kite", things("red kite"), FP, latents(50), SIGMAS).entry_id
        other.keeper.unsaved = 0  # it does not save: the next opener finds the older file
    caplog.set_level(logging.INFO, logger="comfyui_chai.cache_store.index.keeper")
    with opener(**worker) as s:
        assert not [r for r in caplog.records if "rebuilding" in r.getMessage()]
        assert len(s.keeper.index) == 21
        hit = s.lookup(things("kite"), FP, SHAPE, HitRule(0.8), touch=False, load=False)
        assert hit.hit and hit.entry.id == new


def test_a_saved_index_of_one_point_per_text_is_rebuilt_once(opener, caplog, tmp_path):
    worker = same_worker(opener, tmp_path)
    with opener(**worker) as s:
        for i in range(30):
            s.insert(f"p{i}", things(f"{COLOURS[i % 6]} car"), FP, latents(i), SIGMAS)
        # What an earlier version saved: a point for every stored text.
        ids, vectors = s.keeper.log.entity_points().ids, s.keeper.log.entity_points().vectors
        s.keeper.index.remove(s.keeper.index.labels())
        s.keeper.index.add(ids, vectors)
        s.keeper.save()
    caplog.set_level(logging.INFO, logger="comfyui_chai.cache_store.index.keeper")
    with opener(**worker) as s:
        assert [r for r in caplog.records if "rebuilding" in r.getMessage()]
        assert len(s.keeper.index) == 1
        assert s.lookup(things("car"), FP, SHAPE, HitRule(0.8), touch=False, load=False).hit


def test_float_noise_in_similarities_does_not_pick_the_donor(opener):
    """Two entries matched equally well, up to the 1e-7 that hnswlib and numpy disagree by: the newest wins."""
    from comfyui_chai.cache_store.lookup import ranking
    from comfyui_chai.cache_store.lookup.ranking import IdentityMatch, Matched
    from comfyui_chai.cache_store.types import shape_key

    with opener() as s:
        old = s.insert("a barn", things("barn"), FP, latents(1), SIGMAS).entry_id
        new = s.insert("a field", things("field"), FP, latents(2), SIGMAS).entry_id
        rule = HitRule(0.8)
        for noisy in ("barn", "field"):
            matched = Matched(tuple(IdentityMatch(0, "", head, 1.0 - (6e-8 if head == noisy else 0.0))
                                    for head in ("barn", "field")))
            assert ranking.rank(s.db, matched, FP, shape_key(SHAPE), rule)[:2] == [new, old]
