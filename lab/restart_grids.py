"""The restart lab's grids (which conditions a run samples) and, fixed before any run, the short list of
comparisons each grid's claims rest on (read at the Bonferroni-corrected level, `lab/intervals.py`).

"table": the issue-27 table on the 30-step model; "restart": the full restart grid (sigma 0.95 to 0.6, fast
steps 8 / 6 / 4, every donor relation, the noise swap and Cache Attention after the restart at 0.8, and the solver
control); "distilled": the 4-step guidance-1 student (plain 4 is its own full run) with restarts that skip one
step (0.75, 3 steps) or two (0.5, 2 steps); "quick": a smoke subset of "table"; "solvers": plain, AB2 and
ComfyUI's dpmpp_2m at 8 / 6 / 4 beside the scene restart at 0.8; "restart_solver": the restart's tail sampled
with DPM-Solver++(2M) against Euler; "distilled_solver": the student with the multistep solvers and restarts whose
tail is sampled with DPM-Solver++(2M).
"""
from __future__ import annotations

from lab.lab import RELATIONS
from lab.restart_lab import CellKey, Condition
from lab.solvers import COMFY_SAMPLERS

TABLE_SIGMA = 0.8
SIGMAS = (0.95, 0.9, 0.8, 0.7, 0.6)
FAST = (8, 6, 4)


def _full(full_steps: int) -> list[Condition]:
    """Ground truth and the full run: every grid's first two rows."""
    return [Condition("gt"), Condition("reference", full_steps)]


def table_grid(full_steps: int = 30) -> list[Condition]:
    """The issue's table: plain 30 / 8 / 6, CHAI 8 (pack steps, scene), restarts at 0.8 and AB2."""
    r = lambda n, rel, **kw: Condition("restart", n, rel, TABLE_SIGMA, **kw)  # noqa: E731
    return _full(full_steps) + [
        Condition("plain", 8), Condition("plain", 6), Condition("chai", 8, "scene"),
        r(8, "scene"), r(6, "scene"), r(8, "scene", swap=False), r(8, "scene", both=True),
        r(8, "object"), r(8, "none"), Condition("solver", 8, solver="ab2"), Condition("solver", 6, solver="ab2")]


def quick_grid(full_steps: int = 30) -> list[Condition]:
    """A smoke subset: plain 8, CHAI 8, the restart at 0.8 (scene, swap and no swap), AB2 8."""
    r = lambda n, rel, **kw: Condition("restart", n, rel, TABLE_SIGMA, **kw)  # noqa: E731
    return _full(full_steps) + [Condition("plain", 8), Condition("chai", 8, "scene"), r(8, "scene"),
                                r(8, "scene", swap=False), Condition("solver", 8, solver="ab2")]


def restart_grid(full_steps: int = 30, comfy: bool = False) -> list[Condition]:
    """Every restart sigma x fast steps x relation (swap), at 0.8 also no swap and both; the solver control."""
    out = _full(full_steps)
    for n in FAST:
        out += [Condition("plain", n), Condition("solver", n, solver="ab2")]
        out += [Condition("solver", n, solver=s) for s in COMFY_SAMPLERS if comfy and s != "euler"]
        for rel in RELATIONS:
            out += [Condition("restart", n, rel, s) for s in SIGMAS]
            out += [Condition("restart", n, rel, TABLE_SIGMA, swap=False),
                    Condition("restart", n, rel, TABLE_SIGMA, both=True)]
    return out


def distilled_grid(full_steps: int = 4) -> list[Condition]:
    """The student: plain 4 (the reference), plain 3 / 2, AB2 3 / 2, restarts skipping 1 or 2 steps."""
    out = _full(full_steps) + [Condition("plain", 3), Condition("plain", 2),
                               Condition("solver", 3, solver="ab2"), Condition("solver", 2, solver="ab2")]
    for rel in RELATIONS:
        for sigma, n in ((0.75, 3), (0.5, 2)):
            out += [Condition("restart", n, rel, sigma), Condition("restart", n, rel, sigma, swap=False)]
    return out


