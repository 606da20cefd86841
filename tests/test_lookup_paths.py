"""The lookup's fast paths: the ranking's scene clause runs on a window of the best entries first (the candidates must
be exactly those of the clause run on every entry, on both backends), and a hit's recency is committed without
waiting for the disk while every other write still waits."""
from __future__ import annotations

import random

import numpy as np
import pytest

from comfyui_chai.cache_store.config import StoreConfig
from comfyui_chai.cache_store.entities.extract import Entity
from comfyui_chai.cache_store.folder.store import CacheStore
from comfyui_chai.cache_store.lookup import ranking
from comfyui_chai.cache_store.lookup.rule import HitRule
from comfyui_chai.cache_store.types import EmbeddedEntities, shape_key
from store_helpers import EMBEDDER, SIGMAS, latents, vector

FP, SHAPE, THR = "model-a", (1, 4, 2, 4, 4), 0.8
PLACES = ["beach", "forest", "desert", "city", "snow"]
SUBJECTS = ["dog", "red dog", "small dog", "cat", "old cat"]


def embedded(*entities: Entity) -> EmbeddedEntities:
    return EmbeddedEntities(entities, np.stack([vector(e.text) for e in entities]), EMBEDDER)


def entity(text: str, role: str) -> Entity:
    kind = "scene" if role == "scene" else "object"
    return Entity(text, kind, text.split()[-1], role)


def everywhere(db, matched, rule, scenes):
    """The reference: the whole ranking query with the scene clause over every entry (the window bypassed)."""
    saved = ranking.SCENE_WINDOW
    ranking.SCENE_WINDOW = 10**9
    try:
        return ranking.rank(db, matched, FP, shape_key(SHAPE), rule, scenes)
    finally:
        ranking.SCENE_WINDOW = saved


@pytest.mark.parametrize("window", [1, 3, 64])
def test_windowed_scene_clause_picks_the_same_candidates(opener, monkeypatch, window):
    rng = random.Random(window)
    with opener("c", StoreConfig(10**9)) as s:
        for i in range(40):
            ents = [entity(rng.choice(SUBJECTS), "main")]
            if rng.random() < 0.8:
                ents.append(entity(rng.choice(PLACES), "scene"))
            if rng.random() < 0.3:
                ents.append(entity(rng.choice([x for x in SUBJECTS if x != ents[0].text]), "secondary"))
            s.insert(f"p{i}", embedded(*ents), FP, latents(i), SIGMAS)
        monkeypatch.setattr(ranking, "SCENE_WINDOW", window)
        rule = HitRule(THR)
        checked = short = 0
        for subject in SUBJECTS:
            for place in PLACES + [None]:
                request = embedded(entity(subject, "main"), *([entity(place, "scene")] if place else []))
                labels, sims = s.keeper.query(request.vectors, ranking.NEIGHBOURS)
                matched = [(q, int(lab), float(sim)) for q in range(len(request))
                           for lab, sim in zip(labels[q], sims[q]) if lab >= 0 and sim >= THR]
                grouped = ranking.by_identity(s.db, matched)
                carried = ranking.borrowable(s.db, request, grouped, rule)
                scenes = ranking.agreeing_scenes(request, grouped)
                if not carried or scenes is None:
                    continue
                got = ranking.rank(s.db, carried, FP, shape_key(SHAPE), rule, scenes)
                assert got == everywhere(s.db, carried, rule, scenes)
                checked += 1
                short += len(got) < ranking.CANDIDATES
        assert checked >= 15 and short >= 1 and checked - short >= 1  # both the window and the fallback ran


def test_recency_is_not_durable_but_entries_are(tmp_path):
    with CacheStore(tmp_path / "c", StoreConfig(10**9)) as s:
        conn = s.manifest.conn
        first = s.insert("a dog", embedded(entity("dog", "main")), FP, latents(1), SIGMAS).entry_id
        hit = s.lookup(embedded(entity("dog", "main")), FP, SHAPE, HitRule(THR))
        assert hit.hit and hit.entry.hits == 1 and s.entry(first).hits == 1  # the touch was committed
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        s.touch(first)
        touch, statements[:] = list(statements), []
        s.insert("a cat", embedded(entity("cat", "main")), FP, latents(2), SIGMAS)
        conn.set_trace_callback(None)
        assert touch[0] == "PRAGMA synchronous=NORMAL" and touch[-1] == "PRAGMA synchronous=FULL"
        assert "COMMIT" in touch and "COMMIT" in statements
        assert not any("synchronous" in sql for sql in statements)  # the insert commits at FULL
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2 and s.entry(first).hits == 2


def test_an_entry_of_the_same_prompt_is_preferred_among_equal_donors(opener):
    from dataclasses import replace

    with opener("c", StoreConfig(10**9)) as s:
        ents = (entity("dog", "main"), entity("beach", "scene"))
        own = s.insert("A dog on the beach", embedded(*ents), FP, latents(1), SIGMAS).entry_id
        newer = s.insert("a dog running on the beach at dawn", embedded(*ents), FP, latents(2), SIGMAS).entry_id
        plain = s.lookup(embedded(*ents), FP, SHAPE, HitRule(THR))
        assert plain.hit and plain.entry.id == newer  # equal matches: the newest
        request = replace(embedded(*ents), prompt="a  dog on the BEACH")
        again = s.lookup(request, FP, SHAPE, HitRule(THR))
        assert again.hit and again.entry.id == own  # the same prompt, up to case and spacing, first


def test_the_ranking_joins_identities_and_refuses_the_texts_the_rule_refuses(opener):
    """A match stands for every stored text of its identity, and the per-text part of the hit rule runs in the
    ranking's SQL on both backends: the newest entry, whose text names the request's head as a modifier ("fire"
    in a 'fire truck' parsed as an adjective), is refused; the older entry of the same identity is the hit."""
    truck = vector("truck")

    def one(text: str, head: str, core: str = "") -> EmbeddedEntities:
        return EmbeddedEntities((Entity(text, "object", head, "main", core),), truck[None], EMBEDDER)

    with opener("c", StoreConfig(10**9)) as s:
        red = s.insert("a red truck", one("red truck", "truck"), FP, latents(1), SIGMAS).entry_id
        s.insert("a fire truck", one("fire truck", "truck"), FP, latents(2), SIGMAS)
        s.insert("an old truck", EmbeddedEntities((Entity("old truck", "object", "truck", "secondary"),),
                                                  truck[None], EMBEDDER), FP, latents(3), SIGMAS)  # a prop
        fire = s.lookup(one("fire", "fire"), FP, SHAPE, HitRule(THR, decision=None), touch=False)
        assert fire.hit and fire.entry.id == red
        assert [(m.query, m.entity) for m in fire.matches] == [("fire", "red truck")]
        plain = s.lookup(one("truck", "truck"), FP, SHAPE, HitRule(THR, decision=None), touch=False)
        assert plain.hit and plain.entry.prompt == "a fire truck"  # no refusal: the newest main subject
