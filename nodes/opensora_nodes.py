"""OpenSora 1.2 nodes: STDiT3 loader, T5 text encode with the null-caption negative, empty latent, exact scheduler.

The widget tables come from the dependency-free `opensora.choices`; the model code from `opensora` (its ComfyUI
glue is `opensora.comfy_model`).
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from comfy_api.v0_0_2 import io

from ..opensora.captions import T5_EOS_ID, prepare_caption, truncate_tokens
from ..opensora.choices import (ASPECT_CHOICES, DEFAULT_ASPECT, DEFAULT_FRAMES, DEFAULT_RESOLUTION,
                                FRAME_CHOICES, MAX_FRAMES, MAX_SIDE, RESOLUTION_CHOICES, video_for_choices)
from ..opensora.comfy_adapter import VIDEO_KEY, trim_padding, video_from_latent_dict, video_to_dict
from ..opensora.comfy_model import is_opensora, load_opensora_model, null_caption, with_video
from ..opensora.presets import VideoSpec
from ..opensora.schedule import opensora_sigmas
from .canvas import show
from .errors import ChaiNodeError, user_errors
from .paths import loader_model_files, loader_model_path
from .widgets import combo

log = logging.getLogger(__name__)

CATEGORY = "CHAI/OpenSora"
DTYPE_CHOICES = ["default", "fp32", "fp16", "bf16"]
T5_KEY = "t5xxl"  # token dict key of ComfyUI's T5-XXL tokenizers (CLIPLoader type "pixart")
MAX_T5_TOKENS = 300  # OpenSora's T5 model_max_length, </s> included
SIZE_TOOLTIP = ("Nominal pixel {what} of the video (OpenSora's size, e.g. 426 for 240p 9:16 even though the "
                "VAE decodes 424); used only when no latent is connected.")


def _model_files() -> list[str]:
    return loader_model_files()


def _require_opensora(model: Any, node: str) -> None:
    """Raise a clear error when MODEL is not an OpenSora STDiT3 from the CHAI loader."""
    if not is_opensora(model):
        kind = type(getattr(model, "model", model)).__name__
        raise ChaiNodeError(f"{node}: the MODEL is a {kind}, not an OpenSora 1.2 STDiT3; load it with "
                            "'CHAI OpenSora Model Loader'.")


class OpenSoraModelLoader(io.ComfyNode):
    """Load an OpenSora 1.2 STDiT3 checkpoint from models/diffusion_models as a ComfyUI MODEL."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_OpenSoraModelLoader",
            display_name="CHAI OpenSora Model Loader",
            category=CATEGORY,
            description="Loads an Open-Sora 1.2 STDiT3 (e.g. hpcai-tech/OpenSora-STDiT-v3 model.safetensors, "
                        "4.8 GB) as a native ComfyUI model: KSampler, SamplerCustom, LoRA-style patches and "
                        "memory management apply.",
            inputs=[
                combo(
                    "model_name", options=_model_files(),
                    tooltip="STDiT3 checkpoint in models/diffusion_models (or a diffusion_models path of "
                            "extra_model_paths.yaml). The pack's own toy-world model, toyworld_stdit3.safetensors "
                            "(runs on any CPU in seconds), is listed too, by this loader only. Other kinds of "
                            "model are refused with a message saying what the file looks like."),
                combo(
                    "weight_dtype", options=DTYPE_CHOICES, default="default",
                    tooltip="Weight precision. 'default' lets ComfyUI choose (bf16 on GPUs that support it, as "
                            "Open-Sora runs; fp32 on CPU). bf16/fp16 halve memory (2.4 GB instead of 4.8 GB); "
                            "where the device cannot compute in that dtype, ComfyUI casts per layer."),
            ],
            outputs=[io.Model.Output("opensora_model", display_name="MODEL",
                                     tooltip="The STDiT3 model; connect it to a sampler and to "
                                             "'CHAI OpenSora Text Encode' (for the null-caption negative).")],
        )

    @classmethod
    def execute(cls, model_name: str, weight_dtype: str) -> io.NodeOutput:
        node = "CHAI OpenSora Model Loader"
        if weight_dtype not in DTYPE_CHOICES:
            raise ChaiNodeError(f"{node}: unknown weight_dtype {weight_dtype!r}; choose one of "
                                f"{', '.join(DTYPE_CHOICES)}")
        import folder_paths

        with user_errors(node):
            path = loader_model_path(model_name)
            if path is None:
                raise ChaiNodeError(f"{node}: {model_name!r} is not in the diffusion_models folder "
                                    f"({', '.join(folder_paths.get_folder_paths('diffusion_models'))})")
            model = load_opensora_model(path, weight_dtype)
        return io.NodeOutput(model)


