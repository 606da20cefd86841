"""Names and numbers every part of CHAI shares: run modes, transformer-option keys, choices, the timestep scale."""
from __future__ import annotations

FULL, FAST = "full", "fast"  # a miss samples the full schedule; a hit the fast one with Cache Attention

RUN_KEY = "chai_run"  # transformer_options key of the current CacheAttentionRun
CAPTURE_KEY = "chai_capture"  # APPLY_MODEL wrapper key of a miss's donor capture

KV_MODES: tuple[str, ...] = ("replace", "concat")
APPLY_TO: tuple[str, ...] = ("cond", "both")
DONOR_MAPPINGS: tuple[str, ...] = ("matched_sigma", "same_index", "final_clean")
# How a hit reuses its donor (chai_attention/restart.py, docs/quality-lab.md): start from the donor's latent at the
# restart sigma, borrow its attention at the cache steps (the paper's Cache Attention), or both.
RESTART, CACHE_ATTENTION, BOTH = "restart", "cache_attention", "both"
REUSE_MODES: tuple[str, ...] = (RESTART, CACHE_ATTENTION, BOTH)
DEFAULT_REUSE = RESTART  # the nodes' default: the quality lab's best hit (docs/quality-lab.md)
DEFAULT_RESTART_SIGMA = 0.8
# Fast steps (from 1) where Cache Attention runs by default; chosen in the pack's quality lab, whose measurements
# (against the paper's 2,3,4) are in docs/quality-lab.md.
DEFAULT_CACHE_STEPS: tuple[int, ...] = (5, 6)

# Wan 2.2 A14B text-to-video: the low-noise expert samples the steps below this sigma (image-to-video: 0.9).
WAN22_BOUNDARY = 0.875

# Flow models in this pack (STDiT3, Wan) take the timestep 1000 * sigma.
TIMESTEP_SCALE = 1000.0
