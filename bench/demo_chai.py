"""The main job: stream toy-world prompts through the full CHAI pipeline with the trained toy STDiT3 (CPU).

Each request extracts the prompt's entities (spaCy), looks them up in a real cache folder (MiniLM + index), and
then either misses (full 30-step schedule; its donor latents are stored) or hits (8 steps, Cache Attention at
steps 2-4 fed by the donor's latents). Every video is written as a GIF and read back by the toy world's
detectors (scene, object, colour, motion), so each line says whether the video shows what the prompt asked for.

    python -m bench.demo_chai                  # 20 requests into ./demo_cache, GIFs in ./demo_out
    python -m bench.demo_chai --n 8 --keep     # keep what an earlier run stored (later requests hit more)
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from bench._common import shorten, table

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

    @property
    def correct(self) -> bool:
        """All four attributes read back as asked."""
        return tuple(self.detected) == tuple(self.combo)


def make_stream(n: int, seed: int) -> list[tuple[str, tuple[str, str, str, str]]]:
    """n (caption, combo) requests drawn with replacement from every combination, several phrasings each."""
    from comfyui_chai.toyworld.prompts import all_combos, caption

    if n < 1:
        raise ValueError(f"need at least one request, got {n}")
    rng = np.random.default_rng(seed)
    combos = all_combos()
    picks = [combos[int(i)] for i in rng.integers(0, len(combos), size=n)]
    return [(caption(c, rng), c) for c in picks]


def describe_match(report) -> str:
    """'query ~ stored (sim)' of the best entity match of a hit."""
    if not report.matches:
        return ""
    query, stored, sim = max(report.matches, key=lambda m: m[2])
    return f"{query} ~ {stored} ({sim:.2f})"


def summary_rows(requests: Sequence[Request]) -> tuple[list[list[object]], dict[str, float]]:
    """Per-mode rows (count, mean seconds, steps, read-back accuracy) and the headline figures."""
    rows: list[list[object]] = []
    stats: dict[str, float] = {}
    for mode, label in (("full", "miss (30 steps)"), ("fast", "hit (8 steps, Cache Attention)")):
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20, help="requests to stream (default 20)")
    ap.add_argument("--seed", type=int, default=3, help="seed of the prompt stream and of the noise")
    ap.add_argument("--cache", type=Path, default=Path("demo_cache"), help="cache folder (default ./demo_cache)")
    ap.add_argument("--out", type=Path, default=Path("demo_out"), help="GIF folder (default ./demo_out)")
    ap.add_argument("--keep", action="store_true", help="keep the cache's content instead of clearing it")
    ap.add_argument("--weights", type=Path, default=None, help="toy STDiT3 weights (default: the shipped ones)")
    ap.add_argument("--cfg", type=float, default=None, help="guidance scale (default: the toy model's)")
    ap.add_argument("--full-steps", type=int, default=30)
    ap.add_argument("--fast-steps", type=int, default=8)
    ap.add_argument("--cache-steps", default="2,3,4")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(max(1, args.threads))
    from comfyui_chai.cache_store.config import budget_from_gb
    from comfyui_chai.cache_store.service import ChaiCache
    from comfyui_chai.chai_attention.config import ChaiConfig
    from comfyui_chai.chai_attention.pipeline import ChaiPipeline
    from comfyui_chai.toyworld.detect import detect
    from comfyui_chai.toyworld.latent import decode
    from comfyui_chai.toyworld.media import save_gif
    from comfyui_chai.toyworld.model import DEFAULT_CFG, ToyVideoSpec, load_toy_model, toy_sigmas, toy_text_encoder

    try:
        config = ChaiConfig(full_steps=args.full_steps, fast_steps=args.fast_steps, cache_steps=args.cache_steps)
        stream = make_stream(args.n, args.seed)
        model = load_toy_model(args.weights)
    except (ValueError, FileNotFoundError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    if args.cache.exists() and not args.keep:
        shutil.rmtree(args.cache)
    print(f"CHAI demo: {len(stream)} toy-world requests, cache {args.cache}/, videos {args.out}/ "
          f"(full {config.full_steps} steps on a miss, {config.fast_steps} with Cache Attention at steps "
          f"{','.join(map(str, config.cache_steps))} on a hit)", flush=True)
    t0 = time.perf_counter()
    cache = ChaiCache(args.cache, budget_bytes=budget_from_gb(0.5))
    cache.embed_prompt("a red ball")  # load spaCy and MiniLM before the first timed request
    pipe = ChaiPipeline(model, cache, config, text_encode=toy_text_encoder(), video=ToyVideoSpec(),
                        schedule=toy_sigmas, cfg=DEFAULT_CFG if args.cfg is None else args.cfg)
    print(f"loaded the model, spaCy and MiniLM in {time.perf_counter() - t0:.1f} s", flush=True)

    requests: list[Request] = []
    width = len(str(len(stream)))
    try:
        for i, (prompt, combo) in enumerate(stream, 1):
            result = pipe.generate(prompt, seed=args.seed * 1000 + i)
            rep = result.report
            video = decode(result.latent)[0].cpu().numpy()
            d = detect(video)
            req = Request(i, prompt, combo, rep.mode, rep.steps, rep.timings.get("total", 0.0),
                          describe_match(rep), rep.donor_prompt or "", (d.scene, d.obj, d.colour, d.motion))
            req.gif = str(save_gif(video, args.out / f"{i:0{width}d}_{'hit' if rep.mode == 'fast' else 'miss'}.gif"))
            requests.append(req)
            verdict = "all 4 attributes right" if req.correct else "read back: " + ", ".join(
                f"{a} {got} (asked {want})" for a, got, want in zip(ATTRS, req.detected, combo) if got != want)
            head = "HIT " if rep.mode == "fast" else "MISS"
            print(f"[{i:>{width}}/{len(stream)}] {head} {req.steps:>2} steps {req.seconds:6.2f} s  {shorten(prompt, 58)}",
                  flush=True)
            if rep.mode == "fast":
                print(f"{'':>{2 * width + 3}}  matched {req.match}; donor: {shorten(req.donor, 60)}", flush=True)
            print(f"{'':>{2 * width + 3}}  {verdict} -> {req.gif}", flush=True)
    finally:
        cache.close()
    rows, stats = summary_rows(requests)
    print()
    print(table(["requests", "n", "mean s", "read back right"], rows))
    print(f"\nhit rate {100 * stats['hit_rate']:.0f}%; a hit is {stats['per_hit']:.2f}x faster than a miss; "
          f"the stream took {sum(r.seconds for r in requests):.1f} s, {stats['stream']:.2f}x faster than all misses "
          f"({time.perf_counter() - t0:.1f} s in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
