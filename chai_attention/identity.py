"""Every identity CHAI keys a cache by: model fingerprints, weight and patch digests, the image-conditioning digest.

A hit is only possible between runs of the same architecture, weights, patches, dtype and (for image-to-video) the
same conditioning image. Everything here reads attributes only (of torch modules, of ComfyUI's ModelPatcher, CLIP
and CONDITIONING objects): nothing imports ComfyUI. The values are stored in cache entries: changing how any of
them is computed turns every saved entry into a miss (tests/test_identity.py pins them).
"""
from __future__ import annotations

import hashlib
import json
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from .adapters import unwrap_model
from .conditioning import IMAGE_KEYS

SAMPLE_ELEMENTS = 256  # elements read from each weight tensor for the sampled weights digest
_BIT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ------------------------------------------------------------------------------------------ the recursive hasher

@dataclass(frozen=True)
class Hasher:
    """How nested values (tensors, sequences, mappings, objects holding tensors) are fed into a hash.

    One walk serves every digest; the fields are the two digests' historical choices, which stored entries pin.
    """

    tensor: Callable[[Tensor], bytes]  # the bytes of one tensor
    max_depth: int  # deeper values are fed as `too_deep`
    too_deep: bytes
    none: bytes  # what None is fed as
    inner: Callable[[Any], Any]  # what an object of another type contributes after its class name (None: nothing)

    def feed(self, value: Any, h: "hashlib._Hash", depth: int = 0) -> None:
        """Feed `value` into `h`."""
        if depth > self.max_depth:
            h.update(self.too_deep)
        elif value is None:
            h.update(self.none)
        elif isinstance(value, Tensor):
            h.update(self.tensor(value))
        elif isinstance(value, (list, tuple)):
            h.update(f"[{len(value)}".encode())
            for item in value:
                self.feed(item, h, depth + 1)
        elif isinstance(value, Mapping):
            for key in sorted(value, key=str):
                h.update(str(key).encode())
                self.feed(value[key], h, depth + 1)
        elif isinstance(value, (bool, int, float, str)):
            h.update(repr(value).encode())
        else:
            h.update(type(value).__name__.encode())
            inner = self.inner(value)
            if inner is not None:
                self.feed(inner, h, depth + 1)


def sample_bytes(t: Tensor, elements: int = SAMPLE_ELEMENTS) -> bytes:
    """Shape, dtype and the raw bits of up to `elements` evenly spaced values of a tensor, as bytes."""
    head = f"{tuple(t.shape)}|{t.dtype}|".encode()
    bits = _BIT_VIEWS.get(t.element_size())
    if t.is_meta or t.numel() == 0 or bits is None:
        return head
    flat = t.detach().reshape(-1)
    if flat.dtype != bits:
        flat = flat.view(bits)  # raw bits: exact for every dtype, fp8 included
    n = flat.numel()
    idx = torch.linspace(0, n - 1, steps=min(n, elements), device=flat.device).round().long()
    return head + flat[idx].cpu().numpy().tobytes()


def _all_values(t: Tensor) -> bytes:
    """Shape and every value as float32."""
    t = t.detach().to("cpu", torch.float32).contiguous()
    return f"{tuple(t.shape)}|".encode() + t.numpy().tobytes()


def _tensor_fields(value: Any) -> dict[str, Any]:
    """An object's tensor-holding attributes (e.g. comfy.clip_vision.Output)."""
    return {k: v for k, v in sorted(vars(value).items()) if isinstance(v, (Tensor, list, tuple))}


# Weight patches (LoRA tuples, comfy.weight_adapter objects and their `weights`), tensors sampled.
PATCH_HASHER = Hasher(sample_bytes, 8, b"<deep>", b"None", lambda v: getattr(v, "weights", None))
# Image conditioning (latents, masks, CLIP vision outputs), every value read.
CONDITIONING_HASHER = Hasher(_all_values, 6, b"-", b"-", _tensor_fields)


# ------------------------------------------------------------------------------------------ torch models

