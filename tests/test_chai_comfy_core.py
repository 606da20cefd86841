"""The ComfyUI-independent parts behind the CHAI nodes: payloads, cache lookup/write of traces, store generations,
the model-input donor capture, shared runs and the weights/patch digests (no ComfyUI needed)."""
from __future__ import annotations

import copy
import hashlib

import numpy as np
import pytest
import torch

from comfyui_chai.cache_store.entities.embedders.function import FunctionEmbedder
from comfyui_chai.cache_store.entities.extract import Entity
from comfyui_chai.cache_store.service import ChaiCache
from comfyui_chai.chai_attention.cache_io import (WriteOutcome, lookup_hit, resolve_threshold, threshold_source,
                                                  write_trace)
from comfyui_chai.chai_attention.comfy.capture import ModelInputCapture
from comfyui_chai.chai_attention.comfy.prepare import SharedRun
from comfyui_chai.chai_attention.identity import conditioning_digest, original_weights_digest, patches_digest
from comfyui_chai.chai_attention.config import ChaiConfig
from comfyui_chai.chai_attention.donors import Donor, DonorSet
from comfyui_chai.chai_attention.constants import FAST, FULL
from comfyui_chai.chai_attention.payloads import CacheHit, ChaiReport, PromptEntities, SampleTrace
from comfyui_chai.chai_attention.steps import capture_plan

PAPER_STEPS = (2, 3, 4)  # the mechanism tests use the paper's cache steps (the default is 5,6)

SHAPE = (1, 4, 3, 4, 4)
FULL_SIGMAS = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0]
FAST_SIGMAS = [1.0, 0.8, 0.6, 0.4, 0.2, 0.0]


def _vector(word: str, dim: int = 8) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "little")
    return np.random.default_rng(seed).normal(size=dim)


def _embedder(name: str = "toy@1") -> FunctionEmbedder:
    calls = []

    def fn(phrases):
        calls.append(list(phrases))
        return np.stack([_vector(p) for p in phrases])

    emb = FunctionEmbedder(name, fn, 8, 0.9)
    emb.calls = calls
    return emb


def _entities(prompt: str, *words: str, embedder=None) -> PromptEntities:
    return PromptEntities(prompt, tuple(Entity(w, "object", w.split()[-1]) for w in words), embedder)


def _donors(value: float = 1.0) -> DonorSet:
    return DonorSet([Donor(s, torch.full(SHAPE, value * s)) for s in (0.8, 0.6, 0.4)])


def _trace(mode: str = FULL, donors: DonorSet | None = None, fingerprint: str = "fp", **kw) -> SampleTrace:
    return SampleTrace(mode=mode, fingerprint=fingerprint, shape=SHAPE, config=ChaiConfig(cache_steps=PAPER_STEPS),
                       sampler_name="euler", scheduler="simple", sigmas=tuple(FULL_SIGMAS), report=ChaiReport("p", mode, 30),
                       donors=donors, **kw)


@pytest.fixture
def cache(tmp_path):
    c = ChaiCache(tmp_path / "c", budget_bytes=10**8, embedder=_embedder())
    yield c
    c.close()


def test_entities_embed_with_the_cache_embedder_unless_given_one_and_only_once_per_embedder(cache):
    ents = _entities("a red fox in snow", "red fox", "snow")
    first = ents.embedded(cache)
    assert first.embedder == "fn:toy@1" and first.vectors.shape == (2, 8)
    assert ents.embedded(cache) is first and len(cache.embedder.calls) == 1
    own = _embedder("own@2")
    other = _entities("a red fox in snow", "red fox", embedder=own)
    assert other.embedded(cache).embedder == "fn:own@2" and len(cache.embedder.calls) == 1
    assert ents.listing() == "red fox, snow" and _entities("nothing").listing() == "(none)"


def test_threshold_zero_means_the_calibrated_default_of_the_embedder_in_use(cache):
    assert resolve_threshold(cache, _entities("x", "fox"), 0.0) == 0.9
    assert resolve_threshold(cache, _entities("x", "fox"), 0.75) == 0.75
    own = FunctionEmbedder("own", lambda p: np.ones((len(p), 8)), 8, 0.6)
    assert resolve_threshold(cache, _entities("x", "fox", embedder=own), None) == 0.6


def test_the_threshold_source_says_what_zero_meant(cache, tmp_path):
    assert threshold_source(cache, _entities("x", "fox"), 0.0).endswith("the embedder's calibrated value")
    assert threshold_source(cache, _entities("x", "fox"), 0.75) == "set on the node"
    own = FunctionEmbedder("own", lambda p: np.ones((len(p), 8)), 8, 0.6)
    assert "text encoder" in threshold_source(cache, _entities("x", "fox", embedder=own), 0.0)
    configured = ChaiCache(tmp_path / "t", budget_bytes=10**8, embedder=_embedder(), threshold=0.7)
    try:
        assert "configured for this cache" in threshold_source(configured, _entities("x", "fox"), 0.0)
    finally:
        configured.close()
    hit = lookup_hit(cache, _entities("a red fox", "red fox"), "fp", SHAPE)
    assert hit.threshold == 0.9 and hit.threshold_source.startswith("auto (0 on the node)")


