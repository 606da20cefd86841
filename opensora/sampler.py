"""Reference rectified-flow sampler with classifier-free guidance, as OpenSora 1.2 samples (no ComfyUI).

Conventions (see schedule.py): at flow sigma s the latent is ``x = (1 - s) * x0 + s * noise`` and the model,
called with timestep ``1000 * s``, returns the OpenSora velocity ``v = x0 - noise`` (STDiT3 returns 8 channels;
the first half is v, the second, learned-sigma half is dropped). One Euler step from sigma s_i to s_{i+1} is
``x <- x + v * (s_i - s_{i+1})``, so a schedule ending at 0 lands on the clean latent. The denoised estimate
at a step is ``x + s * v``. ComfyUI's flow (CONST) models use the opposite sign: their output is ``-v``.

``solver="dpmpp_2m"`` replaces Euler by the second-order multistep DPM-Solver++ (Lu et al. 2022) written on the
same ODE, ``dx/ds = (x - D) / s`` with D the denoised estimate: the exact step for a constant D,
``x <- (s'/s) x + (1 - s'/s) D``, taken with D extrapolated linearly in log-sigma from the last two estimates
(the first and the final step use D itself; the first step is exactly Euler's). ComfyUI's ``dpmpp_2m`` sampler
is the same method, so a pure-torch run and a ComfyUI run of one schedule agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .presets import DEFAULT_FPS, model_fps
from .schedule import NUM_TIMESTEPS

DEFAULT_CFG = 7.0
SOLVERS: tuple[str, ...] = ("euler", "dpmpp_2m")

ModelFn = Callable[..., torch.Tensor]
StepCallback = Callable[[int, torch.Tensor, float, torch.Tensor], Any]


def make_noise(
    shape: Sequence[int],
    seed: int | None = None,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """Standard-normal starting latent, reproducible from a seed or a torch.Generator (drawn on the CPU)."""
    if generator is None:
        if seed is None:
            raise ValueError("give a seed or a torch.Generator for reproducible noise")
        generator = torch.Generator(device="cpu").manual_seed(int(seed))
    noise = torch.randn(tuple(shape), generator=generator, dtype=torch.float32, device=generator.device)
    return noise.to(device=device, dtype=dtype)


def cfg_combine(v_cond: torch.Tensor, v_uncond: torch.Tensor, cfg: float) -> torch.Tensor:
    """Classifier-free guidance: v_uncond + cfg * (v_cond - v_uncond)."""
    return v_uncond + cfg * (v_cond - v_uncond)


def _velocity(out: torch.Tensor, channels: int) -> torch.Tensor:
    """First `channels` output channels (STDiT3's learned-sigma half is dropped)."""
    if out.shape[1] == channels:
        return out
    if out.shape[1] == 2 * channels:
        return out[:, :channels]
    raise ValueError(f"model returned {out.shape[1]} channels for a {channels}-channel latent")


def _match_uncond_length(cond: torch.Tensor, uncond: torch.Tensor) -> torch.Tensor:
    """Cut the null caption to the prompt's token count (OpenSora reuses the prompt mask for it)."""
    if uncond.shape[:-2] != cond.shape[:-2] and uncond.shape[0] == 1:
        uncond = uncond.expand(*cond.shape[:-2], *uncond.shape[-2:])
    if uncond.shape[-2] > cond.shape[-2]:
        uncond = uncond[..., : cond.shape[-2], :]
    if uncond.shape != cond.shape:
        raise ValueError(f"uncond {tuple(uncond.shape)} does not match cond {tuple(cond.shape)}")
    return uncond


def _double_batch(kwargs: Mapping[str, Any], batch: int) -> dict[str, Any]:
    """Repeat every tensor kwarg whose first dim is the batch size, for a [cond; uncond] batch."""
    doubled: dict[str, Any] = {}
    for name, value in kwargs.items():
        if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == batch:
            doubled[name] = torch.cat([value, value], dim=0)
        else:
            doubled[name] = value
    return doubled


@torch.no_grad()
def sample(
    model: ModelFn,
    noise: torch.Tensor,
    cond: torch.Tensor,
    uncond: torch.Tensor | None,
    sigmas: Sequence[float] | torch.Tensor,
    cfg: float = DEFAULT_CFG,
    callback: StepCallback | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
    *,
    batched_cfg: bool = True,
    model_dtype: torch.dtype | None = None,
    dtype: torch.dtype = torch.float32,
    solver: str = "euler",
    history: tuple[torch.Tensor, float] | None = None,
) -> torch.Tensor:
    """Integrate the flow from sigmas[0] to sigmas[-1] with `solver` steps and CFG; returns the final latent.

    noise is the latent at sigmas[0] (pure noise when it is 1; a partly denoised latent to resume a run).
    cond / uncond are the text embeddings passed as the model's ``y`` (uncond None: no guidance; a longer
    uncond, e.g. the 300-row null caption, is cut to cond's token count). model_kwargs (mask, fps, height,
    width ...) go to every call; with batched_cfg, tensors whose first dim is the batch are repeated for the
    [cond; uncond] batch. callback(i, x, sigma, v) runs once per step with the latent entering step i, its
    sigma and the guided velocity; its return value is ignored. The state is integrated in `dtype`; inputs
    are cast to model_dtype (if given) before each call and outputs back to `dtype`. history (dpmpp_2m only) is
    a (denoised estimate, its sigma) from before sigmas[0]: the first step then extrapolates from it as a run
    that had taken that earlier step would (a restart resuming a donor's run).
    """
    sig = torch.as_tensor(sigmas, dtype=torch.float64).flatten()
    if sig.numel() < 2:
        raise ValueError("sigmas needs at least two entries (start and end)")
    if not bool((sig[1:] < sig[:-1]).all()):
        raise ValueError("sigmas must be strictly decreasing")
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    if history is not None and solver != "dpmpp_2m":
        raise ValueError("a denoised history only means something to the multistep dpmpp_2m solver")
    if noise.ndim < 2:
        raise ValueError(f"noise must be batched [B, C, ...], got shape {tuple(noise.shape)}")
    batch, channels = noise.shape[0], noise.shape[1]
    if cond.shape[0] != batch:
        raise ValueError(f"cond batch {cond.shape[0]} != latent batch {batch}")
    kwargs = dict(model_kwargs or {})
    # guide: the uncond for CFG, None without guidance (cfg 1 gives v_cond exactly: skip the uncond pass)
    guide = _match_uncond_length(cond, uncond) if uncond is not None and cfg != 1.0 else None
    kwargs2 = _double_batch(kwargs, batch) if guide is not None and batched_cfg else kwargs

    in_dtype = model_dtype or dtype

    def call(x_in: torch.Tensor, t: torch.Tensor, y: torch.Tensor, kw: dict[str, Any]) -> torch.Tensor:
        out = model(x_in.to(in_dtype), t, y.to(in_dtype) if model_dtype is not None else y, **kw)
        return _velocity(out, channels).to(dtype)

    x = noise.to(dtype)
    sigma_list = sig.tolist()
    if history is not None and not float(history[1]) > sigma_list[0]:
        raise ValueError(f"the history's sigma {history[1]} must lie above the first sigma {sigma_list[0]}")
    multistep = Dpmpp2m(history) if solver == "dpmpp_2m" else None
    for i in range(len(sigma_list) - 1):
        s, s_next = sigma_list[i], sigma_list[i + 1]
        t = torch.full((batch,), s * NUM_TIMESTEPS, dtype=torch.float32, device=x.device)
        if guide is None:
            v = call(x, t, cond, kwargs)
        elif batched_cfg:
            out = call(torch.cat([x, x]), torch.cat([t, t]), torch.cat([cond, guide]), kwargs2)
            v_cond, v_uncond = out.chunk(2, dim=0)
            v = cfg_combine(v_cond, v_uncond, cfg)
        else:
            v = cfg_combine(call(x, t, cond, kwargs), call(x, t, guide, kwargs), cfg)
        if callback is not None:
            callback(i, x, s, v)
        x = x + v * (s - s_next) if multistep is None else multistep.step(x, x + s * v, s, s_next)
    return x


class Dpmpp2m:
    """DPM-Solver++(2M) one step at a time on the flow ODE, from denoised estimates; keeps the previous estimate
    and its sigma (a `history` given at the start stands in for a step taken before: a resumed run)."""

    def __init__(self, history: tuple[torch.Tensor, float] | None = None) -> None:
        self.previous: tuple[torch.Tensor, float] | None = None
        if history is not None:
            self.previous = (history[0], float(history[1]))

    def step(self, x: torch.Tensor, denoised: torch.Tensor, s: float, s_next: float) -> torch.Tensor:
        """The latent at s_next from x at s and the (guided) denoised estimate there."""
        if s_next <= 0.0:
            self.previous = None
            return denoised
        h = math.log(s) - math.log(s_next)
        d = denoised
        if self.previous is not None:
            before, s_before = self.previous
            if not s_before > s:
                raise ValueError(f"the previous estimate's sigma {s_before} must lie above this step's sigma {s}")
            r = (math.log(s_before) - math.log(s)) / h
            d = (1.0 + 1.0 / (2.0 * r)) * denoised - (1.0 / (2.0 * r)) * before.to(denoised.dtype)
        self.previous = (denoised, s)
        return (s_next / s) * x + (1.0 - s_next / s) * d


def opensora_model_kwargs(
    height: int,
    width: int,
    num_frames: int,
    batch_size: int = 1,
    fps: float = DEFAULT_FPS,
    mask: torch.Tensor | None = None,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """The extra STDiT3 inputs OpenSora passes: nominal height/width in pixels, fps (120 for an image), mask."""
    kw: dict[str, Any] = {
        "height": torch.full((batch_size,), float(height), device=device),
        "width": torch.full((batch_size,), float(width), device=device),
        "fps": torch.full((batch_size,), model_fps(num_frames, fps), device=device),
    }
    if mask is not None:
        kw["mask"] = mask
    return kw
