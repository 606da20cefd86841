"""A miss's donor capture inside ComfyUI: an APPLY_MODEL wrapper that keeps the model input at the planned sigmas."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from torch import Tensor

from ..donors import DonorCapture
from ..run import COND
from ..steps import CapturePlan, first_value, match_step


class ModelInputCapture(DonorCapture):
    """A miss's donor capture: an APPLY_MODEL wrapper that keeps the latent the model is evaluated on at each
    planned sigma of the full schedule (the last such evaluation of a step: for heun that is the step's own
    latent, not the previous step's corrector guess).

    It reads the model input rather than the sampler callback's x, which some samplers (uni_pc) keep in another
    scaling. Latents are copied to the CPU in float32, cond chunk only. `check` (the adapter's `check_call`) sees
    every call's extra arguments first and may refuse the request (ValueError) before the model runs.
    """

    def __init__(self, plan: CapturePlan, full_sigmas: Sequence[float], shape: Sequence[int],
                 check: Callable[[Mapping[str, Any]], None] | None = None) -> None:
        super().__init__(plan, device="cpu")
        self.full_sigmas = tuple(float(s) for s in full_sigmas)
        self.shape = tuple(shape)
        self.check = check

    def observe(self, step: int, x: Tensor, sigma: float) -> None:
        """Record x for a planned step, replacing an earlier evaluation at the same sigma."""
        if step in self.plan.indices:
            self._kept.pop(step, None)
        super().observe(step, x, sigma)

    def _chunk(self, x: Tensor, cond_or_uncond: Sequence[int] | None) -> Tensor | None:
        chunks = list(cond_or_uncond or [COND])
        if x.shape[0] % len(chunks):
            return None
        rows = x.shape[0] // len(chunks)
        at = chunks.index(COND) if COND in chunks else 0
        part = x[at * rows:(at + 1) * rows]
        return part if tuple(part.shape) == self.shape else None

    # An APPLY_MODEL wrapper, not a step callback: nothing calls it through DonorCapture's callback signature.
    def __call__(self, executor: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """APPLY_MODEL wrapper: (x, t, c_concat, c_crossattn, control, transformer_options, ...)."""
        if self.check is not None:
            self.check(kwargs)
        x, t = args[0], args[1]
        options = args[5] if len(args) > 5 else kwargs.get("transformer_options") or {}
        sigma = first_value(t)
        if sigma is None:
            raise ValueError("the model was called with an empty timestep: no step of the schedule to capture")
        step = match_step(sigma, self.full_sigmas)
        if step is not None and self.plan.wants(step):
            part = self._chunk(x, options.get("cond_or_uncond"))
            if part is None:
                self.skipped.append(f"step {step + 1}: model input {tuple(x.shape)} is not the latent {self.shape}")
            else:
                self.observe(step, part, self.full_sigmas[step])
        return executor(*args, **kwargs)


__all__ = ["ModelInputCapture"]
