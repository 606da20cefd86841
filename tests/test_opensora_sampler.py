"""Reference rectified-flow Euler sampler with CFG (no ComfyUI)."""

import pytest
import torch

from comfyui_chai.opensora.sampler import cfg_combine, make_noise, opensora_model_kwargs, sample
from comfyui_chai.opensora.schedule import opensora_sigmas
from sampler_helpers import LatentCapture

SHAPE = (1, 4, 3, 4, 6)


def _y(value: float, batch: int = 1, tokens: int = 5, dim: int = 8) -> torch.Tensor:
    return torch.full((batch, 1, tokens, dim), value)


class PointMassFlow:
    """Exact OpenSora velocity field for data concentrated at x0: v = (x0 - x) / sigma, sigma = t / 1000."""

    def __init__(self, x0: torch.Tensor) -> None:
        self.x0 = x0
        self.calls: list[dict] = []

    def __call__(self, x, timestep, y, **kwargs):
        self.calls.append({"x": x.clone(), "t": timestep.clone(), "y": y.clone(), **kwargs})
        sigma = (timestep / 1000.0).view(-1, *[1] * (x.ndim - 1))
        return (self.x0.to(x.dtype) - x) / sigma


class TextVelocity:
    """Velocity equal to the mean of each sample's text embedding (lets CFG be checked by hand)."""

    def __init__(self, channels_out: int = 4) -> None:
        self.channels_out = channels_out
        self.calls: list[dict] = []

    def __call__(self, x, timestep, y, **kwargs):
        self.calls.append({"x": x, "t": timestep, "y": y, **kwargs})
        per_sample = y.float().flatten(1).mean(1).view(-1, 1, 1, 1, 1).to(x.dtype)
        out = per_sample.expand(x.shape[0], 4, *x.shape[2:])
        if self.channels_out == 8:
            out = torch.cat([out, torch.full_like(out, 1e6)], dim=1)  # learned-sigma half must be ignored
        return out


def test_single_step_exact_recovery_with_known_velocity():
    x0 = make_noise(SHAPE, seed=1)
    eps = make_noise(SHAPE, seed=2)

    def model(x, t, y, **kw):
        return x0 - eps  # the true OpenSora velocity v = x0 - noise

    out = sample(model, eps, _y(0.0), None, [1.0, 0.0])
    torch.testing.assert_close(out, x0)


@pytest.mark.parametrize("steps", [1, 2, 8, 30])
def test_point_mass_flow_integrates_exactly_and_intermediates_lie_on_the_path(steps):
    x0 = make_noise(SHAPE, seed=3)
    eps = make_noise(SHAPE, seed=4)
    model = PointMassFlow(x0)
    sigmas = opensora_sigmas(steps, 240, 426, 51)
    capture = LatentCapture(range(steps))
    out = sample(model, eps, _y(1.0), None, sigmas, callback=capture)
    torch.testing.assert_close(out, x0, atol=1e-5, rtol=1e-5)
    for i in range(steps):
        s = sigmas[i].item()
        torch.testing.assert_close(capture.latents[i], (1 - s) * x0 + s * eps, atol=1e-5, rtol=1e-5)
        assert capture.sigmas[i] == pytest.approx(s)
    assert torch.allclose(torch.stack([c["t"][0] for c in model.calls]), sigmas[:-1] * 1000)


def test_velocity_sign_and_learned_sigma_half_dropped():
    noise = make_noise(SHAPE, seed=5)
    out = sample(TextVelocity(channels_out=8), noise, _y(0.25), None, [1.0, 0.5, 0.0])
    torch.testing.assert_close(out, noise + 0.25)  # x <- x + v * (s_i - s_{i+1}); total drop 1


def test_cfg_formula_batched_and_split_agree():
    noise = make_noise(SHAPE, seed=6)
    cond, uncond, cfg = _y(0.3), _y(-0.1), 7.0
    batched = TextVelocity()
    out = sample(batched, noise, cond, uncond, [1.0, 0.0], cfg)
    guided = -0.1 + cfg * (0.3 - (-0.1))
    torch.testing.assert_close(out, noise + guided)
    assert len(batched.calls) == 1 and batched.calls[0]["x"].shape[0] == 2
    assert batched.calls[0]["y"][0].mean().item() == pytest.approx(0.3)  # cond first, null caption second
    assert batched.calls[0]["y"][1].mean().item() == pytest.approx(-0.1)
    split = TextVelocity()
    out2 = sample(split, noise, cond, uncond, [1.0, 0.0], cfg, batched_cfg=False)
    torch.testing.assert_close(out2, out)
    assert len(split.calls) == 2 and all(c["x"].shape[0] == 1 for c in split.calls)
    torch.testing.assert_close(cfg_combine(torch.tensor(2.0), torch.tensor(1.0), 3.0), torch.tensor(4.0))


def test_cfg_one_and_no_uncond_skip_the_null_pass():
    noise = make_noise(SHAPE, seed=7)
    for uncond, cfg in [(_y(5.0), 1.0), (None, 7.0)]:
        model = TextVelocity()
        out = sample(model, noise, _y(0.5), uncond, [1.0, 0.4, 0.0], cfg)
        torch.testing.assert_close(out, noise + 0.5)
        assert all(c["x"].shape[0] == 1 for c in model.calls) and len(model.calls) == 2