def _config_of(model: nn.Module) -> Any:
    config = getattr(model, "config", None)
    if config is None:
        return None
    if hasattr(config, "to_dict"):
        return config.to_dict()
    if isinstance(config, Mapping):
        return dict(config)
    return repr(config)


def weights_digest(model: nn.Module) -> str:
    """sha256 over every parameter and buffer (name, shape, dtype, bytes), in state-dict order."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        if tensor.is_meta:
            raise ValueError(f"tensor {name} is on the meta device; pass weights_id (e.g. the weights file hash)")
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def model_fingerprint(model: Any, *, weights_id: str | None = None, dtype: torch.dtype | None = None,
                      extra: Mapping[str, Any] | None = None) -> str:
    """'<class>@<16 hex>' over architecture, config, weights (their digest, or `weights_id`), dtype and `extra`.

    Hashing the weights reads every byte of the model (seconds for a 1 B model); the ComfyUI side passes a
    sampled digest of the weights and the LoRA stack instead. `extra` takes anything else that changes outputs.
    """
    net = unwrap_model(model)
    if not isinstance(net, nn.Module):
        raise TypeError(f"cannot fingerprint a {type(net).__name__}: not a torch module")
    compute = dtype or getattr(net, "dtype", None)
    if not isinstance(compute, torch.dtype):
        compute = next((p.dtype for p in net.parameters()), torch.float32)
    record = {
        "class": f"{type(net).__module__.rsplit('.', 1)[-1]}.{type(net).__name__}",
        "config": _config_of(net),
        "weights": weights_id if weights_id is not None else weights_digest(net),
        "dtype": str(compute).replace("torch.", ""),
        "extra": dict(extra or {}),
    }
    digest = hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()
    return f"{type(net).__name__}@{digest[:16]}"


# ------------------------------------------------------------------------------------------ ComfyUI objects

def original_weights_digest(module: nn.Module, backup: Mapping[str, Any] | None = None, prefix: str = "") -> str:
    """sha256 over every tensor's name, shape, dtype and a sample of its values, as loaded from disk.

    `backup` is a ModelPatcher's backup of weights it patched in place (keys with `prefix`): those originals are
    read instead, so a loaded LoRA never leaks into the digest.
    """
    h = hashlib.sha256()
    backup = backup or {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        saved = backup.get(prefix + name)
        if saved is not None:
            tensor = getattr(saved, "weight", saved)
        h.update(name.encode())
        h.update(sample_bytes(tensor))
    return h.hexdigest()


_WEIGHT_DIGESTS: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
_DIGEST_LOCK = threading.Lock()


def base_weights_digest(patcher: Any, module: nn.Module, prefix: str) -> str:
    """original_weights_digest memoised per module (weights are only ever patched through the backups)."""
    with _DIGEST_LOCK:
        found = _WEIGHT_DIGESTS.get(module)
    if found is None:
        found = original_weights_digest(module, getattr(patcher, "backup", None), prefix)
        with _DIGEST_LOCK:
            _WEIGHT_DIGESTS[module] = found
    return found


def patches_digest(patcher: Any) -> str:
    """sha256 over a ModelPatcher's weight patches: keys, strengths, offsets, functions and patch tensors."""
    h = hashlib.sha256()
    patches = getattr(patcher, "patches", None) or {}
    for key in sorted(patches):
        h.update(key.encode())
        for patch in patches[key]:
            strength, value = patch[0], patch[1]
            rest = patch[2:]
            h.update(repr((strength, *[getattr(r, "__name__", r) for r in rest])).encode())
            PATCH_HASHER.feed(value, h)
    return h.hexdigest()


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def comfy_model_fingerprint(model: Any) -> str:
    """Fingerprint of a ComfyUI MODEL: architecture, original weights, LoRA-style patches and strengths, dtype.

    The weights are identified by a digest of their names, shapes, dtypes and a sample of every tensor's values
    (a ModelPatcher does not know which file it came from; two files with the same tensors are the same model).
    """
    base = model.model
    net = base.diffusion_model
    weights = base_weights_digest(model, net, "diffusion_model.")
    config = getattr(getattr(base, "model_config", None), "unet_config", None)
    extra = {
        "base_model": type(base).__name__,
        "unet_config": {k: _jsonable(v) for k, v in (config or {}).items()},
        "patches": patches_digest(model) if getattr(model, "patches", None) else "",
        "compute_dtype": str(getattr(base, "manual_cast_dtype", None) or model.model_dtype()),
    }
    return model_fingerprint(net, weights_id=f"sampled:{weights[:24]}", dtype=model.model_dtype(), extra=extra)


