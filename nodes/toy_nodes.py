"""Toy-world nodes: the pack's small trained STDiT3 end to end on any CPU (text encode, empty latent, decode).

The model itself loads with CHAI OpenSora Model Loader (toyworld_stdit3.safetensors is listed there); its file
carries its flow shift and nominal size, so KSampler and CHAI Sampler need no extra node. The work is done in
`toyworld.comfy_adapter` (plain torch and numpy, both part of every ComfyUI install); these classes are glue.
"""
from __future__ import annotations

import logging
from typing import Any

from comfy_api.v0_0_2 import io

from ..opensora.comfy_model import is_opensora, null_caption
from ..toyworld.comfy_adapter import (DEFAULT_UPSCALE, MAX_BATCH, MAX_UPSCALE, PLAYBACK_FPS, decode_frames,
                                      empty_latent, prompt_conditioning)
from ..toyworld.model import TEXT_DIM, TEXT_TOKENS
from ..toyworld.text import kept_text
from .canvas import show
from .errors import ChaiNodeError, user_errors

log = logging.getLogger(__name__)

CATEGORY = "CHAI/Toy World"


def _require_toy_text(model: Any, node: str, dim: int) -> None:
    """Raise a clear error unless MODEL is an STDiT3 that reads `dim`-wide captions (the toy model)."""
    if not is_opensora(model):
        kind = type(getattr(model, "model", model)).__name__
        raise ChaiNodeError(f"{node}: the MODEL is a {kind}; load toyworld_stdit3.safetensors with "
                            "'CHAI OpenSora Model Loader'.")
    channels = model.get_model_object("diffusion_model").config.caption_channels
    if channels != dim:
        raise ChaiNodeError(f"{node}: this STDiT3 reads {channels}-d captions, the toy text encoder gives {dim}-d; "
                            "it is not the toy-world model (use CHAI OpenSora Text Encode with T5 for OpenSora).")


class ToyTextEncode(io.ComfyNode):
    """Encode a prompt with the toy world's hashed word features; the negative is the model's null caption."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_ToyTextEncode",
            display_name="CHAI Toy Text Encode",
            category=CATEGORY,
            description="The toy-world model's text encoder: one fixed hashed 64-d vector per word (up to 20 "
                        "words; no weights, no CLIP needed). The negative is the model's learned null caption of "
                        "the same length, as for OpenSora. The world knows scenes (beach, forest, snowy field, "
                        "night sky, city street, desert), objects (ball, car, kite, bird, box), colours (red, "
                        "blue, green, yellow, purple) and motions (left, right, up, down, bouncing, still).",
            inputs=[
                io.Model.Input("model", tooltip="The toy-world model (toyworld_stdit3.safetensors from 'CHAI "
                                                "OpenSora Model Loader'); its null caption becomes the negative."),
                io.String.Input("prompt", multiline=True, default="",
                                tooltip="A toy-world caption, e.g. 'a red ball bouncing across a sunny beach'. "
                                        "Words after the 20th are ignored; unknown words mean nothing to the "
                                        "model."),
            ],
            outputs=[
                io.Conditioning.Output("positive", display_name="positive",
                                       tooltip="The prompt's word features [1, words, 64]."),
                io.Conditioning.Output("negative", display_name="negative",
                                       tooltip="The model's null caption, as many rows as the prompt has words: "
                                               "the unconditional input for classifier-free guidance."),
                io.String.Output("kept", display_name="kept prompt",
                                 tooltip="The prompt as far as the encoder read it (the first 20 words): give it "
                                         "to CHAI Entity Extract, so that entities come from what the video is "
                                         "conditioned on."),
            ],
        )

    @classmethod
    def execute(cls, model: Any, prompt: str) -> io.NodeOutput:
        node = "CHAI Toy Text Encode"
        with user_errors(node):
            _require_toy_text(model, node, TEXT_DIM)
            caption = prompt_conditioning(prompt)
            status = f"{caption.used_words} words encoded"
            if caption.used_words < caption.total_words:
                log.warning("[CHAI] toy text encode: only the first %d of %d words are used", caption.used_words,
                            caption.total_words)
                status = (f"prompt cut: only the first {caption.used_words} of {caption.total_words} words are "
                          "read (the toy encoder's limit); the rest is ignored")
            length = caption.features.shape[1]
            positive = [[caption.features, {"pooled_output": None}]]
            negative = [[null_caption(model, length), {"pooled_output": None}]]
        kept = kept_text(prompt or "", TEXT_TOKENS)
        return io.NodeOutput(positive, negative, kept, ui=show(status))


class ToyEmptyLatent(io.ComfyNode):
    """Empty toy-world latent [B, 4, 8, 16, 16]: 8 frames of 16x16 (nominally 128x128)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_ToyEmptyLatent",
            display_name="CHAI Toy Empty Latent",
            category=CATEGORY,
            description="The toy world's one video size: 8 frames of 16x16 pixels in a fixed 4-channel pixel-space "
                        "latent (the model treats it as a 128x128 video, as an OpenSora latent of that size).",
            inputs=[io.Int.Input("batch_size", default=1, min=1, max=MAX_BATCH,
                                 tooltip="Videos per run (all share the prompt; each gets its own noise).")],
            outputs=[io.Latent.Output("latent", display_name="LATENT",
                                      tooltip="Zeros [batch, 4, 8, 16, 16].")],
        )

    @classmethod
    def execute(cls, batch_size: int) -> io.NodeOutput:
        with user_errors("CHAI Toy Empty Latent"):
            import comfy.model_management

            samples = empty_latent(int(batch_size), device=comfy.model_management.intermediate_device())
        return io.NodeOutput({"samples": samples})


class ToyDecode(io.ComfyNode):
    """Decode toy-world latents to RGB frames, nearest-neighbour upscaled, plus the frame rate for CreateVideo."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_ToyDecode",
            display_name="CHAI Toy Decode",
            category=CATEGORY,
            description="The toy world's fixed pixel-space decode (no VAE file): 4 latent channels back to RGB, "
                        "each pixel upscaled to a square block so the 16x16 frames can be seen and saved.",
            inputs=[
                io.Latent.Input("samples", tooltip="Toy latents [B, 4, 8, 16, 16], e.g. from CHAI Sampler or "
                                                   "KSampler."),
                io.Int.Input("upscale", default=DEFAULT_UPSCALE, min=1, max=MAX_UPSCALE,
                             tooltip="Nearest-neighbour upscale factor: 8 gives 128x128 frames (the size the "
                                     "model was told), 1 the raw 16x16."),
            ],
            outputs=[
                io.Image.Output("images", display_name="images",
                                tooltip="All frames of all videos, [B * 8, 16 * upscale, 16 * upscale, 3]; "
                                        "connect to CreateVideo."),
                io.Float.Output("frame_rate", display_name="fps",
                                tooltip="Playback frame rate, 8: a clip of 8 frames lasts one second (the model's "
                                        "nominal 24 fps would show it for a third of a second); connect to "
                                        "CreateVideo's fps."),
            ],
        )

    @classmethod
    def execute(cls, samples: dict, upscale: int) -> io.NodeOutput:
        with user_errors("CHAI Toy Decode"):
            images = decode_frames(samples["samples"], int(upscale))
        return io.NodeOutput(images, PLAYBACK_FPS)


NODES = [ToyTextEncode, ToyEmptyLatent, ToyDecode]
