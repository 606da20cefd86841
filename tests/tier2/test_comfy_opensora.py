"""Tier 2: OpenSora 1.2 as a native ComfyUI model, run by ComfyUI's own KSampler and SamplerCustom.

A tiny STDiT3 checkpoint is saved at test time into a temporary diffusion_models folder and loaded through
CHAI_OpenSoraModelLoader. Text goes through CHAI_OpenSoraTextEncode with a tiny T5 built through ComfyUI's own
T5 classes (PixArt tokenizer, T5 encoder with a small config and random weights) whose width matches the tiny
model's caption channels. Sampled latents are compared with the reference sampler (opensora/sampler.py) fed
ComfyUI's noise for the same seed. A test-only output node captures node outputs.
"""
from __future__ import annotations

import os
from typing import Any

import pytest
from comfy_test_nodes import capture_node, clip_loader_node

if not os.environ.get("COMFYUI_DIR"):
    pytest.skip("tier 2 needs a ComfyUI checkout: set COMFYUI_DIR (see tests/tier2/conftest.py)",
                allow_module_level=True)

import torch  # noqa: E402

NODE_IDS = {
    "CHAI_OpenSoraModelLoader": "CHAI OpenSora Model Loader",
    "CHAI_OpenSoraTextEncode": "CHAI OpenSora Text Encode",
    "CHAI_OpenSoraEmptyLatent": "CHAI OpenSora Empty Latent",
    "CHAI_OpenSoraScheduler": "CHAI OpenSora Scheduler",
    "CHAI_OpenSoraModelSampling": "CHAI OpenSora Model Sampling",
}
TINY_FILE = "tiny_stdit3.safetensors"
WAN_FILE = "not_stdit3_wan_like.safetensors"
CAPTION_CHANNELS = 32
TINY_T5 = {"d_ff": 64, "d_kv": 8, "d_model": CAPTION_CHANNELS, "dense_act_fn": "gelu_pytorch_tanh",
           "is_gated_act": True, "layer_norm_epsilon": 1e-6, "model_type": "t5", "num_heads": 4, "num_layers": 2,
           "relative_attention_num_buckets": 32, "vocab_size": 32128, "pad_token_id": 0, "eos_token_id": 1}
PROMPT = "A (red) fox runs through the SNOW at dawn, https://example.com #wildlife"
CAPTURED: dict[str, dict[str, Any]] = {}


_Capture = capture_node(CAPTURED, {
    "latent": ("LATENT",), "conditioning": ("CONDITIONING",), "sigmas": ("SIGMAS",),
    "model": ("MODEL",), "text": ("STRING", {"forceInput": True}),
    "negative": ("CONDITIONING",),
})


def tiny_clip(seed: int = 0) -> Any:
    """A ComfyUI CLIP with the PixArt T5 tokenizer and a tiny T5 encoder (random, well-scaled weights)."""
    import comfy.sd
    import comfy.sd1_clip
    import comfy.supported_models_base
    import comfy.text_encoders.pixart_t5
    import comfy.text_encoders.t5

    class TinyT5(comfy.sd1_clip.SDClipModel):
        def __init__(self, device="cpu", layer="last", layer_idx=None, dtype=None, model_options={}):
            super().__init__(device=device, layer=layer, layer_idx=layer_idx, textmodel_json_config=dict(TINY_T5),
                             dtype=dtype, special_tokens={"end": 1, "pad": 0}, model_class=comfy.text_encoders.t5.T5,
                             model_options={**model_options, "model_name": "t5xxl"})

    class TinyPixArtTE(comfy.sd1_clip.SD1ClipModel):
        def __init__(self, device="cpu", dtype=None, model_options={}):
            super().__init__(device=device, dtype=dtype, name="t5xxl", clip_model=TinyT5, model_options=model_options)

    target = comfy.supported_models_base.ClipTarget(comfy.text_encoders.pixart_t5.PixArtTokenizer, TinyPixArtTE)
    clip = comfy.sd.CLIP(target, model_options={"dtype": torch.float32})
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for key, value in clip.cond_stage_model.t5xxl.transformer.state_dict().items():
        if value.ndim == 1:
            state[key] = torch.ones(value.shape)
        elif "relative_attention_bias" in key:
            state[key] = torch.randn(value.shape, generator=gen) * 0.1
        else:
            state[key] = torch.randn(value.shape, generator=gen) / value.shape[-1] ** 0.5
    clip.load_sd(state)
    return clip