def test_full_trace_is_stored_then_found_with_cpu_donors_and_a_report_naming_the_match(cache):
    ents = _entities("a red fox in snow", "red fox", "snow")
    miss = lookup_hit(cache, ents, "fp", SHAPE)
    assert not miss.hit and "empty" in miss.reason and miss.donors is None
    written = write_trace(cache, ents, _trace(donors=_donors()))
    assert written.stored and written.outcome is WriteOutcome.STORED
    assert written.line.startswith("stored entry ") and "red fox, snow" in written.line
    entry = cache.store.entries()[0]
    assert entry.prompt == "a red fox in snow" and len(entry.sigmas) == 3
    hit = lookup_hit(cache, _entities("a red fox on grass", "red fox", "grass"), "fp", SHAPE)
    assert hit.hit and hit.entry_id == entry.id and hit.donor_prompt == "a red fox in snow"
    assert hit.matches[0][:2] == ("red fox", "red fox") and hit.matches[0][2] == pytest.approx(1.0, abs=1e-5)
    assert hit.donors.sigmas == (0.8, 0.6, 0.4) and hit.donors.donors[0].latent.device.type == "cpu"
    assert torch.equal(hit.donors.donors[1].latent, torch.full(SHAPE, 0.6))
    assert hit.unusable_reason("fp", SHAPE) is None
    assert "another model" in hit.unusable_reason("other", SHAPE)
    assert "shape" in hit.unusable_reason("fp", (1, 4, 6, 4, 4))
    other_model = lookup_hit(cache, _entities("a red fox", "red fox"), "other", SHAPE)
    assert not other_model.hit and "another model" in other_model.reason
    other_shape = lookup_hit(cache, _entities("a red fox", "red fox"), "fp", (1, 4, 6, 4, 4))
    assert not other_shape.hit and "latent shape" in other_shape.reason


def test_fast_trace_stores_nothing_and_refreshes_the_donor_without_counting_a_hit(cache):
    ents = _entities("a red fox in snow", "red fox")
    write_trace(cache, ents, _trace(donors=_donors()))
    before = cache.store.entries()[0]
    generation = cache.store.generation
    fast = _trace(FAST, donor_entry=before.id, donor_cache=str(cache.root))
    written = write_trace(cache, _entities("a red fox on grass", "red fox"), fast)
    after = cache.store.entries()[0]
    assert written.outcome is WriteOutcome.REFRESHED and not written.stored
    assert "nothing stored" in written.line and "refreshed" in written.line
    assert cache.store.stats().entries == 1 and cache.store.generation == generation
    assert after.last_used >= before.last_used and after.hits == before.hits
    elsewhere = write_trace(cache, ents, _trace(FAST, donor_entry=before.id, donor_cache="/some/other/cache"))
    assert elsewhere.outcome is WriteOutcome.OTHER_CACHE and "another cache" in elsewhere.line
    no_donor = write_trace(cache, ents, _trace(FAST))
    assert no_donor.outcome is WriteOutcome.NO_DONOR and no_donor.outcome.fast


@pytest.fixture
def backend_cache(opener):
    """A ChaiCache on each store backend in turn (tests/store_backends.py; the server one skips without PostgreSQL)."""
    if opener.kind == "folder":
        c = ChaiCache(opener.tmp / "c", budget_bytes=10**8, embedder=_embedder())
    else:
        c = ChaiCache(opener.tmp / "index", budget_bytes=10**8, embedder=_embedder(), server=opener.server(),
                      name=f"{opener.prefix}-c")
    yield c
    c.close()


def test_a_fast_run_whose_donor_was_evicted_says_so_and_refreshes_nothing_on_either_backend(backend_cache):
    cache = backend_cache
    ents = _entities("a red fox in snow", "red fox")
    write_trace(cache, ents, _trace(donors=_donors()))
    donor = cache.store.entries()[0]
    live = write_trace(cache, ents, _trace(FAST, donor_entry=donor.id, donor_cache=str(cache.root)))
    assert live.outcome is WriteOutcome.REFRESHED and str(donor.id) in live.line
    assert cache.store.clear() == 1 and cache.store.entry(donor.id) is None  # evicted since the run
    gone = write_trace(cache, ents, _trace(FAST, donor_entry=donor.id, donor_cache=str(cache.root)))
    assert gone.outcome is WriteOutcome.DONOR_EVICTED and not gone.stored
    assert "evicted" in gone.line and "refreshed" not in gone.line
    assert cache.store.stats().entries == 0