def solvers_grid(full_steps: int = 30) -> list[Condition]:
    """The solver check: plain, AB2 and ComfyUI's dpmpp_2m at 8 / 6 / 4 against the scene restart at 0.8."""
    out = _full(full_steps)
    for n in FAST:
        out += [Condition("plain", n), Condition("solver", n, solver="ab2"), Condition("solver", n, solver="dpmpp_2m"),
                Condition("restart", n, "scene", TABLE_SIGMA)]
    return out


def restart_solver_grid(full_steps: int = 30) -> list[Condition]:
    """The restart's tail with DPM-Solver++(2M) against Euler at 8 / 6, beside plain 8 and dpmpp_2m 8 / 6."""
    r = lambda n, rel, **kw: Condition("restart", n, rel, TABLE_SIGMA, **kw)  # noqa: E731
    return _full(full_steps) + [
        Condition("plain", 8), Condition("solver", 8, solver="dpmpp_2m"), Condition("solver", 6, solver="dpmpp_2m"),
        r(8, "scene"), r(6, "scene"), r(8, "scene", solver="dpmpp_2m"), r(6, "scene", solver="dpmpp_2m"),
        r(8, "object", solver="dpmpp_2m")]


def distilled_solver_grid(full_steps: int = 4) -> list[Condition]:
    """The student: plain 4 (the reference) and 3, AB2 3, dpmpp_2m 4 / 3, restarts sampled with dpmpp_2m."""
    out = _full(full_steps) + [Condition("plain", 3), Condition("solver", 3, solver="ab2"),
                               Condition("solver", 4, solver="dpmpp_2m"), Condition("solver", 3, solver="dpmpp_2m")]
    for rel in ("scene", "same"):
        out += [Condition("restart", 3, rel, 0.75, solver="dpmpp_2m")]
    return out + [Condition("restart", 2, "same", 0.5, solver="dpmpp_2m")]


def distilled_history_grid(full_steps: int = 4) -> list[Condition]:
    """The student: restarts whose dpmpp_2m tail takes the donor's origin as its previous denoised estimate."""
    out = _full(full_steps) + [Condition("solver", n, solver="dpmpp_2m") for n in (4, 3, 2)]
    out += [Condition("restart", 3, "same", 0.75, solver="dpmpp_2m")]
    for rel in ("same", "scene"):
        out += [Condition("restart", 3, rel, 0.75, solver="dpmpp_2m", history=True)]
    return out + [Condition("restart", 2, "same", 0.5, solver="dpmpp_2m", history=True)]


def distilled_relation_grid(full_steps: int = 4) -> list[Condition]:
    """The student: the resumed restart from a donor of the same object and scene in another colour."""
    out = _full(full_steps) + [Condition("solver", n, solver="dpmpp_2m") for n in (3, 2)]
    for rel in ("same", "subject_scene"):
        out += [Condition("restart", 3, rel, 0.75, solver="dpmpp_2m", history=True),
                Condition("restart", 2, rel, 0.5, solver="dpmpp_2m", history=True)]
    return out


def distilled_attention_grid(full_steps: int = 4) -> list[Condition]:
    """The student: Cache Attention hits at 3 steps (the pack's cache sigmas) against its own 4 and plain 3."""
    return _full(full_steps) + [Condition("plain", 3), Condition("chai", 3, "scene"), Condition("chai", 3, "same")]


def restart_relation_grid(full_steps: int = 30) -> list[Condition]:
    """The 30-step model: the default restart from a scene donor against one of the same object and scene in
    another colour (which the product's same-scene rule also restarts from)."""
    r = lambda rel: Condition("restart", 8, rel, TABLE_SIGMA)  # noqa: E731
    return _full(full_steps) + [Condition("plain", 8), r("scene"), r("subject_scene")]


GRIDS = {"table": table_grid, "quick": quick_grid, "restart": restart_grid, "distilled": distilled_grid,
         "solvers": solvers_grid, "restart_solver": restart_solver_grid,
         "distilled_solver": distilled_solver_grid, "distilled_history": distilled_history_grid,
         "distilled_relation": distilled_relation_grid, "restart_relation": restart_relation_grid,
         "distilled_attention": distilled_attention_grid}


def _rk(n: int, rel: str, sigma: float = TABLE_SIGMA) -> CellKey:
    """The cell key of a swap restart."""
    return Condition("restart", n, rel, sigma).key


