"""Tier 2: the OpenSora VAE nodes inside a real ComfyUI, on a tiny checkpoint with the official tensor names.

The checkpoint is built at test time: a tiny SD-style 2-D VAE (ComfyUI's own AutoencoderKL with 32 channels,
renamed to the diffusers names the official file uses) under `spatial_vae.module.`, plus a tiny temporal VAE
under `temporal_vae.` with `scale` / `shift`. It goes through the loader node (ComfyUI builds its VAE from the
stripped 2-D part), the encode and decode nodes, CreateVideo and SaveVideo, and the mp4 is read back.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

if not os.environ.get("COMFYUI_DIR"):
    pytest.skip("tier 2 needs a ComfyUI checkout: set COMFYUI_DIR (see tests/tier2/conftest.py)",
                allow_module_level=True)

import torch  # noqa: E402

NODE_IDS = {"CHAI_OpenSoraVAELoader": "CHAI OpenSora VAE Loader", "CHAI_OpenSoraVAEDecode": "CHAI OpenSora VAE Decode",
            "CHAI_OpenSoraVAEEncode": "CHAI OpenSora VAE Encode"}
VAE_FILE = "tiny_opensora_vae.safetensors"
SD_VAE_FILE = "tiny_sd_vae.safetensors"
TINY_DDCONFIG = {"double_z": True, "z_channels": 4, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 32,
                 "ch_mult": [1, 1, 1, 1], "num_res_blocks": 1, "attn_resolutions": [], "dropout": 0.0}
ATTN_TO_DIFFUSERS = {"norm": "group_norm", "q": "to_q", "k": "to_k", "v": "to_v", "proj_out": "to_out.0"}


def ldm_to_diffusers(ldm: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename an LDM-format 2-D VAE state dict to diffusers names (inverse of ComfyUI's converter)."""
    from comfy.diffusers_convert import vae_conversion_map

    out = {}
    for key, value in ldm.items():
        new = key
        for sd_part, hf_part in vae_conversion_map:
            new = new.replace(sd_part, hf_part)
        m = re.match(r"^(.*mid_block\.attentions\.0\.)([a-z_]+)\.(weight|bias)$", new)
        if m:
            new = f"{m.group(1)}{ATTN_TO_DIFFUSERS[m.group(2)]}.{m.group(3)}"
            if value.ndim == 4:
                value = value[:, :, 0, 0]  # diffusers attention projections are Linear layers
        out[new] = value
    return out


def tiny_spatial_state_dict() -> dict[str, torch.Tensor]:
    """A tiny diffusers-format AutoencoderKL state dict, random but well scaled, checked against ComfyUI's converter."""
    from comfy.diffusers_convert import convert_vae_state_dict
    from comfy.ldm.models.autoencoder import AutoencoderKL

    model = AutoencoderKL(ddconfig=TINY_DDCONFIG, embed_dim=4)
    gen = torch.Generator().manual_seed(0)
    ldm = {}
    for key, value in model.state_dict().items():
        if value.ndim == 1:
            ldm[key] = torch.ones(value.shape) if "norm" in key and key.endswith("weight") else torch.zeros(value.shape)
        else:
            fan_in = value[0].numel()
            ldm[key] = torch.randn(value.shape, generator=gen) / fan_in ** 0.5
    diffusers = ldm_to_diffusers(ldm)
    assert "decoder.up_blocks.0.resnets.0.norm1.weight" in diffusers
    assert "encoder.mid_block.attentions.0.to_q.weight" in diffusers
    back = convert_vae_state_dict(dict(diffusers))
    assert {k: tuple(v.shape) for k, v in back.items()} == {k: tuple(v.shape) for k, v in ldm.items()}
    return diffusers


