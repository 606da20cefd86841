"""OpenSora VAE v1.2: temporal VAE layout, chunk arithmetic, pipeline shapes, causality, normalisation, loading.

The 2-D VAE is replaced by `PatchSpatialDouble` (a deterministic 8x block-average / nearest-upsampling stand-in),
so nothing here claims anything about the SDXL VAE; the tier-2 test runs ComfyUI's real 2-D VAE.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from comfyui_chai.opensora.comfy_vae import frames_for_latent, images_to_pixels, latent_info, make_latent_info, pixels_to_images
from comfyui_chai.opensora.loading import CheckpointError, KeyMismatchError, WrongArchitectureError
from comfyui_chai.opensora.presets import FRAME_PRESETS, vae_latent_frames
from comfyui_chai.opensora.vae import (SPATIAL_SCALE, OpenSoraVAE, Tiling, chunk_plan, default_num_frames, tile_starts,
                          tiled_apply)
from comfyui_chai.opensora.vae_loading import (CONFIG_METADATA_KEY, SPATIAL_PREFIX, infer_temporal_config,
                                  load_opensora_vae_file, load_temporal_part, save_opensora_vae)
from comfyui_chai.opensora.vae_temporal import (LATENT_SCALE, LATENT_SHIFT, CausalConv3d, TemporalPart, TemporalVAEConfig,
                                   depth_to_time, time_padding)
from doubles import PatchSpatialDouble

FIXTURE = Path(__file__).parent / "fixtures" / "opensora_vae_v12_keys.json"
TINY = TemporalVAEConfig(filters=8, num_res_blocks=1, channel_multipliers=(1, 2, 2, 2), num_groups=4)
TINY32 = TemporalVAEConfig(filters=32, num_res_blocks=1, channel_multipliers=(1, 1, 1, 1))  # groups 32 inferable


@pytest.fixture(scope="module")
def tiny() -> TemporalPart:
    torch.manual_seed(0)
    part = TemporalPart(TINY).eval()
    with torch.no_grad():  # non-trivial GroupNorm affine so that a wrong ordering would show
        for name, p in part.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return part


@pytest.fixture(scope="module")
def pipe(tiny) -> OpenSoraVAE:
    return OpenSoraVAE(tiny, PatchSpatialDouble())


def video(frames: int, h: int = 24, w: int = 34, seed: int = 1) -> torch.Tensor:
    return torch.rand(1, 3, frames, h, w, generator=torch.Generator().manual_seed(seed)) * 2 - 1


# ---------------------------------------------------------------------------------------------- layout

def test_full_temporal_vae_matches_checkpoint_key_fixture_on_meta_device():
    fixture = json.loads(FIXTURE.read_text())
    with torch.device("meta"):
        part = TemporalPart()
    state = {k: list(v.shape) for k, v in part.state_dict().items()}
    assert sorted(set(fixture["keys"]) - set(state)) == []
    assert sorted(set(state) - set(fixture["keys"])) == []
    assert {k: v for k, v in state.items() if fixture["keys"][k] != v} == {}
    assert len(state) == fixture["num_tensors"] == 269
    assert sum(k.startswith("temporal_vae.") for k in state) == fixture["temporal_tensors"] == 267
    params = sum(p.numel() for p in part.parameters())
    assert params == fixture["temporal_parameters"] == 309_687_144
    # The notes' 309,687,152 counts the 8 scale/shift values as well.
    assert sum(math.prod(v) for v in state.values()) == fixture["total_elements"] == 309_687_152
    enc = sum(p.numel() for p in part.temporal_vae.encoder.parameters())
    dec = sum(p.numel() for p in part.temporal_vae.decoder.parameters())
    assert (enc, dec) == (144_421_128, 165_265_924)
    assert state["temporal_vae.encoder.block_res_blocks.1.0.conv3.conv.weight"] == [256, 128, 1, 1, 1]
    assert state["temporal_vae.decoder.conv_blocks.2.conv.weight"] == [1024, 512, 3, 3, 3]
    assert state["scale"] == state["shift"] == [1, 4, 1, 1, 1]


def test_default_statistics_are_the_released_values():
    part = TemporalPart(TINY)
    assert part.scale.flatten().tolist() == pytest.approx(LATENT_SCALE)
    assert part.shift.flatten().tolist() == pytest.approx(LATENT_SHIFT)
    assert LATENT_SHIFT == (-0.10, 0.34, 0.27, 0.98) and LATENT_SCALE == (3.85, 2.32, 2.33, 3.06)


@pytest.mark.parametrize("kwargs, message", [
    ({"channel_multipliers": (1, 2)}, "temporal_downsample needs 1"),
    ({"filters": 12, "num_groups": 8}, "not divisible"),
    ({"activation": "gelu"}, "activation"),
    ({"num_res_blocks": 0}, "num_res_blocks"),
    ({"channel_multipliers": ()}, "non-empty"),
])
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TemporalVAEConfig(**kwargs)


def test_config_round_trips_through_dict():
    assert TemporalVAEConfig.from_dict(TINY.to_dict()) == TINY
    assert TemporalVAEConfig().time_downsample_factor == 4
    with pytest.raises(ValueError, match="unknown"):
        TemporalVAEConfig.from_dict({"nope": 1})


# ---------------------------------------------------------------------------------------------- building blocks

@pytest.mark.parametrize("kernel, stride, pad", [(3, 1, 2), (3, 2, 1), (1, 1, 0)])
def test_causal_conv_front_padding(kernel, stride, pad):
    conv = CausalConv3d(2, 2, kernel, time_stride=stride)
    assert conv.time_pad == pad
    x = torch.randn(1, 2, 8, 5, 6)
    y = conv(x)
    assert y.shape == (1, 2, 8 // stride, 5, 6)  # H/W kept by the symmetric k//2 padding


@pytest.mark.parametrize("stride", [1, 2])
def test_causal_conv_output_never_depends_on_later_frames(stride):
    torch.manual_seed(0)
    conv = CausalConv3d(3, 3, 3, time_stride=stride)
    x = torch.randn(1, 3, 8, 4, 4)
    k = 5
    x2 = x.clone()
    x2[:, :, k] += 1.0
    y, y2 = conv(x), conv(x2)
    # Output t sees padded inputs up to t*stride + 2, i.e. frames up to t*stride + 2 - time_pad.
    last_seen = [t * stride + 2 - conv.time_pad for t in range(y.shape[2])]
    for t, seen in enumerate(last_seen):
        if seen < k:
            assert torch.equal(y[:, :, t], y2[:, :, t]), t
        else:
            assert not torch.equal(y[:, :, t], y2[:, :, t]), t


def test_depth_to_time_channel_order():
    x = torch.arange(2 * 2 * 3, dtype=torch.float32).view(1, 4, 3, 1, 1)  # channels c*2+s, 3 frames
    y = depth_to_time(x, 2)
    assert y.shape == (1, 2, 6, 1, 1)
    for c in range(2):
        for t in range(3):
            for s in range(2):
                assert y[0, c, 2 * t + s, 0, 0] == x[0, c * 2 + s, t, 0, 0]


def test_time_padding():
    assert [time_padding(n) for n in (1, 2, 3, 4, 5, 17, 20)] == [3, 2, 1, 0, 3, 3, 0]


# ---------------------------------------------------------------------------------------------- chunk arithmetic

@pytest.mark.parametrize("preset, frames", sorted(FRAME_PRESETS.items()))
def test_chunk_plan_for_every_frame_preset(preset, frames):
    plan = chunk_plan(frames)
    expected_latents = {1: 1, 51: 15, 102: 30, 204: 60, 408: 120}[frames]
    assert sum(c.latents for c in plan) == expected_latents == vae_latent_frames(frames)
    assert sum(c.frames for c in plan) == frames
    if frames == 1:
        assert [(c.frames, c.padding, c.latents) for c in plan] == [(1, 3, 1)]
    else:
        assert len(plan) == frames // 17
        assert all((c.frames, c.padding, c.latents) == (17, 3, 5) for c in plan)
    assert [c.frame_start for c in plan] == [17 * i for i in range(len(plan))]
    assert [c.latent_start for c in plan] == [5 * i for i in range(len(plan))]
    assert default_num_frames(expected_latents) == frames


@pytest.mark.parametrize("frames", list(range(1, 40)) + [60, 100, 409])
def test_chunk_plan_for_any_frame_count(frames):
    plan = chunk_plan(frames)
    assert sum(c.latents for c in plan) == vae_latent_frames(frames)
    for c in plan:
        assert (c.frames + c.padding) % 4 == 0 and c.padding == (4 - c.frames % 4) % 4
        assert c.latents == math.ceil(c.frames / 4)
    assert plan[-1].frames == (frames % 17 or 17)


def test_default_num_frames_for_partial_chunks():
    assert [default_num_frames(t) for t in (1, 2, 5, 6, 7, 14, 15)] == [1, 5, 17, 18, 22, 47, 51]
    for t in range(1, 40):  # the smallest frame count with exactly t latent frames
        n = default_num_frames(t)
        assert vae_latent_frames(n) == t and (n == 1 or vae_latent_frames(n - 1) == t - 1)
    with pytest.raises(ValueError):
        default_num_frames(0)


# ---------------------------------------------------------------------------------------------- pipeline

@pytest.mark.parametrize("frames", [1, 5, 17, 18, 23, 51])
def test_encode_decode_shapes_and_frame_counts(pipe, frames):
    z = pipe.encode(video(frames))
    assert z.shape == (1, 4, vae_latent_frames(frames), 3, 4)  # 24x34 -> 3x4 latents
    assert torch.isfinite(z).all()
    x = pipe.decode(z, frames)
    assert x.shape == (1, 3, frames, 24, 32)  # 34 columns floor to 32
    assert torch.isfinite(x).all()


@pytest.mark.parametrize("frames", sorted(FRAME_PRESETS.values()))
def test_decode_frame_count_for_every_preset(pipe, frames):
    z = torch.randn(1, 4, vae_latent_frames(frames), 1, 2)
    x = pipe.decode(z, frames)
    assert x.shape == (1, 3, frames, 8, 16)
    assert pipe.decode(z).shape[2] == frames  # the default frame count is exact for the presets


def test_spatial_size_floors_to_multiples_of_eight(pipe):
    v = video(1, 240, 426)
    z = pipe.encode(v)
    assert z.shape == (1, 4, 1, 30, 53)
    assert pipe.decode(z, 1).shape == (1, 3, 1, 240, 424)
    assert pipe.latent_shape(51, 240, 426) == (1, 4, 15, 30, 53)


def test_decode_rejects_frame_counts_that_do_not_fit(pipe):
    z = torch.randn(1, 4, 14, 1, 1)  # 2 full chunks + 4 latents: 47..50 frames
    with pytest.raises(ValueError, match="cannot decode to 46 frames"):
        pipe.decode(z, 46)
    with pytest.raises(ValueError, match="cannot decode to 51 frames"):
        pipe.decode(z, 51)
    assert pipe.decode(z, 47).shape[2] == 47  # last chunk: 13 frames, 3 padding frames dropped
    assert pipe.decode(z).shape[2] == 47
    with pytest.raises(ValueError, match="expected latents"):
        pipe.decode(torch.randn(1, 8, 5, 1, 1))


def test_batch_of_videos_is_decoded_per_video(pipe):
    z = torch.randn(2, 4, 5, 2, 2)
    both = pipe.decode(z, 17)
    assert both.shape == (2, 3, 17, 16, 16)
    assert torch.allclose(both[1:], pipe.decode(z[1:], 17), atol=1e-5)


class RecordingDouble(PatchSpatialDouble):
    """The spatial double, recording the batches and inputs it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.encode_batches: list[int] = []
        self.decode_inputs: list[torch.Tensor] = []

    def encode(self, frames):
        self.encode_batches.append(frames.shape[0])
        return super().encode(frames)

    def decode(self, latents):
        self.decode_inputs.append(latents.clone())
        return super().decode(latents)