def test_full_trace_without_donors_or_entities_is_reported_not_stored(cache):
    written = write_trace(cache, _entities("a fox", "fox"), _trace(capture_problem="never evaluated"))
    assert written.outcome is WriteOutcome.NOT_STORED and "never evaluated" in written.line
    written = write_trace(cache, _entities("nothing to see"), _trace(donors=_donors()))
    assert written.outcome is WriteOutcome.NOT_STORED and not written.outcome.fast
    assert written.line.startswith("not stored")
    assert cache.store.stats().entries == 0


def test_cache_hit_without_donors_is_unusable_with_its_reason():
    miss = CacheHit(False, "the cache is empty", "miss: the cache is empty", "fp", SHAPE, 0.7)
    assert miss.unusable_reason("fp", SHAPE) == "the cache is empty"


class _Executor:
    def __init__(self):
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return args[0]


def _call(capture, x, sigma, chunks):
    executor = _Executor()
    capture(executor, x, torch.full((x.shape[0],), sigma), None, None, None, {"cond_or_uncond": chunks})
    assert executor.calls == 1


def test_model_input_capture_keeps_the_last_evaluation_at_each_planned_sigma_cond_chunk_only():
    plan = capture_plan(FULL_SIGMAS, FAST_SIGMAS, (2, 3, 4))
    assert plan.indices == (2, 4, 6)
    capture = ModelInputCapture(plan, FULL_SIGMAS, SHAPE)
    for i, s in enumerate(FULL_SIGMAS[:-1]):
        uncond, cond = torch.full(SHAPE, -1.0), torch.full(SHAPE, float(i))
        _call(capture, torch.cat([uncond, cond]), s, [1, 0])  # batched [uncond; cond]
        if i in (1, 3):  # a heun-like corrector at the next step's sigma, before that step's own evaluation
            _call(capture, torch.full(SHAPE, 99.0), FULL_SIGMAS[i + 1], [0])
    _call(capture, torch.full(SHAPE, 55.0), 0.75, [0])  # a midpoint sigma: never captured
    donors = capture.donors()
    assert donors.sigmas == (0.8, 0.6, 0.4)
    assert [float(d.latent[0, 0, 0, 0, 0]) for d in donors.donors] == [2.0, 4.0, 6.0]
    assert capture.problem() == ""


def test_model_input_capture_reports_what_it_never_saw():
    plan = capture_plan(FULL_SIGMAS, FAST_SIGMAS, (2, 3, 4))
    capture = ModelInputCapture(plan, FULL_SIGMAS, SHAPE)
    _call(capture, torch.zeros(SHAPE), 0.8, [0])
    _call(capture, torch.zeros(2, 4, 3, 4, 8), 0.6, [0])  # not the latent's shape (an area conditioning)
    problem = capture.problem()
    assert "steps 5, 7" in problem and "is not the latent" in problem
    with pytest.raises(RuntimeError):
        capture.donors()


def test_model_input_capture_lets_the_adapter_refuse_a_call_before_the_model_runs():
    def check(extra):
        if extra.get("guiding_frame_index") is not None:
            raise ValueError("image-to-video")

    capture = ModelInputCapture(capture_plan(FULL_SIGMAS, FAST_SIGMAS, (2, 3, 4)), FULL_SIGMAS, SHAPE, check)
    executor = _Executor()
    with pytest.raises(ValueError, match="image-to-video"):
        capture(executor, torch.zeros(SHAPE), torch.full((1,), 0.8), None, None, None, {"cond_or_uncond": [0]},
                guiding_frame_index=0)
    assert executor.calls == 0 and "steps 3, 5, 7" in capture.problem()  # nothing ran, nothing was kept
    capture(executor, torch.zeros(SHAPE), torch.full((1,), 0.8), None, None, None, {"cond_or_uncond": [0]})
    assert executor.calls == 1 and "steps 5, 7" in capture.problem()


def test_shared_run_is_shared_by_copies_of_the_model_options():
    run = SharedRun(ChaiConfig(cache_steps=PAPER_STEPS), FAST_SIGMAS, _donors())
    options = {"transformer_options": {"chai_run": run, "other": [1]}}
    cloned = copy.deepcopy(options)
    assert cloned["transformer_options"]["chai_run"] is run and copy.copy(run) is run
    assert cloned["transformer_options"]["other"] is not options["transformer_options"]["other"]


def test_weights_digest_sees_values_dtype_and_reads_originals_from_the_backup():
    net = torch.nn.Sequential(torch.nn.Linear(8, 300), torch.nn.Linear(300, 4))
    base = original_weights_digest(net)
    assert original_weights_digest(net) == base
    original = net[0].weight.detach().clone()
    with torch.no_grad():
        net[0].weight[0, 0] += 1.0  # element 0 is always sampled
    assert original_weights_digest(net) != base
    assert original_weights_digest(net, {"m.0.weight": original}, prefix="m.") == base  # patched in place
    fp32 = original_weights_digest(net)
    assert original_weights_digest(net.to(torch.float16)) != fp32


