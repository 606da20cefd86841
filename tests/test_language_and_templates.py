"""Prompts in other languages are a clean miss; camera template phrases never become entities."""
from __future__ import annotations

import pytest

from comfyui_chai.cache_store.entities.language import _SCRIPTS, OTHER_SCRIPT_SHARE, foreign_language, other_script
from comfyui_chai.cache_store.entities.stop_entities import StopEntities


@pytest.mark.parametrize("prompt, code", [
    ("Ein Golden Retriever rennt bei Sonnenuntergang am Strand entlang", "de"),
    ("Un chat qui dort sur le rebord de la fenêtre", "fr"),
    ("Un perro corriendo por la playa al atardecer con su dueño", "es"),
])
def test_other_languages_are_recognised_by_their_function_words(prompt, code):
    assert foreign_language(prompt) == code


@pytest.mark.parametrize("prompt", [
    "Cinematic shot of Van Gogh's selfie, Van Gogh style",  # names are not function words
    "A dog running on the beach at sunset",
    "La Paz at night, a city of lights",
    "",
])
def test_english_prompts_and_names_are_english(prompt):
    assert foreign_language(prompt) is None


def test_foreign_prompts_have_no_entities(spacy_pipeline):
    from comfyui_chai.cache_store.entities.extract import EntityExtractor

    x = EntityExtractor(spacy_pipeline)
    assert x.extract("Ein Koch flambiert Pfannkuchen in einer kleinen Restaurantküche") == []
    assert [e.text for e in x.extract("a cook flambeing pancakes in a small restaurant kitchen")]


def test_template_phrases_are_masked_before_parsing(spacy_pipeline):
    from comfyui_chai.cache_store.entities.extract import EntityExtractor

    stop = StopEntities.parse(["template: depth of field", "template: drone shot"])
    assert stop.mask_templates("a cat, shallow Depth  of field") == "a cat, shallow ,"
    texts = [e.text for e in EntityExtractor(spacy_pipeline).extract(
        "A white horse in a misty meadow, shallow depth of field, drone shot")]
    assert "field" not in texts and "drone" not in texts and "white horse" in texts


def test_language_names_and_the_note_cover_every_detected_language():
    from comfyui_chai.cache_store.entities.language import OTHER_LANGUAGES, english_only_note, language_name

    for code in OTHER_LANGUAGES:
        assert language_name(code) != code and language_name(code) in english_only_note(code)


def _other_script_by_counting(text: str) -> str | None:
    """`other_script` without its Latin-only shortcut: every letter counted against every script."""
    letters = [ord(ch) for ch in text if ch.isalpha()]
    if not letters:
        return None
    counts = {code: sum(any(lo <= c <= hi for lo, hi in ranges) for c in letters) for code, ranges in _SCRIPTS}
    if counts["ja"] and counts["ja"] + counts["zh"] >= OTHER_SCRIPT_SHARE * len(letters):
        return "ja"
    code, n = max(counts.items(), key=lambda kv: kv[1])
    return code if n >= OTHER_SCRIPT_SHARE * len(letters) else None


@pytest.mark.parametrize("text", [
    "A dog running on the beach", "Ein Hund läuft über die Straße, ça va, señor", "一只猫在窗台上睡觉",
    "猫が窓辺で寝ている", "Собака бежит по пляжу", "a cat, 一只猫", "Ωμέγα and a dog", "Ø ß ħ ŋ", "",
    "ʃɐ ǂ ɏ Ͱ", "A cat named Ͱ",
])
def test_other_script_shortcut_gives_the_counted_answer(text):
    assert other_script(text) == _other_script_by_counting(text)