_REF30: CellKey = ("reference", "-", 30, "-")
# Fixed before the first run (issue 27): the 30-step model's headline comparisons, as (condition, baseline).
COMPARISONS_30: tuple[tuple[CellKey, CellKey], ...] = (
    (_rk(8, "scene"), _REF30),  # a restart hit at 8 keeps the full run's quality
    (_rk(6, "scene"), _REF30),  # ... and at 6
    (_rk(8, "scene"), ("plain", "-", 8, "-")),  # it beats typing fewer steps
    (_rk(8, "scene"), ("solver", "-", 8, "ab2")),  # it beats the better few-step solver at equal evaluations
    (_rk(6, "scene"), ("solver", "-", 6, "ab2")),
    (("chai", "scene", 8, "pack"), ("plain", "-", 8, "-")),  # Cache Attention against plain 8
    (("solver", "-", 8, "ab2"), _REF30),  # the solver control against the full run
    (_rk(8, "object"), ("plain", "-", 8, "-")),  # a donor of another scene under a restart
)
_REF4: CellKey = ("reference", "-", 4, "-")
# Fixed before the first run: the distilled model's comparisons against its own 4-step output.
COMPARISONS_4: tuple[tuple[CellKey, CellKey], ...] = (
    (_rk(3, "scene", 0.75), _REF4), (_rk(2, "scene", 0.5), _REF4),
    (("plain", "-", 3, "-"), _REF4), (("plain", "-", 2, "-"), _REF4),
    (_rk(3, "scene", 0.75), ("plain", "-", 3, "-")), (_rk(2, "scene", 0.5), ("plain", "-", 2, "-")),
    (_rk(3, "object", 0.75), _REF4), (_rk(3, "none", 0.75), _REF4),
)
# A/A checks: conditions whose seed sets are compared against each other (one condition, seed a vs seed b).
AA_30: tuple[CellKey, ...] = (_REF30, ("plain", "-", 8, "-"), ("chai", "scene", 8, "pack"), _rk(8, "scene"),
                              ("solver", "-", 8, "ab2"))
AA_4: tuple[CellKey, ...] = (_REF4, ("plain", "-", 3, "-"), ("plain", "-", 2, "-"), _rk(3, "scene", 0.75),
                             _rk(2, "scene", 0.5))


# Fixed before its run (after the 12-prompt restart grid showed dpmpp_2m at or below plain 30): the solver check.
COMPARISONS_SOLVERS: tuple[tuple[CellKey, CellKey], ...] = (
    (_rk(8, "scene"), ("solver", "-", 8, "dpmpp_2m")), (_rk(6, "scene"), ("solver", "-", 6, "dpmpp_2m")),
    (("solver", "-", 8, "dpmpp_2m"), _REF30), (("solver", "-", 4, "dpmpp_2m"), _REF30),
)


def _rd(n: int, rel: str, sigma: float = TABLE_SIGMA) -> CellKey:
    """The cell key of a swap restart whose tail is sampled with DPM-Solver++(2M)."""
    return Condition("restart", n, rel, sigma, solver="dpmpp_2m").key


_DPM = lambda n: ("solver", "-", n, "dpmpp_2m")  # noqa: E731
# Fixed before its run (issue 27 item 4's rule: does the solver that wins on its own also help the restart?).
COMPARISONS_RESTART_SOLVER: tuple[tuple[CellKey, CellKey], ...] = (
    (_rd(8, "scene"), _rk(8, "scene")), (_rd(6, "scene"), _rk(6, "scene")),
    (_rd(8, "scene"), _REF30), (_rd(6, "scene"), _REF30), (_rd(8, "scene"), _DPM(8)),
)
# Fixed before its run: the student with multistep solvers, and restarts sampled with one, against its own 4 steps.
COMPARISONS_4_SOLVER: tuple[tuple[CellKey, CellKey], ...] = (
    (_DPM(3), _REF4), (("solver", "-", 3, "ab2"), _REF4), (_DPM(4), _REF4),
    (_rd(3, "scene", 0.75), _REF4), (_rd(3, "same", 0.75), _REF4), (_rd(3, "scene", 0.75), _DPM(3)),
)


