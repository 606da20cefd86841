"""Roles of entities (main subject, scene, secondary) and the hit rule that reads them."""
from __future__ import annotations

import pytest

from comfyui_chai.cache_store.lookup.rule import HitRule
from comfyui_chai.cache_store.entities.roles import MAIN, SCENE, SECONDARY


@pytest.fixture(scope="module")
def extract(spacy_pipeline):
    from comfyui_chai.cache_store.entities.extract import EntityExtractor

    extractor = EntityExtractor(spacy_pipeline)
    return lambda prompt: {e.text: e.role for e in extractor.extract(prompt)}


@pytest.mark.parametrize("prompt, expected", [
    ("A golden retriever, running on the beach", {"golden retriever": MAIN, "beach": SCENE}),
    ("a dog catching a frisbee in the park", {"dog": MAIN, "frisbee": SECONDARY, "park": SCENE}),
    ("Close up of a cat sleeping on a sofa", {"cat": MAIN, "sofa": SECONDARY}),
    ("The dense forest, where a green kite is drifting left", {"dense forest": SCENE, "green kite": MAIN}),
    ("teddy bear sitting on a bench in the park", {"teddy bear": MAIN, "bench": SECONDARY, "park": SCENE}),
])
def test_main_subject_scene_and_secondary_come_from_the_parse(extract, prompt, expected):
    assert extract(prompt) == expected


@pytest.mark.parametrize("prompt, owner, part", [
    ("Push in on the face of an old fisherman in a storm", "old fisherman", "face"),
    ("zoom in on the eyes of a black cat sitting on a broom", "black cat", "eye"),
    ("the paws of a kitten on a keyboard", "kitten", "paw"),
    ("the tiger's eye in close-up", "tiger", "eye"),
])
def test_a_part_hands_the_main_role_to_its_owner(extract, prompt, owner, part):
    roles = extract(prompt)
    assert roles[owner] == MAIN and roles[part] == SECONDARY


def test_an_owner_past_a_verb_is_the_parsers_mistake_and_no_owner(extract):
    roles = extract("The engine of a train puffing smoke")
    assert roles["engine"] == MAIN and roles["smoke"] == SECONDARY


def test_a_container_or_a_non_part_keeps_its_reading(extract):
    assert extract("A cup of coffee on a table") == {"coffee": MAIN, "table": SECONDARY}
    assert extract("a dog catching a frisbee in the park")["frisbee"] == SECONDARY  # no part, no owner


def test_a_camera_move_from_a_to_b_has_both_ends_in_its_subject(extract):
    roles = extract("crane down from a cathedral ceiling to a white cat sitting in the aisle")
    assert roles["white cat"] == MAIN and roles["cathedral ceiling"] == MAIN
    roles = extract("zoom out, from the eye of a tiger to the whole jungle")
    assert roles["tiger"] == MAIN and roles["eye"] == SECONDARY and roles["whole jungle"] == SCENE
    # Only a move whose start is the subject: a man walking to the harbour keeps the harbour a scene.
    assert extract("A man walks from the station to the harbour")["harbour"] == SCENE
    # The move's end is in its own sentence: a later sentence's destination stays what it was.
    roles = extract("Tracking shot from a red kite. A man carries a box to the van.")
    assert roles["red kite"] == MAIN and roles["van"] == SECONDARY
    # Nor in another clause of it: the move ends before a verb.
    assert extract("The camera pulls away from a vase of flowers as a cat jumps onto the table")["table"] == SECONDARY


def test_a_name_given_to_the_subject_is_the_subject_too(extract):
    roles = extract("An aging samurai named Kenji walks alone into a snowbound village")
    assert roles["kenji"] == MAIN and roles["aging samurai"] == MAIN
    assert extract("a small robot called Bolt rolling through a junkyard")["bolt"] == MAIN
    assert extract("A woman calling her dog in the park")["dog"] == SECONDARY  # calling a dog names nothing


def test_generic_people_carry_what_they_do(extract):
    roles = extract("a man playing guitar on stage at night")
    assert roles["man playing guitar"] == MAIN and roles["stage"] == SCENE
    assert extract("A person is riding a bike")["person riding bike"] == MAIN
    assert "people shaking hand" in extract("two people shaking hands")


def test_modifier_variants_of_one_thing_in_one_prompt_become_one_entity(extract):
    roles = extract("a beige tiger walking through tall grass; the tiger yawns")
    assert "beige tiger" in roles and "tiger" not in roles


def test_a_prompt_without_a_grammatical_subject_makes_its_first_object_the_main_one(extract):
    roles = extract("red apples and a wooden bowl on a kitchen table")
    assert roles["red apple"] == MAIN


def test_hit_rule_needs_main_or_scene_on_both_sides():
    rule = HitRule(0.7)
    assert rule.carries(MAIN, SCENE, 0.9) and rule.carries(SCENE, SCENE, 0.7)
    assert not rule.carries(MAIN, SECONDARY, 0.99) and not rule.carries(SECONDARY, MAIN, 0.99)
    assert not rule.carries(MAIN, MAIN, 0.69)
    with pytest.raises(ValueError):
        HitRule(0.0)
    with pytest.raises(ValueError):
        HitRule(0.7, frozenset({"hero"}))


def test_core_keeps_nouns_compounded_onto_the_head_and_drops_adjectives(spacy_pipeline):
    from comfyui_chai.cache_store.entities.extract import EntityExtractor

    x = EntityExtractor(spacy_pipeline)
    cores = {e.text: e.core or e.head for p in ("a red sports car on a road", "a sea lion on a pier",
                                                 "a small wooden boat", "a baseball bat")
             for e in x.extract(p)}
    assert cores["red sports car"] == "sports car" and cores["sea lion"] == "sea lion"
    assert cores["small wooden boat"] == "boat" and cores["baseball bat"] == "baseball bat"


def test_same_thing_refuses_a_modifier_taken_for_a_head_and_guards_compound_identity():
    from comfyui_chai.cache_store.entities.extract import Entity

    rule = HitRule(0.7)
    sausage_dog = Entity("sausage dog", "object", "dog", MAIN, "sausage dog")
    sausage = Entity("sizzling sausage", "object", "sausage", MAIN)
    assert not rule.same_thing(sausage_dog, sausage, 0.99)
    humpback = Entity("humpback whale", "object", "whale", MAIN, "humpback whale")
    whale = Entity("whale", "object", "whale", MAIN)
    loose = HitRule(0.6)  # under the compound threshold (0.70) but over the rule's
    assert not loose.accepts(humpback, whale, 0.68) and loose.accepts(humpback, whale, 0.72)
    assert loose.accepts(Entity("old whale", "object", "whale", MAIN), whale, 0.68)  # an adjective: no compound
    sea_lion, lion = Entity("sea lion", "object", "lion", MAIN, "sea lion"), Entity("lion", "object", "lion", MAIN)
    assert not loose.accepts(sea_lion, lion, 0.99)  # a named kind is never its noun
    red_ball, blue_ball = Entity("red ball", "object", "ball", MAIN), Entity("blue ball", "object", "ball", MAIN)
    assert rule.accepts(red_ball, blue_ball, 0.76)
    street = Entity("street", "scene", "street", SCENE)
    city_street = Entity("city street", "scene", "street", SCENE, "city street")
    assert rule.accepts(city_street, street, 0.71)  # places keep their compounds