_TinyT5Loader = clip_loader_node(tiny_clip)


@pytest.fixture(scope="module")
def env(comfy, tmp_path_factory) -> dict[str, Any]:
    """Tiny checkpoint and a wrong one in a temporary diffusion_models folder; test-only nodes registered."""
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    stdit3 = comfy.pack_module("opensora.stdit3")
    loading = comfy.pack_module("opensora.loading")
    folder = tmp_path_factory.mktemp("diffusion_models")
    torch.manual_seed(0)
    model = stdit3.STDiT3(stdit3.STDiT3Config(hidden_size=32, depth=2, num_heads=2, caption_channels=CAPTION_CHANNELS,
                                              model_max_length=320))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim > 1:
                p.normal_(0.0, 0.5 / p.shape[-1] ** 0.5 if p.ndim == 2 else 0.2)
            elif "norm" not in name:
                p.normal_(0.0, 0.02)
    loading.save_stdit3(model, folder / TINY_FILE)
    save_file({"patch_embedding.weight": torch.zeros(8, 16, 1, 2, 2), "blocks.0.self_attn.q.weight": torch.zeros(8, 8),
               "blocks.0.self_attn.k.weight": torch.zeros(8, 8)}, str(folder / WAN_FILE))
    fp = comfy.folder_paths
    paths = fp.folder_names_and_paths["diffusion_models"][0]
    paths.append(str(folder))
    mappings = comfy.nodes.NODE_CLASS_MAPPINGS
    mappings["CHAI_Test_Capture"] = _Capture
    mappings["CHAI_Test_TinyT5"] = _TinyT5Loader
    yield {"folder": folder, "path": folder / TINY_FILE, "reference": loading.load_stdit3(folder / TINY_FILE)}
    CAPTURED.clear()  # ModelPatchers must not outlive ComfyUI's modules (their __del__ needs them)
    paths.remove(str(folder))
    mappings.pop("CHAI_Test_Capture", None)
    mappings.pop("CHAI_Test_TinyT5", None)


def run_ok(comfy, prompt: dict):
    """Run a prompt and fail with ComfyUI's message when it does not succeed; the run's result."""
    result = comfy.run(prompt)
    assert result.valid, (result.validation_error, result.node_errors)
    assert result.success, result.error
    return result


def loader(dtype: str = "fp32", name: str = TINY_FILE) -> dict:
    return {"class_type": "CHAI_OpenSoraModelLoader", "inputs": {"model_name": name, "weight_dtype": dtype}}


def empty_latent(resolution: str = "144p", aspect: str | None = None, frames: str | None = None, fps: float = 24.0,
                 batch: int = 1, custom: tuple[int, int, int] = (240, 426, 51)) -> dict:
    return {"class_type": "CHAI_OpenSoraEmptyLatent",
            "inputs": {"resolution": resolution, "aspect_ratio": aspect or "9:16 (240x426 HxW at 240p, landscape)",
                       "frames": frames or "custom", "custom_height": custom[0], "custom_width": custom[1],
                       "custom_frames": custom[2], "fps": fps, "batch_size": batch}}


def encode(prompt: str = PROMPT, model: list | None = None, aesthetic: bool = True) -> dict:
    return {"class_type": "CHAI_OpenSoraTextEncode",
            "inputs": {"clip": ["t5", 0], "model": model or ["model", 0], "prompt": prompt,
                       "add_aesthetic_score": aesthetic, "aesthetic_score": 6.5, "clean_prompt": True}}


def capture(key: str, **links: list) -> dict:
    return {"class_type": "CHAI_Test_Capture", "inputs": {"key": key, **links}}