def _rh(n: int, rel: str, sigma: float) -> CellKey:
    """The cell key of a swap restart with a dpmpp_2m tail that carries the donor's origin as its history."""
    return Condition("restart", n, rel, sigma, solver="dpmpp_2m", history=True).key


# Fixed before its run: does a restart that resumes the donor's multistep history buy what no donor-free sampler
# gives (the 4-step dpmpp_2m quality at 3 or 2 evaluations)?
COMPARISONS_4_HISTORY: tuple[tuple[CellKey, CellKey], ...] = (
    (_rh(3, "same", 0.75), _REF4), (_rh(3, "same", 0.75), _DPM(3)), (_rh(3, "same", 0.75), _DPM(4)),
    (_rh(3, "same", 0.75), _rd(3, "same", 0.75)), (_rh(2, "same", 0.5), _REF4), (_rh(2, "same", 0.5), _DPM(2)),
    (_rh(3, "scene", 0.75), _REF4),
)


# Fixed before its run: does the product's "main subject and scene matched" relation (here: the same object and
# scene in another colour) restart as cleanly as the same prompt on the student?
COMPARISONS_4_RELATION: tuple[tuple[CellKey, CellKey], ...] = (
    (_rh(3, "subject_scene", 0.75), _REF4), (_rh(2, "subject_scene", 0.5), _REF4),
    (_rh(3, "subject_scene", 0.75), _DPM(3)), (_rh(3, "subject_scene", 0.75), _rh(3, "same", 0.75)),
)


# Fixed before its run: is a same-object-and-scene donor in another colour as safe a restart on the 30-step model
# as the lab's scene donor?
COMPARISONS_RELATION: tuple[tuple[CellKey, CellKey], ...] = (
    (_rk(8, "subject_scene"), _REF30), (_rk(8, "subject_scene"), _rk(8, "scene")),
    (_rk(8, "subject_scene"), ("plain", "-", 8, "-")),
)


# Fixed before its run: would a Cache Attention hit (what a few-step hit that cannot restart would get where cache
# steps are set) keep the student's quality?
COMPARISONS_4_ATTENTION: tuple[tuple[CellKey, CellKey], ...] = (
    (("chai", "scene", 3, "pack"), _REF4), (("chai", "same", 3, "pack"), _REF4),
    (("chai", "scene", 3, "pack"), ("plain", "-", 3, "-")),
)


def comparisons_for(grid: str) -> tuple[tuple[CellKey, CellKey], ...]:
    """The fixed comparison list of a grid."""
    return {"distilled": COMPARISONS_4, "solvers": COMPARISONS_SOLVERS, "restart_solver": COMPARISONS_RESTART_SOLVER,
            "distilled_solver": COMPARISONS_4_SOLVER, "distilled_history": COMPARISONS_4_HISTORY,
            "distilled_relation": COMPARISONS_4_RELATION, "restart_relation": COMPARISONS_RELATION,
            "distilled_attention": COMPARISONS_4_ATTENTION}.get(grid, COMPARISONS_30)


def aa_for(grid: str) -> tuple[CellKey, ...]:
    """The A/A conditions of a grid."""
    if grid == "restart_solver":
        return (_REF30, _rd(8, "scene"))
    if grid == "distilled_solver":
        return (_REF4, _DPM(3), _rd(3, "scene", 0.75))
    if grid == "distilled_history":
        return (_REF4, _DPM(3), _rh(3, "same", 0.75))
    if grid == "distilled_relation":
        return (_REF4, _rh(3, "subject_scene", 0.75))
    if grid == "restart_relation":
        return (_REF30, _rk(8, "subject_scene"))
    if grid == "distilled_attention":
        return (_REF4, ("chai", "scene", 3, "pack"))
    return AA_4 if grid in ("distilled",) else AA_30  # (the solver check runs one seed: no A/A)


__all__ = ["GRIDS", "SIGMAS", "FAST", "TABLE_SIGMA", "COMPARISONS_30", "COMPARISONS_4", "AA_30", "AA_4",
           "table_grid", "quick_grid", "restart_grid", "distilled_grid", "comparisons_for", "aa_for"]
