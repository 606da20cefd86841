"""The hit rule's Python predicates (what the benches measure) and its SQL (what the stores run) agree."""
from __future__ import annotations

import itertools
import sqlite3
from dataclasses import replace

import numpy as np
import pytest

from comfyui_chai.cache_store.entities.extract import Entity
from comfyui_chai.cache_store.entities.lexicon import same_kind_of_place
from comfyui_chai.cache_store.entities.roles import BORROWABLE, MAIN, ROLES, SCENE
from comfyui_chai.cache_store.lookup import ranking
from comfyui_chai.cache_store.lookup.rule import HitRule, IdentityFilter, closed_compound, kinds_differ
from comfyui_chai.cache_store.types import EmbeddedEntities

DIM = 6
PLACES = ("beach", "forest", "street", "desert", "harbour", "jungle", "snow", "ice")  # forest, jungle: one kind
# Words before a scene's head: none, another place, a cover's adjective or compound ("snowy forest", "snow-covered
# street"), or a cover's noun in another compound ("ice cream", "snow-white": no cover).
MODIFIERS = ("", "", "", "snowy", "snow-covered", "beach", "icy", "jungle", "ice cream", "snow-white")


def _unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


def _cases(rng: np.random.Generator, n: int) -> list[tuple[list[Entity], list[Entity], dict[str, np.ndarray]]]:
    """Random (request, donor) entity lists of 0-2 scenes each, with vectors near or far from each other."""
    base = {p: _unit(rng.normal(size=DIM)) for p in PLACES}
    cases = []
    for _ in range(n):
        vectors: dict[str, np.ndarray] = {"dog": _unit(np.ones(DIM))}
        sides = []
        for side in ("r", "d"):
            scenes = []
            for i, place in enumerate(rng.choice(PLACES, size=int(rng.integers(0, 3)), replace=False)):
                modifier = str(rng.choice(MODIFIERS))
                text = f"{side}{i} {modifier} {place}" if modifier and modifier != place else f"{side}{i} {place}"
                vectors[text] = _unit(base[place] + rng.normal(scale=float(rng.choice([0.05, 0.4, 1.0])), size=DIM))
                scenes.append(Entity(text, "scene", str(place), SCENE))
            sides.append([Entity("dog", "object", "dog", MAIN), *scenes])
        cases.append((sides[0], sides[1], vectors))
    return cases


