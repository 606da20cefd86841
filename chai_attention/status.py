"""One-line statuses for the CHAI nodes: what a user reads on the canvas after a run.

Pure functions over the typed fields of the payloads (CacheHit, ChaiReport) and of the write's outcome (never
over their prose); the nodes send them to the node (ComfyUI's progress text) and put them first in the node's text
output.
"""
from __future__ import annotations

from .cache_io import WriteReport
from .constants import FAST
from .payloads import CacheHit, ChaiReport

SEP = " · "
MAX_LABEL = 40


def _short(text: str, limit: int = MAX_LABEL) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def same_prompt(hit: CacheHit) -> bool:
    """The hit's donor is an earlier run of this very prompt (the prompt was queued again)."""
    return bool(hit.hit and hit.donor_prompt is not None and hit.donor_prompt.strip() == hit.prompt.strip())


def lookup_status(hit: CacheHit) -> str:
    """'HIT sunny beach 1.00 · donor #3' or 'MISS · the cache is empty'."""
    if hit.hit:
        best = max(hit.matches, key=lambda m: m[2]) if hit.matches else None
        head = f"HIT {_short(best[1])} {best[2]:.2f}" if best else "HIT"
        parts = [head, f"donor #{hit.entry_id}" if hit.entry_id is not None else "donor"]
        if same_prompt(hit):
            parts.append("same prompt as its donor: a new fast video, by design")
        return SEP.join(parts)
    return SEP.join(["MISS", _short(hit.reason or "no match", 60)])


def same_prompt_note(hit: CacheHit) -> str:
    """The report's explanation when a prompt hits its own earlier entry (empty otherwise)."""
    if not same_prompt(hit):
        return ""
    return ("note: this prompt is already in the cache, so it hits its own earlier run and the sampler makes a "
            "new video in the fast steps from it (by design: CHAI reuses what it stored, it does not replay "
            "it; the stored video stays in output/). Queued again while the cache gains or loses no entry, this "
            "lookup is served from ComfyUI's output cache (the node says so): with a new seed the sampler makes "
            "another fast video from the same donor, with a fixed seed nothing runs.")


def sampler_status(report: ChaiReport) -> str:
    """'HIT sunny beach 1.00 · 8 steps · 0.34 s' or 'MISS · 30 steps · 1.20 s'."""
    seconds = report.timings.get("total", report.timings.get("sample"))
    if report.mode == FAST:
        best = max(report.matches, key=lambda m: m[2]) if report.matches else None
        head = f"HIT {_short(best[1])} {best[2]:.2f}" if best else "HIT"
    else:
        head = "MISS"
    parts = [head, f"{report.steps} steps"]
    if seconds is not None:
        parts.append(f"{seconds:.2f} s")
    if report.mode != FAST and report.hit_unusable:
        parts.append("hit unusable, ran in full")
    return SEP.join(parts)


def write_status(written: WriteReport, entries: int) -> str:
    """'stored · 3 entries' or 'nothing stored (fast run) · 3 entries'."""
    if written.stored:
        head = "stored"
    elif written.outcome.fast:
        head = "nothing stored (fast run)"
    else:
        head = _short(written.line, 60)
    return SEP.join([head, f"{entries} entries"])
