"""Parsing that survives the styles users write: camera phrasing, tag lists, typos, adjectives (issue 25)."""
from __future__ import annotations

import pytest

from comfyui_chai.cache_store.entities.tags import is_tag_list, normalise_tags, strip_weights
from comfyui_chai.cache_store.entities.wordclass import WordClasses


@pytest.fixture(scope="module")
def extractor(spacy_pipeline):
    from comfyui_chai.cache_store.entities.extract import EntityExtractor

    return EntityExtractor(spacy_pipeline)


def roles(extractor, prompt: str) -> dict[str, str]:
    return {e.text: e.role for e in extractor.extract(prompt)}


@pytest.mark.parametrize("prompt, expected", [
    ("The camera orbits around. Tower, the camera circles around.", {"tower": "main"}),
    ("camera circles around a lighthouse", {"lighthouse": "scene"}),
    ("The camera pans left across a beach", {"beach": "scene"}),
    ("camera zooms in on a red car", {"red car": "main"}),
    ("dolly shot of a vintage tram", {"vintage tram": "main"}),
    ("tracking shot, zoom in, a fox trotting through snow", {"fox": "main", "snow": "scene"}),
])
def test_camera_and_motion_phrasing_is_never_an_entity(extractor, prompt, expected):
    got = roles(extractor, prompt)
    assert {k: v for k, v in got.items() if k in expected} == expected
    assert not [t for t in got if any(w in t.split() for w in ("camera", "orbit", "circle", "pan", "zoom",
                                                                  "shot", "dolly", "tracking"))]


@pytest.mark.parametrize("prompt, main", [
    ("A lion changes from big to small", "lion"),
    ("A beige lion changes from big to small", "beige lion"),
    ("a baseball batter swings at a pitch", "baseball batter"),
    ("An owl turns from white to brown", "owl"),
])
def test_verbs_tagged_as_plural_nouns_are_verbs_and_adjectives_never_entities(extractor, prompt, main):
    got = roles(extractor, prompt)
    assert got.get(main) == "main"
    assert not {"small", "big", "white", "brown"} & set(got)
    assert not any(t.endswith(("change", "swing", "turn")) for t in got)


@pytest.mark.parametrize("prompt, main, verb", [
    ("A red fox trots through a silent snowy forest in the early morning, its bright orange fur standing out "
     "against the white landscape.", "red fox", "trot"),
    ("A young surfer paddles out and catches a huge turquoise wave off the coast of Hawaii.", "young surfer",
     "paddle"),
    ("A sleek high-speed train glides through a snowy landscape with Mount Fuji rising in the background.",
     "sleek high-speed train", "glide"),
])
def test_prose_verbs_beside_a_participle_or_their_own_conjunct_are_verbs(extractor, prompt, main, verb):
    got = roles(extractor, prompt)
    assert got.get(main) == "main"
    assert not any(t.endswith(" " + verb) for t in got)


def test_a_plural_noun_with_its_own_verb_stays_a_noun(extractor):
    assert "dog toy" in roles(extractor, "the dog toys lie on the floor")
    assert "dog toy" in roles(extractor, "the dog toys lie on the floor while the puppy is sleeping")
    assert "city light" in roles(extractor, "city lights at night")


def test_tag_lists_are_split_quality_tags_dropped_and_the_person_tag_is_the_subject(extractor):
    got = roles(extractor, "masterpiece, best quality, 1girl, silver hair, red eyes, (red dress:1.2), "
                           "looking at viewer, forest, highres")
    assert got == {"girl": "main", "silver hair": "secondary", "red eye": "secondary", "red dress": "secondary",
                   "forest": "scene"}
    got = roles(extractor, "score_9, score_8_up, 1boy, solo, samurai armor, bamboo forest, night, 8k")
    assert got.get("boy") == "main" and got.get("bamboo forest") == "scene"
    assert not [t for t in got if "score" in t or "8k" in t or "solo" in t]


def test_weights_and_tag_detection():
    assert strip_weights("a (red dress:1.2) and ((blue hat)) [cat] <lora:style_x:0.8>").split() == \
        ["a", "red", "dress", "and", "blue", "hat", "cat"]
    assert is_tag_list(["1girl", "smile"], had_weights=False)
    assert is_tag_list(["castle", "moat", "dragon", "storm clouds"], had_weights=False)
    assert not is_tag_list(["A knight rides through the gate of a burning castle at dusk", "rain falling"], False)
    # prose with commas keeps its sentences
    prose = "A knight rides through the gate of a burning castle, banners torn, rain falling on the stones"
    assert normalise_tags(prose) == prose
    assert normalise_tags("best quality, 2girls, beach, sunset, masterpiece").split(". ") == \
        ["two girls", "beach", "sunset"]


def test_misspelt_common_nouns_are_repaired(extractor):
    got = roles(extractor, "a grizly bear catches a salmon in a rivr")
    assert got.get("grizzly bear") == "main" and got.get("river") == "scene"
    assert "golden retriever" in roles(extractor, "a golden retreiver running on the sand")


def test_typo_repair_leaves_real_and_unknown_words_alone(extractor):
    words = extractor.words
    assert [words.correct(w) for w in ("moutain", "kitchn", "dolphn", "motorcyle")] == \
        ["mountain", "kitchen", "dolphin", "motorcycle"]
    # real words, names, slang and short words are never rewritten into another noun
    for word in ("beech", "horse", "ramen", "vlog", "hoodie", "kpop", "bokeh", "cat"):
        assert words.correct(word) is None
    assert words.correct_text("Kyoto at night, a rivr") == "Kyoto at night, a river"
    assert WordClasses().correct_text("a rivr") == "a rivr"  # a pipeline without tables: nothing changes


@pytest.mark.parametrize("prompt, code", [
    ("Ein Hund läuft am Strand", "de"),  # one German function word and a letter English never uses
    ("Кошка спит на подоконнике", "ru"),
    ("一只猫在沙发上睡觉", "zh"),
    ("海辺を走る犬、夕焼け", "ja"),
    ("바닷가를 달리는 강아지", "ko"),
    ("Bocian stoi w gnieździe na dachu starej stodoły", "pl"),
    ("Semaver ve ince belli çay bardakları, buhar yükseliyor", "tr"),
    ("Kırmızı saçlı kurye kız yağmurlu şehirde bisiklet sürüyor", "xx"),  # no listed function word: its letters
])
def test_other_languages_and_scripts_are_named(prompt, code):
    from comfyui_chai.cache_store.entities.language import english_only_note, foreign_language, language_name

    assert foreign_language(prompt) == code
    assert language_name(code) in english_only_note(code)


@pytest.mark.parametrize("prompt", ["A café in Paris at dawn", "a piñata at a birthday party", "f1 car pit stop",
                                    "pan left, then pan right. Clouds.",
                                    "a cat in 東京 at night", "La Paz at night, a city of lights"])
def test_english_with_a_foreign_word_or_letter_stays_english(prompt):
    from comfyui_chai.cache_store.entities.language import foreign_language

    assert foreign_language(prompt) is None


def test_a_prompt_in_another_script_has_no_entities_and_the_reason_is_known(extractor):
    from comfyui_chai.cache_store.entities.language import foreign_language

    assert extractor.extract("Кошка спит на подоконнике") == [] and foreign_language("Кошка спит") == "ru"
