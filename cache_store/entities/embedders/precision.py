"""Which precision the MiniLM encoder's dense products run in: bf16 where the CPU multiplies it natively."""
from __future__ import annotations

import os

from .base import EmbedError

PRECISION_ENV_VAR = "CHAI_MINILM_PRECISION"
PRECISIONS = ("auto", "float32", "bfloat16")
# CPU flags of native bf16 dot products (x86). Without them oneDNN emulates bf16 and is slower than float32.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux); empty elsewhere or when unreadable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively and torch's oneDNN will use it."""
    if not NATIVE_BF16_FLAGS & cpu_flags():
        return False
    try:
        import torch

        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError, ImportError):
        return False


def resolve_precision(precision: str, device: str) -> str:
    """'float32' or 'bfloat16' for the dense products: 'auto' (or $CHAI_MINILM_PRECISION) takes bf16 only on a
    CPU that has native bf16; a GPU keeps float32."""
    choice = (os.environ.get(PRECISION_ENV_VAR, "").strip().lower() or "auto") if precision == "auto" else precision
    if choice not in PRECISIONS:
        raise EmbedError(f"{PRECISION_ENV_VAR}={choice!r} is not one of {', '.join(PRECISIONS)}")
    if choice == "auto":
        return "bfloat16" if str(device).startswith("cpu") and native_bf16() else "float32"
    return choice


__all__ = ["NATIVE_BF16_FLAGS", "PRECISIONS", "PRECISION_ENV_VAR", "cpu_flags", "native_bf16", "resolve_precision"]
