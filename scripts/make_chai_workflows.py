"""Write the shipped CHAI workflows (UI format, workflows/), their API-format twins (tests/workflows/) and the
subgraph blueprints (subgraphs/).

    python scripts/make_chai_workflows.py          # rewrite all
    python scripts/make_chai_workflows.py --check  # exit 1 when a file on disk differs from what this writes

The graphs are described here once; the UI files are what ComfyUI's template browser lists, the API twins are
what the tests validate and run. Node sockets and widget order come from tests/workflows/node_specs.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

import ui_graph  # noqa: E402
from workflow_api import ui_to_api  # noqa: E402

from comfyui_chai.chai_attention.config import ChaiConfig  # noqa: E402
from comfyui_chai.chai_attention.constants import WAN22_BOUNDARY  # noqa: E402
from comfyui_chai.toyworld.model import DEFAULT_CFG as TOY_CFG  # noqa: E402

PACK_CACHE_STEPS = ",".join(map(str, ChaiConfig().cache_steps))  # the CHAI Sampler / CHAI Apply default
SPECS = ui_graph.SPECS
OPENSORA_PROMPT = "a golden retriever running along a sunny beach at sunset, waves in the background"
TOY_PROMPT = "a red ball bouncing across a sunny beach"
TOY_NOTE_TEMPLATE = """## CHAI on the toy world (runs on any CPU in seconds)

The pack ships a small trained STDiT3 (**toyworld_stdit3.safetensors**, listed by the OpenSora loader; no
download) for a procedural world of 8-frame 16x16 clips: scenes (beach, forest, snowy field, night sky, city
street, desert), objects (ball, car, kite, bird, box), colours (red, blue, green, yellow, purple) and motions
(left, right, up, down, bouncing, still).