def base_graph(frames: int = 17, fps: float = 24.0) -> dict:
    """Loader, tiny T5, text encode and a 144p 9:16 latent of `frames` frames (T = 5 for 17)."""
    return {
        "model": loader(),
        "t5": {"class_type": "CHAI_Test_TinyT5", "inputs": {"seed": 0}},
        "text": encode(),
        "latent": empty_latent("144p", frames="custom", custom=(240, 426, frames), fps=fps),
    }


def _reference(comfy, env: dict, noise: torch.Tensor, cond: torch.Tensor, uncond: torch.Tensor, sigmas: torch.Tensor,
               cfg: float, height: int, width: int, fps: float) -> torch.Tensor:
    """The pure-torch reference sampler (opensora/sampler.py) on the same checkpoint in fp32."""
    sampler = comfy.pack_module("opensora.sampler")
    model = env["reference"]
    return sampler.sample(lambda x, t, y, **kw: model(x, t, y, **kw), noise, cond, uncond, sigmas, cfg,
                          model_kwargs={"height": height, "width": width, "fps": fps})


# ---------------------------------------------------------------------------------------------------------------


def test_nodes_registered_under_chai_opensora_with_tooltips(comfy):
    assert not [line for line in comfy.load_log if ("Cannot import" in line or "Error while calling" in line)
                and "ComfyUI-CHAI" in line]
    for node_id, display in NODE_IDS.items():
        cls = comfy.nodes.NODE_CLASS_MAPPINGS[node_id]
        assert comfy.nodes.NODE_DISPLAY_NAME_MAPPINGS[node_id] == display
        assert cls.CATEGORY == "CHAI/OpenSora"
        inputs = cls.INPUT_TYPES()
        declared = {**inputs.get("required", {}), **inputs.get("optional", {})}
        assert declared
        for name, spec in declared.items():
            options = spec[1] if len(spec) > 1 else {}
            assert len(options.get("tooltip") or "") > 20, f"{node_id}.{name} lacks a useful tooltip"
    assert tuple(comfy.nodes.NODE_CLASS_MAPPINGS["CHAI_OpenSoraTextEncode"].RETURN_TYPES) == (
        "CONDITIONING", "CONDITIONING", "STRING")
    assert tuple(comfy.nodes.NODE_CLASS_MAPPINGS["CHAI_OpenSoraScheduler"].RETURN_TYPES) == ("SIGMAS",)


def test_loader_builds_a_native_flow_model_with_comfy_ops(comfy, env):
    run_ok(comfy, {"model": loader(), "cap": capture("loader", model=["model", 0])})
    patcher = CAPTURED["loader"]["model"]
    cm = comfy.pack_module("opensora.comfy_model")
    from comfy import model_base, model_patcher
    from comfy import ops as comfy_ops

    assert isinstance(patcher, model_patcher.ModelPatcher)
    assert isinstance(patcher.model, cm.OpenSoraModel) and cm.is_opensora(patcher)
    assert patcher.model.model_type == model_base.ModelType.FLOW
    sampling = patcher.get_model_object("model_sampling")
    assert sampling.multiplier == 1000
    assert sampling.shift == pytest.approx(2.421875)
    assert float(sampling.timestep(torch.tensor(0.25))) == pytest.approx(250.0)
    fmt = patcher.model.latent_format
    assert (fmt.latent_channels, fmt.latent_dimensions) == (4, 3)
    z = torch.randn(1, 4, 2, 3, 3)
    assert torch.equal(fmt.process_in(z), z) and torch.equal(fmt.process_out(z), z)
    dm = patcher.model.diffusion_model
    assert isinstance(dm.spatial_blocks[0].attn.qkv, comfy_ops.CastWeightBiasOp)
    assert isinstance(dm.x_embedder.proj, comfy_ops.CastWeightBiasOp)
    # Same tensors as the plain loader reads; official names under diffusion_model.
    ref = env["reference"].state_dict()
    for key, value in dm.state_dict().items():
        assert torch.equal(value, ref[key]), key
    assert "diffusion_model.spatial_blocks.0.attn.qkv.weight" in patcher.model.state_dict()
    assert patcher.model.memory_required([2, 4, 15, 30, 53]) > patcher.model.memory_required([1, 4, 1, 18, 32]) > 0


