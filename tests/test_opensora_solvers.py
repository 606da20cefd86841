"""The reference sampler's second solver: DPM-Solver++(2M) on the flow ODE, against Euler and a fine solution."""

import math

import pytest
import torch

from comfyui_chai.opensora.sampler import SOLVERS, sample
from comfyui_chai.opensora.schedule import opensora_sigmas

C2 = 0.36  # variance of the 1-D Gaussian data


class GaussianFlow:
    """Exact velocity of flow-matched Gaussian data N(0, C2): v = E[x0 | x] - noise estimate, OpenSora's sign."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x, timestep, y, **kwargs):
        self.calls += 1
        s = float(timestep.reshape(-1)[0]) / 1000.0
        a = 1.0 - s
        x0 = a * C2 / (a * a * C2 + s * s) * x  # posterior mean of the clean sample
        return (x0 - x) / s  # x + s v = x0


def _run(steps: int, solver: str, model=None) -> torch.Tensor:
    noise = torch.linspace(-2.0, 2.0, 9).view(1, 1, 1, 1, 9).double()
    y = torch.zeros(1, 1, 2, 4)
    sig = [1.0 - i / steps for i in range(steps)] + [0.0]
    return sample(model or GaussianFlow(), noise, y, None, sig, 1.0, dtype=torch.float64, solver=solver)


def _exact() -> torch.Tensor:
    """The ODE's solution: the probability-flow map of a Gaussian is linear, x0 = sqrt(C2) * noise."""
    noise = torch.linspace(-2.0, 2.0, 9).view(1, 1, 1, 1, 9).double()
    return math.sqrt(C2) * noise


def test_solvers_are_named():
    assert SOLVERS == ("euler", "dpmpp_2m")
    with pytest.raises(ValueError, match="solver must be one of"):
        _run(4, "heun")


def test_dpmpp_2m_at_8_steps_beats_euler_at_32():
    exact = _exact()
    err = {(n, s): float((_run(n, s) - exact).abs().max()) for n in (8, 16, 32) for s in SOLVERS}
    assert 1.6 < err[(8, "euler")] / err[(16, "euler")] < 2.6  # Euler: first order
    assert err[(8, "dpmpp_2m")] < 0.25 * err[(8, "euler")]
    assert err[(8, "dpmpp_2m")] < err[(32, "euler")]


def test_first_and_only_step_is_euler_and_costs_one_call_per_step():
    one_e, one_d = _run(1, "euler"), _run(1, "dpmpp_2m")
    assert torch.equal(one_e, one_d)
    model = GaussianFlow()
    _run(6, "dpmpp_2m", model)
    assert model.calls == 6


def test_dpmpp_2m_on_a_shifted_schedule_lands_on_the_denoised_estimate():
    model = GaussianFlow()
    sig = opensora_sigmas(8, 240, 426, 51)
    noise = torch.randn(1, 1, 1, 1, 5, generator=torch.Generator().manual_seed(0)).double()
    seen = []
    out = sample(model, noise, torch.zeros(1, 1, 2, 4), None, sig, 1.0, dtype=torch.float64, solver="dpmpp_2m",
                 callback=lambda i, x, s, v: seen.append((x.clone(), s, v.clone())))
    x_last, s_last, v_last = seen[-1]
    assert torch.allclose(out, x_last + s_last * v_last)  # the final step returns D itself
    euler = sample(GaussianFlow(), noise, torch.zeros(1, 1, 2, 4), None, sig, 1.0, dtype=torch.float64)
    exact = math.sqrt(C2) * noise
    assert float((out - exact).abs().max()) < 0.6 * float((euler - exact).abs().max())


def test_a_run_resumed_with_its_own_denoised_history_is_the_uninterrupted_run():
    noise = torch.linspace(-2.0, 2.0, 9).view(1, 1, 1, 1, 9).double()
    y = torch.zeros(1, 1, 2, 4)
    sig = [1.0, 0.75, 0.5, 0.25, 0.0]
    seen = []
    whole = sample(GaussianFlow(), noise, y, None, sig, 1.0, dtype=torch.float64, solver="dpmpp_2m",
                   callback=lambda i, x, s, v: seen.append((x.clone(), x + s * v)))
    x1, denoised0 = seen[1][0], seen[0][1]
    resumed = sample(GaussianFlow(), x1, y, None, sig[1:], 1.0, dtype=torch.float64, solver="dpmpp_2m",
                     history=(denoised0, 1.0))
    torch.testing.assert_close(resumed, whole)
    fresh = sample(GaussianFlow(), x1, y, None, sig[1:], 1.0, dtype=torch.float64, solver="dpmpp_2m")
    assert float((fresh - whole).abs().max()) > 1e-3  # without it the tail restarts the multistep history
    with pytest.raises(ValueError, match="only means something"):
        sample(GaussianFlow(), x1, y, None, sig[1:], 1.0, solver="euler", history=(denoised0, 1.0))
    with pytest.raises(ValueError, match="must lie above"):
        sample(GaussianFlow(), x1, y, None, sig[1:], 1.0, solver="dpmpp_2m", history=(denoised0, 0.75))