1. Queue the prompt as it is: a **miss** (30 steps, its latents stored in the cache "toyworld").
2. Change it to a prompt that shares an entity, e.g. *a blue kite drifting left across a sandy beach*, and queue
   again: a **hit** (8 steps; at steps 5 and 6 the first block attends to the beach video's keys and values).

The lookup, sampler and write nodes report what happened; the video (128x128, 8 frames played at 8 fps: one
second) is saved under output/video/, and a looping animated WEBP preview under output/. Text is encoded by the toy's own word hashing (no CLIP); cfg TOY_CFG_TEXT is what the model was
evaluated at. Scheduler 'opensora' is the model's exact trained schedule (uniform, with the flow shift stored
in the file); 'simple' gives the same sigmas within 0.001."""
TOY_NOTE = TOY_NOTE_TEMPLATE.replace("TOY_CFG_TEXT", f"{TOY_CFG:g}")
WAN_PROMPT = "a red fox walking through fresh snow in a quiet pine forest, soft morning light"
WAN_NEGATIVE = ("blurry, low quality, worst quality, static, still picture, distorted, deformed, watermark, "
                "subtitles, text, extra limbs, messy background")
HUNYUAN_PROMPT = "a golden retriever running along a sunny beach at sunset, waves rolling in behind it"
LTXV_PROMPT = ("A red fox walks slowly through fresh snow in a quiet pine forest. Its thick orange fur stands out "
               "against the white ground, and its breath forms small clouds in the cold air. Soft morning light "
               "falls between the tall trees and long blue shadows stretch across the snow. The camera follows "
               "the fox at ground level. The scene appears to be real-life footage.")
LTXV_NEGATIVE = ("low quality, worst quality, deformed, distorted, disfigured, motion smear, motion artifacts, "
                 "fused fingers, bad anatomy, weird hand, ugly")
WARMUP_PROMPTS = "\n".join([
    "# One prompt per line; lines starting with # are skipped.",
    "a golden retriever running along a sunny beach at sunset",
    "a red fox walking through fresh snow in a pine forest",
    "an old lighthouse on a rocky coast during a storm",
    "a cup of coffee on a wooden table next to a window",
    "a sailboat drifting on a calm lake at dawn",
    "a city street at night with neon signs and rain",
])


# Model files the OpenSora and Wan workflows load: official file names (what the loaders' widgets select), the
# models/ folder each goes in, and a public download URL. The frontend reads them from each loader node's
# properties.models and offers the download when a file is missing.
HF = "https://huggingface.co"
WAN_REPACK = f"{HF}/Comfy-Org/Wan_2.1_ComfyUI_repackaged/resolve/main/split_files"
WAN22_REPACK = f"{HF}/Comfy-Org/Wan_2.2_ComfyUI_Repackaged/resolve/main/split_files"
HUNYUAN_REPACK = f"{HF}/Comfy-Org/HunyuanVideo_repackaged/resolve/main/split_files"
MODEL_FILES = {
    "opensora_stdit3": {"name": "OpenSora-STDiT-v3.safetensors", "directory": "diffusion_models",
                        "url": f"{HF}/hpcai-tech/OpenSora-STDiT-v3/resolve/main/model.safetensors"},
    "t5xxl": {"name": "t5xxl_fp16.safetensors", "directory": "text_encoders",
              "url": f"{HF}/comfyanonymous/flux_text_encoders/resolve/main/t5xxl_fp16.safetensors"},
    "opensora_vae": {"name": "OpenSora-VAE-v1.2.safetensors", "directory": "vae",
                     "url": f"{HF}/hpcai-tech/OpenSora-VAE-v1.2/resolve/main/model.safetensors"},
    "wan21_t2v_1_3b": {"name": "wan2.1_t2v_1.3B_fp16.safetensors", "directory": "diffusion_models",
                       "url": f"{WAN_REPACK}/diffusion_models/wan2.1_t2v_1.3B_fp16.safetensors"},
    "umt5_xxl": {"name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "directory": "text_encoders",
                 "url": f"{WAN_REPACK}/text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors"},
    "wan21_vae": {"name": "wan_2.1_vae.safetensors", "directory": "vae",
                  "url": f"{WAN_REPACK}/vae/wan_2.1_vae.safetensors"},
    "wan22_t2v_high": {"name": "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors", "directory": "diffusion_models",
                       "url": f"{WAN22_REPACK}/diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors"},
    "wan22_t2v_low": {"name": "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors", "directory": "diffusion_models",
                      "url": f"{WAN22_REPACK}/diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors"},
    "wan22_lightx2v_high": {"name": "wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors", "directory": "loras",
                            "url": f"{WAN22_REPACK}/loras/wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors"},
    "wan22_lightx2v_low": {"name": "wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors", "directory": "loras",
                           "url": f"{WAN22_REPACK}/loras/wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors"},
    "wan22_ti2v_5b": {"name": "wan2.2_ti2v_5B_fp16.safetensors", "directory": "diffusion_models",
                      "url": f"{WAN22_REPACK}/diffusion_models/wan2.2_ti2v_5B_fp16.safetensors"},
    "wan22_vae": {"name": "wan2.2_vae.safetensors", "directory": "vae",
                  "url": f"{WAN22_REPACK}/vae/wan2.2_vae.safetensors"},
    "hunyuan_video_t2v": {"name": "hunyuan_video_t2v_720p_bf16.safetensors", "directory": "diffusion_models",
                          "url": f"{HUNYUAN_REPACK}/diffusion_models/hunyuan_video_t2v_720p_bf16.safetensors"},
    "clip_l": {"name": "clip_l.safetensors", "directory": "text_encoders",
               "url": f"{HF}/comfyanonymous/flux_text_encoders/resolve/main/clip_l.safetensors"},
    "llava_llama3": {"name": "llava_llama3_fp8_scaled.safetensors", "directory": "text_encoders",
                     "url": f"{HUNYUAN_REPACK}/text_encoders/llava_llama3_fp8_scaled.safetensors"},
    "hunyuan_video_vae": {"name": "hunyuan_video_vae_bf16.safetensors", "directory": "vae",
                          "url": f"{HUNYUAN_REPACK}/vae/hunyuan_video_vae_bf16.safetensors"},
    "ltxv_2b": {"name": "ltx-video-2b-v0.9.safetensors", "directory": "checkpoints",
                "url": f"{HF}/Lightricks/LTX-Video/resolve/main/ltx-video-2b-v0.9.safetensors"},
}


def files_note(*keys: str) -> str:
    """Markdown list of where each model file goes, with its download link."""
    lines = ["**Model files** (the frontend offers to download a missing one; or fetch it yourself):", ""]
    for key in keys:
        f = MODEL_FILES[key]
        lines.append(f"- `{f['name']}` in `models/{f['directory']}/`: [{f['url'].split('/resolve/')[0]}]({f['url']})")
    return "\n".join(lines)


class UIGraph(ui_graph.UIGraph):
    """ui_graph.UIGraph with model files named by their MODEL_FILES key."""

    def node(self, kind: str, pos: tuple[int, int], widgets: list[Any], *, title: str | None = None,
             size: tuple[int, int] = (320, 130), models: tuple[Any, ...] = ()) -> int:
        return super().node(kind, pos, widgets, title=title, size=size,
                            models=tuple(MODEL_FILES[m] if isinstance(m, str) else m for m in models))


# The CHAI nodes sit in three columns from x: cache and entities, lookup and sampler, write and stats. Each node
# is tall enough for its widgets plus the status line and the report box the pack's web extension adds after a
# run, and the columns leave room for them, so reports never hide under another node.
CHAI_COLUMNS = (0, 360, 780)
OUT_X, SAVE_X = 1640, 2000  # decode and video columns of the t2v workflows (chai_nodes at x=440)


def chai_nodes(g: UIGraph, model: int, latent: int, positive: tuple[int, int], negative: tuple[int, int],
               prompt: int, *, cache_name: str, cfg: float, sampler: str, scheduler: str, x: int,
               with_lookup: bool = True, entity_text: tuple[int, int] | None = None,
               steps: tuple[int, int] = (30, 8), cache_steps: str = PACK_CACHE_STEPS, restart_sigma: float = 0.8,
               model_2: int | None = None) -> int:
    """Cache, entity extract (from `entity_text`, default the prompt), (lookup,) CHAI sampler and write; returns the
    sampler's node id. `model_2`: a second expert (Wan 2.2 A14B's low-noise model) for the lookup and sampler."""
    a, b, c = (x + dx for dx in CHAI_COLUMNS)
    cache = g.node("CHAI_CacheOpen", (a, 40), [cache_name, 2.0, "lru", "minilm"], size=(320, 300))
    ents = g.node("CHAI_EntityExtract", (a, 380), [""], size=(320, 240))
    g.link(*(entity_text or (prompt, 0)), ents, "prompt")
    sampler_id = g.node("CHAI_Sampler", (b, 460 if with_lookup else 40),
                        [42, "randomize", cfg, sampler, scheduler, *steps, cache_steps, "replace", "cond",
                         WAN22_BOUNDARY, "restart", restart_sigma],
                        size=(380, 700))
    for name, (src, slot) in (("model", (model, 0)), ("positive", positive), ("negative", negative),
                              ("latent", (latent, 0))):
        g.link(src, slot, sampler_id, name)
    if model_2 is not None:
        g.link(model_2, 0, sampler_id, "model_2")
    if with_lookup:
        lookup = g.node("CHAI_CacheLookup", (b, 40), [0.0], size=(380, 380))
        g.link(cache, 0, lookup, "cache")
        g.link(ents, 0, lookup, "entities")
        g.link(model, 0, lookup, "model")
        g.link(latent, 0, lookup, "latent")
        g.link(lookup, 0, sampler_id, "hit")
        if model_2 is not None:
            g.link(model_2, 0, lookup, "model_2")
    write = g.node("CHAI_CacheWrite", (c, 40), [], size=(380, 300))
    g.link(cache, 0, write, "cache")
    g.link(ents, 0, write, "entities")
    g.link(sampler_id, 1, write, "trace")
    # Stats take the write's report as input, so ComfyUI runs them after the write (and once after a prompt list).
    stats = g.node("CHAI_CacheStats", (c, 380), ["show"], size=(380, 400))
    g.link(cache, 0, stats, "cache")
    g.link(write, 0, stats, "after")
    return sampler_id


def save_video(g: UIGraph, decode: int, video_y: int, fps: float, prefix: str,
               save_size: tuple[int, int] = (480, 520), fps_from_decode: bool = True) -> None:
    """Decoded frames -> CreateVideo -> SaveVideo (output/video/<prefix>), the tail every t2v workflow shares."""
    video = g.node("CreateVideo", (OUT_X, video_y), [fps], size=(300, 100))
    g.link(decode, 0, video, "images")
    if fps_from_decode:
        g.link(decode, 1, video, "fps")
    save = g.node("SaveVideo", (SAVE_X, 40), [f"video/{prefix}", "auto", "auto"], size=save_size)
    g.link(video, 0, save, "video")


def decode_and_save(g: UIGraph, samples: int, vae: int, pos: tuple[int, int], video_y: int, fps: float, prefix: str,
                    vae_slot: int = 0) -> None:
    """VAEDecode of a sampler's LATENT with ComfyUI's own VAE node (`vae`'s output `vae_slot`), then `save_video`."""
    decode = g.node("VAEDecode", pos, [], size=(220, 60))
    g.link(samples, 0, decode, "samples")
    g.link(vae, vae_slot, decode, "vae")
    save_video(g, decode, video_y, fps, prefix, fps_from_decode=False)


def opensora_t2v() -> UIGraph:
    """OpenSora 1.2 + CHAI, decoded to a saved video."""
    g = UIGraph("chai_opensora_t2v")
    g.note((-420, 40), "## CHAI on OpenSora 1.2\n\nQueue prompts as usual. The first prompts **miss**: they run 30 "
                       "steps and fill the cache. Later prompts that share an entity (an object or a scene) **hit** "
                       "and run 8 steps with Cache Attention, about 3.5x faster. The lookup, sampler and write "
                       "nodes report what happened.\n\n" + files_note("opensora_stdit3", "t5xxl", "opensora_vae"),
           size=(420, 420))
    prompt = g.node("PrimitiveStringMultiline", (0, 40), [OPENSORA_PROMPT], title="Prompt", size=(380, 160))
    model = g.node("CHAI_OpenSoraModelLoader", (0, 240), ["OpenSora-STDiT-v3.safetensors", "default"],
                   models=("opensora_stdit3",))
    clip = g.node("CLIPLoader", (0, 400), ["t5xxl_fp16.safetensors", "pixart", "default"], models=("t5xxl",))
    text = g.node("CHAI_OpenSoraTextEncode", (0, 560), ["", True, 6.5, True], size=(380, 300))
    g.link(clip, 0, text, "clip")
    g.link(model, 0, text, "model")
    g.link(prompt, 0, text, "prompt")
    latent = g.node("CHAI_OpenSoraEmptyLatent", (0, 900),
                    ["240p", "9:16 (240x426 HxW at 240p, landscape)", "2s (51 frames)", 240, 426, 51, 24.0, 1],
                    size=(380, 340))
    sampler = chai_nodes(g, model, latent, (text, 0), (text, 1), prompt, cache_name="opensora", cfg=7.0,
                         sampler="euler", scheduler="opensora", x=440)
    vae = g.node("CHAI_OpenSoraVAELoader", (OUT_X, 40), ["OpenSora-VAE-v1.2.safetensors", "auto"],
                 models=("opensora_vae",))
    decode = g.node("CHAI_OpenSoraVAEDecode", (OUT_X, 210), [0, 24.0, 0, 64], size=(320, 260))
    g.link(sampler, 0, decode, "samples")
    g.link(vae, 0, decode, "vae")
    save_video(g, decode, 510, 24.0, "CHAI_opensora")
    return g


def toy_t2v() -> UIGraph:
    """The shipped toy-world model + CHAI, decoded and saved as a video: the CPU-only example."""
    g = UIGraph("chai_toy_t2v")
    g.note((-460, 40), TOY_NOTE, size=(440, 520))
    prompt = g.node("PrimitiveStringMultiline", (0, 40), [TOY_PROMPT], title="Prompt", size=(380, 160))
    model = g.node("CHAI_OpenSoraModelLoader", (0, 240), ["toyworld_stdit3.safetensors", "default"])
    text = g.node("CHAI_ToyTextEncode", (0, 400), [""], size=(380, 200))
    g.link(model, 0, text, "model")
    g.link(prompt, 0, text, "prompt")
    latent = g.node("CHAI_ToyEmptyLatent", (0, 690), [1], size=(320, 80))
    sampler = chai_nodes(g, model, latent, (text, 0), (text, 1), prompt, cache_name="toyworld", cfg=TOY_CFG,
                         sampler="euler", scheduler="opensora", x=440, entity_text=(text, 2))
    decode = g.node("CHAI_ToyDecode", (OUT_X, 40), [8], size=(300, 100))
    g.link(sampler, 0, decode, "samples")
    save_video(g, decode, 200, 8.0, "CHAI_toy", save_size=(400, 460))
    # An animated WEBP loops forever in the node's preview: the one-second clip can be watched as it plays.
    webp = g.node("SaveAnimatedWEBP", (SAVE_X, 620), ["CHAI_toy_loop", 8.0, True, 80, "default"], size=(400, 560),
                  title="Looping preview")
    g.link(decode, 0, webp, "images")
    g.link(decode, 1, webp, "fps")
    return g


def wan21_t2v() -> UIGraph:
    """Wan 2.1 T2V 1.3B + CHAI with ComfyUI's native loaders, as in ComfyUI's own Wan template."""
    g = UIGraph("chai_wan21_t2v")
    g.note((-420, 40), "## CHAI on Wan 2.1 T2V 1.3B\n\nComfyUI's native Wan nodes plus CHAI: misses run 30 steps "
                       "and fill the cache, hits on a shared entity run 8 steps with Cache Attention in block 0's "
                       "self-attention.\n\n" + files_note("wan21_t2v_1_3b", "umt5_xxl", "wan21_vae"),
           size=(420, 420))
    prompt = g.node("PrimitiveStringMultiline", (0, 40), [WAN_PROMPT], title="Prompt", size=(380, 160))
    unet = g.node("UNETLoader", (0, 240), ["wan2.1_t2v_1.3B_fp16.safetensors", "default"],
                  models=("wan21_t2v_1_3b",))
    model = g.node("ModelSamplingSD3", (0, 400), [8.0], size=(300, 80))
    g.link(unet, 0, model, "model")
    clip = g.node("CLIPLoader", (0, 520), ["umt5_xxl_fp8_e4m3fn_scaled.safetensors", "wan", "default"],
                  models=("umt5_xxl",))
    positive = g.node("CLIPTextEncode", (0, 680), [""], title="Positive", size=(380, 120))
    g.link(clip, 0, positive, "clip")
    g.link(prompt, 0, positive, "text")
    negative = g.node("CLIPTextEncode", (0, 840), [WAN_NEGATIVE], title="Negative", size=(380, 160))
    g.link(clip, 0, negative, "clip")
    latent = g.node("EmptyHunyuanLatentVideo", (0, 1040), [832, 480, 33, 1], size=(320, 160))
    sampler = chai_nodes(g, model, latent, (positive, 0), (negative, 0), prompt, cache_name="wan21", cfg=6.0,
                         sampler="uni_pc", scheduler="simple", x=440)
    vae = g.node("VAELoader", (OUT_X, 40), ["wan_2.1_vae.safetensors"], size=(320, 80), models=("wan21_vae",))
    decode_and_save(g, sampler, vae, (OUT_X, 160), 260, 16.0, "CHAI_wan21")
    return g


def wan_text(g: UIGraph, prompt: int, y: int) -> tuple[int, int]:
    """umT5 text encoder, positive (the shared prompt) and negative CLIPTextEncode nodes."""
    clip = g.node("CLIPLoader", (0, y), ["umt5_xxl_fp8_e4m3fn_scaled.safetensors", "wan", "default"],
                  models=("umt5_xxl",))
    positive = g.node("CLIPTextEncode", (0, y + 160), [""], title="Positive", size=(380, 120))
    g.link(clip, 0, positive, "clip")
    g.link(prompt, 0, positive, "text")
    negative = g.node("CLIPTextEncode", (0, y + 320), [WAN_NEGATIVE], title="Negative", size=(380, 160))
    g.link(clip, 0, negative, "clip")
    return positive, negative


def apply_nodes(g: UIGraph, model: int, latent: int, prompt: int, *, cache_name: str, sampler: str, x: int,
                model_2: int | None = None, positive: int | None = None,
                cache_steps: str = PACK_CACHE_STEPS, steps: tuple[int, int] = (30, 8)) -> tuple[int, int, int, int]:
    """Cache, entity extract, lookup and CHAI Apply; returns (apply, cache, entities, lookup) node ids."""
    cache = g.node("CHAI_CacheOpen", (x, 40), [cache_name, 2.0, "lru", "minilm"], size=(300, 140))
    ents = g.node("CHAI_EntityExtract", (x, 220), [""], size=(300, 120))
    g.link(prompt, 0, ents, "prompt")
    lookup = g.node("CHAI_CacheLookup", (x, 380), [0.0], size=(300, 200))
    for name, src in (("cache", cache), ("entities", ents), ("model", model), ("latent", latent)):
        g.link(src, 0, lookup, name)
    apply = g.node("CHAI_Apply", (x + 340, 40),
                   [sampler, "simple", *steps, cache_steps, "replace", "cond", WAN22_BOUNDARY, "restart", 0.8],
                   size=(340, 460))
    g.link(model, 0, apply, "model")
    g.link(latent, 0, apply, "latent")
    g.link(lookup, 0, apply, "hit")
    for name, src in (("model_2", model_2), ("positive", positive)):
        if src is not None:
            g.link(src, 0, lookup, name)
            g.link(src, 0, apply, name)
    return apply, cache, ents, lookup


def trace_and_write(g: UIGraph, apply: int, samples: int, cache: int, ents: int, x: int) -> None:
    """CHAI Apply Trace after the (last) sampler, then Cache Write and Stats."""
    trace = g.node("CHAI_ApplyTrace", (x, 40), [], size=(300, 100))
    g.link(apply, 4, trace, "chai")
    g.link(samples, 0, trace, "samples")
    write = g.node("CHAI_CacheWrite", (x, 180), [], size=(300, 160))
    g.link(cache, 0, write, "cache")
    g.link(ents, 0, write, "entities")
    g.link(trace, 0, write, "trace")
    stats = g.node("CHAI_CacheStats", (x, 380), ["show"], size=(300, 220))
    g.link(cache, 0, stats, "cache")
    g.link(write, 0, stats, "after")


WAN22_NOTE = ("## CHAI on Wan 2.2 T2V A14B (two experts)\n\nComfyUI's two-sampler Wan 2.2 graph with CHAI "
              "Apply on the high-noise expert: it gives both KSamplerAdvanced their step count (30 on a "
              "miss) and the switch step (where sigma falls below 0.875). A hit that shares the donor's "
              "scene restarts at sigma 0.8, below the switch: the first sampler takes no step and hands the "
              "donor's latent, noised with its seed, to the second, which samples the last 8 steps. A hit "
              "that shares only the main subject runs Cache Attention at steps 2, 3, 4 of 8 (the paper's "
              "setting; the pack's default 5,6 would fall on the low-noise expert, which CHAI Apply does not "
              "patch). The low-noise expert goes to the lookup and CHAI Apply as model_2: a cache entry "
              "serves this pair only.\n\n")
WAN22_4STEP_NOTE = ("## CHAI on Wan 2.2 A14B with the 4-step LoRAs\n\nComfyUI's own Wan 2.2 template with the "
                    "lightx2v 4-step LoRAs on both experts: 4 steps at cfg 1 (4 model passes), shift 5, the "
                    "high-noise expert above sigma 0.875. CHAI Sampler runs both experts (model_2). On a few-step "
                    "model only one reuse kept quality in the pack's lab: **the same prompt again with another "
                    "seed** (a re-roll) restarts from its cached run after the first step and samples the last 3 "
                    "with DPM-Solver++(2M) resuming that run's solver, 3 passes instead of 4; on the lab's "
                    "distilled model that was better than its own 4 Euler steps, with the seed mattering as much. "
                    "restart_sigma 0.8 skips two steps (2 passes): still better than the 4 Euler steps there, "
                    "but the seed matters less. Any other prompt is a miss whose report says why "
                    "(docs/quality-lab.md).\n\n")


def a14b_experts(g: UIGraph, shift: float, loras: tuple[str, ...] = ()) -> tuple[int, int]:
    """Wan 2.2 A14B's two experts (high-noise, low-noise), each UNETLoader (-> its LoRA) -> ModelSamplingSD3."""
    out = []
    for i, key in enumerate(("wan22_t2v_high", "wan22_t2v_low")):
        source = g.node("UNETLoader", (0, 240 + 280 * i), [MODEL_FILES[key]["name"], "default"], models=(key,),
                        title=("High-noise expert", "Low-noise expert")[i])
        if loras:
            lora = g.node("LoraLoaderModelOnly", (-360, 240 + 280 * i), [MODEL_FILES[loras[i]]["name"], 1.0],
                          size=(340, 110), models=(loras[i],), title=("4-step LoRA, high", "4-step LoRA, low")[i])
            g.link(source, 0, lora, "model")
            source = lora
        sampling = g.node("ModelSamplingSD3", (0, 400 + 280 * i), [shift], size=(300, 80))
        g.link(source, 0, sampling, "model")
        out.append(sampling)
    return out[0], out[1]


def wan22_a14b_4step() -> UIGraph:
    """Wan 2.2 T2V A14B with the 4-step lightx2v LoRAs at cfg 1, as ComfyUI's own template, on CHAI Sampler with
    both experts: a re-rolled prompt restarts after the first step (restart_sigma 0.9: the schedule's 0.9375)."""
    g = UIGraph("chai_wan22_a14b_4step")
    loras = ("wan22_lightx2v_high", "wan22_lightx2v_low")
    g.note((-840, 40), WAN22_4STEP_NOTE + files_note("wan22_t2v_high", "wan22_t2v_low", *loras, "umt5_xxl",
                                                     "wan21_vae"), size=(420, 600))
    prompt = g.node("PrimitiveStringMultiline", (0, 40), [WAN_PROMPT], title="Prompt", size=(380, 160))
    high, low = a14b_experts(g, 5.0, loras)
    positive, negative = wan_text(g, prompt, 800)
    latent = g.node("EmptyHunyuanLatentVideo", (0, 1320), [832, 480, 81, 1], size=(320, 160))
    sampler = chai_nodes(g, high, latent, (positive, 0), (negative, 0), prompt, cache_name="wan22_a14b_4step",
                         cfg=1.0, sampler="euler", scheduler="simple", x=440, steps=(4, 3), cache_steps="",
                         restart_sigma=0.9, model_2=low)
    vae = g.node("VAELoader", (OUT_X, 40), ["wan_2.1_vae.safetensors"], size=(320, 80), models=("wan21_vae",))
    decode_and_save(g, sampler, vae, (OUT_X, 160), 880, 16.0, "CHAI_wan22_a14b_4step")
    return g


def wan22_a14b_t2v() -> UIGraph:
    """Wan 2.2 T2V A14B: the standard two-KSamplerAdvanced graph (high-noise then low-noise expert) with CHAI Apply."""
    g = UIGraph("chai_wan22_a14b_t2v")
    g.note((-420, 40), WAN22_NOTE + files_note("wan22_t2v_high", "wan22_t2v_low", "umt5_xxl", "wan21_vae"),
           size=(420, 520))
    prompt = g.node("PrimitiveStringMultiline", (0, 40), [WAN_PROMPT], title="Prompt", size=(380, 160))
    high, low = a14b_experts(g, 8.0)
    positive, negative = wan_text(g, prompt, 800)
    latent = g.node("EmptyHunyuanLatentVideo", (0, 1320), [832, 480, 81, 1], size=(320, 160))
    apply, cache, ents, _ = apply_nodes(g, high, latent, prompt, cache_name="wan22_a14b", sampler="euler", x=440,
                                        cache_steps="2,3,4", model_2=low)
    samplers = []
    for i, (model, noise, leftover) in enumerate(((apply, "enable", "enable"), (low, "disable", "disable"))):
        ks = g.node("KSamplerAdvanced", (1120, 40 + 560 * i),
                    [noise, 42, "randomize", 30, 3.5, "euler", "simple", 0, 10000, leftover], size=(340, 520),
                    title=("High-noise steps", "Low-noise steps")[i])
        g.link(model, 0, ks, "model")
        g.link(positive, 0, ks, "positive")
        g.link(negative, 0, ks, "negative")
        g.link(apply, 2, ks, "steps")
        g.link(apply, 3, ks, "end_at_step" if i == 0 else "start_at_step")
        g.link(latent if i == 0 else samplers[0], 0, ks, "latent_image")
        samplers.append(ks)
    trace_and_write(g, apply, samplers[1], cache, ents, 1500)
    vae = g.node("VAELoader", (1500, 640), ["wan_2.1_vae.safetensors"], size=(320, 80), models=("wan21_vae",))
    decode_and_save(g, samplers[1], vae, (1500, 760), 880, 16.0, "CHAI_wan22_a14b")
    return g


def wan22_5b_i2v() -> UIGraph:
    """Wan 2.2 TI2V 5B image to video: CHAI Apply with SamplerCustomAdvanced and CFGGuider."""
    g = UIGraph("chai_wan22_5b_i2v")
    g.note((-420, 40), "## CHAI on Wan 2.2 TI2V 5B, image to video\n\nA start image (LoadImage) animated with "
                       "many prompts: a request hits only cache entries made from **the same image** (and sharing "
                       "an entity), since Cache Attention pulls the early structure of the donor's video into the "
                       "new one. CHAI Apply feeds SamplerCustomAdvanced its MODEL and SIGMAS (30 steps on a miss, "
                       "8 on a hit).\n\n" + files_note("wan22_ti2v_5b", "umt5_xxl", "wan22_vae"),
           size=(420, 480))
    prompt = g.node("PrimitiveStringMultiline", (0, 40), [WAN_PROMPT], title="Prompt", size=(380, 160))
    unet = g.node("UNETLoader", (0, 240), [MODEL_FILES["wan22_ti2v_5b"]["name"], "default"],
                  models=("wan22_ti2v_5b",))
    model = g.node("ModelSamplingSD3", (0, 400), [8.0], size=(300, 80))
    g.link(unet, 0, model, "model")
    positive, negative = wan_text(g, prompt, 520)
    image = g.node("LoadImage", (0, 1040), ["example.png"], title="Start image", size=(320, 320))
    vae = g.node("VAELoader", (0, 1400), ["wan2.2_vae.safetensors"], size=(320, 80), models=("wan22_vae",))
    latent = g.node("Wan22ImageToVideoLatent", (0, 1520), [1280, 704, 49, 1], size=(320, 160))
    g.link(vae, 0, latent, "vae")
    g.link(image, 0, latent, "start_image")
    apply, cache, ents, _ = apply_nodes(g, model, latent, prompt, cache_name="wan22_5b_i2v", sampler="uni_pc",
                                        x=440, positive=positive)
    noise = g.node("RandomNoise", (1120, 40), [42, "randomize"], size=(300, 100))
    guider = g.node("CFGGuider", (1120, 180), [5.0], size=(300, 140))
    g.link(apply, 0, guider, "model")
    g.link(positive, 0, guider, "positive")
    g.link(negative, 0, guider, "negative")
    select = g.node("KSamplerSelect", (1120, 360), ["uni_pc"], size=(300, 80))
    custom = g.node("SamplerCustomAdvanced", (1120, 480), [], size=(300, 200))
    for name, src in (("noise", noise), ("guider", guider), ("sampler", select), ("latent_image", latent)):
        g.link(src, 0, custom, name)
    g.link(apply, 1, custom, "sigmas")
    trace_and_write(g, apply, custom, cache, ents, 1500)
    decode_and_save(g, custom, vae, (1500, 640), 760, 24.0, "CHAI_wan22_5b_i2v")
    return g


def hunyuan_video_t2v() -> UIGraph:
    """HunyuanVideo T2V + CHAI with ComfyUI's native loaders, as in ComfyUI's own HunyuanVideo template."""
    g = UIGraph("chai_hunyuan_video_t2v")
    g.note((-420, 40), "## CHAI on HunyuanVideo T2V\n\nComfyUI's native HunyuanVideo nodes plus CHAI: misses run 30 "
                       "steps and fill the cache, hits on a shared entity run 8 steps with Cache Attention in the "
                       "first double block's joint attention (the image keys and values come from the donor, the "
                       "text ones stay the prompt's). HunyuanVideo is guidance-distilled: the guidance is "
                       "FluxGuidance's, the sampler's cfg stays 1.0 and the negative is not used.\n\n"
                       + files_note("hunyuan_video_t2v", "clip_l", "llava_llama3", "hunyuan_video_vae"),
           size=(420, 460))
    prompt = g.node("PrimitiveStringMultiline", (0, 40), [HUNYUAN_PROMPT], title="Prompt", size=(380, 160))
    unet = g.node("UNETLoader", (0, 240), ["hunyuan_video_t2v_720p_bf16.safetensors", "default"],
                  models=("hunyuan_video_t2v",))
    model = g.node("ModelSamplingSD3", (0, 400), [7.0], size=(300, 80))
    g.link(unet, 0, model, "model")
    clip = g.node("DualCLIPLoader", (0, 520), ["clip_l.safetensors", "llava_llama3_fp8_scaled.safetensors",
                                               "hunyuan_video", "default"], size=(380, 160),
                  models=("clip_l", "llava_llama3"))
    text = g.node("CLIPTextEncode", (0, 720), [""], title="Prompt encode", size=(380, 120))
    g.link(clip, 0, text, "clip")
    g.link(prompt, 0, text, "text")
    positive = g.node("FluxGuidance", (0, 880), [6.0], title="Positive (guidance 6)", size=(300, 80))
    g.link(text, 0, positive, "conditioning")
    negative = g.node("ConditioningZeroOut", (0, 1000), [], title="Negative (unused at cfg 1)", size=(300, 60))
    g.link(text, 0, negative, "conditioning")
    latent = g.node("EmptyHunyuanLatentVideo", (0, 1100), [848, 480, 73, 1], size=(320, 160))
    sampler = chai_nodes(g, model, latent, (positive, 0), (negative, 0), prompt, cache_name="hunyuan_video",
                         cfg=1.0, sampler="euler", scheduler="simple", x=440)
    vae = g.node("VAELoader", (OUT_X, 40), ["hunyuan_video_vae_bf16.safetensors"], size=(320, 80),
                 models=("hunyuan_video_vae",))
    decode = g.node("VAEDecodeTiled", (OUT_X, 160), [256, 64, 64, 8], size=(300, 160))
    g.link(sampler, 0, decode, "samples")
    g.link(vae, 0, decode, "vae")
    save_video(g, decode, 360, 24.0, "CHAI_hunyuan_video", fps_from_decode=False)
    return g


def ltxv_t2v() -> UIGraph:
    """LTX-Video 2B + CHAI with ComfyUI's native loaders, as in ComfyUI's own LTXV template."""
    g = UIGraph("chai_ltxv_t2v")
    g.note((-420, 40), "## CHAI on LTX-Video\n\nComfyUI's native LTXV nodes plus CHAI: misses run 30 steps and "
                       "fill the cache, hits on a shared entity run 8 steps with Cache Attention in the first "
                       "transformer block's self-attention. LTXV wants long, descriptive prompts. "
                       "ModelSamplingLTXV sets the size-dependent shift that LTXVScheduler uses, so the sampler's "
                       "'simple' scheduler gives LTXVScheduler's sigmas without its terminal stretch.\n\n"
                       + files_note("ltxv_2b", "t5xxl"), size=(420, 460))
    prompt = g.node("PrimitiveStringMultiline", (0, 40), [LTXV_PROMPT], title="Prompt", size=(380, 200))
    ckpt = g.node("CheckpointLoaderSimple", (0, 280), ["ltx-video-2b-v0.9.safetensors"], size=(380, 100),
                  models=("ltxv_2b",))
    clip = g.node("CLIPLoader", (0, 420), ["t5xxl_fp16.safetensors", "ltxv", "default"], models=("t5xxl",))
    positive = g.node("CLIPTextEncode", (0, 580), [""], title="Positive", size=(380, 120))
    g.link(clip, 0, positive, "clip")
    g.link(prompt, 0, positive, "text")
    negative = g.node("CLIPTextEncode", (0, 740), [LTXV_NEGATIVE], title="Negative", size=(380, 160))
    g.link(clip, 0, negative, "clip")
    conditioning = g.node("LTXVConditioning", (0, 940), [25.0], size=(300, 100))
    g.link(positive, 0, conditioning, "positive")
    g.link(negative, 0, conditioning, "negative")
    latent = g.node("EmptyLTXVLatentVideo", (0, 1080), [768, 512, 97, 1], size=(320, 160))
    model = g.node("ModelSamplingLTXV", (0, 1280), [2.05, 0.95], size=(300, 110))
    g.link(ckpt, 0, model, "model")
    g.link(latent, 0, model, "latent")
    sampler = chai_nodes(g, model, latent, (conditioning, 0), (conditioning, 1), prompt, cache_name="ltxv",
                         cfg=3.0, sampler="euler", scheduler="simple", x=440)
    decode_and_save(g, sampler, ckpt, (OUT_X, 40), 140, 24.0, "CHAI_ltxv", vae_slot=2)
    return g


def opensora_warmup() -> UIGraph:
    """A batch of prompts through the miss path (full schedule, capture, write) to fill an OpenSora cache."""
    g = UIGraph("chai_opensora_warmup")
    g.note((-420, 40), "## Warm up a CHAI cache\n\nEvery line of the prompt list runs once through the full "
                       "schedule and is stored, so that later requests sharing its entities hit. Nothing is "
                       "decoded. Use the same model, size and cache name as the workflow you will run.\n\n"
           + files_note("opensora_stdit3", "t5xxl"), size=(420, 380))
    prompts = g.node("CHAI_PromptList", (0, 40), [WARMUP_PROMPTS], size=(420, 260))
    model = g.node("CHAI_OpenSoraModelLoader", (0, 340), ["OpenSora-STDiT-v3.safetensors", "default"],
                   models=("opensora_stdit3",))
    clip = g.node("CLIPLoader", (0, 500), ["t5xxl_fp16.safetensors", "pixart", "default"], models=("t5xxl",))
    text = g.node("CHAI_OpenSoraTextEncode", (0, 660), ["", True, 6.5, True], size=(380, 300))
    g.link(clip, 0, text, "clip")
    g.link(model, 0, text, "model")
    g.link(prompts, 0, text, "prompt")
    latent = g.node("CHAI_OpenSoraEmptyLatent", (0, 1000),
                    ["240p", "9:16 (240x426 HxW at 240p, landscape)", "2s (51 frames)", 240, 426, 51, 24.0, 1],
                    size=(380, 340))
    chai_nodes(g, model, latent, (text, 0), (text, 1), prompts, cache_name="opensora", cfg=7.0, sampler="euler",
               scheduler="opensora", x=460, with_lookup=False)
    return g


# One CHAI node for the common case (issue 24 item 3), as two subgraphs: "CHAI" between the model loader and the
# sampler (cache, entity extract, lookup, CHAI Apply) and "CHAI Store" after it (Apply Trace, Cache Write, Stats),
# since Cache Write needs the sampler's result. Shipped inside a toy-world template (frontend 1.27.10 loads
# subgraphs from a workflow) and as blueprint files in subgraphs/ (ComfyUI releases with app/subgraph_manager.py
# list a pack's subgraphs/*.json as blueprints; on v0.3.64 copy them to user/default/subgraphs/).
CHAI_WIDGETS = ("prompt", "cache_name", "sampler_name", "scheduler", "full_steps", "fast_steps")


def chai_subgraph() -> ui_graph.Subgraph:
    """Cache, entity extract, lookup and CHAI Apply: MODEL and LATENT in, what the sampler needs out."""
    sub = ui_graph.Subgraph("CHAI", first_id=100, first_link=100, input_x=-300, output_x=1100)
    model, latent = sub.add_input("model", "MODEL"), sub.add_input("latent", "LATENT")
    slots = dict(zip(CHAI_WIDGETS, (sub.add_input(n, t) for n, t in
                                    zip(CHAI_WIDGETS, ("STRING", "STRING", "COMBO", "COMBO", "INT", "INT")))))
    cache = sub.node("CHAI_CacheOpen", (0, 40), ["default", 2.0, "lru", "minilm"], size=(300, 300))
    ents = sub.node("CHAI_EntityExtract", (0, 380), [""], size=(300, 240))
    lookup = sub.node("CHAI_CacheLookup", (340, 40), [0.0], size=(340, 380))
    apply = sub.node("CHAI_Apply", (720, 40),
                     ["euler", "simple", 30, 8, PACK_CACHE_STEPS, "replace", "cond", WAN22_BOUNDARY, "restart", 0.8],
                     size=(340, 640))
    sub.link_in(slots["prompt"], ents, "prompt")
    sub.link_in(slots["cache_name"], cache, "name")
    for name in CHAI_WIDGETS[2:]:
        sub.link_in(slots[name], apply, name)
    for node in (lookup, apply):
        sub.link_in(model, node, "model")
        sub.link_in(latent, node, "latent")
    sub.link(cache, 0, lookup, "cache")
    sub.link(ents, 0, lookup, "entities")
    sub.link(lookup, 0, apply, "hit")
    sub.link(cache, 0, apply, "cache")  # the MODEL stores the run itself when the sampler finishes
    sub.link(ents, 0, apply, "entities")
    for name, kind, (src, slot) in (("MODEL", "MODEL", (apply, 0)), ("LATENT", "LATENT", (apply, 6)),
                                    ("steps", "INT", (apply, 2)), ("start_at_step", "INT", (apply, 7)),
                                    ("SIGMAS", "SIGMAS", (apply, 1)), ("chai", "CHAI_APPLIED", (apply, 4)),
                                    ("cache", "CHAI_CACHE", (cache, 0)), ("entities", "CHAI_ENTITIES", (ents, 0))):
        sub.link_out(src, slot, sub.add_output(name, kind))
    return sub


def chai_store_subgraph() -> ui_graph.Subgraph:
    """Apply Trace, Cache Write and Stats: after the sampler, the run is stored for later hits."""
    sub = ui_graph.Subgraph("CHAI Store", first_id=200, first_link=200, input_x=-300, output_x=760)
    chai, samples = sub.add_input("chai", "CHAI_APPLIED"), sub.add_input("samples", "LATENT")
    cache, ents = sub.add_input("cache", "CHAI_CACHE"), sub.add_input("entities", "CHAI_ENTITIES")
    trace = sub.node("CHAI_ApplyTrace", (0, 40), [], size=(300, 200))
    write = sub.node("CHAI_CacheWrite", (340, 40), [], size=(380, 300))
    stats = sub.node("CHAI_CacheStats", (340, 380), ["show"], size=(380, 400))
    sub.link_in(chai, trace, "chai")
    sub.link_in(samples, trace, "samples")
    sub.link_in(cache, write, "cache")
    sub.link_in(ents, write, "entities")
    sub.link_in(cache, stats, "cache")
    sub.link(trace, 0, write, "trace")
    sub.link(write, 0, stats, "after")
    sub.link_out(write, 0, sub.add_output("report", "STRING"))
    return sub


BLUEPRINT_WIDGETS = ["", "default", "euler", "simple", 30, 8]  # the CHAI node's widgets when dropped in a graph
BLUEPRINTS = {"CHAI": (chai_subgraph, BLUEPRINT_WIDGETS), "CHAI Store": (chai_store_subgraph, [])}


def toy_one_node() -> UIGraph:
    """The toy world through the one CHAI subgraph node in front of an ordinary KSamplerAdvanced."""
    g = UIGraph("chai_toy_one_node")
    g.note((-460, 40), "## One CHAI node (toy world, any CPU)\n\n**CHAI** sits between the model loader and the "
                       "sampler, as TeaCache or EasyCache do: it looks the prompt's entities up in the cache and "
                       "gives the sampler a patched MODEL, its steps (30 on a miss, 8 on a hit), start_at_step and "
                       "LATENT (a hit restarts from the donor's latent); the MODEL stores the run in the cache "
                       "when the sampler finishes. It is a subgraph: double-click to see the CHAI nodes "
                       "inside.\n\nIn your own graph: connect MODEL -> model, steps, start_at_step and LATENT -> "
                       "latent_image of a KSamplerAdvanced (add_noise enabled) and set sampler_name and scheduler "
                       "on CHAI to your sampler's. (The **CHAI Store** blueprint, Apply Trace, Cache Write and "
                       "Stats, is for graphs whose run another sampler finishes, such as Wan 2.2's two experts.) "
                       "Queue this prompt (a miss), then one sharing an entity (a hit).",
           size=(440, 520))
    prompt = g.node("PrimitiveStringMultiline", (0, 40), [TOY_PROMPT], title="Prompt", size=(380, 160))
    model = g.node("CHAI_OpenSoraModelLoader", (0, 240), ["toyworld_stdit3.safetensors", "default"])
    text = g.node("CHAI_ToyTextEncode", (0, 400), [""], size=(380, 200))
    g.link(model, 0, text, "model")
    g.link(prompt, 0, text, "prompt")
    latent = g.node("CHAI_ToyEmptyLatent", (0, 690), [1], size=(320, 80))
    chai = g.subgraph_node(chai_subgraph(), (440, 40), ["", "toyworld", "euler", "simple", 30, 8], size=(340, 420))
    g.link(model, 0, chai, "model")
    g.link(latent, 0, chai, "latent")
    g.link(text, 2, chai, "prompt")
    ks = g.node("KSamplerAdvanced", (840, 40),
                ["enable", 42, "randomize", 30, TOY_CFG, "euler", "simple", 0, 10000, "disable"], size=(340, 520))
    for name, (src, slot) in (("model", (chai, 0)), ("positive", (text, 0)), ("negative", (text, 1)),
                              ("latent_image", (chai, 1)), ("steps", (chai, 2)), ("start_at_step", (chai, 3))):
        g.link(src, slot, ks, name)
    decode = g.node("CHAI_ToyDecode", (1240, 260), [8], size=(300, 100))
    g.link(ks, 0, decode, "samples")
    video = g.node("CreateVideo", (1240, 420), [8.0], size=(300, 100))
    g.link(decode, 0, video, "images")
    g.link(decode, 1, video, "fps")
    save = g.node("SaveVideo", (1600, 40), ["video/CHAI_toy_one_node", "auto", "auto"], size=(400, 460))
    g.link(video, 0, save, "video")
    return g


WORKFLOWS = {"chai_opensora_t2v": opensora_t2v, "chai_wan21_t2v": wan21_t2v,
             "chai_opensora_warmup": opensora_warmup, "chai_toy_t2v": toy_t2v,
             "chai_wan22_a14b_t2v": wan22_a14b_t2v, "chai_wan22_5b_i2v": wan22_5b_i2v,
             "chai_hunyuan_video_t2v": hunyuan_video_t2v, "chai_ltxv_t2v": ltxv_t2v,
             "chai_toy_one_node": toy_one_node, "chai_wan22_a14b_4step": wan22_a14b_4step}
# The UI files' names. ComfyUI's template browser (frontend 1.27.10) titles a custom node pack's template with its
# file name in two lines of a 16rem card and describes it with the same name ('-' and '_' shown as spaces; the
# frontend has no other description for a pack's template), so the names are short titles (at most
# MAX_TEMPLATE_TITLE characters, which fit those two lines) written to be read (no '-' or '_'). The API twins and the tests keep the short keys; tests/workflows/template_files.json maps one to the other.
MAX_TEMPLATE_TITLE = 36
TEMPLATE_FILES = {
    "chai_toy_t2v": "CHAI toy world, any CPU, no download",
    "chai_opensora_t2v": "CHAI OpenSora 1.2, text to video",
    "chai_wan21_t2v": "CHAI Wan 2.1 1.3B, text to video",
    "chai_opensora_warmup": "CHAI OpenSora 1.2, warm up a cache",
    "chai_wan22_a14b_t2v": "CHAI Wan 2.2 A14B, two experts",
    "chai_wan22_5b_i2v": "CHAI Wan 2.2 5B, image to video",
    "chai_hunyuan_video_t2v": "CHAI HunyuanVideo, text to video",
    "chai_ltxv_t2v": "CHAI LTX Video 2B, text to video",
    "chai_toy_one_node": "CHAI toy world, one CHAI node",
    "chai_wan22_a14b_4step": "CHAI Wan 2.2 A14B, 4 step LoRAs",
}


def render() -> dict[Path, str]:
    """Every file this script writes, with its text."""
    specs = {kind: spec["widgets"] for kind, spec in SPECS.items()}
    files = {}
    for name, build in WORKFLOWS.items():
        ui = build().to_json()
        files[REPO / "workflows" / f"{TEMPLATE_FILES[name]}.json"] = json.dumps(ui, indent=2) + "\n"
        files[REPO / "tests" / "workflows" / f"{name}_api.json"] = json.dumps(ui_to_api(ui, specs), indent=2) + "\n"
    files[REPO / "tests" / "workflows" / "template_files.json"] = json.dumps(TEMPLATE_FILES, indent=2) + "\n"
    for name, (build, widgets) in BLUEPRINTS.items():
        files[REPO / "subgraphs" / f"{name}.json"] = json.dumps(build().blueprint(widgets), indent=2) + "\n"
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the files on disk")
    args = parser.parse_args(argv)
    stale = []
    rendered = render()
    # UI files this script no longer writes (an old name) would still be listed by the template browser.
    extra = [p for folder in ("workflows", "subgraphs") for p in (REPO / folder).glob("*.json") if p not in rendered]
    for path in extra:
        if args.check:
            stale.append(path)
        else:
            path.unlink()
            print(f"removed {path.relative_to(REPO)}")
    for path, text in rendered.items():
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)}")
    for path in stale:
        print(f"differs: {path.relative_to(REPO)}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
