"""The restart lab: a hit that starts from the donor's latent (issue 27), against plain sampling, Cache Attention
and a better few-step solver, on the 30-step lab model or on a distilled few-step model.

    OMP_NUM_THREADS=1 python bench/bench_restart_lab.py --quick                    # 6 prompts, 2 seeds, smoke
    OMP_NUM_THREADS=1 python bench/bench_restart_lab.py --grid table --seeds 3     # the issue's table, 90 prompts
    OMP_NUM_THREADS=1 python bench/bench_restart_lab.py --grid restart --prompts 30  # the full restart grid
    OMP_NUM_THREADS=1 python bench/bench_restart_lab.py --grid solvers # plain / AB2 / dpmpp_2m against the restart
    OMP_NUM_THREADS=1 python bench/bench_restart_lab.py --grid distilled --model STUDENT.safetensors \\
        --cfg 1 --full-steps 4 --seeds 3                                             # the distilled student

Each held-out combination gets a caption, K noise seeds (the first is the lab's usual 1000 + i) and donors of
each relation (`lab/lab.py`), each donor a full run of its own caption (`--full-steps`). Conditions
(`lab/restart_grids.py`) use the product's restart arithmetic (`lab/restart_lab.py`). Measures as the quality
lab's (`lab/lab_report.py`); the Frechet distance on learned features is read against ground truth of the
combinations run, with the lab's interval method (`lab/intervals.py`: a paired bootstrap over held-out
combinations that keeps a combination's seeds together and redraws the reference set from the same draw). The
fixed comparisons are read at the Bonferroni level; A/A checks compare one condition's seed sets.
`dpmpp_2m` is the reference sampler's own (ComfyUI's result, tier 2); ComfyUI's other samplers (`--comfy`)
need COMFYUI_DIR (and that tree's Python environment).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench._common import table  # noqa: E402
from comfyui_chai.toyworld.latent import decode  # noqa: E402
from comfyui_chai.toyworld.model import DEFAULT_CFG, lab_weights, load_toy_model, toy_text_encoder  # noqa: E402
from comfyui_chai.toyworld.prompts import make_split  # noqa: E402
from comfyui_chai.toyworld.world import random_spec, render  # noqa: E402
from lab.lab import LabItem, LabSampler, Request, make_lab_items  # noqa: E402
from lab.lab_report import (GT_SET, Clip, baselines, build_cells, cluster_bootstrap, ground_truth_set,  # noqa: E402
                            reference_groups)
from lab.restart_grids import GRIDS, aa_for, comparisons_for  # noqa: E402
from lab.restart_lab import Condition, run_condition  # noqa: E402
from lab.restart_report import (aa_checks, aa_summary, compare, comparison_lines, restart_row,  # noqa: E402
                                table_body)
from lab.solvers import comfy_available  # noqa: E402


def seed_of(item: LabItem, i: int, k: int) -> int:
    """The k-th noise seed of lab item i (k = 0: the lab's usual seed)."""
    return item.request.seed if k == 0 else 1000 + i + 10_000 * k


def generate(sampler: LabSampler, items: list[LabItem], grid: list[Condition], seeds: int,
             echo: Any = print) -> tuple[list[Clip], dict[tuple[int, int], np.ndarray]]:
    """Every clip of every condition and seed, item by item; and each (item, seed)'s full-run clip."""
    relations = sorted({c.relation for c in grid if c.relation != "-"})
    clips: list[Clip] = []
    refs: dict[tuple[int, int], np.ndarray] = {}
    t0 = time.perf_counter()
    for i, item in enumerate(items):
        runs = {rel: sampler.donor(item.donors[rel]) for rel in relations}
        truth = item.request.combo
        for k in range(seeds):
            req = Request(item.request.prompt, truth, seed_of(item, i, k))
            for cond in grid:
                if cond.kind == "gt":
                    video, fired, evals = render(random_spec(*truth, np.random.default_rng(req.seed))), [], 0
                else:
                    latent, fired, evals = run_condition(sampler, cond, req, runs)
                    video = decode(latent)[0].numpy()
                donors = [item.donors[cond.relation].combo] if cond.relation != "-" else []
                clips.append(Clip(i, cond.key, video, truth, donors, list(fired), k, evals))
                if cond.kind == "reference":
                    refs[(i, k)] = video
        if echo:
            echo(f"  {i + 1}/{len(items)} prompts, {time.perf_counter() - t0:.0f} s")
    return clips, refs


def report(clips: list[Clip], refs: dict, items: list[LabItem], grid_name: str, grid: list[Condition],
           full_steps: int, reps: int) -> dict[str, Any]:
    """Rows, fixed comparisons and A/A checks of a run."""
    cells = build_cells(clips, refs)
    combos = [item.request.combo for item in items]
    base = baselines(ground_truth_set(combos, GT_SET), cells[("gt", "-", 0, "-")], reference_groups(GT_SET, len(items)))
    boot = cluster_bootstrap(base, len(items), reps)
    full = cells[("reference", "-", full_steps, "-")]
    rows = []
    for cond in grid:
        cell = cells[cond.key]
        plain = cells.get(("plain", "-", cond.steps, "-")) or (full if cond.steps == full_steps else None)
        rows.append(restart_row(cell, base, boot, None if cond.kind == "gt" else plain,
                                None if cond.kind == "gt" else full))
    fixed = cluster_bootstrap(base, len(items), reps, redraw=False)  # the replaced method, for comparison only
    comps = compare(cells, base, boot, comparisons_for(grid_name), fixed=fixed)
    aa = aa_checks(cells, base, boot, aa_for(grid_name))
    return {"rows": rows, "comparisons": comps, "aa": aa}


def print_report(out: dict[str, Any]) -> None:
    """The table, the fixed comparisons and the A/A result."""
    a = out["args"]
    print(f"\n{a['prompts']} held-out prompts x {a['seeds']} seeds, grid {a['grid']}, model {a['model']}, "
          f"cfg {a['cfg']}, full run {a['full_steps']} steps; FD on learned features against {GT_SET} ground-truth "
          f"clips of the combinations run; intervals: paired cluster bootstrap ({a['reps']} draws of held-out "
          f"combinations, seeds together, the reference redrawn)\n")
    print(table(*table_body(out["rows"])))
    m = sum(c["run"] for c in out["comparisons"])
    print(f"\nFixed comparisons (Bonferroni over the {len(out['comparisons'])} listed, "
          f"{100 * (1 - 0.05 / max(len(out['comparisons']), 1)):.2f}% intervals; * excludes zero; {m} run):")
    print("\n".join(comparison_lines(out["comparisons"])))
    print(f"\nA/A (one condition, seed a against seed b): {aa_summary(out['aa'])}")
    for c in out["aa"]:
        print(f"  {c['key']} seeds {c['seeds']}: {c['d']:+.1f} [{c['lo']:+.1f}, {c['hi']:+.1f}]")


def main(argv: list[str] | None = None) -> int:
    """Run the restart lab and print its table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", choices=sorted(GRIDS), default="table")
    p.add_argument("--model", type=Path, default=None, help="toy STDiT3 weights (default: the shipped lab model)")
    p.add_argument("--cfg", type=float, default=DEFAULT_CFG, help="guidance scale (1: no uncond pass)")
    p.add_argument("--full-steps", type=int, default=30, help="the full run's (the donors' and the miss's) steps")
    p.add_argument("--prompts", type=int, default=None, help="held-out prompts (default: all 90)")
    p.add_argument("--seeds", type=int, default=1, help="noise seeds per held-out combination")
    p.add_argument("--quick", action="store_true", help="6 prompts, 2 seeds, the quick grid, no files")
    p.add_argument("--comfy", action="store_true", help="add ComfyUI's samplers to the restart grid (COMFYUI_DIR)")
    p.add_argument("--reps", type=int, default=2000, help="bootstrap draws")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--report", type=Path, default=None, help="print the tables of a saved --json run")
    a = p.parse_args(argv)
    if a.report is not None:
        print_report(json.loads(a.report.read_text(encoding="utf-8")))
        return 0
    torch.set_num_threads(a.threads)
    grid_name = "quick" if a.quick else a.grid
    n_prompts, seeds = (6, max(a.seeds, 2)) if a.quick else (a.prompts, a.seeds)
    if a.comfy and not comfy_available():
        p.error("--comfy needs COMFYUI_DIR set to a ComfyUI tree whose samplers import")
    maker = GRIDS[grid_name]
    grid = maker(a.full_steps, comfy=a.comfy) if grid_name == "restart" else maker(a.full_steps)
    model = load_toy_model(a.model or lab_weights())
    split = make_split(0, 0.1)
    items = make_lab_items(split.held_out, split.train, n_prompts)
    sampler = LabSampler(model, toy_text_encoder(), cfg=a.cfg, full_steps=a.full_steps)
    t0 = time.perf_counter()
    clips, refs = generate(sampler, items, grid, seeds)
    out = report(clips, refs, items, grid_name, grid, a.full_steps, a.reps)
    out["args"] = {"grid": grid_name, "model": str(a.model or lab_weights().name), "cfg": a.cfg,
                   "full_steps": a.full_steps, "prompts": len(items), "seeds": seeds, "reps": a.reps,
                   "command": " ".join(["python bench/bench_restart_lab.py"] + (argv or sys.argv[1:])),
                   "seconds": round(time.perf_counter() - t0)}
    print_report(out)
    if a.json is not None:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1, default=_json), encoding="utf-8")
        print(f"\nwrote {a.json}")
    return 0


def _json(x: Any) -> Any:
    """JSON for numpy scalars and tuples; inf / nan as strings."""
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


if __name__ == "__main__":
    raise SystemExit(main())
