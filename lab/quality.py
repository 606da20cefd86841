"""Pure helpers of the toy-world quality benchmark (`bench/bench_toy_quality.py`): clip PSNR and SSIM, donors that
share exactly one entity with a prompt, donor leakage, the NIRVANA-style start point and cache steps per budget.

Entities. A clip has three entity groups a prompt names: the scene, the coloured object (colour and shape are one
noun chunk, "a red ball") and the motion (a verb phrase, never an entity of the extractor, so never shared). A
one-entity donor shares one group with the prompt and differs from it in every other attribute: the scene donor
of (beach, ball, red, left) has another shape, another colour and another motion on a beach; the object donor is a
red ball in another scene with another motion.

Leakage. For every (generated clip, attribute on which the donor differs from the prompt) pair, the clip leaks
when the detector reads the donor's value of that attribute instead of the prompt's. The rate is leaked pairs over
all such pairs. A clip with no donor (plain sampling) scored against the same donors gives the chance level.

SSIM. The frames are 16x16, too small for the usual 11x11 window (it would leave a 6x6 valid area), so the window
is the usual Gaussian (sigma 1.5, Wang et al. 2004, K1 0.01, K2 0.03, data range 1) truncated at radius 3 (7x7),
evaluated where it fits inside the frame (no padding: 10x10 positions of a 16x16 frame) on each RGB channel of
each frame, and averaged. PSNR is over every pixel and channel of the clip (data range 1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from comfyui_chai.toyworld.detect import ATTRIBUTES
from comfyui_chai.toyworld.prompts import Combo, all_combos

ENTITY_GROUPS: dict[str, tuple[str, ...]] = {"scene": ("scene",), "object": ("obj", "colour"), "motion": ("motion",)}
DONOR_KINDS: tuple[str, ...] = ("scene", "object")  # the groups an extractor files as entities
ATTR_INDEX: dict[str, int] = {name: i for i, name in enumerate(ATTRIBUTES)}

SSIM_SIGMA = 1.5
SSIM_RADIUS = 3
SSIM_K1, SSIM_K2 = 0.01, 0.03

# NIRVANA skips the first K of N steps and resumes from the donor's latent there, K growing with the prompts'
# similarity (5..25 of 50). A flow latent at sigma s is (1 - s) x0 + s noise; with the uniform toy schedule,
# skipping 20% (NIRVANA's K = 10 of 50, its tier for CLIP similarity above 0.75) starts at sigma 0.8.
NIRVANA_START_SIGMA = 0.8


# ---------------------------------------------------------------------------------------------- PSNR / SSIM

def psnr(a: np.ndarray, b: np.ndarray, data_range: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB over every element (inf for identical arrays)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} and {b.shape}")
    mse = float(np.mean((a - b) ** 2))
    return math.inf if mse == 0.0 else 10.0 * math.log10(data_range ** 2 / mse)


def gaussian_kernel(sigma: float = SSIM_SIGMA, radius: int = SSIM_RADIUS) -> np.ndarray:
    """Normalised 1-D Gaussian weights of length 2 * radius + 1."""
    if sigma <= 0 or radius < 0:
        raise ValueError(f"need sigma > 0 and radius >= 0, got {sigma}, {radius}")
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    w = np.exp(-0.5 * (x / sigma) ** 2)
    return w / w.sum()


def _filter_valid(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """Separable weighted window sums over the last two axes, only where the window fits (no padding)."""
    n = len(kernel)
    h, w = x.shape[-2:]
    rows = sum(kernel[k] * x[..., k:h - n + 1 + k, :] for k in range(n))
    return sum(kernel[k] * rows[..., :, k:w - n + 1 + k] for k in range(n))


def ssim_map(a: np.ndarray, b: np.ndarray, data_range: float = 1.0, sigma: float = SSIM_SIGMA,
             radius: int = SSIM_RADIUS) -> np.ndarray:
    """Local SSIM of images [..., H, W] at every position where the Gaussian window fits: [..., H-2r, W-2r]."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} and {b.shape}")
    if min(a.shape[-2:]) < 2 * radius + 1:
        raise ValueError(f"images {a.shape[-2:]} are smaller than the {2 * radius + 1}-pixel SSIM window")
    k = gaussian_kernel(sigma, radius)
    mu_a, mu_b = _filter_valid(a, k), _filter_valid(b, k)
    var_a = _filter_valid(a * a, k) - mu_a ** 2
    var_b = _filter_valid(b * b, k) - mu_b ** 2
    cov = _filter_valid(a * b, k) - mu_a * mu_b
    c1, c2 = (SSIM_K1 * data_range) ** 2, (SSIM_K2 * data_range) ** 2
    return ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2))


def ssim(a: np.ndarray, b: np.ndarray, data_range: float = 1.0) -> float:
    """Mean SSIM of two clips [T, H, W, 3] (or images [H, W, 3]): per channel, per frame, over valid windows."""
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim < 3:
        raise ValueError(f"expected channels-last images or clips, got shape {a.shape}")
    return float(ssim_map(np.moveaxis(a, -1, -3), np.moveaxis(b, -1, -3), data_range).mean())


# ---------------------------------------------------------------------------------------------- donors

def shared_groups(a: Combo, b: Combo) -> tuple[str, ...]:
    """Entity groups on which two combinations agree in every attribute."""
    return tuple(g for g, attrs in ENTITY_GROUPS.items() if all(a[ATTR_INDEX[x]] == b[ATTR_INDEX[x]] for x in attrs))


