"""Model fingerprints: a hit is only possible between runs of the same architecture, weights and dtype."""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

import torch
from torch import nn

from .adapters.base import unwrap_model


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

    Hashing the weights reads every byte of the model (seconds for a 1 B model); the ComfyUI side passes an id
    of the weights file and the LoRA stack instead. `extra` takes anything else that changes outputs.
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