@pytest.fixture(scope="module")
def vae_dir(comfy, tmp_path_factory) -> Path:
    """A `vae` model folder holding the tiny OpenSora VAE and a plain 2-D VAE."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("vae")
    temporal_mod = comfy.pack_module("opensora.vae_temporal")
    loading = comfy.pack_module("opensora.vae_loading")
    torch.manual_seed(0)
    config = temporal_mod.TemporalVAEConfig(filters=32, num_res_blocks=1, channel_multipliers=(1, 1, 1, 1))
    temporal = temporal_mod.TemporalPart(config)
    spatial = tiny_spatial_state_dict()
    loading.save_opensora_vae(folder / VAE_FILE, temporal, spatial)
    save_file({k: v.contiguous() for k, v in spatial.items()}, str(folder / SD_VAE_FILE))
    comfy.folder_paths.add_model_folder_path("vae", str(folder))
    return folder


def loader(name: str = VAE_FILE, dtype: str = "fp32") -> dict:
    return {"class_type": "CHAI_OpenSoraVAELoader", "inputs": {"vae_name": name, "temporal_dtype": dtype}}


def video_prompt(frames: int, width: int = 42, height: int = 32, tile_size: int = 0, fps: float = 12.0) -> dict:
    """EmptyImage frames -> encode -> decode -> CreateVideo(fps from decode) -> SaveVideo mp4."""
    return {
        "1": loader(),
        "2": {"class_type": "EmptyImage", "inputs": {"width": width, "height": height, "batch_size": frames,
                                                     "color": 0x3366CC}},
        "3": {"class_type": "CHAI_OpenSoraVAEEncode",
              "inputs": {"pixels": ["2", 0], "vae": ["1", 0], "mode": "mean", "seed": 0, "fps": fps}},
        "4": {"class_type": "CHAI_OpenSoraVAEDecode",
              "inputs": {"samples": ["3", 0], "vae": ["1", 0], "num_frames": 0, "fps": 24.0,
                         "tile_size": tile_size, "tile_overlap": 16}},
        "5": {"class_type": "CreateVideo", "inputs": {"images": ["4", 0], "fps": ["4", 1]}},
        "6": {"class_type": "SaveVideo", "inputs": {"video": ["5", 0], "filename_prefix": "chai/opensora_vae",
                                                    "format": "mp4", "codec": "h264"}},
    }


def saved_video(comfy, result, node_id: str = "6") -> Path:
    assert result.success, result.error
    (saved,) = result.outputs[node_id]["images"]
    return Path(comfy.folder_paths.get_output_directory()) / saved["subfolder"] / saved["filename"]


def read_video(path: Path) -> tuple[int, int, int, float]:
    """(frames, width, height, fps) of a saved video, decoded with PyAV."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [f for f in container.decode(stream)]
        return len(frames), frames[0].width, frames[0].height, float(stream.average_rate)


def test_nodes_registered_with_category_and_tooltips(comfy):
    for node_id, display in NODE_IDS.items():
        cls = comfy.nodes.NODE_CLASS_MAPPINGS[node_id]
        assert comfy.nodes.NODE_DISPLAY_NAME_MAPPINGS[node_id] == display
        assert cls.CATEGORY == "CHAI/OpenSora"
        inputs = cls.INPUT_TYPES()
        declared = {**inputs.get("required", {}), **inputs.get("optional", {})}
        for name, spec in declared.items():
            options = spec[1] if len(spec) > 1 else {}
            assert len(options.get("tooltip") or "") > 20, f"{node_id}.{name} lacks a useful tooltip"
    assert tuple(comfy.nodes.NODE_CLASS_MAPPINGS["CHAI_OpenSoraVAELoader"].RETURN_TYPES) == ("VAE",)
    assert tuple(comfy.nodes.NODE_CLASS_MAPPINGS["CHAI_OpenSoraVAEDecode"].RETURN_TYPES) == ("IMAGE", "FLOAT")
    assert tuple(comfy.nodes.NODE_CLASS_MAPPINGS["CHAI_OpenSoraVAEEncode"].RETURN_TYPES) == ("LATENT",)


def test_loader_builds_comfyui_vae_for_the_2d_part(comfy, vae_dir):
    comfy_vae = comfy.pack_module("opensora.comfy_vae")
    vae = comfy_vae.load_opensora_vae(str(vae_dir / VAE_FILE), "fp32")
    import comfy.sd

    assert isinstance(vae.spatial_vae, comfy.sd.VAE)
    ddconfig = vae.spatial_vae.first_stage_model.encoder.ch, vae.spatial_vae.first_stage_model.encoder.num_resolutions
    assert ddconfig == (32, 4)
    assert vae.temporal.config.filters == 32
    z = vae.encode_video(torch.rand(6, 40, 58, 3))
    assert z.shape == (1, 4, 2, 5, 7)
    images = vae.decode_video(z, 6)
    assert images.shape == (1, 6, 40, 56, 3) and 0 <= images.min() and images.max() <= 1


