"""The ComfyUI-facing STDiT3 adapter and the OpenSora node choices, tested without ComfyUI."""
from __future__ import annotations

import pytest
import torch

from comfyui_chai.opensora.choices import (ASPECT_CHOICES, CUSTOM, DEFAULT_ASPECT, DEFAULT_FRAMES, FRAME_CHOICES,
                              RESOLUTION_CHOICES, aspect_label, frames_of, orientation, ratio_of, video_for_choices)
from comfyui_chai.opensora.comfy_adapter import (DEFAULT_SHIFT, PATCH_GROUP, VIDEO_FIELDS, VIDEO_KEY, attn_patch_key,
                                    attn_replace_from_options, comfy_forward, fits_latent, frames_for_latent,
                                    infer_video, memory_usage_factor, nominal_size, trim_padding, video_for_latent,
                                    video_from_dict, video_from_latent_dict, video_to_dict)
from comfyui_chai.opensora.presets import ASPECT_RATIOS, FRAME_PRESETS, IMAGE_SIZES, VideoSpec, latent_hw, vae_latent_frames
from comfyui_chai.opensora.schedule import opensora_shift
from comfyui_chai.opensora.stdit3 import STDiT3, STDiT3Config


@pytest.fixture(scope="module")
def tiny() -> STDiT3:
    """A tiny random STDiT3 in eval mode."""
    torch.manual_seed(0)
    model = STDiT3(STDiT3Config(hidden_size=32, depth=2, num_heads=2, caption_channels=16, model_max_length=20))
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim > 1:
                p.normal_(0.0, 0.3 / p.shape[-1] ** 0.5 if p.ndim == 2 else 0.2)
    return model.eval()


# ------------------------------------------------------------------------------------------------ nominal video

def test_nominal_size_recovers_every_preset_from_its_latent():
    for res, sizes in IMAGE_SIZES.items():
        for ratio, (h, w) in sizes.items():
            assert nominal_size(*latent_hw(h, w)) == (h, w), (res, ratio)
    assert nominal_size(30, 53) == (240, 426)  # not 8x (424): the PE scale would differ
    assert nominal_size(13, 7) == (104, 56)  # no preset: 8x the latent


def test_frames_for_latent_is_the_smallest_frame_count_with_that_latent_length():
    for t in range(1, 131):
        f = frames_for_latent(t)
        assert vae_latent_frames(f) == t
        assert f == 1 or vae_latent_frames(f - 1) < t
    assert [frames_for_latent(t) for t in (1, 15, 30, 60, 120)] == [1, 51, 102, 204, 408]
    with pytest.raises(ValueError):
        frames_for_latent(0)


def test_infer_video_and_recorded_video_selection():
    assert infer_video((1, 4, 15, 30, 53)) == VideoSpec(240, 426, 51, 24.0)
    assert infer_video((2, 4, 18, 32)) == VideoSpec(144, 256, 1, 24.0)
    record = {"height": 240, "width": 426, "num_frames": 51, "fps": 30.0}
    assert video_for_latent((1, 4, 15, 30, 53), record) == VideoSpec(240, 426, 51, 30.0)
    # 52..55 frames all give 16 latent frames: a record is kept when it fits the latent exactly.
    assert video_for_latent((1, 4, 16, 30, 53), {**record, "num_frames": 55}).num_frames == 55
    assert video_for_latent((1, 4, 16, 30, 53)).num_frames == 52
    # A stale record (another size) is replaced by the inferred size, its fps kept.
    stale = video_for_latent((1, 4, 15, 45, 80), record)
    assert stale == VideoSpec(360, 640, 51, 30.0)
    assert video_for_latent((1, 4, 1, 18, 32), {"height": "x"}) == VideoSpec(144, 256, 1, 24.0)
    latent = {"samples": torch.zeros(1, 4, 5, 18, 32), VIDEO_KEY: {"height": 144, "width": 256, "num_frames": 17,
                                                                   "fps": 24.0}}
    assert video_from_latent_dict(latent) == VideoSpec(144, 256, 17, 24.0)
    assert video_from_latent_dict({"samples": torch.zeros(1, 4, 5, 18, 32)}).num_frames == frames_for_latent(5)