def test_micro_batches_of_four_frames_and_spatial_scale(tiny):
    spy = RecordingDouble()
    pipe = OpenSoraVAE(tiny, spy)
    v = video(20)
    z = pipe.encode(v, normalize=False)
    assert spy.encode_batches == [4, 4, 4, 4, 1, 3]  # chunk of 17, then chunk of 3
    # The temporal encoder sees the 2-D latents times 0.18215.
    expected = tiny.temporal_vae.encode(
        (PatchSpatialDouble().encode(v[0, :, :17].permute(1, 0, 2, 3)) * SPATIAL_SCALE).permute(1, 0, 2, 3)[None])
    assert torch.allclose(z[:, :, :5], expected, atol=1e-5)
    spy.decode_inputs.clear()
    pipe.decode(z, 20, normalized=False)
    assert [t.shape[0] for t in spy.decode_inputs] == [4, 4, 4, 4, 1, 3]
    first = tiny.temporal_vae.decode(z[:, :, :5], 17)[0, :, :4].permute(1, 0, 2, 3)
    assert torch.allclose(spy.decode_inputs[0], first / SPATIAL_SCALE, atol=1e-5)


def test_chunks_are_encoded_independently_so_later_frames_never_change_earlier_chunks(pipe):
    v = video(40)  # chunks of 17, 17, 6 frames -> 5, 5, 2 latents
    z = pipe.encode(v)
    for k, first_changed in ((20, 5), (35, 10), (17, 5)):
        v2 = v.clone()
        v2[:, :, k] += 0.5
        z2 = pipe.encode(v2)
        assert torch.equal(z[:, :, :first_changed], z2[:, :, :first_changed]), k
        assert not torch.allclose(z[:, :, first_changed:], z2[:, :, first_changed:]), k


