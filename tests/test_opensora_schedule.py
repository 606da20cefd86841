"""OpenSora 1.2 schedule (shift, timesteps, sigmas) and resolution / frame presets."""

import math

import pytest
import torch

from comfyui_chai.opensora import presets
from comfyui_chai.opensora.schedule import (
    opensora_shift,
    opensora_sigmas,
    opensora_timesteps,
    shift_latent_frames,
    shifted_sigmas,
    sigmas_from_timesteps,
    time_shift,
    timesteps_from_sigmas,
)

# Published 240p 9:16 (240x426), 51 frames, 30 steps sigma list (shift 2.421875 as the bf16 pipeline uses).
PUBLISHED_240P_51F_30 = [
    1.000000, 0.985962, 0.971352, 0.956134, 0.940271, 0.923719, 0.906433, 0.888363, 0.869454, 0.849648, 0.828877,
    0.807070, 0.784148, 0.760023, 0.734597, 0.707763, 0.679399, 0.649372, 0.617530, 0.583704, 0.547703, 0.509310,
    0.468278, 0.424325, 0.377129, 0.326316, 0.271454, 0.212038, 0.147479, 0.077076, 0.0,
]

# (height, width) -> shifts for frames (1, 51, 102, 204, 408): (exact formula, bf16 as the official run uses).
SHIFT_TABLE = {
    (144, 256): ([0.375, 1.45237, 2.05396, 2.90474, 4.10792], [0.375, 1.453125, 2.046875, 2.90625, 4.09375]),
    (240, 426): ([0.62451, 2.41872, 3.42059, 4.83745, 6.84118], [0.625, 2.421875, 3.421875, 4.84375, 6.84375]),
    (360, 640): ([0.9375, 3.63092, 5.13490, 7.26184, 10.26980], [0.9375, 3.625, 5.125, 7.25, 10.25]),
    (480, 854): ([1.25049, 4.84312, 6.84921, 9.68624, 13.69841], [1.25, 4.84375, 6.84375, 9.6875, 13.6875]),
    (720, 1280): ([1.875, 7.26184, 10.26980, 14.52369, 20.53960], [1.875, 7.25, 10.25, 14.5, 20.5]),
}
FRAMES = (1, 51, 102, 204, 408)


def test_published_240p_51_frames_30_steps():
    sig = opensora_sigmas(30, 240, 426, 51)
    assert sig.dtype == torch.float32 and sig.shape == (31,)
    want = torch.tensor(PUBLISHED_240P_51F_30, dtype=torch.float64)
    torch.testing.assert_close(sig.double(), want, atol=1e-5, rtol=0)


def test_exact_shift_differs_from_published_bf16_values():
    exact = opensora_sigmas(30, 240, 426, 51, bf16=False).double()
    assert (exact - torch.tensor(PUBLISHED_240P_51F_30, dtype=torch.float64)).abs().max() > 1e-4


@pytest.mark.parametrize("hw", list(SHIFT_TABLE))
def test_shift_table(hw):
    exact, rounded = SHIFT_TABLE[hw]
    for frames, want_exact, want_bf16 in zip(FRAMES, exact, rounded):
        assert opensora_shift(*hw, frames, bf16=False) == pytest.approx(want_exact, abs=1e-5)
        assert opensora_shift(*hw, frames) == want_bf16  # bf16 values are exact binary fractions


def test_model_timesteps_on_the_bf16_grid():
    t = opensora_timesteps(30, 240, 426, 51)
    assert t[0].item() == 1000.0
    assert t.to(torch.bfloat16).float()[:4].tolist() == [1000.0, 984.0, 972.0, 956.0]
    assert t.to(torch.bfloat16).float()[-2:].tolist() == [147.0, 77.0]


@pytest.mark.parametrize("steps", [1, 2, 8, 17, 50])
@pytest.mark.parametrize("hw_frames", [(144, 256, 1), (360, 640, 102), (554, 738, 204), (720, 1280, 51)])
def test_sigmas_follow_the_formula(steps, hw_frames):
    h, w, f = hw_frames
    s = opensora_shift(h, w, f)
    sig = opensora_sigmas(steps, h, w, f)
    assert sig.shape == (steps + 1,)
    want = [s * (1 - i / steps) / (1 + (s - 1) * (1 - i / steps)) for i in range(steps)] + [0.0]
    torch.testing.assert_close(sig.double(), torch.tensor(want, dtype=torch.float64), atol=1e-6, rtol=0)
    assert torch.equal(sig, shifted_sigmas(steps, s))


@pytest.mark.parametrize("steps", [1, 3, 30, 100])
def test_monotonic_and_endpoints(steps):
    for (h, w), _ in SHIFT_TABLE.items():
        for f in FRAMES:
            sig = opensora_sigmas(steps, h, w, f)
            assert sig[0].item() == 1.0 and sig[-1].item() == 0.0
            assert bool((sig[1:] < sig[:-1]).all())


