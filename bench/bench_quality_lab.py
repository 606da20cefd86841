"""The quality lab: does a hit keep quality, under which donor, and what makes Cache Attention help (toy world).

    OMP_NUM_THREADS=1 python bench/bench_quality_lab.py --quick       # 6 prompts, a smoke run
    OMP_NUM_THREADS=1 python bench/bench_quality_lab.py               # all 90 held-out prompts, JSON + pictures

Every held-out combination of the weights' split gets a seeded caption and noise seed and four donors (sharing the
scene, the coloured object, nothing, or everything: see `lab/lab.py`), each a real 30-step run of its own
caption. Conditions, side by side in one run, on the same prompts and seeds:
  * table 1, does the world make few steps hurt: ground truth (renders of the same prompts), 30 steps, plain N;
  * table 2, the grid: plain N and CHAI N per donor relation (replace, block 0, donor latent at the matched sigma)
    with cache steps over the paper's sigma range (2,3,4 of 8) and with the pack's default cache steps (5,6 of 8),
    plus fusion (scene + object donors concatenated);
  * table 3, ablations at the largest and smallest N with the scene donor and the unrelated control: cache-step
    sets (early, single, late), concat, blocks 0 and 1, the donor's clean result, weaker borrowing (a strength
    that blends the borrowed attention output with the block's own); with --late instead, cache steps late in the
    schedule (5-6, 6-7, 5-7, 7-8 of 8) for every relation at every N.
Measures (`lab/measures.py`, `lab/features.py`): all four attributes right (detectors), donor leakage,
flicker and high-frequency energy as ratios to ground truth, palette distance, layout error, the Frechet distance on
summary features and on the toy world's learned video features against 640 ground-truth clips of the combinations
run, with 95% bootstrap intervals over prompts; "FD - plain N" is the paired difference to plain sampling at the
same N (negative: CHAI is closer to ground truth) by the lab's interval method (`lab/intervals.py`: held-out
combinations resampled, the reference set redrawn from the same draw); restart rows use the product's restart
arithmetic (`lab/restart_lab.py`) at sigma 0.8 with the request's noise swapped in; the verdict lines add the
paired flicker and palette differences (starred when their interval excludes zero). PSNR / SSIM against the
same-seed 30-step clip are secondary.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench._common import REPO, table  # noqa: E402
from comfyui_chai.toyworld.latent import decode  # noqa: E402
from comfyui_chai.toyworld.model import lab_weights, load_toy_model, toy_text_encoder  # noqa: E402
from comfyui_chai.toyworld.prompts import make_split  # noqa: E402
from comfyui_chai.toyworld.world import random_spec, render  # noqa: E402
from lab.lab import DEFAULT, PACK, LabSampler, Variant, make_lab_items  # noqa: E402
from lab.lab_plots import write_grid, write_steps_plot  # noqa: E402
from lab.lab_report import (GT_SET, Clip, baselines, build_cells, cluster_bootstrap, ground_truth_set,  # noqa: E402
                            label, reference_groups, row, table_rows)
from lab.restart_lab import Condition, run_condition  # noqa: E402

FULL = 30
ABLATIONS = (Variant("steps 2", (2,)), Variant("steps 1-4", (1, 2, 3, 4)), Variant("steps 2-6", (2, 3, 4, 5, 6)),
             Variant("concat", kv_mode="concat"), Variant("blocks 0+1", blocks=(0, 1)),
             Variant("clean donor", source="clean"),
             # weaker borrowing: half or a quarter of the borrowed output, one early step with concat, later steps
             Variant("strength 0.5", strength=0.5), Variant("strength 0.25", strength=0.25),
             Variant("steps 2 concat", (2,), kv_mode="concat"), Variant("steps 4", (4,)), Variant("steps 5-6", (5, 6)))
ABLATION_RELATIONS = ("scene", "none")
# Cache Attention late in the schedule (steps of 8, mapped to 6 and 4 by sigma), every relation, every N.
LATE = (Variant("late 5-6", (5, 6), of_eight=True), Variant("late 6-7", (6, 7), of_eight=True),
        Variant("late 5-7", (5, 6, 7), of_eight=True), Variant("late 7-8", (7, 8), of_eight=True))
LATE_RELATIONS = ("scene", "object", "none", "same")
RESTART_SIGMA = 0.8  # the grid's restart row: the product's restart arithmetic at this sigma, the noise swapped in


def clip_of(latent: torch.Tensor) -> np.ndarray:
    """Decoded clip [T, H, W, 3]."""
    return decode(latent)[0].numpy()


def generate(sampler: LabSampler, items: list, steps: list[int], ablate: str, echo: Any,
             donors: bool = True) -> list[Clip]:
    """Every clip of every condition, item by item (without donors: ground truth, 30 steps and plain N only);
    `ablate`: "standard" (table 3 at the largest and smallest N), "late" (the late-step sweep) or "none"."""
    clips: list[Clip] = []
    t0 = time.perf_counter()
    for i, item in enumerate(items):
        req, truth = item.request, item.request.combo
        add = lambda key, video, donors=(), fired=(): clips.append(  # noqa: E731
            Clip(i, key, video, truth, list(donors), list(fired)))
        add(("gt", "-", 0, "-"), render(random_spec(*truth, np.random.default_rng(req.seed))))
        add(("reference", "-", FULL, "-"), clip_of(sampler.run(req, FULL)))
        for n in steps:
            add(("plain", "-", n, "-"), clip_of(sampler.run(req, n)))
        if not donors:
            continue
        runs = {rel: sampler.donor(d) for rel, d in item.donors.items()}
        combos = {rel: d.combo for rel, d in item.donors.items()}
        for n in steps:
            for var in (DEFAULT, PACK):
                for rel, run in runs.items():
                    latent, fired = sampler.chai(req, n, [run], var)
                    add(("chai", rel, n, var.name), clip_of(latent), [combos[rel]], fired)
                fusion = Variant("fusion", var.cache_steps, fusion=True, of_eight=var.of_eight)
                latent, fired = sampler.chai(req, n, [runs["scene"], runs["object"]], fusion)
                add(("chai", "fusion", n, var.name), clip_of(latent), [combos["scene"], combos["object"]], fired)
            for rel, run in runs.items():
                cond = Condition("restart", n, rel, RESTART_SIGMA)
                latent, fired, _ = run_condition(sampler, cond, req, runs)
                add(cond.key, clip_of(latent), [combos[rel]], fired)
            if ablate == "standard" and n in (steps[0], steps[-1]):
                sweep, relations = ABLATIONS, ABLATION_RELATIONS
            else:
                sweep, relations = (LATE, LATE_RELATIONS) if ablate == "late" else ((), ())
            for var in (v for v in sweep if v.steps_for(n)):
                for rel in relations:
                    latent, fired = sampler.chai(req, n, [runs[rel]], var)
                    add(("chai", rel, n, var.name), clip_of(latent), [combos[rel]], fired)
        if echo:
            echo(f"  {i + 1}/{len(items)} prompts, {time.perf_counter() - t0:.0f} s")
    return clips


def print_report(rows: dict, steps: list[int], what: str) -> None:
    """The three tables and the verdict lines."""
    print(f"\n{what}; ground-truth set {GT_SET} clips of the combinations run; intervals: 95% "
          f"bootstrap over prompts, FD differences by the cluster bootstrap that redraws the reference\n")
    first = [("gt", "-", 0, "-"), ("reference", "-", FULL, "-")] + [("plain", "-", n, "-") for n in steps]
    print("Table 1: does the world make few steps hurt (plain sampling against ground truth)")
    print(table(*table_rows([rows[k] for k in first], with_delta=False)))
    variants = [v for v in ("default", PACK.name) if any(k[3] == v for k in rows)]
    grid = [k for n in steps for k in [("plain", "-", n, "-")] +
            [("chai", rel, n, v) for v in variants for rel in ("scene", "object", "none", "same", "fusion")] +
            [k for k in sorted(rows) if k[0] == "restart" and k[2] == n]]
    print("\nTable 2: the grid (CHAI: replace, block 0, donor latent at the matched sigma; cache steps over the "
          "paper's sigma range, steps 2-4 of 8, and 'pack': the pack's default cache steps "
          f"{','.join(map(str, PACK.cache_steps))} of 8, mapped to 6 and 4 by sigma)")
    print(table(*table_rows([rows[k] for k in grid])))
    ablation = sorted(k for k in rows if k[0] == "chai" and k[3] not in variants)
    grid_chai = [k for k in grid if k[0] in ("chai", "restart")]
    if ablation:
        print("\nTable 3: ablations")
        print(table(*table_rows([rows[k] for k in sorted(ablation, key=lambda k: (-k[2], k[3], k[1]))])))
    print("\nVerdicts (FD features: CHAI N against plain N, paired; attributes against 30 steps):")
    ref_attrs = rows[("reference", "-", FULL, "-")]["attrs"][0]
    compared = grid_chai + sorted(ablation)
    beyond = 0
    for key in compared:
        r = rows[key]
        d, lo, hi = r["d_fd_net"]
        verdict = "better" if hi < 0 else "worse" if lo > 0 else "no difference"
        beyond += verdict != "no difference"
        ok = r["attrs"][0] >= ref_attrs - 0.01 and (r["leak"] != r["leak"] or r["leak"] <= 0.02)
        leak = "-" if r["leak"] != r["leak"] else f"{100 * r['leak']:.1f}%"
        pixels = "".join(f"  {name} {_signed(r[k], scale)}" for name, k, scale in (
            ("flicker", "d_flicker", 1.0), ("palette x1000", "d_palette", 1000.0)) if k in r)
        print(f"  {label(key):32s} {verdict:14s} FD {d:+.2f} [{lo:+.2f}, {hi:+.2f}]  attrs "
              f"{100 * r['attrs'][0]:.1f}% vs {100 * ref_attrs:.1f}%  leak {leak}{pixels}"
              f"{'' if ok else '  (fails the attribute / leakage bar)'}")
    print(f"  {beyond} of {len(compared)} paired comparisons lie beyond their 95% interval; chance alone puts about "
          f"{len(compared) / 20:.1f} there, so read a single one with care")


def _signed(t: Any, scale: float = 1.0) -> str:
    """'+p [lo, hi]' of a paired difference (times `scale`), starred when the interval excludes zero."""
    p, lo, hi = t
    star = "*" if lo > 0 or hi < 0 else ""
    return f"{scale * p:+.2f} [{scale * lo:+.2f}, {scale * hi:+.2f}]{star}"


def write_plot(path: Path, rows: dict, steps: list[int]) -> None:
    """Frechet distance (learned features) against steps per condition, with the floor and the 30-step line."""
    def points(key_of: Any) -> list[tuple[int, float, float, float]]:
        return [(n, *([rows[key_of(n)]["fd_net"][0]] * 3)) for n in steps]

    series = {"plain": points(lambda n: ("plain", "-", n, "-"))}
    for rel in ("scene", "object", "none", "same", "fusion"):
        series[rel] = points(lambda n, rel=rel: ("chai", rel, n, "default"))
    for rel in ("scene", "none"):
        if ("chai", rel, steps[0], PACK.name) in rows:
            series[f"{rel}, pack steps"] = points(lambda n, rel=rel: ("chai", rel, n, PACK.name))
    write_steps_plot(path, series, rows[("gt", "-", 0, "-")]["fd_net"][0],
                     rows[("reference", "-", FULL, "-")]["fd_net"][0],
                     "Frechet distance (learned features) to ground truth, lower is better")


def main(argv: list[str] | None = None) -> int:
    """Run the lab and print its tables."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", type=Path, default=None,
                   help="toy STDiT3 weights (default: the shipped lab model, trained on the detailed world)")
    p.add_argument("--prompts", type=int, default=None, help="held-out prompts to use (default: all)")
    p.add_argument("--quick", action="store_true", help="6 prompts, N = 8 and 4, no ablations, no files")
    p.add_argument("--steps", default="8,6,4", help="fast step counts")
    p.add_argument("--no-ablations", action="store_true")
    p.add_argument("--late", action="store_true",
                   help="instead of table 3's ablations, Cache Attention late in the schedule (steps 5-6, 6-7, 5-7, "
                        "7-8 of 8, mapped to 6 and 4 by sigma) for every donor relation at every N")
    p.add_argument("--reps", type=int, default=1000,
                   help="bootstrap resamples (held-out combinations, the reference redrawn: lab/intervals.py)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=REPO / "docs" / "quality_lab.json")
    p.add_argument("--png", type=Path, default=REPO / "docs" / "quality_lab.png")
    p.add_argument("--plot", type=Path, default=REPO / "docs" / "quality_steps.png")
    p.add_argument("--gap", action="store_true",
                   help="only table 1, with plain N's paired Frechet difference to 30 steps (no donors; no files)")
    p.add_argument("--report", type=Path, default=None,
                   help="print the tables (and redraw the plot) from a saved --json run instead of running")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    steps = [8, 4] if a.quick else [int(s) for s in a.steps.split(",")]
    n_prompts = 6 if a.quick else a.prompts
    if a.report is not None:
        saved = json.loads(a.report.read_text(encoding="utf-8"))
        rows = {tuple(r["key"]): r for r in saved["rows"]}
        print_report(rows, saved["steps"], f"{saved['prompts']} held-out prompts (from {a.report})")
        write_plot(a.plot, rows, saved["steps"])
        print(f"\nwrote {a.plot}")
        return 0
    model = load_toy_model(a.weights or lab_weights())
    split = make_split(0, 0.1)
    items = make_lab_items(split.held_out, split.train, n_prompts)
    sampler = LabSampler(model, toy_text_encoder())
    t0 = time.perf_counter()
    ablate = "none" if a.quick or a.no_ablations else "late" if a.late else "standard"
    clips = generate(sampler, items, steps, ablate, print, donors=not a.gap)
    refs = {c.item: c.video for c in clips if c.key[0] == "reference"}
    cells = build_cells(clips, refs)
    # the reference set is drawn for the combinations actually run (--quick / --prompts N run fewer than all 90)
    combos = [item.request.combo for item in items]
    base = baselines(ground_truth_set(combos, GT_SET), cells[("gt", "-", 0, "-")],
                     reference_groups(GT_SET, len(items)))
    boot = cluster_bootstrap(base, len(items), a.reps)
    if a.gap:
        reference = cells[("reference", "-", FULL, "-")]
        keys = [("gt", "-", 0, "-"), ("reference", "-", FULL, "-")] + [("plain", "-", n, "-") for n in steps]
        gap = [row(cells[k], base, reference if k[0] == "plain" else None, a.reps, boot) for k in keys]
        print(f"\n{len(items)} held-out prompts; Table 1 with plain N against 30 steps (paired, 95% bootstrap)")
        print(table(*table_rows(gap, delta_label="FD - 30 steps")))
        return 0
    plain = {n: cells[("plain", "-", n, "-")] for n in steps}
    rows = {key: row(cell, base, plain.get(key[2]) if key[0] in ("chai", "restart") else None, a.reps, boot)
            for key, cell in cells.items()}
    print_report(rows, steps, f"{len(items)} held-out prompts, {len(clips)} clips, "
                              f"{time.perf_counter() - t0:.0f} s")
    if a.quick:
        return 0
    write_plot(a.plot, rows, steps)
    picks = []
    for i in range(min(4, len(items))):
        by = {c.key: c.video for c in clips if c.item == i}
        n = steps[0]
        picks.append((f"{items[i].request.prompt}  |  scene donor: {items[i].donors['scene'].prompt}",
                      [("ground truth", by[("gt", "-", 0, "-")]), ("30 steps", by[("reference", "-", FULL, "-")]),
                       (f"plain {n}", by[("plain", "-", n, "-")]), (f"plain {steps[-1]}", by[("plain", "-", steps[-1], "-")])]
                      + [(f"CHAI {n} {rel}", by[("chai", rel, n, "default")]) for rel in ("scene", "object", "none")]
                      + [(f"CHAI {n} scene, pack steps", by[("chai", "scene", n, PACK.name)])]))
    write_grid(a.png, picks)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"prompts": len(items), "steps": steps, "reps": a.reps,
                                  "rows": [r for r in rows.values()]}, indent=1, default=float), encoding="utf-8")
    print(f"\nwrote {a.json}, {a.png}, {a.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