def truncate_t5_tokens(tokens: dict, max_tokens: int = MAX_T5_TOKENS) -> tuple[dict, int, int]:
    """Cut ComfyUI's T5 token batches to OpenSora's limit (max_tokens - 1 text tokens + </s>): (tokens, kept, total)."""
    batches = tokens[T5_KEY]
    flat = [tok for batch in batches for tok in batch]
    total = len(flat)
    if total <= max_tokens:
        return tokens, total, total
    cut = truncate_tokens(flat, max_tokens, eos=T5_EOS_ID, key=lambda tok: int(tok[0]))
    return {**tokens, T5_KEY: [cut]}, len(cut), total


class OpenSoraTextEncode(io.ComfyNode):
    """Encode a prompt the way Open-Sora 1.2 does; the negative is the model's learned null caption."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_OpenSoraTextEncode",
            display_name="CHAI OpenSora Text Encode",
            category=CATEGORY,
            description="Cleans the prompt as Open-Sora does (lower case, URLs/HTML/symbols removed), appends the "
                        "aesthetic-score suffix, encodes with T5-XXL cut to 300 tokens, and returns the model's "
                        "null caption of the same length as the negative (Open-Sora never encodes a negative).",
            inputs=[
                io.Clip.Input(
                    "clip", tooltip="T5-XXL from a 'Load CLIP' node with type 'pixart' (t5xxl_fp16 or fp32; fp8 "
                                    "files add error). Other text encoders are refused."),
                io.Model.Input(
                    "model", tooltip="The OpenSora model from 'CHAI OpenSora Model Loader'; its null caption "
                                     "(y_embedding) becomes the negative."),
                io.String.Input(
                    "prompt", multiline=True, default="",
                    tooltip="The video description. Plain English; ComfyUI's (word:1.2) weights are not used "
                            "(Open-Sora's cleaning removes parentheses)."),
                io.Boolean.Input(
                    "add_aesthetic_score", default=True,
                    tooltip="Append ' aesthetic score: X.' as Open-Sora's inference does by default (on)."),
                io.Float.Input(
                    "aesthetic_score", default=6.5, min=0.0, max=10.0, step=0.5, round=0.1,
                    tooltip="The score to append; Open-Sora uses 6.5. Higher asks for more polished footage."),
                io.Boolean.Input(
                    "clean_prompt", default=True,
                    tooltip="Apply Open-Sora's caption cleaning (on, as Open-Sora always does). Off only "
                            "lower-cases the text."),
            ],
            outputs=[
                io.Conditioning.Output("positive", display_name="positive",
                                       tooltip="T5 features of the cleaned prompt, [1, L, 4096], L <= 300."),
                io.Conditioning.Output("negative", display_name="negative",
                                       tooltip="The model's null caption, first L rows: Open-Sora's "
                                               "unconditional input for classifier-free guidance."),
                io.String.Output("caption", display_name="caption",
                                 tooltip="The exact text given to T5 (after cleaning and the suffix)."),
            ],
        )

    @classmethod
    def execute(cls, clip: Any, model: Any, prompt: str, add_aesthetic_score: bool, aesthetic_score: float,
                clean_prompt: bool) -> io.NodeOutput:
        node = "CHAI OpenSora Text Encode"
        if clip is None:
            raise ChaiNodeError(f"{node}: no CLIP connected; load T5-XXL with 'Load CLIP' type 'pixart'.")
        with user_errors(node):
            _require_opensora(model, node)
            caption = prepare_caption(prompt, aesthetic_score if add_aesthetic_score else None, clean=clean_prompt)
            tokens = clip.tokenize(caption)
            if set(tokens) != {T5_KEY}:
                raise ChaiNodeError(f"{node}: the CLIP is not a lone T5-XXL (its tokenizers: {sorted(tokens)}); "
                                    "load t5xxl with 'Load CLIP' type 'pixart'.")
            tokens, kept, total = truncate_t5_tokens(tokens)
            status = f"{total} T5 tokens"
            if kept < total:
                log.info("[CHAI] OpenSora caption cut from %d to %d T5 tokens", total, kept)
                status = (f"prompt cut: {kept} of {total} T5 tokens kept (OpenSora reads {MAX_T5_TOKENS}); the end "
                          "of the prompt is ignored")
            conditioning = clip.encode_from_tokens_scheduled(tokens)
            channels = model.get_model_object("diffusion_model").config.caption_channels
            positive, negative = [], []
            for cond, extra in conditioning:
                cond = trim_padding(cond, extra.get("attention_mask"))
                if cond.shape[-1] != channels:
                    raise ChaiNodeError(f"{node}: the text encoder gives {cond.shape[-1]}-d features but this "
                                        f"STDiT3 expects {channels}-d (T5-XXL: 4096); load t5xxl with type "
                                        "'pixart'.")
                extra = {k: v for k, v in extra.items() if k != "attention_mask"}
                positive.append([cond, extra])
                negative.append([null_caption(model, cond.shape[1]), {"pooled_output": None}])
        return io.NodeOutput(positive, negative, caption, ui=show(status))


class OpenSoraEmptyLatent(io.ComfyNode):
    """Empty OpenSora latent [B, 4, T, H/8, W/8] for a preset or custom size, recording the nominal video."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_OpenSoraEmptyLatent",
            display_name="CHAI OpenSora Empty Latent",
            category=CATEGORY,
            description="Empty latent for Open-Sora 1.2. Aspect ratios are written height:width as Open-Sora "
                        "does: 9:16 is landscape (240 high x 426 wide at 240p). The nominal size, frame count "
                        "and fps travel in the latent for the scheduler and the VAE decode.",
            inputs=[
                combo(
                    "resolution", options=RESOLUTION_CHOICES, default=DEFAULT_RESOLUTION,
                    tooltip="Open-Sora resolution preset (240p is the official default and what CHAI was "
                            "measured on; 720p needs a large GPU). 'custom' uses custom_height/custom_width."),
                combo(
                    "aspect_ratio", options=ASPECT_CHOICES, default=DEFAULT_ASPECT,
                    tooltip="Open-Sora's five aspect ratios, height:width; the label shows the 240p size as "
                            "height x width. 9:16 is the landscape default."),
                combo(
                    "frames", options=FRAME_CHOICES, default=DEFAULT_FRAMES,
                    tooltip="Open-Sora frame presets (image, 2s=51 ... 16s=408 frames at 24 fps); 'custom' uses "
                            "custom_frames. 51 frames give 15 latent frames."),
                io.Int.Input(
                    "custom_height", default=240, min=8, max=MAX_SIDE, step=2,
                    tooltip="Pixel height when resolution is 'custom' (the latent is height // 8 high)."),
                io.Int.Input(
                    "custom_width", default=426, min=8, max=MAX_SIDE, step=2,
                    tooltip="Pixel width when resolution is 'custom' (the latent is width // 8 wide)."),
                io.Int.Input(
                    "custom_frames", default=51, min=1, max=MAX_FRAMES,
                    tooltip="Frame count when frames is 'custom'; multiples of 17 match how the VAE chunks "
                            "video (17 frames -> 5 latent frames)."),
                io.Float.Input(
                    "fps", default=24.0, min=1.0, max=240.0, step=1.0, round=0.01,
                    tooltip="Frame rate the model is conditioned on and the video is saved at (Open-Sora: 24; "
                            "a single image is always conditioned on 120, as Open-Sora does)."),
                io.Int.Input("batch_size", default=1, min=1, max=64,
                             tooltip="Videos per run; each one needs the full activation memory."),
            ],
            outputs=[io.Latent.Output("latent", display_name="LATENT",
                                      tooltip="Zeros [batch, 4, T, H/8, W/8] plus latent['opensora'] = "
                                              "{height, width, num_frames, fps}.")],
        )

    @classmethod
    def execute(cls, resolution: str, aspect_ratio: str, frames: str, custom_height: int, custom_width: int,
                custom_frames: int, fps: float, batch_size: int) -> io.NodeOutput:
        node = "CHAI OpenSora Empty Latent"
        with user_errors(node):
            video = video_for_choices(resolution, aspect_ratio, frames, custom_height, custom_width, custom_frames,
                                      fps)
            import comfy.model_management

            samples = torch.zeros(video.latent_shape(batch_size), device=comfy.model_management.intermediate_device())
        status = (f"{video.height}x{video.width} px, {video.num_frames} frames at {video.fps:g} fps -> latent "
                  f"{list(samples.shape)}")
        if video.height % 8 or video.width % 8:
            # The VAE works in 8-pixel blocks: the nominal size is what the model is told, the decode is floored.
            status += f"; decodes to {video.height // 8 * 8}x{video.width // 8 * 8} px"
        return io.NodeOutput({"samples": samples, VIDEO_KEY: video_to_dict(video)}, ui=show(status))