def test_loader_dtype_choice_sets_weight_dtype(comfy, env):
    run_ok(comfy, {"model": loader("bf16"), "cap": capture("bf16", model=["model", 0])})
    patcher = CAPTURED["bf16"]["model"]
    dm = patcher.model.diffusion_model
    assert dm.spatial_blocks[0].attn.qkv.weight.dtype == torch.bfloat16
    assert patcher.model.get_dtype() == torch.bfloat16
    # CPU cannot compute in bf16 by ComfyUI's rules: weights stay bf16, layers cast to fp32 on the fly.
    assert patcher.model.manual_cast_dtype == torch.float32
    assert dm.dtype == torch.float32


def test_loader_refuses_a_wrong_checkpoint_with_a_clear_message(comfy, env):
    result = comfy.run({"model": loader("default", name=WAN_FILE), "cap": capture("wrong", model=["model", 0])})
    assert result.valid and not result.success
    message = result.error["exception_message"]
    assert "CHAI OpenSora Model Loader" in message
    assert "not an Open-Sora 1.2 STDiT3 checkpoint" in message
    assert "Wan" in message


def test_empty_latent_shapes_and_record_for_every_size_preset(comfy, env):
    choices = comfy.pack_module("opensora.choices")
    presets = comfy.pack_module("opensora.presets")
    prompt, expected = {}, {}
    for res in presets.RESOLUTIONS:
        for label in choices.ASPECT_CHOICES:
            key = f"{res}|{label}"
            i = len(expected)
            prompt[f"l{i}"] = empty_latent(res, label, frames=choices.frames_label("image"))
            prompt[f"c{i}"] = capture(key, latent=[f"l{i}", 0])
            h, w = presets.IMAGE_SIZES[res][choices.ratio_of(label)]
            expected[key] = ((1, 4, 1, h // 8, w // 8), {"height": h, "width": w, "num_frames": 1, "fps": 24.0})
    run_ok(comfy, prompt)
    assert len(expected) == 25
    for key, (shape, record) in expected.items():
        latent = CAPTURED[key]["latent"]
        assert tuple(latent["samples"].shape) == shape, key
        assert not latent["samples"].any()
        assert latent["opensora"] == record, key
    assert CAPTURED["240p|9:16 (240x426 HxW at 240p, landscape)"]["latent"]["opensora"]["width"] == 426


def test_empty_latent_frame_presets_custom_size_fps_and_batch(comfy, env):
    choices = comfy.pack_module("opensora.choices")
    prompt = {}
    labels = [*choices.FRAME_CHOICES]
    for i, label in enumerate(labels):
        prompt[f"l{i}"] = empty_latent("144p", "1:1 (320x320 HxW at 240p, square)", frames=label,
                                       custom=(100, 60, 35), fps=30.0, batch=2)
        prompt[f"c{i}"] = capture(f"frames|{label}", latent=[f"l{i}", 0])
    prompt["lc"] = empty_latent("custom", frames="custom", custom=(100, 60, 35), fps=12.5)
    prompt["cc"] = capture("custom-size", latent=["lc", 0])
    result = run_ok(comfy, prompt)
    # The node says what it made, and that a size off the VAE's 8-pixel grid decodes floored (100x60 -> 96x56).
    (status,) = result.outputs["lc"]["text"]
    assert status == "100x60 px, 35 frames at 12.5 fps -> latent [1, 4, 11, 12, 7]; decodes to 96x56 px", status
    (status,) = result.outputs["l0"]["text"]
    assert "decodes" not in status and status.startswith("192x192 px, ")
    expected_t = {"image (1 frame)": (1, 1), "2s (51 frames)": (51, 15), "4s (102 frames)": (102, 30),
                  "8s (204 frames)": (204, 60), "16s (408 frames)": (408, 120), "custom": (35, 11)}
    for label in labels:
        latent = CAPTURED[f"frames|{label}"]["latent"]
        frames, t = expected_t[label]
        assert tuple(latent["samples"].shape) == (2, 4, t, 24, 24), label
        assert latent["opensora"] == {"height": 192, "width": 192, "num_frames": frames, "fps": 30.0}
    custom = CAPTURED["custom-size"]["latent"]
    assert tuple(custom["samples"].shape) == (1, 4, 11, 12, 7)
    assert custom["opensora"] == {"height": 100, "width": 60, "num_frames": 35, "fps": 12.5}


def test_scheduler_sigmas_equal_the_exact_opensora_schedule(comfy, env):
    schedule = comfy.pack_module("opensora.schedule")
    prompt = {
        "latent": empty_latent("240p", frames="2s (51 frames)"),
        "s1": {"class_type": "CHAI_OpenSoraScheduler",
               "inputs": {"steps": 30, "latent": ["latent", 0], "height": 8, "width": 8, "num_frames": 1,
                          "bf16_shift": True, "denoise": 1.0}},
        "s2": {"class_type": "CHAI_OpenSoraScheduler",
               "inputs": {"steps": 12, "height": 360, "width": 640, "num_frames": 102, "bf16_shift": False,
                          "denoise": 1.0}},
        "s3": {"class_type": "CHAI_OpenSoraScheduler",
               "inputs": {"steps": 10, "height": 240, "width": 426, "num_frames": 51, "bf16_shift": True,
                          "denoise": 0.5}},
        "c1": capture("s1", sigmas=["s1", 0]), "c2": capture("s2", sigmas=["s2", 0]),
        "c3": capture("s3", sigmas=["s3", 0]),
    }
    run_ok(comfy, prompt)
    s1 = CAPTURED["s1"]["sigmas"]
    assert torch.equal(s1, schedule.opensora_sigmas(30, 240, 426, 51))
    published = [1.000000, 0.985962, 0.971352, 0.956134, 0.940271]
    assert s1[:5].tolist() == pytest.approx(published, abs=1e-5)
    assert s1[-2].item() == pytest.approx(0.077076, abs=1e-5) and s1[-1].item() == 0.0
    assert torch.equal(CAPTURED["s2"]["sigmas"], schedule.opensora_sigmas(12, 360, 640, 102, bf16=False))
    assert torch.equal(CAPTURED["s3"]["sigmas"], schedule.opensora_sigmas(20, 240, 426, 51)[-11:])


def _noise_and_conds(comfy, key: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    from comfy import sample as comfy_sample

    got = CAPTURED[key]
    latent = got["latent"]
    noise = comfy_sample.prepare_noise(latent["samples"], 1234)
    (pos, _), = got["conditioning"]
    (neg, _), = got["negative"]
    return noise, pos, neg, latent


def test_text_encode_cleans_truncates_and_returns_the_null_caption(comfy, env):
    captions = comfy.pack_module("opensora.captions")
    long_prompt = " ".join(f"word{i % 7} and" for i in range(400))
    prompt = {"model": loader(), "t5": {"class_type": "CHAI_Test_TinyT5", "inputs": {"seed": 0}},
              "text": encode(), "long": encode(long_prompt, aesthetic=False),
              "c1": capture("enc", conditioning=["text", 0], negative=["text", 1], text=["text", 2],
                            model=["model", 0]),
              "c2": capture("enc-long", conditioning=["long", 0], negative=["long", 1])}
    result = run_ok(comfy, prompt)
    # The cut is reported on the node, not only in the server log.
    (status,) = result.outputs["long"]["text"]
    assert status.startswith("prompt cut: 300 of ") and "T5 tokens kept (OpenSora reads 300)" in status, status
    (status,) = result.outputs["text"]["text"]
    assert status.endswith(" T5 tokens") and "cut" not in status
    got = CAPTURED["enc"]
    assert got["text"] == captions.prepare_caption(PROMPT)
    assert "(" not in got["text"] and "https" not in got["text"] and got["text"].endswith("aesthetic score: 6.5.")
    (pos, extra), = got["conditioning"]
    (neg, _), = got["negative"]
    y_table = got["model"].model.diffusion_model.y_embedder.y_embedding
    assert pos.shape[0] == 1 and pos.shape[2] == CAPTION_CHANNELS and 5 < pos.shape[1] < 60
    assert "attention_mask" not in extra
    assert neg.shape == pos.shape and torch.equal(neg[0], y_table[: pos.shape[1]])
    # Matches a direct encode of the same caption with the same tiny T5 (the node adds nothing else).
    clip = tiny_clip(0)
    direct = clip.encode_from_tokens_scheduled(clip.tokenize(got["text"]))[0][0]
    torch.testing.assert_close(pos, direct)
    (pos_long, _), = CAPTURED["enc-long"]["conditioning"]
    (neg_long, _), = CAPTURED["enc-long"]["negative"]
    assert pos_long.shape[1] == 300 and neg_long.shape[1] == 300


def test_ksampler_equals_the_reference_sampler(comfy, env):
    from comfy import samplers as comfy_samplers

    graph = base_graph()
    graph["ks"] = {"class_type": "KSampler",
                   "inputs": {"model": ["model", 0], "seed": 1234, "steps": 6, "cfg": 7.0, "sampler_name": "euler",
                              "scheduler": "simple", "positive": ["text", 0], "negative": ["text", 1],
                              "latent_image": ["latent", 0], "denoise": 1.0}}
    graph["cap"] = capture("ks", latent=["latent", 0], conditioning=["text", 0], negative=["text", 1],
                           model=["model", 0])
    graph["out"] = capture("ks-out", latent=["ks", 0])
    run_ok(comfy, graph)
    noise, pos, neg, latent = _noise_and_conds(comfy, "ks")
    sigmas = comfy_samplers.calculate_sigmas(CAPTURED["ks"]["model"].get_model_object("model_sampling"), "simple", 6)
    ref = _reference(comfy, env, noise, pos, neg, sigmas, 7.0, 144, 256, 24.0)
    out = CAPTURED["ks-out"]["latent"]
    assert out["opensora"] == latent["opensora"]  # KSampler keeps the record for the VAE decode
    assert out["samples"].shape == (1, 4, 5, 18, 32)
    torch.testing.assert_close(out["samples"], ref, atol=1e-4, rtol=1e-4)
    assert (ref - noise).abs().mean() > 0.1  # the run really moved the latent


def test_sampler_custom_with_opensora_scheduler_equals_the_reference(comfy, env):
    schedule = comfy.pack_module("opensora.schedule")
    graph = base_graph()
    graph.update({
        "sigmas": {"class_type": "CHAI_OpenSoraScheduler",
                   "inputs": {"steps": 5, "latent": ["latent", 0], "height": 8, "width": 8, "num_frames": 1,
                              "bf16_shift": True, "denoise": 1.0}},
        "euler": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
        "sc": {"class_type": "SamplerCustom",
               "inputs": {"model": ["model", 0], "add_noise": True, "noise_seed": 1234, "cfg": 4.5,
                          "positive": ["text", 0], "negative": ["text", 1], "sampler": ["euler", 0],
                          "sigmas": ["sigmas", 0], "latent_image": ["latent", 0]}},
        "cap": capture("sc", latent=["latent", 0], conditioning=["text", 0], negative=["text", 1],
                       sigmas=["sigmas", 0]),
        "out": capture("sc-out", latent=["sc", 0]),
    })
    run_ok(comfy, graph)
    noise, pos, neg, _ = _noise_and_conds(comfy, "sc")
    sigmas = CAPTURED["sc"]["sigmas"]
    assert torch.equal(sigmas, schedule.opensora_sigmas(5, 144, 256, 17))
    ref = _reference(comfy, env, noise, pos, neg, sigmas, 4.5, 144, 256, 24.0)
    torch.testing.assert_close(CAPTURED["sc-out"]["latent"]["samples"], ref, atol=1e-4, rtol=1e-4)


def test_model_sampling_node_sets_shift_and_passes_fps_to_the_model(comfy, env):
    from comfy import samplers as comfy_samplers

    schedule = comfy.pack_module("opensora.schedule")
    graph = base_graph(frames=34, fps=30.0)
    graph.update({
        "ms": {"class_type": "CHAI_OpenSoraModelSampling",
               "inputs": {"model": ["model", 0], "latent": ["latent", 0], "height": 8, "width": 8, "num_frames": 1,
                          "fps": 24.0, "bf16_shift": True}},
        "ks": {"class_type": "KSampler",
               "inputs": {"model": ["ms", 0], "seed": 1234, "steps": 4, "cfg": 3.0, "sampler_name": "euler",
                          "scheduler": "simple", "positive": ["text", 0], "negative": ["text", 1],
                          "latent_image": ["latent", 0], "denoise": 1.0}},
        "cap": capture("ms", latent=["latent", 0], conditioning=["text", 0], negative=["text", 1], model=["ms", 0]),
        "out": capture("ms-out", latent=["ks", 0]),
    })
    run_ok(comfy, graph)
    patched = CAPTURED["ms"]["model"]
    sampling = patched.get_model_object("model_sampling")
    assert sampling.shift == pytest.approx(schedule.opensora_shift(144, 256, 34))
    assert sampling.shift != pytest.approx(2.421875)
    noise, pos, neg, latent = _noise_and_conds(comfy, "ms")
    assert latent["opensora"]["fps"] == 30.0
    sigmas = comfy_samplers.calculate_sigmas(sampling, "simple", 4)
    out = CAPTURED["ms-out"]["latent"]["samples"]
    ref30 = _reference(comfy, env, noise, pos, neg, sigmas, 3.0, 144, 256, 30.0)
    ref24 = _reference(comfy, env, noise, pos, neg, sigmas, 3.0, 144, 256, 24.0)
    torch.testing.assert_close(out, ref30, atol=1e-4, rtol=1e-4)
    assert (out - ref24).abs().max() > 1e-3  # fps really reached the model


def test_attention_patch_key_and_wrappers_reach_the_forward(comfy, env):
    from comfy import patcher_extension
    from comfy import sample as comfy_sample
    from comfy import samplers as comfy_samplers

    run_ok(comfy, {"model": loader(), "cap": capture("patch", model=["model", 0])})
    base = CAPTURED["patch"]["model"]
    adapter = comfy.pack_module("opensora.comfy_adapter")
    latent = torch.zeros(1, 4, 2, 8, 12)
    noise = comfy_sample.prepare_noise(latent, 7)
    cond = [[torch.randn(1, 6, CAPTION_CHANNELS, generator=torch.Generator().manual_seed(3)), {}]]
    neg = [[comfy.pack_module("opensora.comfy_model").null_caption(base, 6), {}]]
    sigmas = comfy.pack_module("opensora.schedule").opensora_sigmas(3, 64, 96, 5)
    euler = comfy_samplers.sampler_object("euler")

    def run(model):
        return comfy_sample.sample_custom(model, noise, 5.0, euler, sigmas, cond, neg, latent, disable_pbar=True,
                                          seed=7)

    plain = run(base)
    calls, wrapped = [], []

    def identity(call):
        calls.append((call.kind, call.index, call.q.shape, call.info["transformer_options"].get("cond_or_uncond")))
        assert "sigmas" in call.info["transformer_options"]
        return call.block.attn.attend(call.q, call.k, call.v)

    m = base.clone()
    m.set_model_patch_replace(identity, adapter.PATCH_GROUP, "spatial_attn", 0)
    assert ("spatial_attn", 0) in m.model_options["transformer_options"]["patches_replace"]["dit"]

    def wrapper(executor, *args, **kwargs):
        wrapped.append(args[-1] is not None and isinstance(args[-1], dict))
        return executor(*args, **kwargs)

    m.add_wrapper_with_key(patcher_extension.WrappersMP.DIFFUSION_MODEL, "chai-test", wrapper)
    torch.testing.assert_close(run(m), plain, atol=1e-5, rtol=1e-5)
    assert len(calls) == 3 and all(c[:2] == ("spatial", 0) for c in calls)  # once per step, block 0 only
    assert all(sorted(c[3]) == [0, 1] for c in calls)  # cond and uncond batched
    assert wrapped == [True, True, True]

    zeroing = base.clone()
    zeroing.set_model_patch_replace(lambda call: torch.zeros_like(call.block.attn.attend(call.q, call.k, call.v)),
                                    "dit", "temporal_attn", 1)
    assert (run(zeroing) - plain).abs().max() > 1e-4
    # An object patch of block 0's spatial attention (the other public route) is applied on load and undone.
    attn = base.get_model_object("diffusion_model").spatial_blocks[0].attn
    original, hits = attn.forward, []

    def attn_forward(x, rope=None):
        hits.append(tuple(x.shape))
        return original(x, rope)

    objected = base.clone()
    objected.add_object_patch("diffusion_model.spatial_blocks.0.attn.forward", attn_forward)
    torch.testing.assert_close(run(objected), plain, atol=1e-6, rtol=1e-6)
    assert hits == [(4, 24, 32)] * 3  # (batch 2 x 2 frames, 4x6 patches, hidden 32) once per step
    # The patched clones never touched the shared model: a plain run afterwards is bit-identical.
    assert torch.equal(run(base), plain)
    # ComfyUI keeps a clone's object patches until another clone loads; then the original method is back.
    assert len(hits) == 3 and attn.forward == original


def test_ksampler_simple_schedule_vs_exact_schedule(comfy, env):
    from comfy import samplers as comfy_samplers

    schedule = comfy.pack_module("opensora.schedule")
    cm = comfy.pack_module("opensora.comfy_model")
    run_ok(comfy, {"model": loader(), "cap": capture("sched", model=["model", 0])})
    sampling = CAPTURED["sched"]["model"].get_model_object("model_sampling")
    for steps in (8, 10, 20, 25, 50):  # step counts dividing 1000: "simple" hits the exact grid
        simple = comfy_samplers.calculate_sigmas(sampling, "simple", steps)
        torch.testing.assert_close(simple, schedule.opensora_sigmas(steps, 240, 426, 51), atol=2e-6, rtol=0)
    simple30 = comfy_samplers.calculate_sigmas(sampling, "simple", 30)
    gap = (simple30 - schedule.opensora_sigmas(30, 240, 426, 51)).abs().max().item()
    assert 1e-4 < gap < 1.5e-3
    assert cm.flow_sampling(CAPTURED["sched"]["model"].model.model_config, 3.0).shift == 3.0


def test_weight_patches_apply_in_full_and_partial_loading(comfy, env):
    """A LoRA-style weight patch changes the output identically whether ComfyUI loads fully or casts per layer."""
    run_ok(comfy, {"model": loader(), "cap": capture("lowvram", model=["model", 0])})
    base = CAPTURED["lowvram"]["model"]
    cpu = torch.device("cpu")
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(2, 4, 3, 8, 8, generator=gen), torch.randn(2, 6, CAPTION_CHANNELS, generator=gen)
    sigma = torch.tensor([0.6, 0.6])
    key = "diffusion_model.spatial_blocks.0.attn.qkv.weight"
    weight = base.model.state_dict()[key]

    cast_patches = []

    def output(patcher, lowvram_bytes: int = 0) -> torch.Tensor:
        patcher.patch_model(device_to=cpu, lowvram_model_memory=lowvram_bytes, load_weights=True)
        try:
            cast_patches.append(patcher.model.lowvram_patch_counter)
            with torch.no_grad():
                return patcher.model.apply_model(x, sigma, c_crossattn=y, transformer_options={})
        finally:
            patcher.unpatch_model()

    plain = output(base.clone())
    full, partial = base.clone(), base.clone()
    for m in (full, partial):
        m.add_patches({key: ("diff", [torch.full_like(weight, 0.02)])}, 1.0)
    patched_full = output(full)
    patched_partial = output(partial, lowvram_bytes=1)  # nothing fits: every comfy.ops layer casts on the fly
    assert cast_patches == [0, 0, 1]  # only the partial load applied the patch through the cast path
    assert (patched_full - plain).abs().max() > 1e-5
    torch.testing.assert_close(patched_partial, patched_full)
    torch.testing.assert_close(output(base.clone()), plain)  # unpatching restored the shared weights
