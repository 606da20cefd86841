"""Rows, fixed comparisons, A/A checks and seed diversity of the restart lab (`bench/bench_restart_lab.py`)."""
from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

import numpy as np

from lab.intervals import ClusterBootstrap, bonferroni_level, excludes_zero, holm
from lab.lab_report import Baselines, Cell, CellKey, clustered, label
from lab.quality import psnr


def seed_psnr(cell: Cell) -> float:
    """Mean PSNR (dB) between every two seeds of one prompt in one condition (inf: identical clips; nan: 1 seed)."""
    by: dict[int, list[np.ndarray]] = {}
    for c in cell.clips:
        by.setdefault(c.item, []).append(c.video)
    values = [psnr(a, b) for vs in by.values() for a, b in itertools.combinations(vs, 2)]
    if not values:
        return math.nan
    finite = [v for v in values if math.isfinite(v)]
    return math.inf if not finite else float(np.mean(finite))


def _cl(cell: Cell, base: Baselines) -> Any:
    """A cell's clustered features, named by its key (its bootstrap draws computed once)."""
    return clustered(cell, base, name=repr(cell.key))


def restart_row(cell: Cell, base: Baselines, boot: ClusterBootstrap, plain: Cell | None,
                full: Cell | None) -> dict[str, Any]:
    """One condition's figures: attributes, leakage, layout, palette, FD with its interval, the paired FD
    differences to plain sampling at the same evaluations and to the full run (95%), seed diversity."""
    s = cell.scores
    leaked, pairs = sum(x.leak[0] for x in s), sum(x.leak[1] for x in s)
    out: dict[str, Any] = {
        "key": list(cell.key), "label": label(cell.key), "n": len(s),
        "evals": int(max((c.evals for c in cell.clips), default=0)),
        "attrs": float(np.mean([x.correct[4] for x in s])),
        "leak": leaked / pairs if pairs else math.nan,
        "layout": float(np.mean([x.layout for x in s])), "palette": float(np.mean([x.palette for x in s])),
        "fd": boot.interval(_cl(cell, base)),
        # seed 0 only (one clip per combination): comparable across conditions whatever their seed diversity
        # (a condition that ignores the seed has K copies of each clip, and FD's small-sample bias grows as 1/N)
        "fd_seed0": boot.interval(clustered(cell, base, [c.seed == 0 for c in cell.clips], f"{cell.key!r} seed 0")),
        "seed_psnr": seed_psnr(cell),
        "psnr_full": float(np.mean([x.psnr for x in s if math.isfinite(x.psnr)] or [math.nan])),
        "fired": sorted({tuple(c.fired) for c in cell.clips}),
    }
    for name, other in (("d_plain", plain), ("d_full", full)):
        if other is not None and other.key != cell.key:
            out[name] = boot.difference(_cl(cell, base), _cl(other, base))
            out[name + "_key"] = list(other.key)
    return out


def compare(cells: dict[CellKey, Cell], base: Baselines, boot: ClusterBootstrap,
            comparisons: Sequence[tuple[CellKey, CellKey]], alpha: float = 0.05,
            fixed: ClusterBootstrap | None = None) -> list[dict[str, Any]]:
    """The fixed comparisons at the Bonferroni level (m = the whole list), with Holm-adjusted p-values; with
    `fixed` (the same draws against a fixed reference), that method's interval beside for comparison."""
    level = bonferroni_level(len(comparisons), alpha)
    out = []
    for a, b in comparisons:
        if a not in cells or b not in cells:
            out.append({"a": list(a), "b": list(b), "run": False})
            continue
        d, lo, hi, p = boot.difference(_cl(cells[a], base), _cl(cells[b], base), level)
        out.append({"a": list(a), "b": list(b), "run": True, "d": d, "lo": lo, "hi": hi, "p": p, "level": level})
        if fixed is not None:
            out[-1]["fixed"] = list(fixed.difference(_cl(cells[a], base), _cl(cells[b], base), level)[1:3])
    run = [c for c in out if c["run"]]
    for c, adj in zip(run, holm([c["p"] for c in run]) if run else []):
        c["p_holm"] = adj
    return out


