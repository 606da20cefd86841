"""The demo's job (`bench/demo_chai.py`): stream toy-world prompts through a `ChaiPipeline`, write each video as a
GIF, read it back with the detectors, and say per request and for the stream what CHAI did and how fast."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from .detect import detect
from .latent import decode
from .media import save_gif
from .prompts import Combo, all_combos, caption
from .text_table import shorten, table

ATTRS = ("scene", "obj", "colour", "motion")


@dataclass
class Request:
    """One streamed request and what it did."""

    index: int
    prompt: str
    combo: tuple[str, str, str, str]
    mode: str = ""
    steps: int = 0
    seconds: float = 0.0
    match: str = ""
    donor: str = ""
    detected: tuple[str, str, str, str] = ("", "", "", "")
    gif: str = ""
    reuse: str = ""  # a hit's reuse mode ("restart", "cache_attention", "both")

    @property
    def correct(self) -> bool:
        """All four attributes read back as asked."""
        return tuple(self.detected) == tuple(self.combo)


def make_stream(n: int, seed: int) -> list[tuple[str, Combo]]:
    """n (caption, combo) requests drawn with replacement from every combination, several phrasings each."""
    if n < 1:
        raise ValueError(f"need at least one request, got {n}")
    rng = np.random.default_rng(seed)
    combos = all_combos()
    picks = [combos[int(i)] for i in rng.integers(0, len(combos), size=n)]
    return [(caption(c, rng), c) for c in picks]


def describe_match(report: Any) -> str:
    """'query ~ stored (sim)' of the best entity match of a hit."""
    if not report.matches:
        return ""
    query, stored, sim = max(report.matches, key=lambda m: m[2])
    return f"{query} ~ {stored} ({sim:.2f})"


def serve(pipe: Any, stream: Sequence[tuple[str, Combo]], out: Path, seed: int) -> Iterator[Request]:
    """Generate each request (noise seed seed * 1000 + i), write its GIF into `out`, read it back; one at a time."""
    width = len(str(len(stream)))
    for i, (prompt, combo) in enumerate(stream, 1):
        result = pipe.generate(prompt, seed=seed * 1000 + i)
        rep = result.report
        video = decode(result.latent)[0].cpu().numpy()
        d = detect(video)
        req = Request(i, prompt, combo, rep.mode, rep.steps, rep.timings.get("total", 0.0), describe_match(rep),
                      rep.donor_prompt or "", (d.scene, d.obj, d.colour, d.motion), reuse=rep.reuse)
        req.gif = str(save_gif(video, out / f"{i:0{width}d}_{'hit' if rep.mode == 'fast' else 'miss'}.gif"))
        yield req


def request_lines(req: Request, total: int) -> list[str]:
    """The demo's lines for one request: mode, steps, seconds, prompt; the match of a hit; the read-back verdict."""
    width = len(str(total))
    verdict = "all 4 attributes right" if req.correct else "read back: " + ", ".join(
        f"{a} {got} (asked {want})" for a, got, want in zip(ATTRS, req.detected, req.combo) if got != want)
    head = "HIT " if req.mode == "fast" else "MISS"
    lines = [f"[{req.index:>{width}}/{total}] {head} {req.steps:>2} steps {req.seconds:6.2f} s  "
             f"{shorten(req.prompt, 58)}"]
    if req.mode == "fast":
        lines.append(f"{'':>{2 * width + 3}}  {req.reuse or 'hit'}: matched {req.match}; donor: "
                     f"{shorten(req.donor, 52)}")
    lines.append(f"{'':>{2 * width + 3}}  {verdict} -> {req.gif}")
    return lines


def summary_rows(requests: Sequence[Request]) -> tuple[list[list[object]], dict[str, float]]:
    """Per-mode rows (count, mean seconds, steps, read-back accuracy) and the headline figures."""
    rows: list[list[object]] = []
    stats: dict[str, float] = {}
    for mode, label in (("full", "miss (30 steps)"), ("fast", "hit (8 steps)")):
        sel = [r for r in requests if r.mode == mode]
        mean = statistics.fmean(r.seconds for r in sel) if sel else float("nan")
        stats[mode] = mean
        acc = sum(r.correct for r in sel) / len(sel) if sel else float("nan")
        rows.append([label, len(sel), f"{mean:.3f}" if sel else "-", f"{100 * acc:.0f}%" if sel else "-"])
    total = sum(r.seconds for r in requests)
    stats["hit_rate"] = sum(r.mode == "fast" for r in requests) / len(requests)
    stats["per_hit"] = stats["full"] / stats["fast"]  # nan when either mode is missing
    # Every request as a miss would have cost the mean miss time.
    stats["stream"] = len(requests) * stats["full"] / total if total > 0 else float("nan")
    return rows, stats


def summary_text(requests: Iterable[Request]) -> str:
    """The per-mode table and the hit-rate / speed-up line (without the wall time of the whole run)."""
    requests = list(requests)
    if not requests:
        return "no requests were served"
    rows, stats = summary_rows(requests)
    hits = sum(r.mode == "fast" for r in requests)
    took = f"the stream took {sum(r.seconds for r in requests):.1f} s"
    if hits == 0:
        speed = "no hits, so no speed-up to report (a later run with --keep reuses what this one stored)"
    elif hits == len(requests):
        speed = f"no misses, so no hit-vs-miss speed-up to compare (hits took {stats['fast']:.2f} s each)"
    else:
        speed = f"a hit is {stats['per_hit']:.2f}x faster than a miss"
        took += f", {stats['stream']:.2f}x faster than all misses"
    return (table(["requests", "n", "mean s", "read back right"], rows)
            + f"\n\nhit rate {100 * stats['hit_rate']:.0f}%; {speed}; {took}")
