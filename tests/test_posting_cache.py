"""Held postings rank as the SQL does, and never outlive a change to the cache (both backends)."""
from __future__ import annotations

import random

import numpy as np
import pytest

from comfyui_chai.cache_store.entities.extract import Entity
from comfyui_chai.cache_store.entities.roles import MAIN, ROLES, SCENE, SECONDARY
from comfyui_chai.cache_store.lookup import flow, ranking
from comfyui_chai.cache_store.lookup.posting_cache import PostingCache, _ordered
from comfyui_chai.cache_store.lookup.rule import HitRule
from comfyui_chai.cache_store.types import EmbeddedEntities
from store_helpers import EMBEDDER, SIGMAS, latents, vector

FP, OTHER_FP, SHAPE = "model-a", "model-b", (1, 4, 2, 4, 4)
# (text, kind, head, core): look-alikes of one head ("sea lion" / "lion", "lion tamer"), scenes, generic people
VOCAB = [("lion", "object", "lion", ""), ("old lion", "object", "lion", ""), ("sea lion", "object", "lion", "sea lion"),
         ("lion tamer", "object", "tamer", ""), ("red car", "object", "car", ""), ("car", "object", "car", ""),
         ("toy car", "object", "car", "toy car"), ("beach", "scene", "beach", ""), ("sunny beach", "scene", "beach", ""),
         ("forest", "scene", "forest", ""), ("dense forest", "scene", "forest", ""), ("man", "object", "man", ""),
         ("man playing guitar", "object", "man", ""), ("dog", "object", "dog", ""), ("hot dog", "object", "dog",
                                                                                    "hot dog"),
         ("street", "scene", "street", ""), ("city street", "scene", "street", "")]


def prompt_entities(rng: random.Random) -> EmbeddedEntities:
    """One to four vocabulary entities with random roles, each vector made of what it is."""
    chosen = rng.sample(VOCAB, rng.randint(1, 4))
    entities = tuple(Entity(text, kind, head, rng.choice(ROLES) if kind == "object" else
                            rng.choice((SCENE, SCENE, SECONDARY)), core) for text, kind, head, core in chosen)
    return EmbeddedEntities(entities, np.stack([vector(e.identity) for e in entities]), EMBEDDER,
                            prompt=" and ".join(e.text for e in entities))


def answer(store, request: EmbeddedEntities, held: PostingCache | None) -> tuple:
    """A lookup's answer (hit, donor, reason) and its ranked candidates, with or without held postings."""
    store.postings = held
    res = store.lookup(request, FP, SHAPE, HitRule(0.8), touch=False, load=False)
    return res.hit, res.entry.id if res.entry else None, res.reason


def ranked(store, request: EmbeddedEntities, held: PostingCache | None, scenes_too: bool) -> list[int]:
    """The candidates `flow._rank` gives for this request's borrowable matches."""
    store.postings = held
    store.keeper.sync()
    found = store.keeper.query(request.vectors, ranking.NEIGHBOURS)
    if found is None:
        return []
    rule = HitRule(0.8)
    matched = [(q, int(lab), float(sim)) for q in range(len(request)) for lab, sim in zip(*[a[q] for a in found])
               if lab >= 0 and sim >= rule.threshold]
    carried = ranking.borrowable(store.db, request, ranking.by_identity(store.db, matched), rule)
    if not carried:
        return []
    scenes = ranking.agreeing_scenes(request, carried) if scenes_too else None
    return flow._rank(store, carried, FP, SHAPE, rule, scenes)


def test_held_postings_rank_as_the_sql_does_through_inserts_and_evictions(opener):
    rng = random.Random(5)
    with opener() as s:
        held = s.postings
        assert held is not None
        compared = hits = 0
        for round_ in range(4):
            for half in range(2):  # the second half's inserts reach held postings as additions, not a drop
                for i in range(15):
                    fp = OTHER_FP if rng.random() < 0.15 else FP
                    s.insert(f"entry {round_}-{half}-{i}", prompt_entities(rng), fp, latents(i), SIGMAS)
                for _ in range(20):
                    request = prompt_entities(rng)
                    for scenes_too in (False, True):
                        assert ranked(s, request, held, scenes_too) == ranked(s, request, None, scenes_too)
                    with_held = answer(s, request, held)
                    assert with_held == answer(s, request, None)
                    compared += 1
                    hits += with_held[0]
            s.prune(s.stats().bytes * 3 // 4)  # the oldest quarter goes: the held postings are dropped
        assert compared == 160 and 20 < hits < 150  # both kinds of answer were compared
        # both ways of following the cache ran (after the first prune the lowered budget makes inserts evict)
        assert held.fetches > 0 and held.appended >= 15


def test_a_write_by_another_handle_reaches_held_postings(opener):
    with opener() as s, opener() as other:
        lion = EmbeddedEntities((Entity("lion", "object", "lion", MAIN),), vector("lion")[None], EMBEDDER)
        first = s.insert("a lion", lion, FP, latents(1), SIGMAS).entry_id
        assert answer(s, lion, s.postings)[1] == first
        fetched = s.postings.fetches
        assert answer(s, lion, s.postings)[1] == first and s.postings.fetches == fetched  # held, not fetched
        newer = other.insert("a lion again", lion, FP, latents(2), SIGMAS).entry_id
        assert answer(s, lion, s.postings)[1] == newer  # equally good: the newest, seen at once
        assert s.postings.appended == 1 and s.postings.fetches == fetched  # added to what was held
        other.prune(1)  # every entry goes
        assert answer(s, lion, s.postings)[:2] == (False, None)


def test_held_postings_keep_within_their_bound(opener):
    with opener() as s:
        s.postings = PostingCache(max_postings=3)
        for i, text in enumerate(("lion", "car", "dog", "man")):
            request = EmbeddedEntities((Entity(text, "object", text, MAIN),), vector(text)[None], EMBEDDER)
            for j in range(2):
                s.insert(f"{text} {j}", request, FP, latents(i * 2 + j), SIGMAS)
        for text in ("lion", "car", "dog", "man"):
            request = EmbeddedEntities((Entity(text, "object", text, MAIN),), vector(text)[None], EMBEDDER)
            assert answer(s, request, s.postings)[0]
        held = s.postings._held
        assert len(held) == 1 and s.postings._size == 2  # two postings per identity: only the last one fits


@pytest.mark.parametrize("seed", range(20))
def test_the_order_is_the_sql_order(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    entry = rng.integers(1, 15, n)
    q = rng.integers(0, 3, n)
    sim = np.round(rng.uniform(0.8, 1.0, n) / 2 ** -16) * 2 ** -16
    best: dict[tuple[int, int], float] = {}
    for e, qq, s in zip(entry.tolist(), q.tolist(), sim.tolist()):
        best[(e, qq)] = max(best.get((e, qq), -2.0), s)
    score: dict[int, tuple[int, float]] = {}
    for (e, _), s in best.items():
        count, total = score.get(e, (0, 0.0))
        score[e] = (count + 1, total + s)
    expected = sorted(score, key=lambda e: (-score[e][0], -score[e][1], -e))
    assert _ordered(entry, q, sim).tolist() == expected