def differing_attributes(truth: Combo, donor: Combo) -> tuple[str, ...]:
    """Attributes (scene, obj, colour, motion) whose value the donor does not share with the prompt."""
    return tuple(name for name in ATTRIBUTES if truth[ATTR_INDEX[name]] != donor[ATTR_INDEX[name]])


def is_one_entity_donor(combo: Combo, donor: Combo, kind: str) -> bool:
    """True when the donor shares exactly `kind`'s group with combo and differs in every other attribute."""
    keep = ENTITY_GROUPS[kind]
    return all((combo[ATTR_INDEX[x]] == donor[ATTR_INDEX[x]]) == (x in keep) for x in ATTRIBUTES)


def one_entity_donor(combo: Combo, kind: str, rng: np.random.Generator,
                     pool: Sequence[Combo] | None = None) -> Combo:
    """A random donor sharing only `kind`'s entity with combo, from `pool` when it has one, else from every combo."""
    if kind not in DONOR_KINDS:
        raise ValueError(f"donor kind must be one of {DONOR_KINDS}, got {kind!r}")
    for source in (pool, all_combos()):
        if not source:
            continue
        candidates = sorted(c for c in source if is_one_entity_donor(combo, c, kind))
        if candidates:
            return tuple(candidates[int(rng.integers(len(candidates)))])  # type: ignore[return-value]
    raise ValueError(f"no {kind} donor exists for {combo}")


# ---------------------------------------------------------------------------------------------- leakage

@dataclass
class Leakage:
    """Leaked (clip, donor-differing attribute) pairs, overall and per attribute."""

    leaked: int = 0
    pairs: int = 0
    by_attribute: dict[str, list[int]] = field(default_factory=lambda: {a: [0, 0] for a in ATTRIBUTES})

    @property
    def rate(self) -> float:
        """Leaked pairs over all pairs (nan without pairs)."""
        return self.leaked / self.pairs if self.pairs else math.nan

    def add(self, detected: Sequence[str], truth: Combo, donor: Combo) -> None:
        """Count one clip's pairs against one donor."""
        for name in differing_attributes(truth, donor):
            i = ATTR_INDEX[name]
            hit = int(detected[i] == donor[i])
            self.leaked += hit
            self.pairs += 1
            self.by_attribute[name][0] += hit
            self.by_attribute[name][1] += 1


def _as_tuple(d: Any) -> tuple[str, ...]:
    return tuple(d.as_tuple()) if hasattr(d, "as_tuple") else tuple(d)


def count_leakage(detections: Sequence[Any], truths: Sequence[Combo],
                  donors: Sequence[Combo | Sequence[Combo]]) -> Leakage:
    """Leakage of clips (Detection or 4-tuples) against their donor (or several donors each, for control rows)."""
    if not len(detections) == len(truths) == len(donors):
        raise ValueError("need one truth and one donor entry per detection")
    out = Leakage()
    for d, truth, donor in zip(detections, truths, donors):
        group = [donor] if donor and isinstance(donor[0], str) else list(donor)
        for one in group:
            out.add(_as_tuple(d), truth, one)
    return out


# ---------------------------------------------------------------------------------------------- step plans

@dataclass(frozen=True)
class NirvanaPlan:
    """Where a NIRVANA-style run starts on the donor's full trajectory and the sigmas it then samples."""

    start_index: int  # 0-based step of the donor's full schedule whose input latent is the start point
    start_sigma: float
    sigmas: tuple[float, ...]  # start_sigma ... 0, one model evaluation per step

    @property
    def evaluations(self) -> int:
        """Model evaluations (sampler steps) of the run."""
        return len(self.sigmas) - 1


def _floats(sigmas: Any) -> list[float]:
    values = [float(s) for s in (sigmas.reshape(-1).tolist() if hasattr(sigmas, "tolist") else sigmas)]
    if len(values) < 2 or any(b >= a for a, b in zip(values, values[1:])):
        raise ValueError("a schedule needs at least two strictly decreasing sigmas")
    return values


def nirvana_plan(full_sigmas: Any, fast_sigmas: Any, target: float = NIRVANA_START_SIGMA) -> NirvanaPlan:
    """Start at the donor's full-schedule step nearest `target`; the fast schedule, scaled to start there."""
    full, fast = _floats(full_sigmas), _floats(fast_sigmas)
    if not 0.0 < target <= full[0]:
        raise ValueError(f"the start sigma must lie in (0, {full[0]}], got {target}")
    starts = full[:-1]
    index = min(range(len(starts)), key=lambda i: abs(starts[i] - target))
    start = starts[index]
    return NirvanaPlan(index, start, tuple(start * s / fast[0] for s in fast))


def cache_steps_for(fast_sigmas: Any, reference_sigmas: Any, reference_steps: Sequence[int] = (2, 3, 4)
                    ) -> tuple[int, ...]:
    """Cache steps of a fast schedule covering the noise range the reference cache steps cover (never step 1)."""
    # With the reference 2,3,4 of 8 uniform steps (sigma 0.875 down to 0.625): 2,3 of 6 and 2 of 4.
    fast, ref = _floats(fast_sigmas), _floats(reference_sigmas)
    floor = ref[max(reference_steps) - 1]
    steps = tuple(i + 1 for i in range(1, len(fast) - 1) if fast[i] >= floor - 1e-6)
    return steps or ((2,) if len(fast) > 2 else ())


def nearest_by_cosine(query: np.ndarray, candidates: np.ndarray) -> int:
    """Index of the candidate row with the highest cosine similarity to the query vector."""
    q = np.asarray(query, np.float64).reshape(-1)
    c = np.asarray(candidates, np.float64)
    sims = c @ q / (np.linalg.norm(c, axis=1) * np.linalg.norm(q) + 1e-12)
    return int(np.argmax(sims))
