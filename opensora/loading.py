"""Load and save STDiT3 checkpoints: streamed tensor by tensor, cast on the way, architecture checked first.

The official `hpcai-tech/OpenSora-STDiT-v3/model.safetensors` (fp32, bare module names) loads as is; so does any
smaller STDiT3 whose configuration can be read from its shapes (and from the `stdit3_config` metadata that
`save_stdit3` writes, which is the only place a head count other than hidden/72 can come from). The model is built
on the meta device and each tensor is read, cast and assigned in turn, so the peak memory is the model in the
target dtype plus one tensor as stored.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor, nn

from .stdit3 import STDiT3, STDiT3Config, rope_frequencies

ARCH_METADATA_KEY = "chai_arch"
ARCH_NAME = "stdit3"
CONFIG_METADATA_KEY = "stdit3_config"
XL_HEAD_DIM = 72  # head width of the released model; the fallback when nothing else gives the head count
OPTIONAL_KEYS = frozenset({"rope.freqs"})  # deterministic, recomputed when absent
KNOWN_PREFIXES = ("model.diffusion_model.", "diffusion_model.", "module.", "model.")
SIGNATURE_KEYS = ("x_embedder.proj.weight", "spatial_blocks.0.attn.qkv.weight")

_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as STDiT3."""


class WrongArchitectureError(CheckpointError):
    """The checkpoint is some other model (the message says what it looks like)."""


class KeyMismatchError(CheckpointError):
    """The checkpoint is STDiT3-like but its tensor names or shapes do not match the configuration."""

    def __init__(self, message: str, missing: Sequence[str], unexpected: Sequence[str],
                 mismatched: Sequence[tuple[str, tuple[int, ...], tuple[int, ...]]]) -> None:
        super().__init__(message)
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.mismatched = list(mismatched)


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """torch dtype for 'fp32' / 'fp16' / 'bf16' (and their long names) or a float torch.dtype."""
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"unsupported STDiT3 dtype {dtype}; use float32, float16 or bfloat16")
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"unsupported STDiT3 dtype {dtype!r}; use one of fp32, fp16, bf16")
    return _DTYPES[key]


# ---------------------------------------------------------------------------------------------- tensor sources

@dataclass
class TensorSource:
    """Names, shapes and metadata of a checkpoint, with a reader for one tensor at a time."""

    name: str
    shapes: dict[str, tuple[int, ...]]
    metadata: dict[str, str]
    read: Callable[[str], Tensor]


def _safetensors_source(path: Path, handle: Any) -> TensorSource:
    """Source over an open safetensors handle (header only until `read`)."""
    shapes = {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}
    return TensorSource(str(path), shapes, dict(handle.metadata() or {}), handle.get_tensor)


def _mapping_source(state_dict: Mapping[str, Tensor], name: str, metadata: Mapping[str, str] | None) -> TensorSource:
    """Source over an in-memory (or mmapped) state dict."""
    shapes = {k: tuple(v.shape) for k, v in state_dict.items() if isinstance(v, Tensor)}
    return TensorSource(name, shapes, dict(metadata or {}), lambda k: state_dict[k])


