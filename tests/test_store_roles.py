"""The store keeps each entity's role and identity, applies the hit rule (on both backends), and upgrades v1 caches in
place."""
from __future__ import annotations

import sqlite3

import numpy as np

from comfyui_chai.cache_store.config import StoreConfig
from comfyui_chai.cache_store.entities.extract import Entity
from comfyui_chai.cache_store.folder.store import CacheStore
from comfyui_chai.cache_store.types import EmbeddedEntities
from comfyui_chai.cache_store.lookup.rule import HitRule
from store_helpers import EMBEDDER, SIGMAS, latents, vector

FP, SHAPE, THR = "model-a", (1, 4, 2, 4, 4), 0.8


def embedded(*entities: Entity) -> EmbeddedEntities:
    return EmbeddedEntities(entities, np.stack([vector(e.core or e.head) for e in entities]), EMBEDDER)


def test_a_match_of_secondary_elements_is_a_miss_that_says_why(opener):
    with opener("c", StoreConfig(10**9)) as s:
        s.insert("a man playing guitar on stage", embedded(
            Entity("man playing guitar", "object", "man", "main", "man playing guitar"),
            Entity("guitar", "object", "guitar", "secondary"), Entity("stage", "scene", "stage", "scene")),
            FP, latents(1), SIGMAS)
        miss = s.lookup(embedded(Entity("guitar", "object", "guitar", "main")), FP, SHAPE, HitRule(THR))
        assert not miss.hit and "secondary" in miss.reason and "'guitar'~'guitar'" in miss.reason
        hit = s.lookup(embedded(Entity("stage", "scene", "stage", "scene")), FP, SHAPE, HitRule(THR))
        assert hit.hit and hit.matches[0].role == "scene"
        own_secondary = s.lookup(embedded(Entity("stage", "scene", "stage", "secondary")), FP, SHAPE, HitRule(THR))
        assert not own_secondary.hit


def test_the_same_main_subject_in_another_scene_is_a_miss_that_says_why(opener):
    dog = Entity("dog", "object", "dog", "main")
    with opener("c", StoreConfig(10**9)) as s:
        s.insert("a dog on a beach", embedded(dog, Entity("beach", "scene", "beach", "scene")), FP, latents(1), SIGMAS)
        elsewhere = s.lookup(embedded(dog, Entity("forest", "scene", "forest", "scene")), FP, SHAPE, HitRule(THR))
        assert not elsewhere.hit and "another scene ('forest' here, 'beach' there)" in elsewhere.reason
        assert s.lookup(embedded(dog, Entity("beach", "scene", "beach", "scene")), FP, SHAPE, HitRule(THR)).hit
        assert s.lookup(embedded(dog), FP, SHAPE, HitRule(THR)).hit  # the request names no scene: nothing to disagree with
        # an entry of the same subject without a scene serves the forest request
        s.insert("a dog", embedded(dog), FP, latents(2), SIGMAS)
        served = s.lookup(embedded(dog, Entity("forest", "scene", "forest", "scene")), FP, SHAPE, HitRule(THR))
        assert served.hit and served.entry.prompt == "a dog"
        # more conflicting entries than the lookup's candidate list, all newer: the scene-less one still serves
        for i, place in enumerate(["desert", "city", "snow", "lake", "river", "canyon", "meadow", "harbor", "cave"]):
            s.insert(f"a dog in the {place}", embedded(dog, Entity(place, "scene", place, "scene")), FP,
                     latents(3 + i), SIGMAS)
        served = s.lookup(embedded(dog, Entity("forest", "scene", "forest", "scene")), FP, SHAPE, HitRule(THR))
        assert served.hit and served.entry.prompt == "a dog"


def test_scenes_of_one_kind_of_place_agree_whatever_their_words(opener):
    dog = Entity("dog", "object", "dog", "main")
    with opener("c", StoreConfig(10**9)) as s:
        s.insert("a dog in the jungle", embedded(dog, Entity("jungle", "scene", "jungle", "scene")), FP, latents(1),
                 SIGMAS)
        s.insert("a dog on a beach", embedded(dog, Entity("beach", "scene", "beach", "scene")), FP, latents(2), SIGMAS)
        assert float(vector("forest") @ vector("jungle")) < THR  # far apart for the test embedder, but both woodland
        served = s.lookup(embedded(dog, Entity("forest", "scene", "forest", "scene")), FP, SHAPE, HitRule(THR))
        assert served.hit and served.entry.prompt == "a dog in the jungle"
        # the beach (a coast) agrees with neither woodland nor the sea's other kinds: "a dog in a meadow" misses
        missed = s.lookup(embedded(dog, Entity("meadow", "scene", "meadow", "scene")), FP, SHAPE, HitRule(THR))
        assert not missed.hit and "another scene" in missed.reason