def test_groupnorm_spans_time_inside_a_chunk(pipe):
    # Upstream's GroupNorm normalises over (channels, T, H, W), so inside one 17-frame chunk a later frame does
    # move earlier latents; causality holds across chunks (test above) and for every convolution.
    v = video(17)
    v2 = v.clone()
    v2[:, :, 16] += 0.5
    assert not torch.allclose(pipe.encode(v)[:, :, 0], pipe.encode(v2)[:, :, 0])


def test_decoded_chunks_depend_only_on_their_own_latents(pipe):
    z = torch.randn(1, 4, 10, 2, 2)
    z2 = z.clone()
    z2[:, :, 7] += 1.0
    x, x2 = pipe.decode(z, 34), pipe.decode(z2, 34)
    assert torch.equal(x[:, :, :17], x2[:, :, :17])
    assert not torch.allclose(x[:, :, 17:], x2[:, :, 17:])


def test_normalisation_round_trip(pipe, tiny):
    z = torch.randn(2, 4, 3, 2, 2)
    assert torch.allclose(tiny.denormalize(tiny.normalize(z)), z, atol=1e-6)
    scale = torch.tensor(LATENT_SCALE).view(1, 4, 1, 1, 1)
    shift = torch.tensor(LATENT_SHIFT).view(1, 4, 1, 1, 1)
    assert torch.allclose(tiny.normalize(z), (z - shift) / scale)
    v = video(9)
    raw = pipe.encode(v, normalize=False)
    model = pipe.encode(v)
    assert torch.allclose(model, (raw - shift) / scale, atol=1e-6)
    assert torch.allclose(pipe.decode(model, 9), pipe.decode(raw, 9, normalized=False), rtol=1e-4, atol=1e-4)