def read_checkpoint_header(path: str | os.PathLike) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """(name -> shape, metadata) of a safetensors file without reading any tensor data."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as handle:
        src = _safetensors_source(Path(path), handle)
    return src.shapes, src.metadata


# ---------------------------------------------------------------------------------------------- architecture

def _has(keys: set[str], *needles: str) -> bool:
    """True when some single key contains every one of the needles."""
    return any(all(n in k for n in needles) for k in keys)


_LOOKALIKES: tuple[tuple[Callable[[set[str]], bool], str], ...] = (
    (lambda k: _has(k, "lora_") or _has(k, ".lora_A.") or _has(k, ".lora_down."),
     "a LoRA / adapter file (not a full model)"),
    (lambda k: _has(k, "temporal_vae.") or _has(k, "spatial_vae."), "the Open-Sora 1.2 VAE (OpenSora-VAE-v1.2)"),
    (lambda k: _has(k, "blocks.0.attn_temp."), "an Open-Sora 1.0/1.1 STDiT or STDiT2 model, not STDiT3"),
    (lambda k: _has(k, "input_blocks.0.0.") or _has(k, "down_blocks.0.resnets."),
     "a Stable Diffusion UNet"),
    (lambda k: _has(k, "blocks.0.self_attn.q.") or _has(k, "patch_embedding.weight"), "a Wan 2.x video model"),
    (lambda k: _has(k, "double_blocks.0.") and _has(k, "txt_in."), "a HunyuanVideo model"),
    (lambda k: _has(k, "double_blocks.0.img_attn."), "a Flux model"),
    (lambda k: _has(k, "joint_blocks.0."), "an SD3 / MMDiT model"),
    (lambda k: _has(k, "transformer_blocks.0.attn1.") and _has(k, "adaln_single."),
     "a diffusers PixArt / LTX-Video transformer"),
    (lambda k: _has(k, "blocks.0.attn.qkv.") and _has(k, "y_embedder.y_embedding"),
     "a PixArt-alpha/sigma image model (no temporal blocks)"),
    (lambda k: _has(k, "encoder.conv_in.") or _has(k, "decoder.conv_in."),
     "a VAE / autoencoder"),
    (lambda k: _has(k, "SelfAttention.q.") or _has(k, "shared.weight"), "a T5 text encoder"),
    (lambda k: _has(k, "text_model.encoder.layers."), "a CLIP text encoder"),
)


def find_prefix(keys: Iterable[str]) -> str | None:
    """The prefix in front of the STDiT3 names ('' for bare names), or None when the file is not STDiT3-like."""
    keys = set(keys)
    if all(k in keys for k in SIGNATURE_KEYS):
        return ""
    for prefix in KNOWN_PREFIXES:
        if all(prefix + k in keys for k in SIGNATURE_KEYS):
            return prefix
    return None


def describe_checkpoint(keys: Iterable[str]) -> str:
    """Short description of what a non-STDiT3 checkpoint looks like, from its tensor names."""
    keys = set(keys)
    for test, description in _LOOKALIKES:
        if test(keys):
            return description
    sample = ", ".join(sorted(keys)[:4]) or "no tensors"
    return f"an unrecognised model ({len(keys)} tensors: {sample}, ...)"


def _example_keys(keys: Iterable[str], n: int = 3) -> str:
    """A few of the names, sorted, for messages."""
    return ", ".join(sorted(keys)[:n])


# ---------------------------------------------------------------------------------------------- configuration

def _block_count(shapes: Mapping[str, Sequence[int]], kind: str) -> int:
    """Number of `kind` blocks (max index + 1)."""
    pattern = re.compile(rf"^{kind}\.(\d+)\.")
    indices = [int(m.group(1)) for k in shapes if (m := pattern.match(k))]
    return max(indices) + 1 if indices else 0


def _need(shapes: Mapping[str, Sequence[int]], key: str) -> tuple[int, ...]:
    """Shape of a key that configuration inference cannot do without."""
    if key not in shapes:
        raise CheckpointError(f"cannot infer the STDiT3 configuration: tensor {key!r} is missing")
    return tuple(shapes[key])


def infer_config(shapes: Mapping[str, Sequence[int]], metadata: Mapping[str, str] | None = None) -> STDiT3Config:
    """STDiT3Config from bare-named tensor shapes, checked against the `stdit3_config` metadata when present."""
    # Heads come from the metadata, else the q/k-norm width, else rope.freqs, else hidden/72 (the XL head width).
    x_w = _need(shapes, "x_embedder.proj.weight")
    if len(x_w) != 5:
        raise CheckpointError(f"x_embedder.proj.weight should be 5-D (Conv3d), got {list(x_w)}")
    hidden, in_ch, patch = x_w[0], x_w[1], tuple(x_w[2:])
    fc1 = _need(shapes, "spatial_blocks.0.mlp.fc1.weight")
    table = _need(shapes, "y_embedder.y_embedding")
    inferred: dict[str, Any] = {
        "hidden_size": hidden,
        "depth": _block_count(shapes, "spatial_blocks"),
        "mlp_ratio": fc1[0] / hidden,
        "patch_size": patch,
        "in_channels": in_ch,
        "caption_channels": table[1],
        "model_max_length": table[0],
        "qk_norm": "spatial_blocks.0.attn.q_norm.weight" in shapes,
    }
    out_total = _need(shapes, "final_layer.linear.weight")[0]
    out_ch, rem = divmod(out_total, math.prod(patch))
    if rem or out_ch not in (in_ch, 2 * in_ch):
        raise CheckpointError(f"final_layer.linear has {out_total} outputs, not 1x or 2x in_channels per patch")
    inferred["pred_sigma"] = out_ch == 2 * in_ch

    meta_cfg = config_from_metadata(metadata, CONFIG_METADATA_KEY, STDiT3Config, inferred)

    if "spatial_blocks.0.attn.q_norm.weight" in shapes:
        head_dim = shapes["spatial_blocks.0.attn.q_norm.weight"][0]
    elif "rope.freqs" in shapes:
        head_dim = 2 * shapes["rope.freqs"][0]
    else:
        head_dim = None
    if meta_cfg is not None:
        if head_dim is not None and meta_cfg.head_dim != head_dim:
            raise CheckpointError(f"{CONFIG_METADATA_KEY} metadata gives head_dim {meta_cfg.head_dim} but the "
                                  f"q/k norm or rope tensors are {head_dim} wide")
        return meta_cfg
    head_dim = head_dim or XL_HEAD_DIM
    if hidden % head_dim:
        raise CheckpointError(f"cannot infer num_heads for hidden_size {hidden}: store the configuration in the "
                              f"{CONFIG_METADATA_KEY!r} metadata (save_stdit3 does) or pass config=")
    try:
        return STDiT3Config(num_heads=hidden // head_dim, **inferred)
    except ValueError as exc:
        raise CheckpointError(f"inferred an invalid STDiT3 configuration: {exc}") from exc


def config_from_metadata(metadata: Mapping[str, str] | None, key: str, config_cls: Any,
                         inferred: Mapping[str, Any]) -> Any:
    """The config a checkpoint's metadata records, checked against what its tensor shapes say (None if absent)."""
    if not metadata or not metadata.get(key):
        return None
    try:
        cfg = config_cls.from_dict(json.loads(metadata[key]))
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"unreadable {key} metadata: {exc}") from exc
    for name, value in inferred.items():
        if getattr(cfg, name) != value:
            raise CheckpointError(f"{key} metadata says {name}={getattr(cfg, name)!r} but the tensor shapes say "
                                  f"{value!r}")
    return cfg