def test_video_dict_round_trip_and_errors():
    video = VideoSpec(276, 368, 102, 24.0)
    data = video_to_dict(video)
    assert tuple(data) == VIDEO_FIELDS and data == {"height": 276, "width": 368, "num_frames": 102, "fps": 24.0}
    assert video_from_dict(data) == video
    assert video_from_dict({"height": 8, "width": 8, "num_frames": 1}).fps == 24.0
    with pytest.raises(ValueError, match="lack"):
        video_from_dict({"height": 240, "width": 426})
    with pytest.raises(ValueError):
        video_from_dict({"height": 0, "width": 426, "num_frames": 1})
    with pytest.raises(ValueError):
        video_from_dict([240, 426, 51])
    assert fits_latent(video, (1, 4, 30, 34, 46)) and not fits_latent(video, (1, 4, 29, 34, 46))


def test_default_shift_is_opensoras_240p_51_frame_value():
    assert DEFAULT_SHIFT == pytest.approx(2.421875)
    assert DEFAULT_SHIFT == opensora_shift(240, 426, 51)


# ------------------------------------------------------------------------------------------------ forward / patches

def _kw(video: VideoSpec, **extra) -> dict:
    return {"height": video.height, "width": video.width, "fps": 120.0 if video.num_frames == 1 else video.fps,
            **extra}


def test_comfy_forward_returns_minus_velocity_with_nominal_size_and_fps(tiny):
    x = torch.randn(2, 4, 3, 18, 32)
    t = torch.tensor([700.0, 700.0])
    y = torch.randn(2, 5, 16)
    out = comfy_forward(tiny, x, t, y, {})
    assert out.shape == (2, 4, 3, 18, 32) and out.dtype == torch.float32
    inferred = infer_video(x.shape)  # 144x256, 9 frames -> fps 24
    ref = tiny(x, t, y, **_kw(inferred))[:, :4]
    torch.testing.assert_close(out, -ref)
    # A recorded video reaches the model: another fps changes the output.
    options = {VIDEO_KEY: {"height": 144, "width": 256, "num_frames": 9, "fps": 8.0}}
    out8 = comfy_forward(tiny, x, t, y, options)
    torch.testing.assert_close(out8, -tiny(x, t, y, height=144, width=256, fps=8.0)[:, :4])
    assert (out8 - out).abs().max() > 1e-5
    # A single frame is conditioned on fps 120, as OpenSora does for images.
    x1 = x[:, :, :1]
    torch.testing.assert_close(comfy_forward(tiny, x1, t, y, {}), -tiny(x1, t, y, height=144, width=256,
                                                                       fps=120.0)[:, :4])
    with pytest.raises(ValueError, match="text conditioning"):
        comfy_forward(tiny, x, t, None, {})


def test_euler_step_with_comfy_sign_equals_opensora_step(tiny):
    # ComfyUI CONST: denoised = x - sigma * out, Euler d = (x - denoised) / sigma, x += d * (s_next - s).
    x = torch.randn(1, 4, 2, 8, 12)
    y = torch.randn(1, 4, 16)
    s, s_next = 0.8, 0.55
    t = torch.tensor([1000.0 * s])
    out = comfy_forward(tiny, x, t, y, {})
    denoised = x - s * out
    comfy_next = x + (x - denoised) / s * (s_next - s)
    v = tiny(x, t, y, **_kw(infer_video(x.shape)))[:, :4]
    torch.testing.assert_close(comfy_next, x + v * (s - s_next), atol=1e-6, rtol=1e-5)


def test_attn_patch_key_maps_onto_stdit3_attn_replace(tiny):
    assert attn_patch_key("spatial_attn", 0) == ("spatial_attn", 0)
    with pytest.raises(ValueError):
        attn_patch_key("double_block", 0)
    assert attn_replace_from_options({}) is None
    assert attn_replace_from_options({"patches_replace": {"dit": {("double_block", 0): print}}}) is None
    seen = []

    def patch(call):
        seen.append((call.kind, call.index, call.info["transformer_options"]["marker"]))
        return call.block.attn.attend(call.q, call.k, call.v)

    options = {"marker": 7, "patches_replace": {PATCH_GROUP: {("spatial_attn", 0): patch,
                                                              ("spatial_attn", 0, 3): print}}}
    replace = attn_replace_from_options(options)
    assert list(replace) == [("spatial_attn", 0)]
    x = torch.randn(1, 4, 2, 8, 12)
    y = torch.randn(1, 4, 16)
    t = torch.tensor([500.0])
    plain = comfy_forward(tiny, x, t, y, {})
    torch.testing.assert_close(comfy_forward(tiny, x, t, y, options), plain)
    assert seen == [("spatial", 0, 7)]
    zero = {"patches_replace": {"dit": {("temporal_attn", 1): lambda call: call.q.new_zeros(
        call.q.shape[0], call.q.shape[2], call.block.hidden_size)}}}
    assert (comfy_forward(tiny, x, t, y, zero) - plain).abs().max() > 1e-6


