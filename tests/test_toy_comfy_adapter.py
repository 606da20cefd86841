"""The toy world in ComfyUI's terms, without ComfyUI: caption features, latents, frames, fixed shift and video."""
from __future__ import annotations

import json

import pytest
import torch

from comfyui_chai.opensora.comfy_adapter import (FIXED_METADATA_KEY, VIDEO_KEY, FixedSampling, call_video, comfy_forward,
                                    fixed_sampling_from_metadata, infer_video)
from comfyui_chai.opensora.loading import CheckpointError, read_checkpoint_header
from comfyui_chai.opensora.schedule import uniform_flow_sigmas
from comfyui_chai.opensora.stdit3 import STDiT3
from comfyui_chai.toyworld import latent as toy_latent
from comfyui_chai.toyworld.comfy_adapter import FPS, PLAYBACK_FPS, decode_frames, empty_latent, prompt_conditioning
from comfyui_chai.toyworld.model import ToyVideoSpec, default_weights, toy_config, toy_sigmas, toy_text_encoder

PROMPT = "a red ball bouncing across a sunny beach"


def test_prompt_conditioning_is_the_encoders_valid_rows():
    caption = prompt_conditioning(PROMPT)
    y, mask = toy_text_encoder()(PROMPT)
    assert caption.features.shape == (1, 8, 64) and caption.used_words == caption.total_words == 8
    assert torch.equal(caption.features, y[:, 0, :8]) and int(mask.sum()) == 8
    long = prompt_conditioning(" ".join(["red"] * 25))
    assert long.features.shape == (1, 20, 64) and (long.used_words, long.total_words) == (20, 25)
    empty = prompt_conditioning("")
    assert empty.features.shape == (1, 1, 64) and empty.total_words == 0


def test_empty_latent_has_the_toy_shape():
    z = empty_latent(3)
    assert tuple(z.shape) == ToyVideoSpec().latent_shape(3) == (3, 4, 8, 16, 16) and not z.any()
    with pytest.raises(ValueError, match="batch_size"):
        empty_latent(0)


def test_decode_frames_are_nearest_upscaled_decoded_clips():
    z = torch.randn(2, 4, 8, 16, 16)
    clips = toy_latent.decode(z)  # [2, 8, 16, 16, 3]
    frames = decode_frames(z, 8)
    assert frames.shape == (16, 128, 128, 3) and frames.dtype == torch.float32
    assert torch.equal(frames[::, ::8, ::8], clips.reshape(16, 16, 16, 3))
    assert torch.equal(frames[9, 8 * 3 + 7, 8 * 5 + 2], clips[1, 1, 3, 5])  # a whole 8x8 block per pixel
    assert torch.equal(decode_frames(z, 1), clips.reshape(16, 16, 16, 3))
    assert FPS == 24.0
    assert PLAYBACK_FPS == 8.0  # a watchable second per 8-frame clip, not a third of one
    for bad in (0, 2.0, 1000):
        with pytest.raises(ValueError, match="upscale"):
            decode_frames(z, bad)


def test_shipped_weights_declare_their_shift_and_nominal_video():
    _, metadata = read_checkpoint_header(default_weights())
    facts = json.loads(metadata[FIXED_METADATA_KEY])
    fixed = fixed_sampling_from_metadata(metadata)
    assert fixed.shift == facts["shift"] == 1.0
    video = ToyVideoSpec()
    assert (fixed.height, fixed.width, fixed.num_frames, fixed.fps) == (video.height, video.width,
                                                                        video.num_frames, video.fps)
    assert (fixed.height, fixed.num_frames, fixed.latent_frames) == (128, 8, 8)


def test_fixed_sampling_metadata_absent_or_malformed():
    assert fixed_sampling_from_metadata({}) is None and fixed_sampling_from_metadata(None) is None
    for raw in ("not json", json.dumps({"size": 16, "frames": 8}), json.dumps({"shift": -1, "size": 16, "frames": 8}),
                json.dumps({"shift": 1.0, "size": 0, "frames": 8})):
        with pytest.raises(CheckpointError, match="toyworld"):
            fixed_sampling_from_metadata({FIXED_METADATA_KEY: raw})


def test_uniform_flow_sigmas_equal_the_toy_schedule():
    for steps in (1, 8, 30):
        assert torch.equal(uniform_flow_sigmas(steps, 1.0), toy_sigmas(steps))
    assert torch.equal(uniform_flow_sigmas(12, 3.0), toy_sigmas(12, 3.0))
    with pytest.raises(ValueError):
        uniform_flow_sigmas(0)


@pytest.fixture(scope="module")
def toy_net() -> STDiT3:
    torch.manual_seed(0)
    model = STDiT3(toy_config(hidden_size=32, depth=1, num_heads=2, patch_t=2)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


def test_comfy_forward_gives_a_fixed_model_its_video_and_equals_the_masked_reference(toy_net):
    shape = (1, 4, 8, 16, 16)
    toy_net.fixed_sampling = FixedSampling(1.0, 128, 128, 8, 12.0)  # an fps the shape could never imply
    try:
        assert call_video(toy_net, shape) is toy_net.fixed_sampling
        assert infer_video(shape).num_frames != 8  # OpenSora's VAE would need more frames for 8 latent frames
        other = call_video(toy_net, (1, 4, 5, 16, 16))  # not the trained shape: inferred as for OpenSora
        assert other.height == 128 and other.num_frames != 5
        x = torch.randn(shape)
        t = torch.tensor([600.0])
        y, mask = toy_text_encoder()(PROMPT)
        caption = prompt_conditioning(PROMPT).features
        out = comfy_forward(toy_net, x, t, caption, {})
        ref = toy_net(x, t, y, mask=mask, height=torch.tensor([128.0]), width=torch.tensor([128.0]),
                      fps=torch.tensor([12.0]))[:, :4]
        torch.testing.assert_close(out, -ref, atol=1e-5, rtol=1e-5)
        recorded = {VIDEO_KEY: {"height": 128, "width": 128, "num_frames": 27, "fps": 30.0}}
        assert torch.equal(comfy_forward(toy_net, x, t, caption, recorded), out)  # the file's video wins
    finally:
        toy_net.fixed_sampling = None
    assert (comfy_forward(toy_net, x, t, caption, {}) - out).abs().max() > 1e-5  # fps 24 without it
