"""The one-line statuses the CHAI nodes show on the canvas (chai_attention.status)."""
from __future__ import annotations

from comfyui_chai.chai_attention.cache_io import WriteOutcome, WriteReport
from comfyui_chai.chai_attention.constants import FAST, FULL
from comfyui_chai.chai_attention.payloads import CacheHit, ChaiReport
from comfyui_chai.chai_attention.status import (lookup_status, same_prompt, same_prompt_note, sampler_status,
                                                write_status)


def _hit(hit: bool, prompt: str = "a dog on a sunny beach", donor: str | None = "a cat on a sunny beach",
         reason: str = "shared entities") -> CacheHit:
    return CacheHit(hit, reason, "", "fp", (1, 4, 2, 2, 2), 0.65, prompt=prompt, entry_id=3 if hit else None,
                    donor_prompt=donor if hit else None,
                    matches=(("dog", "cat", 0.4), ("sunny beach", "sunny beach", 1.0)) if hit else ())


def test_lookup_status_names_the_best_match_or_the_miss_reason():
    assert lookup_status(_hit(True)) == "HIT sunny beach 1.00 · donor #3"
    assert lookup_status(_hit(False, reason="the cache is empty")) == "MISS · the cache is empty"
    long = lookup_status(_hit(False, reason="x" * 200))
    assert long.startswith("MISS · x") and long.endswith("...") and len(long) < 80


def test_a_prompt_that_hits_its_own_entry_is_explained():
    own = _hit(True, donor="a dog on a sunny beach ")
    assert same_prompt(own) and not same_prompt(_hit(True)) and not same_prompt(_hit(False))
    assert "same prompt as its donor" in lookup_status(own)
    assert "it does not replay" in same_prompt_note(own) and same_prompt_note(_hit(True)) == ""


def test_sampler_status_gives_mode_steps_and_time():
    fast = ChaiReport("p", FAST, 8, matches=(("beach", "sunny beach", 0.91),), timings={"total": 0.3421})
    assert sampler_status(fast) == "HIT sunny beach 0.91 · 8 steps · 0.34 s"
    restart = ChaiReport("p", FAST, 8, matches=(("beach", "sunny beach", 0.91),), reuse="cache_attention",
                         timings={"total": 0.3421})
    assert sampler_status(restart) == "HIT sunny beach 0.91 · 8 steps · cache attention · 0.34 s"
    full = ChaiReport("p", FULL, 30, timings={"sample": 1.5})
    assert sampler_status(full) == "MISS · 30 steps · 1.50 s"
    unusable = ChaiReport("p", FULL, 30, reason="the entry is for another shape", hit_unusable=True)
    assert sampler_status(unusable) == "MISS · 30 steps · hit unusable, ran in full"
    # The status reads the typed field, never the prose: a reason that merely says so changes nothing.
    prose = ChaiReport("p", FULL, 30, reason="the cached entry could not be used (shape)")
    assert sampler_status(prose) == "MISS · 30 steps"


def test_write_status_says_whether_anything_was_stored():
    assert write_status(WriteReport(WriteOutcome.STORED, "stored entry 4"), 4) == "stored · 4 entries"
    for fast in (WriteOutcome.REFRESHED, WriteOutcome.DONOR_EVICTED, WriteOutcome.OTHER_CACHE, WriteOutcome.NO_DONOR):
        assert write_status(WriteReport(fast, "whatever the line says"), 4) == "nothing stored (fast run) · 4 entries"
    refused = write_status(WriteReport(WriteOutcome.NOT_STORED, "not stored: too large"), 0)
    assert refused == "not stored: too large · 0 entries"
    # A full run's line that happens to start with "fast run" is still not a fast run.
    assert write_status(WriteReport(WriteOutcome.NOT_STORED, "fast run? no"), 0) == "fast run? no · 0 entries"


def test_a_status_is_one_short_line_however_long_what_it_says():
    from comfyui_chai.chai_attention.status import MAX_STATUS, one_line

    cut = one_line("entities: " + ", ".join(f"thing{i}" for i in range(500)) + "\nsecond line")
    assert "\n" not in cut and len(cut) <= MAX_STATUS and cut.endswith("...")
    assert one_line("MISS · the cache is empty") == "MISS · the cache is empty"


def test_entity_extract_names_a_few_entities_and_counts_the_rest():
    from comfyui_chai.chai_attention.status import MAX_STATUS, entities_report, entities_status

    many = [f"entity {i}" for i in range(40)]
    status = entities_status(many)
    assert status.startswith("entities: entity 0, entity 1") and "+34 more" in status and len(status) <= MAX_STATUS
    assert entities_status(["ball", "sunny beach"]) == "entities: ball, sunny beach"
    assert entities_status(["ball"], cut=(20, 5000)) == "entities: ball · from the 20 of 5000 words the encoder reads"
    assert entities_report(many).count("entity ") == 40  # the report box lists them all
    # Long entities: as many as fit the line, and the count of the rest is never cut off.
    long = entities_status([f"very long entity phrase number {i}" for i in range(9)])
    assert long.endswith(" more") and len(long) <= MAX_STATUS and "number 0" in long, long
    assert "reads the first 20 of the prompt's 5000 words" in entities_report(["ball"], (20, 5000))


def test_a_prompt_in_another_language_says_extraction_is_english_only_and_what_to_do():
    from comfyui_chai.cache_store.entities.language import english_only_note
    from comfyui_chai.chai_attention.status import entities_report, entities_status

    status = entities_status([], "German")
    assert status == "entities: (none) · prompt not English (German): extraction is English-only"
    note = english_only_note("de")
    assert "English-only" in note and "German" in note and "English description" in note
    assert entities_report([], language_note=note).split("\n")[1] == note
    assert entities_status(["dog"], "German") == "entities: dog"  # entities found: nothing to explain