def test_stochastic_encode_is_seeded(pipe):
    v = video(6)
    a = pipe.encode(v, sample=True, seed=7)
    b = pipe.encode(v, sample=True, seed=7)
    c = pipe.encode(v, sample=True, seed=8)
    mean = pipe.encode(v)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)
    assert not torch.allclose(a, mean)
    gen = torch.Generator().manual_seed(7)
    assert torch.equal(pipe.encode(v, sample=True, generator=gen), a)


def test_tiles_cover_and_blend(pipe):
    assert tile_starts(53, 16, 4) == [0, 12, 24, 36, 37]
    assert tile_starts(10, 16, 4) == [0]
    x = torch.randn(2, 4, 30, 53)
    up = tiled_apply(lambda t: torch.nn.functional.interpolate(t, scale_factor=8), x, 16, 4, 8)
    assert torch.allclose(up, torch.nn.functional.interpolate(x, scale_factor=8), atol=1e-6)
    z = torch.randn(1, 4, 5, 30, 53)
    whole = pipe.decode(z, 17)
    tiled = pipe.decode(z, 17, tiling=Tiling(tile=16, overlap=4))
    assert torch.allclose(whole, tiled, atol=1e-5)  # the double is local, so tiling must not change it
    both = pipe.decode(z, 17, tiling=Tiling(tile=16, overlap=4, temporal=True))
    assert both.shape == whole.shape and torch.isfinite(both).all()
    with pytest.raises(ValueError):
        Tiling(tile=16, overlap=16)