def text_encoder_digest(clip: Any) -> str:
    """12 hex over a ComfyUI CLIP's original encoder weights and its patches (a LoRA on the encoder counts)."""
    patcher = getattr(clip, "patcher", None)
    digest = hashlib.sha256(base_weights_digest(patcher, clip.cond_stage_model, "").encode())
    digest.update(patches_digest(patcher).encode())
    return digest.hexdigest()[:12]


def conditioning_digest(positive: Sequence[Any] | None, latent: Mapping[str, Any] | None = None) -> str | None:
    """'image:<16 hex>' over the image conditioning of `positive` (a CONDITIONING list) and an inpainting-style
    latent (samples plus noise_mask); None when the request has no image conditioning (text-to-video).

    A donor serves an image-to-video request only when made from the very same conditioning (docs/cache-attention.md,
    "Image-to-video"): another image is a miss, never a wrong hit.
    """
    h = hashlib.sha256()
    found = False
    for entry in positive or ():
        options = entry[1] if isinstance(entry, (list, tuple)) and len(entry) > 1 else None
        if not isinstance(options, Mapping):
            continue
        for key in IMAGE_KEYS:
            if options.get(key) is not None:
                found = True
                h.update(key.encode())
                CONDITIONING_HASHER.feed(options[key], h)
    mask = latent.get("noise_mask") if latent is not None else None
    if latent is not None and isinstance(mask, Tensor):
        found = True
        h.update(b"noise_mask")
        CONDITIONING_HASHER.feed(mask, h)
        CONDITIONING_HASHER.feed(latent["samples"], h)
    return f"image:{h.hexdigest()[:16]}" if found else None


def request_fingerprint(model: Any, model_2: Any = None, conditioning: str | None = None) -> str:
    """The fingerprint a cache entry is keyed by: the MODEL's, or, for a pair of experts (Wan 2.2 A14B: high-noise
    `model`, low-noise `model_2`) and/or an image conditioning digest (`conditioning_digest`), one over all of
    them ('<class>+<class>@...' / '...+image@...'), so an entry only serves the same pair and image.
    The switching boundary is not part of it: the donors are captured at high-noise steps, before any switch."""
    base = comfy_model_fingerprint(model)
    if model_2 is None and not conditioning:
        return base
    parts, names = [base], [base.split("@")[0]]
    if model_2 is not None:
        second = comfy_model_fingerprint(model_2)
        parts.append(second)
        names.append(second.split("@")[0])
    if conditioning:
        parts.append(conditioning)
        names.append("image")
    return f"{'+'.join(names)}@{hashlib.sha256('|'.join(parts).encode()).hexdigest()[:16]}"


def comfy_request_fingerprint(model: Any, latent: Mapping[str, Any], model_2: Any = None,
                              positive: Sequence[Any] | None = None) -> str:
    """`request_fingerprint` of a ComfyUI request: its MODEL, optional second expert and image conditioning."""
    return request_fingerprint(model, model_2, conditioning_digest(positive, latent))


__all__ = [
    "Hasher", "PATCH_HASHER", "CONDITIONING_HASHER", "SAMPLE_ELEMENTS", "sample_bytes", "weights_digest",
    "model_fingerprint", "original_weights_digest", "base_weights_digest", "patches_digest",
    "comfy_model_fingerprint", "text_encoder_digest", "conditioning_digest", "request_fingerprint",
    "comfy_request_fingerprint",
]
