"""Read OpenSora-VAE-v1.2 checkpoints: the temporal part streamed into `TemporalPart`, the 2-D part handed out as is.

The official `hpcai-tech/OpenSora-VAE-v1.2/model.safetensors` holds `spatial_vae.module.*` (a diffusers-format SDXL
AutoencoderKL), `temporal_vae.*` and the `scale` / `shift` latent statistics. The temporal configuration is read
from the shapes (and from the `opensora_vae_temporal_config` metadata that `save_opensora_vae` writes, the only
place a GroupNorm group count other than 32 can come from). Tensors are read one at a time, so the peak memory is
the temporal model in the target dtype plus one tensor as stored. Files of another kind are refused with a message
saying what they look like.
"""
from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor

from .loading import (CheckpointError, KeyMismatchError, TensorSource, WrongArchitectureError, assign_tensor,
                      config_from_metadata, describe_checkpoint, find_prefix, name_list, parse_dtype)
from .vae_temporal import LATENT_SCALE, LATENT_SHIFT, TemporalPart, TemporalVAEConfig

log = logging.getLogger(__name__)

TEMPORAL_PREFIX = "temporal_vae."
SPATIAL_PREFIX = "spatial_vae.module."
STAT_KEYS = ("scale", "shift")
SIGNATURE_KEY = "temporal_vae.encoder.conv_in.conv.weight"
OUTER_PREFIXES = ("", "module.", "model.", "vae.")
CONFIG_METADATA_KEY = "opensora_vae_temporal_config"
ARCH_METADATA_KEY = "chai_arch"
ARCH_NAME = "opensora_vae_v1_2"


def find_vae_prefix(keys: Any) -> str | None:
    """Prefix in front of `temporal_vae.*` ('' in the official file), or None when there is no temporal VAE."""
    keys = set(keys)
    for prefix in OUTER_PREFIXES:
        if prefix + SIGNATURE_KEY in keys:
            return prefix
    return None


def describe_non_vae(keys: Any) -> str:
    """What a checkpoint without `temporal_vae.*` looks like, for the refusal message."""
    keys = set(keys)
    if find_prefix(keys) is not None:
        return "an Open-Sora 1.2 STDiT3 diffusion model (x_embedder, spatial_blocks, temporal_blocks): load it " \
               "with the OpenSora model loader instead"
    if any(k.startswith(SPATIAL_PREFIX) for k in keys):
        return "only the 2-D part of an OpenSora VAE (spatial_vae.module.*) without its temporal_vae.* part"
    image_vae = ("decoder.up_blocks.0.resnets.0.norm1.weight", "decoder.up.0.block.0.norm1.weight",
                 "first_stage_model.decoder.conv_in.weight", "decoder.conv_in.weight", "encoder.conv_in.weight")
    if any(k in keys for k in image_vae):
        return "a 2-D image VAE (SD / SDXL style, no temporal_vae.* tensors): use ComfyUI's Load VAE for it"
    return describe_checkpoint(keys)


def _block_indices(shapes: Mapping[str, Any], pattern: str) -> list[int]:
    """Sorted distinct integers captured by `pattern` (one group) over the names."""
    rx = re.compile(pattern)
    return sorted({int(m.group(1)) for k in shapes if (m := rx.match(k))})


def _need(shapes: Mapping[str, Any], key: str) -> tuple[int, ...]:
    """Shape of a tensor the configuration cannot be inferred without."""
    if key not in shapes:
        raise CheckpointError(f"cannot infer the temporal VAE configuration: tensor {key!r} is missing")
    return tuple(shapes[key])


