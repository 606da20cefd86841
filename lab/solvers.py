"""Few-step solvers for the lab's solver control: plain N steps with a multistep update at equal model evaluations.

`ab2` is the lab's own two-step Adams-Bashforth update of the flow ODE (variable step: the previous velocity
extrapolated over the step); `comfy_sampler` runs one of ComfyUI's own k-diffusion samplers (optional: only where
COMFYUI_DIR names a ComfyUI tree) on the toy model wrapped as a denoiser. The toy's velocity v points from noise
to data (x_next = x + (sigma - sigma_next) v, the reference Euler sampler), so the flow denoiser is x + sigma v,
which is how ComfyUI reads a flow (CONST) model's output.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

Velocity = Callable[[Tensor, float], Tensor]  # guided velocity at (x, sigma): one model evaluation
COMFY_SAMPLERS = ("euler", "dpmpp_2m", "deis", "ipndm", "uni_pc")


def euler(v: Velocity, x: Tensor, sigmas: Sequence[float]) -> Tensor:
    """The reference Euler sampler written on a velocity function (a check that `v` is the sampler's)."""
    for s, s_next in zip(sigmas, sigmas[1:]):
        x = x + (float(s) - float(s_next)) * v(x, float(s))
    return x


def ab2(v: Velocity, x: Tensor, sigmas: Sequence[float]) -> Tensor:
    """Two-step Adams-Bashforth on the flow ODE: Euler first, then v_i + h_i / (2 h_{i-1}) (v_i - v_{i-1})."""
    previous: tuple[Tensor, float] | None = None
    for s, s_next in zip(sigmas, sigmas[1:]):
        h = float(s) - float(s_next)
        vi = v(x, float(s))
        slope = vi if previous is None else vi + (h / (2.0 * previous[1])) * (vi - previous[0])
        x = x + h * slope
        previous = (vi, h)
    return x


def comfy_available() -> bool:
    """Whether COMFYUI_DIR names a ComfyUI tree whose k-diffusion samplers import."""
    try:
        _comfy_modules()
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return False
    return True


def _comfy_modules() -> tuple[Any, Any]:
    """(comfy.k_diffusion.sampling, comfy.extra_samplers.uni_pc) from COMFYUI_DIR, on the CPU."""
    root = os.environ.get("COMFYUI_DIR")
    if not root or not os.path.isdir(root):
        raise ImportError("COMFYUI_DIR is not set to a ComfyUI tree")
    if root not in sys.path:
        sys.path.insert(0, root)
    if "comfy.options" not in sys.modules:
        argv, sys.argv = sys.argv, [sys.argv[0], "--cpu"]
        try:
            import comfy.options
            comfy.options.enable_args_parsing()
            import comfy.k_diffusion.sampling  # noqa: F401 - parses --cpu once
        finally:
            sys.argv = argv
    import comfy.extra_samplers.uni_pc as uni_pc
    import comfy.k_diffusion.sampling as kds
    return kds, uni_pc


def comfy_sampler(name: str, v: Velocity, x: Tensor, sigmas: Sequence[float]) -> tuple[Tensor, int]:
    """(final latent, model evaluations) of ComfyUI's sampler `name` on the flow denoiser x + sigma v."""
    kds, uni_pc = _comfy_modules()
    fn = {"euler": kds.sample_euler, "dpmpp_2m": kds.sample_dpmpp_2m, "deis": kds.sample_deis,
          "ipndm": kds.sample_ipndm, "uni_pc": uni_pc.sample_unipc}[name]
    calls = [0]

    def denoiser(xx: Tensor, sigma: Tensor, **_: Any) -> Tensor:
        calls[0] += 1
        s = float(sigma.reshape(-1)[0])
        return xx + s * v(xx, s)

    sig = torch.tensor([float(s) for s in sigmas], dtype=torch.float32)
    with torch.no_grad():
        out = fn(denoiser, x.clone(), sig, extra_args={}, disable=True)
    return out, calls[0]


__all__ = ["Velocity", "COMFY_SAMPLERS", "euler", "ab2", "comfy_available", "comfy_sampler"]
