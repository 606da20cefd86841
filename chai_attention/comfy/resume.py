"""The SAMPLER of a few-step restart hit: DPM-Solver++(2M) that resumes the donor's solver history (restart.py).

ComfyUI glue: imports ComfyUI inside functions only. One sampler object serves every stage of a request (Wan 2.2
A14B's two experts), so the multistep history carries over the switch as it would within one run; a sampling that
starts at the restart's first sigma starts from the donor's history again (a graph queued twice reuses the object).
"""
from __future__ import annotations

from typing import Any, Callable

from torch import Tensor

from ...opensora.sampler import Dpmpp2m


def resume_steps(history: tuple[Tensor, float], start: float) -> Callable[..., Tensor]:
    """A k-diffusion style sampler function: 2M steps from denoised estimates, the first of a sampling that starts
    at `start` (the restart's sigma) extrapolating from `history` (the donor's origin as the denoised estimate at
    the sigma before the restart)."""
    solver: Dpmpp2m | None = None

    def sample_fn(model: Any, x: Tensor, sigmas: Tensor, extra_args: dict[str, Any] | None = None,
                  callback: Callable[[dict[str, Any]], Any] | None = None, disable: bool | None = None) -> Tensor:
        nonlocal solver
        if solver is None or abs(float(sigmas[0]) - start) < 1e-6:  # the history moves to x's device and dtype
            solver = Dpmpp2m((history[0].to(x.device, x.dtype), history[1]))
        extra_args = extra_args or {}
        s_in = x.new_ones([x.shape[0]])
        for i in range(len(sigmas) - 1):
            denoised = model(x, sigmas[i] * s_in, **extra_args)
            if callback is not None:
                callback({"x": x, "i": i, "sigma": sigmas[i], "sigma_hat": sigmas[i], "denoised": denoised})
            x = solver.step(x, denoised, float(sigmas[i]), float(sigmas[i + 1]))
        return x

    return sample_fn


def resume_sampler(history: tuple[Tensor, float], start: float) -> Any:
    """A ComfyUI SAMPLER (KSAMPLER) running `resume_steps`."""
    import comfy.samplers

    return comfy.samplers.KSAMPLER(resume_steps(history, start))


__all__ = ["resume_steps", "resume_sampler"]