def test_encode_decode_and_save_video_inside_comfyui(comfy, vae_dir):
    frames = 20  # 17 + 3: the recorded frame count matters (the default for 6 latent frames would be 18)
    result = comfy.run(video_prompt(frames))
    path = saved_video(comfy, result)
    assert path.suffix == ".mp4" and path.is_file()
    count, width, height, fps = read_video(path)
    assert (count, width, height) == (frames, 40, 32)  # 42 columns floor to 40
    assert fps == pytest.approx(12.0)  # recorded by the encode node, passed on by the decode node


def test_tiled_decode_inside_comfyui(comfy, vae_dir):
    result = comfy.run(video_prompt(5, width=128, height=64, tile_size=64))  # 8x16 latents: 3 tiles of 8x8
    count, width, height, _ = read_video(saved_video(comfy, result))
    assert (count, width, height) == (5, 128, 64)


def test_comfyui_vae_decode_node_accepts_the_opensora_vae(comfy, vae_dir):
    prompt = video_prompt(17)
    prompt["4"] = {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["1", 0]}}
    prompt["5"]["inputs"]["fps"] = 24.0
    count, width, height, fps = read_video(saved_video(comfy, comfy.run(prompt)))
    assert (count, width, height, fps) == (17, 40, 32, 24.0)


def test_comfyui_vae_encode_node_gives_the_same_latent(comfy, vae_dir):
    comfy_vae = comfy.pack_module("opensora.comfy_vae")
    vae = comfy_vae.load_opensora_vae(str(vae_dir / VAE_FILE), "fp32")
    images = torch.rand(9, 16, 24, 3, generator=torch.Generator().manual_seed(3))
    (latent,) = comfy.nodes.VAEEncode().encode(vae, images)
    assert torch.equal(latent["samples"], vae.encode_video(images))
    (decoded,) = comfy.nodes.VAEDecode().decode(vae, {"samples": latent["samples"]})
    assert decoded.shape == (9, 16, 24, 3)  # VAEDecode sees no frame count; 9 is the smallest for 3 latents


def test_wrong_files_are_refused_with_a_description(comfy, vae_dir):
    result = comfy.run({"1": loader(SD_VAE_FILE), "2": {"class_type": "CHAI_OpenSoraVAEDecode", "inputs": {
        "samples": ["3", 0], "vae": ["1", 0], "num_frames": 0, "fps": 24.0, "tile_size": 0, "tile_overlap": 16}},
        "3": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "4": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}}})
    assert result.valid and not result.success
    message = result.error["exception_message"]
    assert "2-D image VAE" in message and "not an OpenSora VAE v1.2 checkpoint" in message


def test_other_vae_objects_are_refused_by_the_decode_node(comfy, vae_dir):
    nodes_mod = comfy.pack_module("nodes.opensora_vae_nodes")
    errors = comfy.pack_module("nodes.errors")
    latent = {"samples": torch.zeros(1, 4, 5, 2, 2)}
    with pytest.raises(errors.ChaiNodeError, match="not the OpenSora VAE v1.2"):
        nodes_mod.OpenSoraVAEDecode.execute(latent, object(), 0, 24.0, 0, 16)


def test_sdxl_sized_2d_part_gets_comfyui_default_config(comfy):
    from comfy.diffusers_convert import convert_vae_state_dict
    from comfy.ldm.models.autoencoder import AutoencoderKL

    comfy_vae = comfy.pack_module("opensora.comfy_vae")
    sdxl = {**TINY_DDCONFIG, "ch": 128, "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2}
    with torch.device("meta"):
        model = AutoencoderKL(ddconfig=sdxl, embed_dim=4)
    ldm = model.state_dict()
    assert sum(v.numel() for v in ldm.values()) == 83_653_863  # the SDXL VAE size in the notes
    ddconfig, embed_dim = comfy_vae.infer_ldm_vae_config(convert_vae_state_dict(ldm_to_diffusers(ldm)))
    assert (ddconfig, embed_dim) == (sdxl, 4)
