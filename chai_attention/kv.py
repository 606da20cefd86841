"""The one Cache Attention K/V math, independent of the model family: the K/V combine and the CFG row mask.

`combine_kv` and `chunk_row_mask` serve every family (chai_attention.hooks calls them inside the hooked attention);
the quality lab's weaker borrowing (`lab.lab.borrowed_attention`) builds on them.

Layout: q, k, v are [R, heads, N, head_dim], R rows of independent attention (for STDiT3 spatial blocks one row
per (sample, frame); for a full 3-D attention such as Wan's, one row per sample). Donor keys and values come in
the same layout with Rd rows that correspond, row by row, to the rows they serve (frame i of the donor for frame i
of the live latent); Rd may divide the number of served rows, in which case the donor rows are tiled (a donor
batch of one serving every sample and CFG half).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .config import KV_MODES


def tile_rows(t: Tensor, rows: int) -> Tensor:
    """Repeat t [Rd, ...] along dim 0 to `rows` rows (Rd must divide rows)."""
    have = t.shape[0]
    if have == rows:
        return t
    if have == 0 or rows % have:
        raise ValueError(f"donor keys/values have {have} rows, which does not divide the {rows} rows they serve; "
                         "the donor latent must have the live latent's shape (batch 1 or the live batch)")
    return t.repeat(rows // have, *([1] * (t.dim() - 1)))


def combine_kv(k: Tensor, v: Tensor, k_donor: Tensor, v_donor: Tensor, mode: str = "replace",
               dim: int = -2) -> tuple[Tensor, Tensor]:
    """Keys and values the live queries attend to: the donor's ("replace") or own then donor's ("concat").

    dim is the token axis: -2 fits both of ComfyUI's layouts ([B, L, heads * d] and [B, heads, L, d]). Donor rows
    (dim 0) are tiled over the live rows; every other axis but the token axis must match.
    """
    if mode not in KV_MODES:
        raise ValueError(f"K/V mode must be one of {', '.join(KV_MODES)}; got {mode!r}")
    k_donor, v_donor = tile_rows(k_donor, k.shape[0]), tile_rows(v_donor, v.shape[0])
    axis = dim % k.dim()
    for donor, own in ((k_donor, k), (v_donor, v)):
        if donor.dim() != own.dim() or any(a != b for i, (a, b) in enumerate(zip(donor.shape, own.shape))
                                           if i not in (0, axis)):
            raise ValueError(f"donor keys/values {tuple(donor.shape)} do not match the block's {tuple(own.shape)} "
                             "in heads or head width")
    k_donor, v_donor = k_donor.to(k.dtype), v_donor.to(v.dtype)
    if mode == "replace":
        return k_donor, v_donor
    return torch.cat([k, k_donor], dim=axis), torch.cat([v, v_donor], dim=axis)


def chunk_row_mask(flags: Sequence[bool], rows: int, device: torch.device | str | None = None) -> Tensor:
    """Bool [rows] marking the rows of the chunks whose flag is set; rows split evenly over the chunks."""
    n = len(flags)
    if n == 0 or rows % n:
        raise ValueError(f"{rows} attention rows cannot be split into {n} CFG chunks")
    return torch.tensor([bool(f) for f in flags], device=device).repeat_interleave(rows // n)