# ---------------------------------------------------------------------------------------------- loading

def _tiny_spatial_sd() -> dict[str, torch.Tensor]:
    return {"decoder.conv_in.weight": torch.randn(8, 4, 3, 3), "encoder.conv_in.weight": torch.randn(8, 3, 3, 3)}


def test_tiny_checkpoint_with_official_names_loads(tmp_path, tiny):
    path = save_opensora_vae(tmp_path / "vae.safetensors", tiny, _tiny_spatial_sd())
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        keys = set(f.keys())
    assert "temporal_vae.encoder.conv_in.conv.weight" in keys and "scale" in keys and "shift" in keys
    assert SPATIAL_PREFIX + "decoder.conv_in.weight" in keys
    loaded = load_temporal_part(path)
    assert loaded.config == TINY
    for k, v in tiny.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    v = video(5)
    assert torch.equal(OpenSoraVAE(loaded, PatchSpatialDouble()).encode(v),
                       OpenSoraVAE(tiny, PatchSpatialDouble()).encode(v))
    temporal, spatial = load_opensora_vae_file(path, dtype="bf16")
    assert set(spatial) == {"decoder.conv_in.weight", "encoder.conv_in.weight"}
    assert next(temporal.parameters()).dtype == torch.bfloat16
    assert temporal.scale.dtype == torch.float32


def test_config_is_inferred_from_shapes_without_metadata(tmp_path):
    torch.manual_seed(0)
    part = TemporalPart(TINY32)
    from safetensors.torch import save_file

    path = tmp_path / "nometa.safetensors"
    save_file({("module." + k): v.contiguous() for k, v in part.state_dict().items()}, str(path))
    loaded = load_temporal_part(path)
    assert loaded.config == TINY32
    assert torch.equal(loaded.temporal_vae.decoder.conv_out.conv.weight, part.temporal_vae.decoder.conv_out.conv.weight)
    two_blocks = TemporalPart(TemporalVAEConfig(filters=32, num_res_blocks=2))
    shapes = {k: tuple(v.shape) for k, v in two_blocks.state_dict().items()}
    assert infer_temporal_config(shapes) == TemporalVAEConfig(filters=32, num_res_blocks=2)
    with torch.device("meta"):
        full = {k: tuple(v.shape) for k, v in TemporalPart().state_dict().items()}
    assert infer_temporal_config(full) == TemporalVAEConfig()


def test_metadata_that_contradicts_the_shapes_is_refused(tmp_path, tiny):
    wrong = json.dumps({**TINY.to_dict(), "filters": 16})
    path = save_opensora_vae(tmp_path / "v.safetensors", tiny, extra_metadata={CONFIG_METADATA_KEY: wrong})
    with pytest.raises(CheckpointError, match="filters"):
        load_temporal_part(path)


