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
MAX_STATUS = 90  # a status is one short line on the node, never wrapping into its report box
MAX_LISTED = 6  # entities named in Entity Extract's status (the rest counted)


def _short(text: str, limit: int = MAX_LABEL) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(status: str, limit: int = MAX_STATUS) -> str:
    """The status as one line of at most `limit` characters (whitespace collapsed, cut with '...')."""
    return _short(status, limit)


def entities_status(texts: list[str] | tuple[str, ...], language: str | None = None,
                    cut: tuple[int, int] | None = None) -> str:
    """'entities: ball, sunny beach' (as many as fit one line, at most MAX_LISTED, then '+N more'), or why
    there are none.

    `language`: the name of the other language the prompt is in; `cut`: (words kept, words in the prompt) when
    the text encoder reads only the start of the prompt and the entities come from that start.
    """
    tail = []
    if not texts and language:
        tail.append(f"prompt not English ({language}): extraction is English-only")
    if cut:
        tail.append(f"from the {cut[0]} of {cut[1]} words the encoder reads")
    suffix = "".join(SEP + t for t in tail)
    shown: list[str] = []
    for i, text in enumerate(texts[:MAX_LISTED]):
        label = _short(text)
        rest = len(texts) - i - 1
        line = f"entities: {', '.join([*shown, label])}{f' +{rest} more' if rest else ''}{suffix}"
        if shown and len(line) > MAX_STATUS:
            break
        shown.append(label)
    more = len(texts) - len(shown)
    listing = (", ".join(shown) + (f" +{more} more" if more else "")) if texts else "(none)"
    return one_line(f"entities: {listing}{suffix}")


def entities_report(texts: list[str] | tuple[str, ...], cut: tuple[int, int] | None = None,
                    language_note: str = "") -> str:
    """Entity Extract's report: every entity, where they come from when the encoder reads only part of the
    prompt, and why there are none for a prompt in another language."""
    lines = [f"entities: {', '.join(texts) or '(none)'}"]
    if cut:
        lines.append(f"the text encoder reads the first {cut[0]} of the prompt's {cut[1]} words; the entities come "
                     "from those words only, as the video does")
    if language_note and not texts:
        lines.append(language_note)
    return "\n".join(lines)


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
    """'HIT sunny beach 1.00 · 8 steps · restart · 0.34 s' or 'MISS · 30 steps · 1.20 s'."""
    seconds = report.timings.get("total", report.timings.get("sample"))
    if report.mode == FAST:
        best = max(report.matches, key=lambda m: m[2]) if report.matches else None
        head = f"HIT {_short(best[1])} {best[2]:.2f}" if best else "HIT"
    else:
        head = "MISS"
    parts = [head, f"{report.steps} steps"]
    if report.mode == FAST and report.reuse:
        parts.append(report.reuse.replace("_", " "))
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