def test_a_scene_naming_the_others_place_among_its_words_agrees(opener):
    dog = Entity("dog", "object", "dog", "main")
    snow, snowy_forest = Entity("snow", "scene", "snow", "scene"), Entity("snowy forest", "scene", "forest", "scene")
    with opener("c", StoreConfig(10**9)) as s:
        s.insert("a dog in a burning forest", embedded(dog, Entity("burning forest", "scene", "forest", "scene")), FP,
                 latents(1), SIGMAS)
        assert float(vector("snow") @ vector("forest")) < THR  # far apart for the test embedder
        missed = s.lookup(embedded(dog, snow), FP, SHAPE, HitRule(THR))
        assert not missed.hit and "another scene" in missed.reason
        s.insert("a dog in a snowy forest", embedded(dog, snowy_forest), FP, latents(2), SIGMAS)
        served = s.lookup(embedded(dog, snow), FP, SHAPE, HitRule(THR))  # "snow" among the stored scene's words
        assert served.hit and served.entry.prompt == "a dog in a snowy forest"
    with opener("d", StoreConfig(10**9)) as s:
        s.insert("a dog in the snow", embedded(dog, snow), FP, latents(3), SIGMAS)
        served = s.lookup(embedded(dog, snowy_forest), FP, SHAPE, HitRule(THR))  # ... or among the request's
        assert served.hit and served.entry.prompt == "a dog in the snow"
        burning = s.lookup(embedded(dog, Entity("burning forest", "scene", "forest", "scene")), FP, SHAPE, HitRule(THR))
        assert not burning.hit


def test_a_noun_compounded_on_one_side_names_another_thing(opener):
    with opener("c", StoreConfig(10**9)) as s:
        s.insert("a lion", embedded(Entity("lion", "object", "lion", "main")), FP, latents(1), SIGMAS)
        s.insert("sizzling sausages", embedded(Entity("sizzling sausage", "object", "sausage", "main")), FP,
                 latents(2), SIGMAS)
        sea_lion = Entity("sea lion", "object", "lion", "main", "sea lion")
        lion, other = vector("lion"), vector("zebra")
        other = other - (other @ lion) * lion
        # similarity 0.65 to "lion": under the compound threshold (0.70), over the rule's (0.5)
        close = 0.65 * lion + float(np.sqrt(1 - 0.65 ** 2)) * other / np.linalg.norm(other)
        assert not s.lookup(EmbeddedEntities((sea_lion,), close[None], EMBEDDER), FP, SHAPE, HitRule(0.5)).hit
        plain = Entity("old lion", "object", "lion", "main")  # an adjective: the same kind of thing
        assert s.lookup(EmbeddedEntities((plain,), close[None], EMBEDDER), FP, SHAPE, HitRule(0.5)).hit
        # over the compound threshold a compound is a kind of its noun, unless its name says another kind
        near = 0.95 * lion + float(np.sqrt(1 - 0.95 ** 2)) * other / np.linalg.norm(other)
        cave_lion = Entity("cave lion", "object", "lion", "main", "cave lion")
        assert s.lookup(EmbeddedEntities((cave_lion,), near[None], EMBEDDER), FP, SHAPE, HitRule(0.5)).hit
        assert not s.lookup(EmbeddedEntities((sea_lion,), near[None], EMBEDDER), FP, SHAPE, HitRule(0.5)).hit
        # "sausage" is the stored entity's head but only a modifier of the request's "sausage dog"
        dog = Entity("sausage dog", "object", "dog", "main", "sausage dog")
        assert not s.lookup(EmbeddedEntities((dog,), vector("sausage")[None], EMBEDDER), FP, SHAPE, HitRule(0.5)).hit


def test_roles_survive_a_rebuild_from_the_files(tmp_path):
    root = tmp_path / "c"
    with CacheStore(root, StoreConfig(10**9)) as s:
        s.insert("a dog with a ball", embedded(Entity("dog", "object", "dog", "main"),
                                               Entity("ball", "object", "ball", "secondary")), FP, latents(1), SIGMAS)
    (root / "manifest.sqlite").unlink()
    with CacheStore(root, StoreConfig(10**9)) as s:
        assert s.stats().entries == 1
        assert s.lookup(embedded(Entity("dog", "object", "dog", "main")), FP, SHAPE, HitRule(THR)).hit
        assert not s.lookup(embedded(Entity("ball", "object", "ball", "main")), FP, SHAPE, HitRule(THR)).hit


def test_a_v1_cache_is_upgraded_in_place_and_its_entries_keep_matching(tmp_path):
    root = tmp_path / "c"
    with CacheStore(root, StoreConfig(10**9)) as s:
        s.insert("a dog", embedded(Entity("dog", "object", "dog", "secondary")), FP, latents(1), SIGMAS)
    conn = sqlite3.connect(root / "manifest.sqlite")
    with conn:  # the v1 layout: no head/core on entities (nor their index), no role on postings
        conn.execute("DROP INDEX entities_identity")
        conn.execute("ALTER TABLE entities DROP COLUMN head")
        conn.execute("ALTER TABLE entities DROP COLUMN core")
        conn.execute("CREATE TABLE p1 (group_id INTEGER NOT NULL, entity_id INTEGER NOT NULL, entry_id INTEGER "
                     "NOT NULL, PRIMARY KEY (group_id, entity_id, entry_id)) WITHOUT ROWID")
        conn.execute("INSERT INTO p1 SELECT group_id, entity_id, entry_id FROM postings")
        conn.execute("DROP TABLE postings")
        conn.execute("ALTER TABLE p1 RENAME TO postings")
        conn.execute("UPDATE meta SET value='1' WHERE key='format_version'")
    conn.close()
    with CacheStore(root, StoreConfig(10**9)) as s:
        assert s.stats().format_version == 2 and s.stats().entries == 1
        # v1 entries had no roles: each of their entities may carry a hit, as before the upgrade
        assert s.lookup(embedded(Entity("dog", "object", "dog", "main")), FP, SHAPE, HitRule(THR)).hit