def test_batched_kwargs_repeated_and_null_caption_cut_to_prompt_length():
    batch = 2
    noise = make_noise((batch, *SHAPE[1:]), seed=8)
    cond = _y(0.2, batch=batch, tokens=5)
    null = _y(-0.2, batch=1, tokens=300)  # OpenSora's null caption table has 300 rows
    mask = torch.ones(batch, 5, dtype=torch.long)
    kwargs = opensora_model_kwargs(240, 426, 51, batch_size=batch, mask=mask)
    model = TextVelocity()
    sample(model, noise, cond, null, [1.0, 0.0], 2.0, model_kwargs=kwargs)
    call = model.calls[0]
    assert call["y"].shape == (2 * batch, 1, 5, 8)
    assert call["mask"].shape == (2 * batch, 5)
    assert call["height"].tolist() == [240.0] * 4 and call["width"].tolist() == [426.0] * 4
    assert call["fps"].tolist() == [24.0] * 4


def test_callback_once_per_step_with_schedule_sigmas():
    sigmas = opensora_sigmas(6, 144, 256, 51)
    seen = []
    model = PointMassFlow(torch.zeros(SHAPE))
    sample(model, make_noise(SHAPE, seed=9), _y(1.0), None, sigmas,
           callback=lambda i, x, s, v: seen.append((i, s, x.clone(), v.clone())))
    assert [i for i, *_ in seen] == list(range(6))
    assert [s for _, s, *_ in seen] == pytest.approx(sigmas[:-1].tolist())
    for (i, s, x, v), call in zip(seen, model.calls):
        assert torch.equal(x, call["x"])  # the latent entering the step
        torch.testing.assert_close(x + s * v, torch.zeros(SHAPE), atol=1e-5, rtol=0)  # the denoised estimate


def test_capture_holds_copies():
    capture = LatentCapture([1])
    x = torch.ones(2)
    capture(0, x, 1.0, x)
    capture(1, x, 0.5, x)
    x.add_(1)
    assert list(capture.latents) == [1] and capture.latents[1].tolist() == [1.0, 1.0]


def test_noise_determinism():
    a = make_noise(SHAPE, seed=42)
    assert torch.equal(a, make_noise(SHAPE, seed=42))
    assert not torch.equal(a, make_noise(SHAPE, seed=43))
    g = torch.Generator().manual_seed(42)
    assert torch.equal(a, make_noise(SHAPE, generator=g))
    assert make_noise(SHAPE, seed=1, dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError):
        make_noise(SHAPE)


def test_sampling_is_deterministic_per_seed():
    sigmas = opensora_sigmas(4, 240, 426, 51)

    def run(seed):
        model = PointMassFlow(torch.full(SHAPE, 0.5))
        return sample(model, make_noise(SHAPE, seed=seed), _y(1.0), _y(0.0), sigmas, 3.0, callback=LatentCapture([1]))

    assert torch.equal(run(11), run(11))


def test_model_dtype_cast_and_float32_state():
    model = TextVelocity()
    out = sample(model, make_noise(SHAPE, seed=12), _y(0.5), _y(0.0), [1.0, 0.5, 0.0], 2.0, model_dtype=torch.bfloat16)
    assert model.calls[0]["x"].dtype == torch.bfloat16 and model.calls[0]["y"].dtype == torch.bfloat16
    assert model.calls[0]["t"].dtype == torch.float32
    assert out.dtype == torch.float32


def test_resume_from_intermediate_latent():
    x0, eps = make_noise(SHAPE, seed=13), make_noise(SHAPE, seed=14)
    sigmas = opensora_sigmas(8, 240, 426, 51)
    capture = LatentCapture([3])
    full = sample(PointMassFlow(x0), eps, _y(1.0), None, sigmas, callback=capture)
    resumed = sample(PointMassFlow(x0), capture.latents[3], _y(1.0), None, sigmas[3:])
    torch.testing.assert_close(resumed, full, atol=1e-5, rtol=1e-5)


def test_opensora_schedule_and_model_inputs_drive_the_sampler_as_opensora_does():
    model = TextVelocity()
    noise = make_noise(SHAPE, seed=15)
    kwargs = opensora_model_kwargs(240, 426, 51, noise.shape[0])
    sample(model, noise, _y(0.1), _y(0.0), opensora_sigmas(30, 240, 426, 51), model_kwargs=kwargs)
    assert len(model.calls) == 30
    assert [c["t"][0].item() for c in model.calls[:2]] == pytest.approx([1000.0, 985.9619], abs=1e-3)
    assert model.calls[0]["fps"][0].item() == 24.0 and model.calls[0]["x"].shape[0] == 2
    image = TextVelocity()
    sample(image, noise[:, :, :1], _y(0.1), None, opensora_sigmas(2, 240, 426, 1),
           model_kwargs=opensora_model_kwargs(240, 426, 1, noise.shape[0]))
    assert image.calls[0]["fps"][0].item() == 120.0
