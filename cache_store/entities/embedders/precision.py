"""Which precision the MiniLM encoder's dense products run in (bf16 where the CPU multiplies it natively), and
the bf16 product itself."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .base import EmbedError

if TYPE_CHECKING:
    import torch

PRECISION_ENV_VAR = "CHAI_MINILM_PRECISION"
PRECISIONS = ("auto", "float32", "bfloat16")
# CPU flags of native bf16 dot products (x86). Without them oneDNN emulates bf16 and is slower than float32.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# Weights go to oneDNN's own blocked layout once at load; False keeps plain (in, out) bf16 matrices.
PREPACK = True
PREPACK_ROWS = 16  # the row count oneDNN is told to expect when it lays a weight out (any count works after)


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


def pack_bf16(weight: "torch.Tensor") -> "torch.Tensor":
    """A dense weight (out, in) as bf16 for `bf16_linear`: prepacked for oneDNN where this torch can and the packed
    product equals the plain one (an AMX product otherwise repacks the weight on every call), else (in, out)."""
    import torch

    plain = weight.t().contiguous().to(torch.bfloat16)
    if not PREPACK or weight.device.type != "cpu":
        return plain
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16).contiguous(), PREPACK_ROWS)
        probe = torch.linspace(-2.0, 2.0, 3 * weight.shape[1]).reshape(3, -1).to(torch.bfloat16)
        if torch.equal(_packed_mm(probe, packed), torch.mm(probe, plain)):
            return packed
    except (AttributeError, RuntimeError, TypeError, NotImplementedError):  # torch builds without these ops
        pass
    return plain


def bf16_linear(x: "torch.Tensor", w: "torch.Tensor", b: "torch.Tensor") -> "torch.Tensor":
    """x @ w + b for a float32 x and a `pack_bf16` weight: the product in bf16 (fp32 accumulation), the bias
    added in float32."""
    import torch

    xb = x.to(torch.bfloat16)
    return (_packed_mm(xb, w) if w.is_mkldnn else torch.mm(xb, w)).float().add_(b)


def _packed_mm(x: "torch.Tensor", packed: "torch.Tensor") -> "torch.Tensor":
    import torch

    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


__all__ = ["NATIVE_BF16_FLAGS", "PRECISIONS", "PRECISION_ENV_VAR", "bf16_linear", "cpu_flags", "native_bf16",
           "pack_bf16", "resolve_precision"]