def aa_checks(cells: dict[CellKey, Cell], base: Baselines, boot: ClusterBootstrap, keys: Sequence[CellKey],
              level: float = 0.95) -> list[dict[str, Any]]:
    """A/A: one condition's seed a against its seed b (every pair of seeds), paired on the same draws."""
    out = []
    for key in keys:
        cell = cells.get(key)
        if cell is None:
            continue
        seeds = sorted({c.seed for c in cell.clips})
        for a, b in itertools.combinations(seeds, 2):
            ca = clustered(cell, base, [c.seed == a for c in cell.clips], f"{key!r} seed {a}")
            cb = clustered(cell, base, [c.seed == b for c in cell.clips], f"{key!r} seed {b}")
            d, lo, hi, p = boot.difference(ca, cb, level)
            out.append({"key": list(key), "seeds": [a, b], "d": d, "lo": lo, "hi": hi, "p": p,
                        "excludes_zero": excludes_zero(lo, hi)})
    return out


def _ci(t: Sequence[float] | None, digits: int = 1) -> str:
    """'+p [lo, hi]' or '-'."""
    if t is None:
        return "-"
    return f"{t[0]:+.{digits}f} [{t[1]:+.{digits}f}, {t[2]:+.{digits}f}]"


def _db(x: float) -> str:
    """A PSNR in dB ('identical' for inf)."""
    return "-" if math.isnan(x) else "identical" if math.isinf(x) else f"{x:.1f}"


def table_body(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """(header, body) of the restart table."""
    head = ["condition", "evals", "attrs %", "leak %", "layout", "palette x1e3", "FD [95%]", "FD seed 0",
            "FD - plain N [95%]", "FD - full [95%]", "seed PSNR dB"]
    body = []
    for r in rows:
        fd = r["fd"]
        body.append([r["label"], str(r["evals"]), f"{100 * r['attrs']:.1f}",
                     "-" if math.isnan(r["leak"]) else f"{100 * r['leak']:.1f}", f"{r['layout']:.3f}",
                     f"{1000 * r['palette']:.1f}", f"{fd[0]:.1f} [{fd[1]:.1f}, {fd[2]:.1f}]",
                     f"{r['fd_seed0'][0]:.1f}" if "fd_seed0" in r else "-",
                     _ci(r.get("d_plain")), _ci(r.get("d_full")), _db(r["seed_psnr"])])
    return head, body


def comparison_lines(comps: Sequence[dict[str, Any]]) -> list[str]:
    """One line per fixed comparison."""
    lines = []
    for c in comps:
        name = f"{label(tuple(c['a']))} - {label(tuple(c['b']))}"
        if not c["run"]:
            lines.append(f"  {name:60s} not run in this grid")
            continue
        star = "*" if excludes_zero(c["lo"], c["hi"]) else " "
        fixed = (f"  fixed reference [{c['fixed'][0]:+.1f}, {c['fixed'][1]:+.1f}]" if "fixed" in c else "")
        lines.append(f"  {name:60s} {c['d']:+7.1f} [{c['lo']:+7.1f}, {c['hi']:+7.1f}]{star} "
                     f"p {c['p']:.4f}  Holm {c['p_holm']:.4f}{fixed}")
    return lines


def aa_summary(checks: Sequence[dict[str, Any]]) -> str:
    """'k of n A/A intervals exclude zero'."""
    k = sum(c["excludes_zero"] for c in checks)
    return f"{k} of {len(checks)} A/A intervals (95%) exclude zero" if checks else "no A/A checks (one seed)"


__all__ = ["seed_psnr", "restart_row", "compare", "aa_checks", "table_body", "comparison_lines", "aa_summary"]