class _Patcher:
    def __init__(self, patches):
        self.patches = patches


def test_patches_digest_tells_strengths_and_patch_tensors_apart():
    up = torch.ones(4, 2)
    one = _Patcher({"w": [(1.0, ("lora", (up, up.T, None)), 1.0, None, None)]})
    assert patches_digest(one) == patches_digest(_Patcher({"w": [(1.0, ("lora", (up.clone(), up.T, None)), 1.0,
                                                                     None, None)]}))
    assert patches_digest(one) != patches_digest(_Patcher({"w": [(0.5, ("lora", (up, up.T, None)), 1.0, None,
                                                                  None)]}))
    assert patches_digest(one) != patches_digest(_Patcher({"w": [(1.0, ("lora", (up * 2, up.T, None)), 1.0, None,
                                                                  None)]}))
    assert patches_digest(_Patcher({})) == patches_digest(_Patcher({}))


def test_conditioning_digest_names_the_image_and_nothing_else():
    class VisionOutput:  # the shape of comfy.clip_vision.Output: tensors as attributes
        def __init__(self, seed: int) -> None:
            self.penultimate_hidden_states = torch.randn(1, 3, 4, generator=torch.Generator().manual_seed(seed))

    text = torch.zeros(1, 2, 3)
    image = torch.randn(1, 16, 2, 4, 4, generator=torch.Generator().manual_seed(0))

    def cond(seed: int, **extra) -> list:
        return [[text, {"concat_latent_image": image * seed, "concat_mask": torch.zeros(1, 1, 2, 4, 4),
                        "clip_vision_output": VisionOutput(seed), **extra}]]

    assert conditioning_digest([[text, {}]], {"samples": torch.zeros(1, 4)}) is None  # text-to-video
    assert conditioning_digest(cond(1)) == conditioning_digest(cond(1)) and conditioning_digest(cond(1)).startswith(
        "image:")
    assert conditioning_digest(cond(1)) != conditioning_digest(cond(2))
    assert conditioning_digest(cond(1)) == conditioning_digest(cond(1, pooled_output=torch.ones(3)))  # text only
    kept = {"samples": image, "noise_mask": torch.ones(1, 1, 2, 4, 4)}
    other = {"samples": image + 1, "noise_mask": kept["noise_mask"]}
    assert conditioning_digest([[text, {}]], kept) not in (None, conditioning_digest([[text, {}]], other))


class _TruncatingClip:
    """A ComfyUI-like CLIP whose tokenizer keeps the first `keep` words (word ids 1..keep; 0 = a special token)."""

    def __init__(self, keep: int | None) -> None:
        self.keep = keep

    def tokenize(self, text, return_word_ids=False):
        words = text.split()[: self.keep] if self.keep else text.split()
        batch = [(49406, 1.0, 0)] + [(100 + i, 1.0, i + 1) for i in range(len(words))] + [(49407, 1.0, 0)]
        return {"t5xxl": [batch]} if return_word_ids else {"t5xxl": [[t[:2] for t in batch]]}


class _OneWordIdClip(_TruncatingClip):
    """A tokenizer like ComfyUI's T5 ones: every token has word id 1, so the ids say nothing about what is kept."""

    def tokenize(self, text, return_word_ids=False):
        batch = [(100 + i, 1.0, 1) for i in range(len(text.split()) * 2)] + [(1, 1.0, 0)]
        return {"t5xxl": [batch]} if return_word_ids else {"t5xxl": [[t[:2] for t in batch]]}


class _NoWordIdsClip:
    def tokenize(self, text, **kwargs):
        raise TypeError("tokenize() got an unexpected keyword argument 'return_word_ids'")


def test_entities_come_from_the_words_the_text_encoder_keeps():
    from comfyui_chai.chai_attention.comfy.text import kept_prompt

    prompt = "a red ball bouncing along a city street " + " ".join(["and a sunny beach"] * 1200)
    text, kept, total = kept_prompt(_TruncatingClip(8), prompt)
    assert (text, kept, total) == ("a red ball bouncing along a city street", 8, 8 + 4 * 1200)
    assert "beach" not in text
    # An encoder that keeps every word, or cannot say what it keeps: the whole prompt.
    assert kept_prompt(_TruncatingClip(None), prompt) == (prompt, total, total)
    assert kept_prompt(_NoWordIdsClip(), "a dog") == ("a dog", 2, 2)
    sentence = "A golden retriever running along a sunny beach at sunset"
    assert kept_prompt(_OneWordIdClip(None), sentence) == (sentence, 10, 10)
