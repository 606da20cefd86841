"""Donor latents: what a full run keeps for later fast runs, how they are named in a cache entry, and capture."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from .restart import origin as restart_origin
from .steps import CapturePlan, select_donor

DONOR_NAME = "donor_{:02d}"
ORIGIN_NAME = "restart_{:02d}"  # a restart's origin (restart.py), numbered after the donors
_NAME_RE = re.compile(r"^(donor|restart)_(\d+)$")


@dataclass(frozen=True)
class Donor:
    """One donor latent and the flow sigma it was taken at."""

    sigma: float
    latent: Tensor


class DonorSet:
    """The donor latents of one cached generation, ordered from the noisiest to the cleanest, and the restart
    origin when the generation kept one (`origin`: the sigma it was taken at and the latent less its noise)."""

    def __init__(self, donors: Sequence[Donor], origin: Donor | None = None) -> None:
        if not donors and origin is None:
            raise ValueError("a donor set needs at least one latent")
        shape = tuple((donors[0] if donors else origin).latent.shape)  # type: ignore[union-attr]
        for d in [*donors, *([origin] if origin is not None else [])]:
            if tuple(d.latent.shape) != shape:
                raise ValueError(f"donor latents differ in shape: {tuple(d.latent.shape)} and {shape}")
        self.donors: tuple[Donor, ...] = tuple(sorted(donors, key=lambda d: -float(d.sigma)))
        self.origin = origin

    def __len__(self) -> int:
        return len(self.donors)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape shared by the latents."""
        return tuple((self.donors[0] if self.donors else self.origin).latent.shape)  # type: ignore[union-attr]

    @property
    def sigmas(self) -> tuple[float, ...]:
        """Sigmas of the latents, decreasing."""
        return tuple(float(d.sigma) for d in self.donors)

    def select(self, step_sigma: float, position: int, mapping: str = "matched_sigma") -> int:
        """Index of the donor serving a cache step (see `steps.select_donor`)."""
        return select_donor(self.sigmas, step_sigma, position, mapping)

    def to_entry(self) -> tuple[dict[str, Tensor], list[float]]:
        """(named tensors, sigmas) for `ChaiCache.write`: tensor "donor_NN" (or the origin, "restart_NN") was taken at
        sigmas[NN]."""
        tensors = {DONOR_NAME.format(i): d.latent for i, d in enumerate(self.donors)}
        sigmas = [float(d.sigma) for d in self.donors]
        if self.origin is not None:
            tensors[ORIGIN_NAME.format(len(sigmas))] = self.origin.latent
            sigmas.append(float(self.origin.sigma))
        return tensors, sigmas

    @classmethod
    def from_entry(cls, latents: Mapping[str, Any], sigmas: Sequence[float]) -> "DonorSet":
        """Rebuild from a cache entry's tensors and sigmas as `to_entry` named them."""
        sigmas = [float(s) for s in sigmas]
        donors: list[Donor] = []
        origins: list[Donor] = []
        for name, tensor in latents.items():
            m = _NAME_RE.match(name)
            if m is None:
                raise ValueError(f"cache entry tensor {name!r} is not a CHAI donor latent (expected donor_NN)")
            i = int(m.group(2))
            if i >= len(sigmas):
                raise ValueError(f"cache entry tensor {name!r} has no recorded sigma ({len(sigmas)} recorded)")
            (donors if m.group(1) == "donor" else origins).append(Donor(sigmas[i], torch.as_tensor(tensor)))
        if len(donors) + len(origins) != len(sigmas) or len(origins) > 1:
            raise ValueError(f"cache entry holds {len(donors)} donor latents and {len(origins)} restart origins but "
                             f"{len(sigmas)} sigmas")
        return cls(donors, origins[0] if origins else None)

    @classmethod
    def from_lookup(cls, result: Any) -> "DonorSet":
        """From a hit's `LookupResult` (latents loaded, entry with sigmas)."""
        if not getattr(result, "hit", False) or result.entry is None or result.latents is None:
            raise ValueError("a donor set needs a cache hit with loaded latents")
        return cls.from_entry(result.latents, result.entry.sigmas)


class DonorCapture:
    """Keeps the latents a `CapturePlan` asks for while a full run samples; callable as a sampler step callback."""

    def __init__(self, plan: CapturePlan, device: torch.device | str = "cpu") -> None:
        self.plan = plan
        self.device = device
        self._wanted = dict(zip(plan.indices, plan.sigmas))
        self._kept: dict[int, Donor] = {}
        self._final: Donor | None = None
        self._noise: Tensor | None = None  # the latent entering step 0 (the run's noise when it starts at sigma 1)
        self._at_origin: Donor | None = None
        self.skipped: list[str] = []  # why evaluations at planned sigmas could not be kept

    def reset(self) -> None:
        """Forget everything captured (a new sampling run starts)."""
        self._kept.clear()
        self._final = None
        self._noise = self._at_origin = None
        self.skipped.clear()

    def observe(self, step: int, x: Tensor, sigma: float) -> None:
        """Record the latent x entering 0-based step `step` at `sigma` when the plan wants it."""
        if not self.plan.wants(step):
            return
        kept = x.detach().to(self.device, torch.float32, copy=True)
        if step in self._wanted and step not in self._kept:
            self._kept[step] = Donor(float(sigma), kept)
        if self.plan.origin_index is not None:
            if step == 0:
                self._noise = kept / float(sigma)
            if step == self.plan.origin_index:
                self._at_origin = Donor(float(sigma), kept)

    def observe_final(self, x: Tensor, sigma: float | None = None) -> None:
        """Record the finished latent when the plan keeps it."""
        if self.plan.final:
            s = self.plan.final_sigma if sigma is None else float(sigma)
            self._final = Donor(s, x.detach().to(self.device, torch.float32, copy=True))

    def __call__(self, step: int, x: Tensor, sigma: float, velocity: Tensor | None = None) -> None:
        """Step callback with the reference sampler's signature (i, x, sigma, v)."""
        self.observe(step, x, sigma)

    @property
    def missing(self) -> tuple[int, ...]:
        """Planned step indices not seen yet (-1 stands for the final latent)."""
        gone = tuple(i for i in self.plan.indices if i not in self._kept)
        return gone + ((-1,) if self.plan.final and self._final is None else ())

    def problem(self) -> str:
        """Why the capture is incomplete ('' when it is complete)."""
        if not self.plan.indices and not self.plan.final and self.origin() is None:
            return ("the run kept no latent to reuse (no cache steps, and no restart latent: the run did not start "
                    "from pure noise, or never reached restart_sigma); nothing to store")
        if not self.missing:
            return ""
        steps = ", ".join(str(i + 1) for i in self.missing if i >= 0) or "the final latent"
        detail = f" ({'; '.join(self.skipped[:3])})" if self.skipped else ""
        return (f"the sampler never evaluated the model at the planned sigmas of full-schedule steps {steps}"
                f"{detail}; nothing to store")

    def donors(self) -> DonorSet:
        """The captured donor set; raises when a planned latent was never seen (e.g. an interrupted run)."""
        if self.missing:
            raise RuntimeError(f"the full run did not reach every planned capture (missing steps {self.missing})")
        kept = [self._kept[i] for i in self.plan.indices] + ([self._final] if self._final is not None else [])
        return DonorSet(kept, self.origin())

    def origin(self) -> Donor | None:
        """The restart origin when the plan keeps one and both of its latents were seen (else None: no restart)."""
        if self._noise is None or self._at_origin is None:
            return None
        sigma = self._at_origin.sigma
        return Donor(sigma, restart_origin(self._at_origin.latent, self._noise, sigma))