def infer_temporal_config(shapes: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> TemporalVAEConfig:
    """TemporalVAEConfig from `temporal_vae.*` shapes (no outer prefix), checked against the metadata if present."""
    enc, dec = "temporal_vae.encoder", "temporal_vae.decoder"
    conv_in = _need(shapes, f"{enc}.conv_in.conv.weight")
    filters, in_out = conv_in[0], conv_in[1]
    levels = _block_indices(shapes, rf"^{enc}\.block_res_blocks\.(\d+)\.")
    res_blocks = _block_indices(shapes, rf"^{enc}\.block_res_blocks\.0\.(\d+)\.")
    if not levels or not res_blocks:
        raise CheckpointError("cannot infer the temporal VAE configuration: no encoder.block_res_blocks tensors")
    widths = [_need(shapes, f"{enc}.block_res_blocks.{i}.0.conv1.conv.weight")[0] for i in levels]
    if any(w % filters for w in widths):
        raise CheckpointError(f"level widths {widths} are not multiples of conv_in's {filters} filters")
    down = [f"{enc}.conv_blocks.{i}.conv.weight" in shapes for i in range(len(levels) - 1)]
    latent2 = _need(shapes, f"{enc}.conv2.conv.weight")[0]
    embed2 = _need(shapes, "temporal_vae.quant_conv.conv.weight")[0]
    inferred: dict[str, Any] = {
        "in_out_channels": in_out, "latent_embed_dim": latent2 // 2, "embed_dim": embed2 // 2, "filters": filters,
        "num_res_blocks": len(res_blocks), "channel_multipliers": tuple(w // filters for w in widths),
        "temporal_downsample": tuple(down),
    }
    meta_cfg = config_from_metadata(metadata, CONFIG_METADATA_KEY, TemporalVAEConfig, inferred)
    if meta_cfg is not None:
        return meta_cfg
    if f"{dec}.conv1.conv.weight" in shapes and shapes[f"{dec}.conv1.conv.weight"][0] != widths[-1]:
        raise CheckpointError("decoder.conv1 width does not match the encoder's deepest level")
    groups = 32  # the released value; not visible in the shapes
    if any(w % groups for w in widths):
        raise CheckpointError(f"level widths {widths} are not divisible by 32 GroupNorm groups: store the "
                              f"configuration in the {CONFIG_METADATA_KEY!r} metadata (save_opensora_vae does) "
                              f"or pass config=")
    try:
        return TemporalVAEConfig(num_groups=groups, **inferred)
    except ValueError as exc:
        raise CheckpointError(f"inferred an invalid temporal VAE configuration: {exc}") from exc


def load_temporal_from_source(source: TensorSource, dtype: str | torch.dtype = torch.float32,
                              device: str | torch.device = "cpu", config: TemporalVAEConfig | None = None,
                              strict: bool = True, max_names: int = 20) -> TemporalPart:
    """TemporalPart (eval, no grad) from a checkpoint's `temporal_vae.*`, `scale` and `shift` tensors."""
    dtype = parse_dtype(dtype)
    prefix = find_vae_prefix(source.shapes)
    if prefix is None:
        some = ", ".join(sorted(source.shapes)[:3]) or "no tensors"
        raise WrongArchitectureError(
            f"{source.name} is not an OpenSora VAE v1.2 checkpoint: it looks like {describe_non_vae(source.shapes)} "
            f"(keys such as {some}); the OpenSora VAE has {SIGNATURE_KEY}, spatial_vae.module.* and scale/shift")
    ours = {k[len(prefix):]: k for k in source.shapes
            if k.startswith(prefix + TEMPORAL_PREFIX) or (k.startswith(prefix) and k[len(prefix):] in STAT_KEYS)}
    if config is None:
        config = infer_temporal_config({k: source.shapes[v] for k, v in ours.items()}, source.metadata)
    with torch.device("meta"):
        model = TemporalPart(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(k for k in expected if k not in ours)
    unexpected = sorted(k for k in ours if k not in expected)
    mismatched = [(k, expected[k], tuple(source.shapes[ours[k]])) for k in sorted(ours)
                  if k in expected and tuple(source.shapes[ours[k]]) != expected[k]]
    stats_missing = [k for k in missing if k in STAT_KEYS]
    hard_missing = [k for k in missing if k not in STAT_KEYS or strict]
    if hard_missing or mismatched or (unexpected and strict):
        parts = []
        if hard_missing:
            parts.append(f"{len(hard_missing)} missing: {name_list(hard_missing, max_names)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected: {name_list(unexpected, max_names)}")
        if mismatched:
            shown = [f"{k} (expected {list(e)}, found {list(f)})" for k, e, f in mismatched]
            parts.append(f"{len(mismatched)} with another shape: {name_list(shown, max_names)}")
        arch = f"filters {config.filters}, multipliers {list(config.channel_multipliers)}, " \
               f"{config.num_res_blocks} res blocks"
        raise KeyMismatchError(f"{source.name} does not match the OpenSora temporal VAE ({arch}): " + "; ".join(parts),
                               hard_missing, unexpected, mismatched)
    device = torch.device(device)
    for name in expected:
        if name in stats_missing:
            continue
        tensor = source.read(ours[name])
        # The latent statistics stay float32: they are tiny and the normalisation is done in float32.
        target = torch.float32 if name in STAT_KEYS else dtype
        assign_tensor(model, name, tensor.to(device=device, dtype=target if tensor.is_floating_point() else None))
        del tensor
    for name in stats_missing:
        log.warning("%s has no %r tensor; using the released OpenSora VAE v1.2 value", source.name, name)
        values = LATENT_SCALE if name == "scale" else LATENT_SHIFT
        assign_tensor(model, name, torch.tensor(values, dtype=torch.float32, device=device).view(1, -1, 1, 1, 1))
    return model.eval().requires_grad_(False)


def _safetensors_source(path: Path, handle: Any) -> TensorSource:
    """TensorSource over an open safetensors handle (header only until read)."""
    shapes = {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}
    return TensorSource(str(path), shapes, dict(handle.metadata() or {}), handle.get_tensor)


def _check_file(path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"OpenSora VAE checkpoint not found: {path}")
    if path.suffix.lower() not in (".safetensors", ".sft"):
        raise CheckpointError(f"{path.name}: only .safetensors OpenSora VAE files are supported")
    return path


def load_temporal_part(path: str | os.PathLike, dtype: str | torch.dtype = torch.float32,
                       device: str | torch.device = "cpu", config: TemporalVAEConfig | None = None,
                       strict: bool = True) -> TemporalPart:
    """Stream the temporal VAE and the latent statistics out of an OpenSora VAE .safetensors file."""
    from safetensors import safe_open

    path = _check_file(path)
    with safe_open(str(path), framework="pt", device="cpu") as handle:
        return load_temporal_from_source(_safetensors_source(path, handle), dtype, device, config, strict)


def load_opensora_vae_file(path: str | os.PathLike, dtype: str | torch.dtype = torch.float32,
                           device: str | torch.device = "cpu", config: TemporalVAEConfig | None = None,
                           strict: bool = True) -> tuple[TemporalPart, dict[str, Tensor]]:
    """(TemporalPart, 2-D VAE state dict with `spatial_vae.module.` stripped) from one pass over the file."""
    from safetensors import safe_open

    path = _check_file(path)
    with safe_open(str(path), framework="pt", device="cpu") as handle:
        source = _safetensors_source(path, handle)
        temporal = load_temporal_from_source(source, dtype, device, config, strict)
        prefix = find_vae_prefix(source.shapes) or ""
        spatial_prefix = prefix + SPATIAL_PREFIX
        spatial = {k[len(spatial_prefix):]: handle.get_tensor(k) for k in source.shapes if k.startswith(spatial_prefix)}
    if not spatial:
        raise CheckpointError(f"{path.name} has the temporal VAE but no {SPATIAL_PREFIX}* tensors (the 2-D SDXL "
                              f"part); the OpenSora VAE v1.2 file holds both")
    return temporal, spatial


def save_opensora_vae(path: str | os.PathLike, temporal: TemporalPart,
                      spatial_state_dict: Mapping[str, Tensor] | None = None,
                      extra_metadata: Mapping[str, str] | None = None) -> Path:
    """Write a checkpoint with the official names (`temporal_vae.*`, scale, shift, `spatial_vae.module.*`)."""
    from safetensors.torch import save_file

    path = Path(path)
    state = {k: v.detach().contiguous().cpu() for k, v in temporal.state_dict().items()}
    for k, v in (spatial_state_dict or {}).items():
        state[SPATIAL_PREFIX + k] = v.detach().contiguous().cpu()
    meta = {"format": "pt", ARCH_METADATA_KEY: ARCH_NAME, CONFIG_METADATA_KEY: json.dumps(temporal.config.to_dict())}
    meta.update(extra_metadata or {})
    save_file(state, str(path), metadata=meta)
    return path


__all__ = [
    "TEMPORAL_PREFIX", "SPATIAL_PREFIX", "CONFIG_METADATA_KEY", "find_vae_prefix", "describe_non_vae",
    "infer_temporal_config", "load_temporal_from_source", "load_temporal_part", "load_opensora_vae_file",
    "save_opensora_vae",
]