def test_trim_padding_keeps_only_valid_tokens():
    cond = torch.arange(12.0).view(1, 6, 2)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0]])
    assert torch.equal(trim_padding(cond, mask), cond[:, :3])
    assert trim_padding(cond, None) is cond
    assert trim_padding(cond, torch.ones(1, 4)) is cond  # a foreign mask is left alone
    with pytest.raises(ValueError):
        trim_padding(cond, torch.zeros(1, 6))


def test_memory_usage_factor_matches_a_per_token_activation_estimate():
    xl = memory_usage_factor(STDiT3Config())
    # 1152 * (10 + 8) elements per token, 4 latent cells per token, in ComfyUI's 0.01 MiB per area-byte units.
    assert xl == pytest.approx(1152 * 18 / 4 / (0.01 * 2**20))
    assert 0.4 < xl < 0.6
    assert memory_usage_factor(STDiT3Config(hidden_size=64, depth=1, num_heads=2)) == pytest.approx(xl * 64 / 1152)


# ------------------------------------------------------------------------------------------------ node choices

def test_aspect_labels_are_unambiguous_and_name_the_240p_size():
    assert ASPECT_CHOICES[0] == "9:16 (240x426 HxW at 240p, landscape)" == DEFAULT_ASPECT
    assert "16:9 (426x240 HxW at 240p, portrait)" in ASPECT_CHOICES
    assert "1:1 (320x320 HxW at 240p, square)" in ASPECT_CHOICES
    assert len(set(ASPECT_CHOICES)) == 5 and {ratio_of(label) for label in ASPECT_CHOICES} == set(ASPECT_RATIOS)
    for label in ASPECT_CHOICES:
        h, w = IMAGE_SIZES["240p"][ratio_of(label)]
        assert label == aspect_label(ratio_of(label)) and orientation(h, w) in label
    assert orientation(240, 426) == "landscape" and orientation(426, 240) == "portrait"
    assert ratio_of("4:3") == "4:3"
    with pytest.raises(ValueError, match="aspect ratio"):
        ratio_of("16:10")


def test_frame_and_resolution_choices():
    assert RESOLUTION_CHOICES == ["144p", "240p", "360p", "480p", "720p", CUSTOM]
    assert FRAME_CHOICES[-1] == CUSTOM and DEFAULT_FRAMES == "2s (51 frames)"
    assert [frames_of(label, 0) for label in FRAME_CHOICES[:-1]] == [1, 51, 102, 204, 408]
    assert frames_of(CUSTOM, 68) == 68 and frames_of("4s", 0) == FRAME_PRESETS["4s"]
    with pytest.raises(ValueError):
        frames_of(CUSTOM, 0)
    with pytest.raises(ValueError, match="frame preset"):
        frames_of("3s", 1)


def test_video_for_choices_covers_every_preset_and_custom_sizes():
    for res in ("144p", "240p", "360p", "480p", "720p"):
        for label in ASPECT_CHOICES:
            video = video_for_choices(res, label, DEFAULT_FRAMES)
            assert (video.height, video.width) == IMAGE_SIZES[res][ratio_of(label)]
            assert video.num_frames == 51 and video.fps == 24.0
    assert video_for_choices("240p", DEFAULT_ASPECT, DEFAULT_FRAMES).latent_shape(1) == (1, 4, 15, 30, 53)
    custom = video_for_choices(CUSTOM, "ignored", CUSTOM, 100, 60, 35, 12.0)
    assert custom == VideoSpec(100, 60, 35, 12.0) and custom.latent_shape(2) == (2, 4, 11, 12, 7)
    with pytest.raises(ValueError, match="custom height"):
        video_for_choices(CUSTOM, DEFAULT_ASPECT, DEFAULT_FRAMES, 4, 60)
    with pytest.raises(ValueError, match="resolution"):
        video_for_choices("1080p", DEFAULT_ASPECT, DEFAULT_FRAMES)
    with pytest.raises(ValueError, match="fps"):
        video_for_choices("240p", DEFAULT_ASPECT, DEFAULT_FRAMES, fps=0)