# ---------------------------------------------------------------------------------------------- loading

def assign_tensor(model: nn.Module, name: str, tensor: Tensor) -> None:
    """Put `tensor` in place of the parameter or buffer `name` (no copy)."""
    module_path, _, attr = name.rpartition(".")
    module = model.get_submodule(module_path) if module_path else model
    if attr in module._parameters:
        module._parameters[attr] = nn.Parameter(tensor, requires_grad=False)
    elif attr in module._buffers:
        module._buffers[attr] = tensor
    else:
        raise KeyError(name)


def name_list(names: Sequence[str], limit: int) -> str:
    """Comma-separated names, at most `limit`, with a count of the rest."""
    shown = ", ".join(names[:limit])
    return shown + (f", ... and {len(names) - limit} more" if len(names) > limit else "")


def _check_keys(source: TensorSource, prefix: str, expected: Mapping[str, tuple[int, ...]], strict: bool,
                config: STDiT3Config, max_names: int) -> list[str]:
    """Checkpoint names to read; raise KeyMismatchError listing missing / unexpected / mis-shaped tensors."""
    present = {k[len(prefix):]: k for k in source.shapes if k.startswith(prefix)}
    outside = sorted(k for k in source.shapes if not k.startswith(prefix))
    missing = sorted(k for k in expected if k not in present and k not in OPTIONAL_KEYS)
    unexpected = sorted(k for k in present if k not in expected) + outside
    mismatched = [(k, expected[k], tuple(source.shapes[present[k]])) for k in sorted(present)
                  if k in expected and tuple(source.shapes[present[k]]) != tuple(expected[k])]
    if missing or mismatched or (unexpected and strict):
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing: {name_list(missing, max_names)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected: {name_list(unexpected, max_names)}")
        if mismatched:
            shown = [f"{k} (expected {list(e)}, found {list(f)})" for k, e, f in mismatched]
            parts.append(f"{len(mismatched)} with another shape: {name_list(shown, max_names)}")
        arch = f"hidden {config.hidden_size}, depth {config.depth}, heads {config.num_heads}"
        raise KeyMismatchError(f"{source.name} does not match STDiT3 ({arch}): " + "; ".join(parts),
                               missing, unexpected, mismatched)
    return [k for k in expected if k in present]


def load_stdit3_from_source(source: TensorSource, dtype: str | torch.dtype = torch.float32,
                            device: str | torch.device = "cpu", config: STDiT3Config | None = None,
                            strict: bool = True, max_names: int = 20) -> STDiT3:
    """Build STDiT3 (eval mode, no grad) from a TensorSource, reading and casting one tensor at a time."""
    dtype = parse_dtype(dtype)
    prefix = find_prefix(source.shapes)
    if prefix is None:
        raise WrongArchitectureError(
            f"{source.name} is not an Open-Sora 1.2 STDiT3 checkpoint: it looks like "
            f"{describe_checkpoint(source.shapes)} (keys such as {_example_keys(source.shapes)}); an STDiT3 "
            f"checkpoint has {', '.join(SIGNATURE_KEYS)}, temporal_blocks.* and y_embedder.y_embedding")
    if config is None:
        bare = {k[len(prefix):]: v for k, v in source.shapes.items() if k.startswith(prefix)}
        config = infer_config(bare, source.metadata)
    with torch.device("meta"):
        model = STDiT3(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    names = _check_keys(source, prefix, expected, strict, config, max_names)
    device = torch.device(device)
    for name in names:
        tensor = source.read(prefix + name)
        assign_tensor(model, name, tensor.to(device=device, dtype=dtype if tensor.is_floating_point() else None))
        del tensor
    if "rope.freqs" not in names:
        assign_tensor(model, "rope.freqs", rope_frequencies(config.head_dim, config.rope_theta, device).to(dtype))
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:  # cannot happen when the key check passed; guards against a module-tree change
        raise CheckpointError(f"tensors left unloaded: {name_list(left, max_names)}")
    return model.eval().requires_grad_(False)


def load_stdit3(path: str | os.PathLike, dtype: str | torch.dtype = torch.float32,
                device: str | torch.device = "cpu", config: STDiT3Config | None = None, strict: bool = True,
                max_names: int = 20) -> STDiT3:
    """Load an STDiT3 checkpoint (.safetensors streamed; .pt/.pth/.ckpt memory-mapped) in fp32, fp16 or bf16."""
    # The configuration is inferred from the shapes and metadata unless `config` is given. Raises
    # WrongArchitectureError for another kind of model and KeyMismatchError (names listed, at most `max_names`
    # of each kind) for missing, mis-shaped or, when `strict`, unexpected tensors.
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"STDiT3 checkpoint not found: {path}")
    if path.suffix.lower() == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return load_stdit3_from_source(_safetensors_source(path, handle), dtype, device, config, strict,
                                           max_names)
    state = torch.load(str(path), map_location="cpu", mmap=True, weights_only=True)
    for key in ("state_dict", "model", "module", "ema"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{path} does not hold a state dict")
    return load_stdit3_from_source(_mapping_source(state, str(path), None), dtype, device, config, strict,
                                   max_names)


def load_stdit3_state_dict(state_dict: Mapping[str, Tensor], dtype: str | torch.dtype = torch.float32,
                           device: str | torch.device = "cpu", config: STDiT3Config | None = None,
                           metadata: Mapping[str, str] | None = None, strict: bool = True,
                           name: str = "state dict", max_names: int = 20) -> STDiT3:
    """Same as `load_stdit3` for a state dict already opened (e.g. by ComfyUI's load_torch_file)."""
    return load_stdit3_from_source(_mapping_source(state_dict, name, metadata), dtype, device, config, strict,
                                   max_names)


def stdit3_metadata(config: STDiT3Config, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """safetensors metadata recording the architecture and its configuration."""
    meta = {"format": "pt", ARCH_METADATA_KEY: ARCH_NAME, CONFIG_METADATA_KEY: json.dumps(config.to_dict())}
    meta.update(extra or {})
    return meta


def save_stdit3(model: STDiT3, path: str | os.PathLike, extra_metadata: Mapping[str, str] | None = None) -> Path:
    """Write the model's state dict with official names to safetensors, configuration in the metadata."""
    from safetensors.torch import save_file

    path = Path(path)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata=stdit3_metadata(model.config, extra_metadata))
    return path


__all__ = [
    "CheckpointError", "WrongArchitectureError", "KeyMismatchError", "TensorSource", "parse_dtype",
    "read_checkpoint_header", "find_prefix", "describe_checkpoint", "infer_config", "load_stdit3",
    "load_stdit3_state_dict", "load_stdit3_from_source", "save_stdit3", "stdit3_metadata",
]