def _video_input(latent: dict | None, height: int, width: int, num_frames: int, fps: float = 24.0) -> Any:
    """Nominal video from a LATENT (its record, or inferred from its shape) or, without one, from the widgets."""
    if latent is not None:
        return video_from_latent_dict(latent)
    return VideoSpec(int(height), int(width), int(num_frames), float(fps))


def _size_inputs() -> list:
    """Fallback nominal-size widgets shared by the scheduler and model-sampling nodes."""
    return [
        io.Int.Input("height", default=240, min=8, max=MAX_SIDE, tooltip=SIZE_TOOLTIP.format(what="height")),
        io.Int.Input("width", default=426, min=8, max=MAX_SIDE, tooltip=SIZE_TOOLTIP.format(what="width")),
        io.Int.Input("num_frames", default=51, min=1, max=MAX_FRAMES,
                     tooltip="Pixel frame count (1 = image, 51 = Open-Sora's 2s); used only when no latent is "
                             "connected."),
    ]


class OpenSoraScheduler(io.ComfyNode):
    """Open-Sora 1.2's exact rectified-flow sigmas (resolution- and length-dependent shift) as SIGMAS."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_OpenSoraScheduler",
            display_name="CHAI OpenSora Scheduler",
            category=CATEGORY,
            description="The exact Open-Sora 1.2 schedule for SamplerCustom / SamplerCustomAdvanced with the "
                        "'euler' sampler: sigma_i = s*u/(1+(s-1)*u), u = 1 - i/steps, then 0, with the shift s "
                        "from the nominal size and frame count. KSampler's 'simple' scheduler (with the shift set by "
                        "'CHAI OpenSora Model Sampling') is exact when 1000/steps is whole (8, 10, 20, 25, 40, 50 "
                        "steps) and within 5e-3 otherwise (1.5e-3 at 240p, 30 steps). Not for the toy-world model, "
                        "which has its own fixed shift: use KSampler's 'simple' or CHAI Sampler's 'opensora'.",
            inputs=[
                io.Int.Input("steps", default=30, min=1, max=1000,
                             tooltip="Denoising steps; Open-Sora uses 30 (CHAI fast runs use fewer)."),
                io.Latent.Input("latent", optional=True,
                                tooltip="The latent to be sampled (from 'CHAI OpenSora Empty Latent'); its recorded "
                                        "nominal size and frame count set the shift. Overrides the widgets."),
                *_size_inputs(),
                io.Boolean.Input("bf16_shift", default=True,
                                 tooltip="Round the shift as Open-Sora's bf16 arithmetic does (on: bit-faithful "
                                         "to the official sampler, 2.421875 at 240p/51 frames; off: exact "
                                         "formula, 2.41872)."),
                io.Float.Input("denoise", default=1.0, min=0.0, max=1.0, step=0.01,
                               tooltip="Below 1, keep only the last steps of a longer schedule (as "
                                       "BasicScheduler does) for video-to-video; 1 for text-to-video."),
            ],
            outputs=[io.Sigmas.Output("sigmas", display_name="SIGMAS",
                                      tooltip="steps + 1 sigmas from 1.0 down to 0.")],
        )

    @classmethod
    def execute(cls, steps: int, height: int, width: int, num_frames: int, bf16_shift: bool, denoise: float,
                latent: dict | None = None) -> io.NodeOutput:
        with user_errors("CHAI OpenSora Scheduler"):
            if denoise <= 0.0:
                return io.NodeOutput(torch.FloatTensor([]))
            video = _video_input(latent, height, width, num_frames)
            total = steps if denoise >= 1.0 else int(steps / denoise)
            sigmas = opensora_sigmas(total, video.height, video.width, video.num_frames, bf16=bf16_shift)
        return io.NodeOutput(sigmas[-(steps + 1):].cpu())


class OpenSoraModelSampling(io.ComfyNode):
    """Fit an OpenSora MODEL to a video size: shift for KSampler's schedulers, nominal size and fps for the model."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_OpenSoraModelSampling",
            display_name="CHAI OpenSora Model Sampling",
            category=CATEGORY,
            description="Sets the model's flow shift to Open-Sora's value for this video (KSampler's schedulers "
                        "read it; the loaded default fits 240p 9:16 51 frames) and passes the nominal size and "
                        "fps to the model. Without it, the model infers them from the latent shape (exact for "
                        "Open-Sora's preset sizes) and uses 24 fps.",
            inputs=[
                io.Model.Input("model", tooltip="The OpenSora model from 'CHAI OpenSora Model Loader'."),
                io.Latent.Input("latent", optional=True,
                                tooltip="The latent to be sampled; its recorded size, frames and fps are used. "
                                        "Overrides the widgets."),
                *_size_inputs(),
                io.Float.Input("fps", default=24.0, min=1.0, max=240.0, step=1.0,
                               tooltip="Frame rate the model is conditioned on; used only when no latent is "
                                       "connected (a single image always uses 120)."),
                io.Boolean.Input("bf16_shift", default=True,
                                 tooltip="Round the shift as Open-Sora's bf16 arithmetic does (on, as the "
                                         "official sampler)."),
            ],
            outputs=[io.Model.Output("patched_model", display_name="MODEL",
                                     tooltip="A clone of the model with this shift and video size.")],
        )

    @classmethod
    def execute(cls, model: Any, height: int, width: int, num_frames: int, fps: float, bf16_shift: bool,
                latent: dict | None = None) -> io.NodeOutput:
        node = "CHAI OpenSora Model Sampling"
        with user_errors(node):
            _require_opensora(model, node)
            video = _video_input(latent, height, width, num_frames, fps)
            patched = with_video(model, video, bf16_shift=bf16_shift)
        return io.NodeOutput(patched)


NODES = [OpenSoraModelLoader, OpenSoraTextEncode, OpenSoraEmptyLatent, OpenSoraScheduler, OpenSoraModelSampling]
