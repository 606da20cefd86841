"""The lab's interval method: a paired cluster bootstrap over held-out combinations that redraws the reference.

A Frechet distance compares a condition's clips with a reference set of ground-truth clips of the same
combinations (the lab's composition rule: the reference cycles through the combinations run, so each brings an
equal share). Resampling only the prompts while that reference stays fixed leaves its composition mismatched with
the resample (a combination drawn twice has twice the generated clips but one share of the reference), which
inflates the distance and keeps intervals wide however many seeds are run. Here the unit of resampling is the
held-out combination, a cluster that carries everything of that combination: its K seeds' clips under every
condition and its share of the reference set. Each resample draws combinations with replacement and rebuilds
every cell and the reference from the same draw, so a paired difference FD(A) - FD(B) is read on one draw.
Intervals are percentile intervals; with m comparisons fixed before the run the level is Bonferroni's
1 - alpha / m. A two-sided bootstrap p-value (twice the smaller tail share at zero) goes with each difference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from lab.measures import frechet_stats, gaussian


@dataclass(frozen=True)
class Clustered:
    """Feature rows [N, D] with the cluster (held-out combination index) of each row."""

    features: np.ndarray
    groups: np.ndarray
    name: str = ""  # a cell's name: its bootstrap draws are computed once per name (empty: never cached)

    def members(self, clusters: int) -> list[np.ndarray]:
        """Row indices of each cluster 0 .. clusters - 1."""
        g = np.asarray(self.groups)
        return [np.flatnonzero(g == c) for c in range(clusters)]

    def subset(self, keep: np.ndarray, name: str = "") -> "Clustered":
        """The rows marked in `keep` (bool [N])."""
        return Clustered(self.features[keep], self.groups[keep], name)


@dataclass
class ClusterBootstrap:
    """Draws of held-out combinations (with replacement) shared by every cell and the reference set."""

    reference: Clustered
    clusters: int
    reps: int = 2000
    seed: int = 0
    redraw: bool = True  # False: every draw meets the whole, fixed reference set (the method this replaces)
    picks: np.ndarray = field(init=False)
    _ref: list[tuple[np.ndarray, np.ndarray]] = field(init=False, default_factory=list)
    _draws: dict[str, np.ndarray] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.clusters < 2:
            raise ValueError(f"a cluster bootstrap needs at least two clusters, got {self.clusters}")
        rng = np.random.default_rng(self.seed)
        self.picks = rng.integers(0, self.clusters, size=(self.reps, self.clusters))
        members = self.reference.members(self.clusters)
        if any(len(m) == 0 for m in members):
            raise ValueError("every combination needs its share of the reference set")
        self._ref_point = gaussian(self.reference.features)
        self._ref = [gaussian(self.reference.features[np.concatenate([members[p] for p in pick])])
                     if self.redraw else self._ref_point for pick in self.picks]

    def point(self, cell: Clustered) -> float:
        """The Frechet distance of the cell to the whole reference set."""
        return frechet_stats(*gaussian(cell.features), *self._ref_point)

    def draws(self, cell: Clustered) -> np.ndarray:
        """[reps] Frechet distances of the resampled cell to the reference rebuilt from the same draw."""
        if cell.name and cell.name in self._draws:
            return self._draws[cell.name]
        members = cell.members(self.clusters)
        out = np.empty(self.reps)
        for r, pick in enumerate(self.picks):
            rows = np.concatenate([members[p] for p in pick])
            out[r] = frechet_stats(*gaussian(cell.features[rows]), *self._ref[r])
        if cell.name:
            self._draws[cell.name] = out
        return out

    def interval(self, cell: Clustered, level: float = 0.95) -> tuple[float, float, float]:
        """(FD, lo, hi) at `level`."""
        return (self.point(cell), *percentiles(self.draws(cell), level))

    def difference(self, a: Clustered, b: Clustered, level: float = 0.95) -> tuple[float, float, float, float]:
        """(FD(a) - FD(b), lo, hi, two-sided bootstrap p) on paired draws."""
        d = self.draws(a) - self.draws(b)
        return (self.point(a) - self.point(b), *percentiles(d, level), bootstrap_p(d))


def percentiles(draws: np.ndarray, level: float) -> tuple[float, float]:
    """The central `level` percentile interval of bootstrap draws."""
    tail = 100.0 * (1.0 - level) / 2.0
    return float(np.percentile(draws, tail)), float(np.percentile(draws, 100.0 - tail))


def bootstrap_p(draws: np.ndarray) -> float:
    """Two-sided bootstrap p-value of zero: twice the smaller share of draws on either side (at most 1)."""
    d = np.asarray(draws)
    return float(min(1.0, 2.0 * min(np.mean(d <= 0), np.mean(d >= 0))))


def bonferroni_level(comparisons: int, alpha: float = 0.05) -> float:
    """The per-comparison interval level that keeps the family-wise error at `alpha`."""
    if comparisons < 1:
        raise ValueError("need at least one comparison")
    return 1.0 - alpha / comparisons


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (step-down, monotone), in the input order."""
    p = np.asarray(pvalues, np.float64)
    m = len(p)
    order = np.argsort(p)
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def excludes_zero(lo: float, hi: float) -> bool:
    """Whether an interval lies wholly on one side of zero."""
    return lo > 0 or hi < 0


__all__ = ["Clustered", "ClusterBootstrap", "percentiles", "bootstrap_p", "bonferroni_level", "holm",
           "excludes_zero"]