def test_missing_and_misshapen_tensors_are_listed(tmp_path, tiny):
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in tiny.state_dict().items()}
    del state["temporal_vae.decoder.conv_out.conv.bias"]
    state["temporal_vae.post_quant_conv.conv.bias"] = torch.zeros(5)
    meta = {CONFIG_METADATA_KEY: json.dumps(TINY.to_dict())}
    save_file(state, str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(KeyMismatchError) as info:
        load_temporal_part(tmp_path / "bad.safetensors")
    assert "temporal_vae.decoder.conv_out.conv.bias" in str(info.value)
    assert "temporal_vae.post_quant_conv.conv.bias (expected [4], found [5])" in str(info.value)


def test_statistics_are_required_unless_not_strict(tmp_path, tiny):
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in tiny.state_dict().items() if k not in ("scale", "shift")}
    save_file(state, str(tmp_path / "nostats.safetensors"), metadata={CONFIG_METADATA_KEY: json.dumps(TINY.to_dict())})
    with pytest.raises(KeyMismatchError, match="scale"):
        load_temporal_part(tmp_path / "nostats.safetensors")
    part = load_temporal_part(tmp_path / "nostats.safetensors", strict=False)
    assert part.scale.flatten().tolist() == pytest.approx(LATENT_SCALE)


@pytest.mark.parametrize("keys, words", [
    ({"x_embedder.proj.weight": (8, 4, 1, 2, 2), "spatial_blocks.0.attn.qkv.weight": (24, 8),
      "temporal_blocks.0.attn.qkv.weight": (24, 8)}, "STDiT3"),
    ({"encoder.conv_in.weight": (8, 3, 3, 3), "decoder.up_blocks.0.resnets.0.norm1.weight": (8,)}, "2-D image VAE"),
    ({"spatial_vae.module.encoder.conv_in.weight": (8, 3, 3, 3)}, "only the 2-D part"),
    ({"model.diffusion_model.input_blocks.0.0.weight": (8, 4, 3, 3)}, "UNet"),
])
def test_checkpoint_of_the_wrong_kind_is_refused_clearly(tmp_path, keys, words):
    from safetensors.torch import save_file

    path = tmp_path / "other.safetensors"
    save_file({k: torch.zeros(s) for k, s in keys.items()}, str(path))
    with pytest.raises(WrongArchitectureError) as info:
        load_temporal_part(path)
    message = str(info.value)
    assert words in message and "not an OpenSora VAE v1.2 checkpoint" in message and "other.safetensors" in message


def test_temporal_only_file_is_refused_for_the_full_vae(tmp_path, tiny):
    path = save_opensora_vae(tmp_path / "t.safetensors", tiny)
    with pytest.raises(CheckpointError, match="no spatial_vae.module"):
        load_opensora_vae_file(path)


def test_non_safetensors_and_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_temporal_part(tmp_path / "absent.safetensors")
    (tmp_path / "x.ckpt").write_bytes(b"0")
    with pytest.raises(CheckpointError, match="safetensors"):
        load_temporal_part(tmp_path / "x.ckpt")


# ---------------------------------------------------------------------------------------------- LATENT dict helpers

def test_latent_info_and_frame_count_resolution():
    samples = torch.zeros(1, 4, 15, 30, 53)
    latent = {"samples": samples, "opensora": make_latent_info(240, 426, 51, 24)}
    assert latent_info(latent) == {"height": 240, "width": 426, "num_frames": 51, "fps": 24.0}
    assert frames_for_latent(latent) == 51
    assert frames_for_latent({"samples": samples}) == 51
    assert frames_for_latent({"samples": samples[:, :, :14], "opensora": {"num_frames": 49}}) == 49
    assert frames_for_latent({"samples": samples[:, :, :14], "opensora": {"num_frames": 49}}, override=47) == 47
    with pytest.raises(ValueError, match="num_frames input says 52"):
        frames_for_latent({"samples": samples}, override=52)
    assert latent_info({"samples": samples, "opensora": {"fps": "x", "num_frames": True}}) == {}


def test_image_pixel_conversions():
    images = torch.rand(5, 16, 24, 3)
    pixels = images_to_pixels(images)
    assert pixels.shape == (1, 3, 5, 16, 24)
    assert pixels.min() >= -1 and pixels.max() <= 1
    assert torch.allclose(pixels_to_images(pixels)[0], images, atol=1e-6)
    assert pixels_to_images(torch.full((1, 3, 1, 2, 2), 3.0)).max() == 1.0