def test_larger_shift_keeps_more_noise():
    low = opensora_sigmas(30, 144, 256, 51)
    high = opensora_sigmas(30, 720, 1280, 408)
    assert bool((high[1:-1] > low[1:-1]).all())


def test_one_step_edge_case():
    assert opensora_sigmas(1, 240, 426, 51).tolist() == [1.0, 0.0]
    assert opensora_timesteps(1, 240, 426, 51).tolist() == [1000.0]


def test_shift_one_is_linear():
    sig = shifted_sigmas(4, 1.0, bf16=False)
    torch.testing.assert_close(sig, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))


def test_time_shift_matches_comfy_form():
    assert time_shift(0.5, 3.0) == pytest.approx(0.75)
    assert time_shift(1.0, 7.0) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        time_shift(0.5, 0.0)


def test_sigma_timestep_mapping_round_trip():
    t = opensora_timesteps(8, 240, 426, 51)
    sig = sigmas_from_timesteps(t)
    assert sig[-1].item() == 0.0
    torch.testing.assert_close(timesteps_from_sigmas(sig[:-1]), t)


def test_shift_temporal_factor():
    assert shift_latent_frames(1) == 1
    assert shift_latent_frames(51) == 15
    assert shift_latent_frames(408) == 120
    # The shift uses num_frames // 17 * 5, not the VAE's latent count, for frame counts off the 17 grid.
    assert shift_latent_frames(60) == 15
    assert presets.vae_latent_frames(60) == 18


def test_short_clips_use_the_image_factor_instead_of_a_zero_shift():
    # OpenSora's formula gives shift 0 for 2..16 frames (every timestep 0); we use the image factor.
    for frames in (2, 9, 16):
        assert shift_latent_frames(frames) == 1
        assert opensora_shift(240, 426, frames) == opensora_shift(240, 426, 1)
        assert opensora_sigmas(5, 240, 426, frames)[1].item() > 0.0
    assert opensora_shift(240, 426, 17) == pytest.approx(math.sqrt(240 * 426 / 512**2) * math.sqrt(5), abs=2e-2)


def test_invalid_arguments():
    with pytest.raises(ValueError):
        opensora_sigmas(0, 240, 426, 51)
    with pytest.raises(ValueError):
        opensora_sigmas(2.5, 240, 426, 51)
    with pytest.raises(ValueError):
        opensora_shift(-240, 426, 51)
    with pytest.raises(ValueError):
        opensora_shift(240, 426, 0)


# ---- presets -----------------------------------------------------------------------------------------------


def test_image_size_table():
    assert presets.image_size("240p", "9:16") == (240, 426)
    assert presets.image_size("240p", "16:9") == (426, 240)
    assert presets.image_size("144p", "3:4") == (166, 221)
    assert presets.image_size("480p", "4:3") == (740, 555)
    assert presets.image_size("720p", "1:1") == (960, 960)
    assert presets.image_size("720p", "3:4") == (832, 1110)
    for res in presets.RESOLUTIONS:
        assert set(presets.IMAGE_SIZES[res]) == set(presets.ASPECT_RATIOS)
        h, w = presets.image_size(res, "9:16")
        assert h < w  # OpenSora writes ratios as H:W
        assert presets.image_size(res, "16:9") == (w, h)
    with pytest.raises(ValueError):
        presets.image_size("1080p", "9:16")
    with pytest.raises(ValueError):
        presets.image_size("240p", "2:1")


def test_frame_presets_and_latent_frames():
    want = {"image": (1, 1), "2s": (51, 15), "4s": (102, 30), "8s": (204, 60), "16s": (408, 120)}
    for name, (frames, latent) in want.items():
        assert presets.num_frames_for(name) == frames
        assert presets.vae_latent_frames(frames) == latent
    # free values: full 17-frame chunks give 5 latents each, a remainder of r frames ceil(r / 4)
    for frames, latent in [(17, 5), (18, 6), (4, 1), (5, 2), (20, 6), (34, 10), (97, 28)]:
        assert presets.vae_latent_frames(frames) == latent
    assert presets.num_frames_for(97) == 97
    assert presets.num_frames_for("33") == 33
    with pytest.raises(ValueError):
        presets.num_frames_for("3s")
    with pytest.raises(ValueError):
        presets.vae_latent_frames(0)


def test_latent_shape_and_spec():
    assert presets.latent_shape(240, 426, 51) == (1, 4, 15, 30, 53)
    assert presets.latent_shape(480, 854, 102, batch_size=2) == (2, 4, 30, 60, 106)
    spec = presets.VideoSpec.from_preset()
    assert (spec.height, spec.width, spec.num_frames, spec.fps) == (240, 426, 51, 24)
    assert spec.latent_shape() == (1, 4, 15, 30, 53)
    assert spec.model_fps == 24.0
    image = presets.VideoSpec.from_preset("360p", "1:1", "image")
    assert image.latent_frames == 1 and image.model_fps == 120.0
    with pytest.raises(ValueError):
        presets.VideoSpec(240, 426, 0)
