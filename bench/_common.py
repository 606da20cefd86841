"""Helpers shared by the bench scripts: data paths, prompt loading, percentiles; table printing from the pack."""
from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PROMPTS = REPO.parent / "shared" / "data" / "vbench" / "all_dimension.txt"

if str(REPO) not in sys.path:  # also runnable as `python bench/<name>.py`
    sys.path.insert(0, str(REPO))

from comfyui_chai.toyworld.text_table import shorten, table  # noqa: E402,F401  (the benches' table printing)


def load_prompts(path: Path | str = DEFAULT_PROMPTS, seed: int | None = None) -> list[str]:
    """Non-empty prompt lines of a text file, shuffled with `seed` when given; SystemExit with a hint if absent."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"prompt list {path} not found; pass --prompts PATH, a text file with one prompt a line "
                         "(the VBench prompt list all_dimension.txt: see the README, Benchmarks)")
    try:
        prompts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as exc:
        raise SystemExit(f"prompt list {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not prompts:
        raise SystemExit(f"prompt list {path} holds no prompts; give a text file with one prompt a line")
    if seed is not None:
        random.Random(seed).shuffle(prompts)
    return prompts


def ms_pct(seconds: Sequence[float], p: float) -> float:
    """Percentile of durations given in seconds, in milliseconds (nan when empty)."""
    return float(np.percentile(np.asarray(seconds, dtype=np.float64) * 1e3, p)) if len(seconds) else float("nan")


def ms_mean(seconds: Sequence[float]) -> float:
    """Mean of durations given in seconds, in milliseconds (nan when empty)."""
    return float(np.mean(seconds) * 1e3) if len(seconds) else float("nan")