def _sql_keeps(rule: HitRule, request: list[Entity], donor: list[Entity], vectors: dict[str, np.ndarray],
               v1: frozenset[str] = frozenset()) -> bool:
    """Whether the ranking's scene clause keeps the donor entry, on a postings table holding just that entry (the
    donor entities named in `v1` stored as rows of format v1: no head, no core)."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE postings (entry_id INTEGER, entity_id INTEGER, role TEXT)")
    db.execute("CREATE TABLE entities (id INTEGER PRIMARY KEY, core TEXT, head TEXT, text TEXT)")
    ids = {e.text: i for i, e in enumerate(donor, start=1)}
    db.executemany("INSERT INTO postings VALUES (1, ?, ?)", [(ids[e.text], e.role) for e in donor])
    # each donor entity is an identity of its own (its text as its core), so a match names exactly that entity
    db.executemany("INSERT INTO entities VALUES (?, ?, ?, ?)",
                   [(ids[e.text], *(("", "") if e.text in v1 else (e.text, e.head)), e.text) for e in donor])
    entities = EmbeddedEntities(tuple(request), np.stack([vectors[e.text] for e in request]), "test")
    matched = [(q, ids[d.text], float(vectors[e.text] @ vectors[d.text]))
               for q, e in enumerate(request) for d in donor]
    matched = [m for m in matched if m[2] >= rule.threshold]
    manifest = type("Db", (), {"query": staticmethod(lambda sql, params=(): db.execute(sql, params).fetchall())})
    scenes = ranking.agreeing_scenes(entities, ranking.by_identity(manifest, matched))
    where, params = rule.scenes_sql(scenes)
    kept = bool(db.execute(f"WITH best(entry_id) AS (VALUES (1)) SELECT entry_id FROM best {where}",
                           params).fetchall())
    if scenes is not None and rule.scenes_must_agree:  # the posting cache tests the same rows in Python
        rows = db.execute("SELECT e.core, e.head, e.id, e.text FROM postings p JOIN entities e ON e.id = p.entity_id "
                          "WHERE p.role = ?", [SCENE]).fetchall()
        assert kept == (not rows or any(scenes.admits(*row) for row in rows)), (request, donor, scenes)
    return kept


@pytest.mark.parametrize("scenes_must_agree", [True, False])
@pytest.mark.parametrize("threshold", [0.5, 0.8, 0.95])
def test_the_scene_predicate_and_its_sql_agree(threshold, scenes_must_agree):
    rule = HitRule(threshold, scenes_must_agree=scenes_must_agree)
    cases = _cases(np.random.default_rng(int(threshold * 100)), 300)
    outcomes, by_kind, by_words = [], 0, 0
    for k, (request, donor, vectors) in enumerate(cases):
        sim = lambda q, d: float(vectors[q.text] @ vectors[d.text])  # noqa: E731
        python = rule.scenes_agree(request, donor, sim)
        assert _sql_keeps(rule, request, donor, vectors) == python, (request, donor)
        # the same donor written by a store of format v1 (its scene's head is its text's last word)
        v1 = frozenset(e.text for e in donor if e.role == SCENE and k % 2)
        assert _sql_keeps(rule, request, donor, vectors, v1) == python, (request, donor, v1)
        outcomes.append(python)
        # agreement only by kind of place: two scenes of one kind, no pair at the threshold
        here, there = [e for e in request if e.role == SCENE], [e for e in donor if e.role == SCENE]
        apart = python and here and there and not any(sim(q, d) >= threshold for q in here for d in there)
        by_kind += bool(apart and any(same_kind_of_place(q.head, d.head) for q in here for d in there))
        by_words += bool(apart and not any(same_kind_of_place(q.head, d.head) for q in here for d in there))
    if scenes_must_agree:
        assert len(set(outcomes)) == 2  # the cases exercise both answers
        assert by_kind  # ... and scenes that agree only by their kind of place ("forest" / "jungle")
        assert by_words  # ... or only by one naming the other's place among its words ("snowy forest" / "snow")
    else:
        assert all(outcomes)


@pytest.mark.parametrize("roles", [BORROWABLE, frozenset({MAIN}), frozenset(ROLES)])
def test_the_role_predicate_and_its_sql_agree(roles):
    rule = HitRule(0.8, roles=roles)
    clause, params = rule.roles_sql("p.role")
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE postings (role TEXT)")
    for query_role, stored_role in itertools.product(ROLES, repeat=2):
        kept = bool(db.execute(f"SELECT 1 FROM (SELECT ? AS role) p WHERE {clause}", [stored_role, *params])
                    .fetchall())
        # the stored side runs in SQL; the request's side is filtered before the query (ranking.borrowable)
        assert rule.carries(query_role, stored_role, 0.9) == (query_role in rule.roles and kept)
    assert not rule.carries(MAIN, MAIN, 0.79)


def test_any_role_widens_only_the_roles():
    rule = HitRule(0.7, scenes_must_agree=False)
    wide = rule.any_role()
    assert wide.roles == frozenset(ROLES) and wide.threshold == 0.7 and not wide.scenes_must_agree


WORDS = ("dog", "sausage", "fire", "truck", "lion", "sea", "man", "red", "hot", "bear", "teddy", "street", "city",
         "horse", "seahorse", "dragon", "dragonfly", "toy")


def _entity(rng: np.random.Generator, role: str = MAIN) -> Entity:
    """A random entity of one to three words from a small vocabulary, so heads, cores and words collide often."""
    words = [str(w) for w in rng.choice(WORDS, size=int(rng.integers(1, 4)))]
    head = words[-1]
    core = " ".join(words[-2:]) if len(words) > 1 and rng.random() < 0.5 else ""
    return Entity(" ".join(words), str(rng.choice(["object", "scene", "other"])), head, role,
                  core if core != head else "")


def test_the_identity_filter_is_same_thing_for_every_stored_entity_of_an_identity_and_its_sql_agrees():
    """`identity_filter` + `IdentityFilter.admits` decide each stored entity as `same_thing` does, and the SQL the
    ranking runs (`identity_sql`) admits exactly the entities `admits` does."""
    rule = HitRule(0.6)
    rng = np.random.default_rng(7)
    db = sqlite3.connect(":memory:")
    sql = f"SELECT 1 FROM (SELECT ? AS drop_object, ? AS ban, ? AS ban_any, ? AS keep) m, " \
          f"(SELECT ? AS kind, ? AS text) e " \
          f"WHERE {rule.identity_sql('m', 'e', 'instr')}"
    seen, kept, named = set(), set(), 0
    for _ in range(4000):
        query, stored = _entity(rng), _entity(rng)
        if rng.random() < 0.2:  # the request's identity written as names ("Aurelia GT"), maybe the stored one's too
            query = replace(query, names=tuple(query.identity.split()))
        if rng.random() < 0.2:  # the request's own words, stored under another identity (an older parse's)
            stored = Entity(query.text, stored.kind, query.head, MAIN, stored.core if stored.core != query.head else "")
        sim = float(rng.choice([0.5, 0.65, 0.69, 0.7, 0.9]))  # under and over both thresholds
        python = rule.same_thing(query, stored, sim)
        only = rule.identity_filter(query, stored.core, stored.head, sim)
        assert python == (only is not None and only.admits(stored.kind, stored.text)), (query, stored, sim)
        if only is not None:
            in_sql = bool(db.execute(sql, [*only.row(), stored.kind, stored.text]).fetchall())
            assert in_sql == only.admits(stored.kind, stored.text), (query, stored, only)
            seen.add((only.drop_object, bool(only.ban), only.ban_any, in_sql))
            kept.add(bool(only.keep) and stored.text == only.keep and only.drop_object and stored.kind == "object")
        seen.add(python)
        named += bool(query.names and python and not rule.same_thing(replace(query, names=()), stored, sim))
    assert {True, False} <= seen and len(seen) >= 8  # refusals of every form were exercised
    assert True in kept  # ... and stored objects of the request's own words under another identity
    assert named  # ... and matches admitted only by a name the two share ("Amara Osei" / "Dr. Osei")


def test_compounds_written_as_one_word_count_like_open_ones():
    rule = HitRule(0.6)
    obj = lambda text: Entity(text, "object", text, MAIN)  # noqa: E731
    # The shorter head begins the longer: another thing, at any similarity ("dragon" / "dragon fly").
    for a, b in (("dragon", "dragonfly"), ("bat", "batter"), ("cat", "caterpillar"), ("pen", "penguin")):
        assert not rule.same_thing(obj(a), obj(b), 0.99) and not rule.same_thing(obj(b), obj(a), 0.99)
        assert rule.identity_filter(obj(a), "", b, 0.99) is None
    # It ends the longer: a kind, at the compound threshold ("horse" / "sea horse").
    assert not rule.same_thing(obj("horse"), obj("seahorse"), 0.68)
    assert rule.same_thing(obj("horse"), obj("seahorse"), 0.9)
    assert not rule.identity_filter(obj("horse"), "", "seahorse", 0.68).admits("object", "seahorse")
    # Short parts are no compounds; places keep theirs.
    assert closed_compound("bee", "beer") == "" and rule.same_thing(obj("bee"), obj("beer"), 0.7)
    sea, shore = Entity("sea", "scene", "sea", "scene"), Entity("seashore", "scene", "seashore", "scene")
    assert rule.same_thing(sea, shore, 0.7)


def _compound(text: str) -> Entity:
    return Entity(text, "object", text.rsplit(" ", 1)[-1], MAIN, text if " " in text else "")


@pytest.mark.parametrize("marked, other", [
    # likenesses: never the thing they depict
    ("teddy bear", "bear"), ("toy car", "car"), ("carousel horse", "horse"), ("wax seal", "seal"),
    ("teddy bear", "grizzly bear"), ("paper-mache horse", "horse"),
    # kinds named by their words: never the noun the name ends with, nor another compound of it
    ("red panda", "panda"), ("hot dog", "dog"), ("black hole", "hole"), ("shooting star", "star"),
    ("red panda", "giant panda"), ("hot dog", "corn dog"), ("sea lion", "lion"), ("computer mouse", "mouse"),
    ("baseball bat", "bat"), ("ice cream cone", "pine cone"), ("ice cream cone", "cone"),
    # ... with a noun after the name, in the plural, hyphenated
    ("red panda cub", "panda cub"), ("sea lion colony", "lion colony"), ("red pandas", "pandas"),
    ("hot-dog", "dog"), ("sea-lion", "lion"),
])
def test_a_likeness_or_a_named_kind_is_never_the_plain_thing(marked, other):
    rule = HitRule(0.6)
    for a, b in ((marked, other), (other, marked)):
        assert not rule.same_thing(_compound(a), _compound(b), 0.99), (a, b)
        only = rule.identity_filter(_compound(a), _compound(b).core, _compound(b).head, 0.99)
        assert only is None or not only.admits("object", b)


def test_two_of_one_mark_still_meet_the_compound_threshold():
    rule, obj = HitRule(0.6), _compound
    assert rule.same_thing(obj("toy car"), obj("toy car"), 0.7)
    assert rule.same_thing(obj("grizzly bear"), obj("bear"), 0.9)
    assert rule.same_thing(obj("teddy bear"), obj("toy teddy bear"), 0.9) is False  # "toy" on one side only
    assert rule.same_thing(obj("red panda"), obj("red panda"), 0.7)
    assert rule.same_thing(obj("baby red panda"), obj("red panda"), 0.9)  # the name in both identities
    # a name whose noun the other side does not hold says nothing about it: a black widow spider is a spider
    for named, thing in (("black widow spider", "spider"), ("hot dog bun", "bun"), ("pine cone wreath", "wreath")):
        assert not kinds_differ(named, thing) and rule.same_thing(obj(named), obj(thing), 0.9)
    assert kinds_differ("waffle cone", "ice cream cone")  # the list's price: a kind of it written otherwise


def test_objects_with_other_heads_need_the_compound_threshold():
    rule = HitRule(0.6)
    obj = lambda text: Entity(text, "object", text, MAIN)  # noqa: E731
    place = lambda text: Entity(text, "scene", text, SCENE)  # noqa: E731
    assert not rule.same_thing(obj("bicycle"), obj("motorcycle"), 0.68)  # under 0.70
    assert rule.same_thing(obj("puppy"), obj("dog"), 0.80)
    assert not rule.identity_filter(obj("bicycle"), "", "motorcycle", 0.68).admits("object", "motorcycle")
    assert rule.identity_filter(obj("puppy"), "", "dog", 0.80).admits("object", "dog")
    # places are not objects: two scenes with other heads keep the rule's own threshold
    assert rule.same_thing(place("harbour"), place("marina"), 0.62)


def test_materials_things_are_made_of_leave_the_thing_itself():
    rule = HitRule(0.6)
    obj = lambda text: Entity(text, "object", text.rsplit(" ", 1)[-1], MAIN, text if " " in text else "")  # noqa: E731
    for made, thing in (("chocolate cake", "cake"), ("cardboard box", "box"), ("clay pot", "pot"),
                        ("rocking chair", "chair"), ("plush sofa", "sofa"), ("stuffed pepper", "pepper"),
                        ("inflatable boat", "boat"), ("miniature pony", "pony"), ("mechanical watch", "watch")):
        assert rule.same_thing(obj(made), obj(thing), 0.75), made
    for likeness, thing in (("robotic dog", "dog"), ("animatronic dinosaur", "dinosaur"), ("plushie bear", "bear")):
        assert not rule.same_thing(obj(likeness), obj(thing), 0.99), likeness


def test_the_same_words_are_the_same_thing_whatever_identity_was_stored():
    # An entity row keeps the identity its first writer's parse gave it ("robotic dog" read as a dog before the
    # depiction words reached the identity): the same words in a request still name the same thing.
    rule = HitRule(0.6)
    now = Entity("robotic dog", "object", "dog", MAIN, "robotic dog")
    before, dog = Entity("robotic dog", "object", "dog", MAIN, ""), Entity("dog", "object", "dog", MAIN, "")
    assert rule.same_thing(now, before, 0.75) and not rule.same_thing(now, dog, 0.75)
    only = rule.identity_filter(now, before.core, before.head, 0.75)
    assert only is not None and only.admits("object", "robotic dog") and not only.admits("object", "dog")
    db = sqlite3.connect(":memory:")
    sql = (f"SELECT 1 FROM (SELECT ? AS drop_object, ? AS ban, ? AS ban_any, ? AS keep) m, "
           f"(SELECT ? AS kind, ? AS text) e WHERE {rule.identity_sql('m', 'e', 'instr')}")
    assert db.execute(sql, [*only.row(), "object", "robotic dog"]).fetchall()
    assert not db.execute(sql, [*only.row(), "object", "dog"]).fetchall()


def test_words_no_stored_text_can_hold_ban_and_keep_nothing_in_sql():
    # stores write NUL and lone surrogates as U+FFFD, and PostgreSQL refuses them as parameters: such a word is
    # no parameter at all, and in Python it matches no stored text either
    only = IdentityFilter(drop_object=True, ban="a\x00b", ban_any=True, keep="robotic\x00dog")
    assert only.row() == (1, "", 0, "")
    assert not only.admits("object", "robotic\ufffddog") and only.admits("scene", "a\ufffdb")


def test_a_scene_covered_by_what_the_other_scene_is_agrees_with_it():
    from comfyui_chai.cache_store.entities.lexicon import covers_named, scene_words_name

    assert scene_words_name("snowy forest", "forest", "snow") and scene_words_name("snow-covered forest", "forest",
                                                                                    "snow")
    assert scene_words_name("foggy harbour", "harbour", "fog") and scene_words_name("icy road", "road", "ice")
    assert scene_words_name("hazy valley", "valley", "haze") and scene_words_name("muddy track", "track", "mud")
    assert not scene_words_name("burning forest", "forest", "snow")
    assert covers_named("snowy forest", "forest") == {"snow"} and not covers_named("snow", "snow")
    # only what covers a place sets its look: a place named as a modifier is another place, and a cover's noun in
    # another compound covers nothing
    for text, head, other in (("sea cave", "cave", "sea"), ("castle gift shop", "shop", "castle"),
                              ("space shuttle cockpit", "cockpit", "space"), ("busy street", "street", "bus"),
                              ("ice cream shop", "shop", "ice"), ("mud hut village", "village", "mud"),
                              ("snow-white castle", "castle", "snow"), ("sand-colored room", "room", "sand")):
        assert not scene_words_name(text, head, other), (text, other)


def test_a_shared_name_ties_two_identities_made_only_of_names():
    from comfyui_chai.cache_store.entities.names import shares_a_name

    aurelia = Entity("aurelia", "object", "aurelia", MAIN, names=("aurelia",))
    osei = Entity("amara osei", "object", "osei", MAIN, "amara osei", names=("amara", "osei"))
    assert shares_a_name(aurelia, "aurelia gt") and shares_a_name(osei, "dr. osei")  # a code, a title
    assert shares_a_name(osei, "dr osei") and not shares_a_name(osei, "dr marrow")
    # a likeness, a part or another product of the name: the usual tests decide
    for stored in ("aurelia gt keychain", "aurelia gt toy car", "aurelia poster"):
        assert not shares_a_name(aurelia, stored) and not HitRule(0.6).same_thing(
            aurelia, Entity(stored, "object", stored.rsplit(" ", 1)[-1], MAIN, stored), 0.9), stored
    lion = Entity("majestik lion", "object", "lion", MAIN, "majestik lion", names=("majestik",))
    assert not shares_a_name(lion, "majestik lion statue") and not shares_a_name(lion, "majestik")
    assert HitRule(0.6).same_thing(aurelia, Entity("aurelia gt", "object", "gt", MAIN, "aurelia gt"), 0.3)
