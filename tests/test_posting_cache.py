"""Held postings rank as the SQL does through inserts, evictions and late commits (both backends)."""
from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from comfyui_chai.cache_store.config import StoreConfig
from comfyui_chai.cache_store.entities.extract import Entity
from comfyui_chai.cache_store.entities.roles import MAIN, ROLES, SCENE, SECONDARY
from comfyui_chai.cache_store.lookup import flow, posting_cache, ranking
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
            s.prune(s.stats().bytes * 3 // 4)  # the oldest quarter goes; then the lowered budget makes inserts evict
        assert compared == 160 and 20 < hits < 150  # both kinds of answer were compared
        # held postings followed every change (no identity fetched twice: the vocabulary has 17 texts) and left out
        # removed entries (fewer than 105 added: some inserts were evicted by later ones before a lookup saw them)
        assert held.appended > 90 and held.fetches <= 17 and held.removed > 0


def test_an_evicted_best_donor_is_left_out_without_a_refetch(opener):
    lion_beach = EmbeddedEntities((Entity("lion", "object", "lion", MAIN), Entity("beach", "scene", "beach", SCENE)),
                                  np.stack([vector("lion"), vector("beach")]), EMBEDDER)
    lion = EmbeddedEntities((Entity("lion", "object", "lion", MAIN),), vector("lion")[None], EMBEDDER)
    with opener() as s, opener() as other:
        held = s.postings
        best = s.insert("a lion on a beach", lion_beach, FP, latents(1), SIGMAS).entry_id
        rest = [s.insert(f"a lion {i}", lion, FP, latents(2 + i), SIGMAS).entry_id for i in range(3)]
        assert answer(s, lion_beach, held)[1] == best
        fetched = held.fetches
        for entry_id in rest:
            other.touch(entry_id)
        assert other.prune(s.stats().bytes * 3 // 4) == [best]  # the least recently used: the best donor
        for scenes_too in (False, True):
            assert ranked(s, lion_beach, held, scenes_too) == ranked(s, lion_beach, None, scenes_too)
        assert answer(s, lion_beach, held)[1] == rest[-1] == answer(s, lion_beach, None)[1]
        assert held.fetches == fetched and held.removed == 1  # kept; the removed one checked once
        newer = other.insert("a lion on a beach again", lion_beach, FP, latents(9), SIGMAS).entry_id
        assert answer(s, lion_beach, held)[1] == newer and held.fetches == fetched


def test_an_insert_committed_after_the_generation_was_read_hides_no_eviction(opener, monkeypatch):
    lion_beach = EmbeddedEntities((Entity("lion", "object", "lion", MAIN), Entity("beach", "scene", "beach", SCENE)),
                                  np.stack([vector("lion"), vector("beach")]), EMBEDDER)
    lion = EmbeddedEntities((Entity("lion", "object", "lion", MAIN),), vector("lion")[None], EMBEDDER)
    dog = EmbeddedEntities((Entity("dog", "object", "dog", MAIN),), vector("dog")[None], EMBEDDER)
    with opener() as s, opener() as other:
        held = s.postings
        best = s.insert("a lion on a beach", lion_beach, FP, latents(1), SIGMAS).entry_id
        second = s.insert("a lion", lion, FP, latents(2), SIGMAS).entry_id
        other.touch(second)
        assert answer(s, lion_beach, held)[1] == best
        assert other.prune(s.stats().bytes * 2 // 3) == [best]
        other.set_budget(10 ** 9)  # the insert below evicts nothing
        s.keeper.sync()  # this lookup read the generation after the eviction ...
        monkeypatch.setattr(s.keeper, "sync", lambda: None)
        other.insert("a dog", dog, FP, latents(3), SIGMAS)  # ... and an insert committed before it read new ids
        # one new id for a generation that moved by one: counting alone would take the eviction for that insert
        # and rank the evicted entry (which the lookup then sets aside as a damaged row)
        assert ranked(s, lion_beach, held, False) == ranked(s, lion_beach, None, False) == [second]
        assert answer(s, lion_beach, held)[1] == second


def test_held_postings_are_refetched_after_many_additions(opener, monkeypatch):
    monkeypatch.setattr(posting_cache, "REFRESH_AFTER", 3)
    lion = EmbeddedEntities((Entity("lion", "object", "lion", MAIN),), vector("lion")[None], EMBEDDER)
    with opener() as s:
        held = s.postings
        for i in range(5):
            newest = s.insert(f"a lion {i}", lion, FP, latents(i), SIGMAS).entry_id
            assert answer(s, lion, held)[1] == newest
        # read at the first fill with every other posting, 3 added, then fetched afresh (one identity: a drop does
        # not read everything again)
        assert held.primed == 1 and held.fetches == 1 and held.appended == 3


def test_a_lower_id_committed_after_a_higher_one_is_not_missed(opener, monkeypatch):
    if opener.kind != "server":
        pytest.skip("SQLite draws entry ids inside its one write transaction: they commit in order")
    from comfyui_chai.cache_store.postgres import store as pg_store

    lion_beach = EmbeddedEntities((Entity("lion", "object", "lion", MAIN), Entity("beach", "scene", "beach", SCENE)),
                                  np.stack([vector("lion"), vector("beach")]), EMBEDDER)
    lion = EmbeddedEntities((Entity("lion", "object", "lion", MAIN),), vector("lion")[None], EMBEDDER)
    lock, waiting, go = pg_store.State.lock, threading.Event(), threading.Event()

    def held_back(cur):  # the slow writer has drawn its id and written its bytes; it takes the state lock later
        if threading.current_thread().name == "slow writer":
            waiting.set()
            assert go.wait(30)
        return lock(cur)

    monkeypatch.setattr(pg_store.State, "lock", staticmethod(held_back))
    with opener() as s, opener() as slow, opener() as fast:
        held = s.postings
        s.insert("a lion", lion, FP, latents(0), SIGMAS)
        assert answer(s, lion_beach, held)[0]
        fetched = held.fetches
        ids: list[int] = []
        writer = threading.Thread(name="slow writer", target=lambda: ids.append(
            slow.insert("a lion on a beach", lion_beach, FP, latents(1), SIGMAS).entry_id))
        writer.start()
        assert waiting.wait(30)
        later = fast.insert("a lion later", lion, FP, latents(2), SIGMAS).entry_id
        assert answer(s, lion_beach, held)[1] == later  # the slow writer's id is lower and not committed yet
        go.set()
        writer.join(30)
        assert ids and ids[0] < later
        assert answer(s, lion_beach, held)[1] == ids[0] == answer(s, lion_beach, None)[1]
        # both added when they came; the one fetch is 'beach', which first matched once the slow writer stored it
        assert held.fetches == fetched + 1 and held.appended == 2


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


def test_a_first_fill_reads_every_posting_at_once_and_ranks_as_the_sql_does(opener):
    rng = random.Random(11)
    with opener() as s:
        for i in range(40):
            s.insert(f"entry {i}", prompt_entities(rng), OTHER_FP if i % 5 == 0 else FP, latents(i), SIGMAS)
        primed, by_identity = PostingCache(), PostingCache(prime=False)
        requests = [prompt_entities(rng) for _ in range(30)]
        for request in requests:
            for scenes_too in (False, True):
                assert ranked(s, request, primed, scenes_too) == ranked(s, request, None, scenes_too) \
                    == ranked(s, request, by_identity, scenes_too)
            assert answer(s, request, primed) == answer(s, request, None) == answer(s, request, by_identity)
        # every identity of both groups came in the one read; none was fetched after it
        assert primed.fetches == 0 and primed.primed > len({(h, c) for _, _, h, c in VOCAB})
        assert primed.prime_seconds > 0 and by_identity.primed == 0 and by_identity.fetches > 0
        assert primed._size == s.db.query("SELECT COUNT(*) FROM postings")[0][0]
        s.insert("a lion later", prompt_entities(rng), FP, latents(99), SIGMAS)
        lion = EmbeddedEntities((Entity("lion", "object", "lion", MAIN),), vector("lion")[None], EMBEDDER)
        assert answer(s, lion, primed) == answer(s, lion, None)  # what came after the read is added as before
        assert primed.fetches == 0 and primed.appended == 1


def test_no_first_fill_read_when_the_postings_would_take_over_half_the_bound(opener):
    rng = random.Random(12)
    with opener() as s:
        for i in range(10):
            s.insert(f"entry {i}", prompt_entities(rng), FP, latents(i), SIGMAS)
        total = s.db.query("SELECT COUNT(*) FROM postings")[0][0]
        small = PostingCache(max_postings=2 * total - 2)  # half the bound is one posting short
        request = prompt_entities(rng)
        assert answer(s, request, small) == answer(s, request, None)
        assert small.primed == 0 and not small.prime  # tried once, read nothing, fetched as before
        fits = PostingCache(max_postings=2 * total)
        assert answer(s, request, fits) == answer(s, request, None) and fits.primed > 0 and fits.fetches == 0


def test_a_first_fill_whose_entities_all_went_in_between_holds_nothing_and_ranks_as_the_sql_does(opener,
                                                                                                    monkeypatch):
    rng = random.Random(13)
    with opener() as s:
        for i in range(6):
            s.insert(f"entry {i}", prompt_entities(rng), FP, latents(i), SIGMAS)
        held = PostingCache()
        real = s.db.query

        def entities_gone(sql, params=()):  # the postings were read; every entity is removed before its names are
            return [] if sql.startswith("SELECT id, core, head, text, kind FROM entities") else real(sql, params)

        monkeypatch.setattr(s.db, "query", entities_gone)
        request = prompt_entities(rng)
        held._follow(s.db, "base", 1)
        assert held.primed == 0 and not held._held and not held.prime
        monkeypatch.setattr(s.db, "query", real)
        assert answer(s, request, held) == answer(s, request, None)  # fetched identity by identity instead


def test_donors_held_for_the_decision_decide_as_read_ones_and_are_read_once(opener):
    from comfyui_chai.cache_store.lookup.decision import DecisionModel

    rng = random.Random(17)
    # A model for the test embedder that reads all the donor's inputs (its entities' vectors, roles and prompt vector).
    model = DecisionModel({"main_sim": 4.0, "scene_sim": 2.0, "bag_sim": 1.0, "donor_prompt_best": 0.5}, -4.0, 0.5,
                          EMBEDDER)
    rule = HitRule(0.8, decision=model)
    with opener() as s:
        for i in range(30):
            s.insert(f"entry {i}", prompt_entities(rng), FP, latents(i), SIGMAS)
        requests = [prompt_entities(rng) for _ in range(25)]

        def answers(held):
            s.postings = held
            return [(r.hit, r.entry.id if r.entry else None, r.reason)
                    for r in (s.lookup(q, FP, SHAPE, rule, touch=False, load=False) for q in requests)]

        held = PostingCache()
        first = answers(held)
        assert first == answers(None)  # held donors decide as donors read from the database
        reads = held.side_reads
        assert reads > 0 and sum(hit for hit, _, _ in first) > 0  # the decision read donors and accepted some
        assert answers(held) == first and held.side_reads == reads  # the second pass read none again
        # Another change log (a rebuilt index, a cleared cache): nothing held is used.
        calls = []
        held.side("another base", 10**9, (1, 8, None), lambda: calls.append(1) or "read")
        assert calls == [1] and answers(held) == first and held.side_reads > reads + 1
        # A generation that went back (a restored database may hand out ids again): nothing held is used either.
        reads = held.side_reads
        held.side(held._sides_base, 10**9, (1, 8, None), lambda: "read")
        assert answers(held) == first and held.side_reads > reads + 1


def test_a_scene_row_of_format_v1_agrees_by_its_kind_of_place_in_both_paths(tmp_path):
    import sqlite3

    from comfyui_chai.cache_store.config import StoreConfig
    from comfyui_chai.cache_store.folder.store import CacheStore

    dog, beach = Entity("dog", "object", "dog", MAIN), Entity("sunny beach", "scene", "beach", SCENE)
    shore = Entity("shore", "scene", "shore", SCENE)  # a place of the beach's kind, its vector far from it
    root = tmp_path / "c"
    with CacheStore(root, StoreConfig(10**9)) as s:
        s.insert("a dog on a sunny beach", EmbeddedEntities((dog, beach), np.stack([vector("dog"), vector("beach")]),
                                                            EMBEDDER), FP, latents(1), SIGMAS)
    conn = sqlite3.connect(root / "manifest.sqlite")
    with conn:  # the scene as a row of format v1 writes it: no head, no core
        conn.execute("UPDATE entities SET head = '', core = '' WHERE text = 'sunny beach'")
    conn.close()
    request = EmbeddedEntities((dog, shore), np.stack([vector("dog"), vector("shore")]), EMBEDDER)
    with CacheStore(root, StoreConfig(10**9)) as s:
        for held in (None, PostingCache()):
            assert answer(s, request, held)[0], held


def test_an_entity_row_written_under_an_older_identity_still_serves_its_own_words(opener):
    # Entity rows are shared by text, so a row keeps the identity its first writer's parse gave it ("robotic dog"
    # read as a dog): a request naming the same words under today's identity is served, by both rankings, and
    # another thing of that identity ("dog") is still refused (a likeness is no dog).
    old = Entity("robotic dog", "object", "dog", MAIN)
    now = EmbeddedEntities((Entity("robotic dog", "object", "dog", MAIN, "robotic dog"),), vector("dog")[None],
                           EMBEDDER)
    for name, prompt, entity in (("a", "a robotic dog", old), ("b", "a dog", Entity("dog", "object", "dog", MAIN))):
        with opener(name, StoreConfig(10**9)) as s:
            s.insert(prompt, EmbeddedEntities((entity,), vector("dog")[None], EMBEDDER), FP, latents(1), SIGMAS)
            for held in (None, PostingCache()):
                assert answer(s, now, held)[0] == (entity is old), (prompt, held)
