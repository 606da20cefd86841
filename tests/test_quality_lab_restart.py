"""The restart lab: its reference set matches the combinations run, its interval method (a cluster bootstrap that
redraws the reference) finds no difference where there is none, its restarts are the product's arithmetic, its
solvers integrate what they should, and its runner goes end to end on a couple of prompts."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from comfyui_chai.chai_attention.restart import origin, renoise, restart_schedule
from comfyui_chai.toyworld.model import toy_sigmas, toy_text_encoder
from lab.intervals import ClusterBootstrap, Clustered, bonferroni_level, bootstrap_p, excludes_zero, holm
from lab.lab import DonorRun, LabSampler, Request, make_lab_items, steps_at_sigmas
from lab.restart_grids import COMPARISONS_30, COMPARISONS_4, GRIDS
from lab.restart_lab import BOTH_SIGMAS, Condition, restart_plan, restart_start, run_condition
from lab.solvers import ab2, euler

PROMPT = "a red ball bouncing across a sunny beach"
COMBO = ("beach", "ball", "red", "bouncing")


# ---------------------------------------------------------------------------------------------- reference set

def test_quality_lab_reference_set_is_drawn_for_the_combinations_run(monkeypatch):
    from bench import bench_quality_lab as bench
    from lab import lab_report

    seen = []

    def recording(combos, n=lab_report.GT_SET, seed=77):
        seen.append(list(combos))
        return lab_report.ground_truth_set(combos, n, seed)

    monkeypatch.setattr(bench, "ground_truth_set", recording)
    monkeypatch.setattr(bench, "GT_SET", 24)
    assert bench.main(["--gap", "--prompts", "2", "--steps", "2", "--reps", "20"]) == 0
    from comfyui_chai.toyworld.prompts import make_split

    split = make_split(0, 0.1)
    run = [item.request.combo for item in make_lab_items(split.held_out, split.train, 2)]
    assert seen == [run]  # not all 90 held-out combinations


# ---------------------------------------------------------------------------------------------- intervals

def _synthetic(rng, clusters, seeds, shift=0.0, dim=4):
    """Clustered features: a per-cluster mean (the combination) plus per-seed noise, optionally shifted."""
    centres = np.random.default_rng(123).standard_normal((clusters, dim)) * 2.0
    rows = np.concatenate([centres[c] + rng.standard_normal((seeds, dim)) + shift for c in range(clusters)])
    return Clustered(rows, np.repeat(np.arange(clusters), seeds))


def test_a_cell_equal_to_the_reference_has_zero_distance_on_every_draw():
    rng = np.random.default_rng(0)
    ref = _synthetic(rng, 30, 6)
    boot = ClusterBootstrap(ref, 30, reps=100)
    draws = boot.draws(Clustered(ref.features.copy(), ref.groups.copy()))
    # the reference is rebuilt from the same draw of combinations, so the set meets itself: exactly 0
    assert np.allclose(draws, 0.0, atol=1e-8) and boot.point(ref) == pytest.approx(0.0, abs=1e-8)


def test_aa_intervals_rarely_exclude_zero_and_a_real_shift_is_found():
    rng = np.random.default_rng(1)
    ref = _synthetic(rng, 40, 8)
    boot = ClusterBootstrap(ref, 40, reps=300)
    excluded = 0
    for trial in range(20):
        a, b = _synthetic(rng, 40, 2), _synthetic(rng, 40, 2)
        d, lo, hi, p = boot.difference(a, b)
        excluded += excludes_zero(lo, hi)
    assert excluded <= 3  # about 1 expected at 95%
    d, lo, hi, p = boot.difference(_synthetic(rng, 40, 2, shift=0.8), _synthetic(rng, 40, 2))
    assert d > 0 and lo > 0 and p < 0.01


def test_intervals_narrow_with_more_seeds_per_combination():
    rng = np.random.default_rng(2)
    ref = _synthetic(rng, 40, 8)
    boot = ClusterBootstrap(ref, 40, reps=300)
    width = {}
    for k in (1, 6):
        _, lo, hi, _ = boot.difference(_synthetic(rng, 40, k, shift=0.5), _synthetic(rng, 40, k))
        width[k] = hi - lo
    assert width[6] < 0.6 * width[1]


def test_draws_are_cached_by_name_and_paired():
    rng = np.random.default_rng(3)
    ref = _synthetic(rng, 10, 4)
    boot = ClusterBootstrap(ref, 10, reps=50)
    a = _synthetic(rng, 10, 2)
    named = Clustered(a.features, a.groups, "a")
    assert np.array_equal(boot.draws(named), boot.draws(Clustered(a.features * 0, a.groups, "a")))  # cached
    assert boot.difference(a, a)[1:3] == (0.0, 0.0)
    with pytest.raises(ValueError, match="share of the reference"):
        ClusterBootstrap(Clustered(ref.features, np.zeros(len(ref.groups), int)), 10, reps=5)


def test_multiple_comparison_helpers():
    assert bonferroni_level(8) == pytest.approx(1 - 0.05 / 8)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert bootstrap_p(np.array([1.0, 2.0, 3.0, -1.0])) == pytest.approx(0.5)
    assert bootstrap_p(np.ones(10)) == 0.0


def test_fixed_comparisons_name_conditions_their_grids_run():
    table = {c.key for c in GRIDS["table"]()}
    assert all(a in table and b in table for a, b in COMPARISONS_30)
    distilled = {c.key for c in GRIDS["distilled"]()}
    assert all(a in distilled and b in distilled for a, b in COMPARISONS_4)
    quick = GRIDS["quick"]()
    assert any(c.kind == "restart" for c in quick)  # --quick includes a restart row


@pytest.mark.parametrize("grid", ["distilled", "solvers", "restart_solver", "distilled_solver", "distilled_history",
                                  "distilled_relation", "restart_relation", "distilled_attention"])
def test_every_grid_runs_the_conditions_its_fixed_comparisons_and_a_a_checks_name(grid):
    from lab.restart_grids import aa_for, comparisons_for

    keys = {c.key for c in GRIDS[grid]()}
    pairs = comparisons_for(grid)
    assert pairs and pairs != COMPARISONS_30 or grid == "table"
    assert all(a in keys and b in keys for a, b in pairs), grid
    assert all(k in keys for k in aa_for(grid)) or grid == "solvers", grid


# ---------------------------------------------------------------------------------------------- restart arithmetic

def test_restart_plan_is_the_products_schedule_arithmetic():
    plan, index, s_cap = restart_plan(0.8, 6, 30)
    assert plan == restart_schedule(toy_sigmas, 0.8, 6) and plan.total == 8  # 6 steps start at 0.75, not 0.8
    assert plan.start_sigma == pytest.approx(0.75) and index == 6 and s_cap == pytest.approx(0.8)
    plan8, _, _ = restart_plan(0.8, 8, 30)
    assert plan8.total == 10 and plan8.start_sigma == pytest.approx(0.8)
    assert BOTH_SIGMAS == pytest.approx((0.5, 0.375))
    assert steps_at_sigmas(BOTH_SIGMAS, list(plan8.sigmas)) == (4, 5)  # 0.5 and 0.4 on 0.8, 0.7, ... 0.1, 0
    assert steps_at_sigmas(BOTH_SIGMAS, list(plan.sigmas)) == (3, 4)  # 0.5 and 0.375 on the tail of 8


def test_restart_start_is_renoise_of_the_donors_origin():
    gen = torch.Generator().manual_seed(0)
    shape = (1, 4, 2, 4, 4)
    latents = [torch.randn(shape, generator=gen) for _ in range(30)]
    d_noise, r_noise = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    donor = DonorRun(latents, toy_sigmas(30)[:-1].tolist(), latents[-1], torch.zeros(1), None, d_noise)
    start, plan, (hist, hist_sigma) = restart_start(donor, r_noise, 0.8, 8)
    torch.testing.assert_close(start, latents[6] + 0.8 * (r_noise - d_noise))  # the noise swap
    torch.testing.assert_close(hist, origin(latents[6], d_noise, 0.8))  # the origin, at the step before the capture
    assert hist_sigma == pytest.approx(donor.sigmas[5])
    same, _, _ = restart_start(donor, r_noise, 0.8, 8, swap=False)
    torch.testing.assert_close(same, latents[6])  # no swap: the donor's own x(0.8)
    start6, plan6, _ = restart_start(donor, r_noise, 0.8, 6)
    torch.testing.assert_close(start6, renoise(origin(latents[6], d_noise, 0.8), r_noise, 0.75))
    with pytest.raises(ValueError, match="no initial noise"):
        restart_start(DonorRun(latents, donor.sigmas, latents[-1], torch.zeros(1), None), r_noise, 0.8, 8)


# ---------------------------------------------------------------------------------------------- solvers

def test_ab2_is_exact_after_its_euler_start_on_a_linear_velocity():
    sigmas = [1.0, 0.75, 0.5, 0.25, 0.0]
    v = lambda x, s: torch.full_like(x, s)  # noqa: E731 - x(0) - x(1) = 1/2 exactly
    x0 = torch.zeros(3)
    out = ab2(v, x0, sigmas)
    first_step_error = 0.25 * 1.0 - (1.0 - 0.75 ** 2) / 2  # Euler's first step, then AB2 is exact
    torch.testing.assert_close(out, torch.full((3,), 0.5 + first_step_error))
    assert abs(float(euler(v, x0, sigmas)[0]) - 0.5) > abs(float(out[0]) - 0.5)


# ---------------------------------------------------------------------------------------------- the lab on the model

@pytest.fixture(scope="module")
def lab10():
    from comfyui_chai.toyworld.model import lab_weights, load_toy_model

    return LabSampler(load_toy_model(lab_weights()), toy_text_encoder(), full_steps=10)


def test_a_restart_of_the_donors_own_request_finishes_the_donors_run(lab10):
    req = Request(PROMPT, COMBO, 3)
    donor = lab10.donor(req)
    latent, fired, evals = run_condition(lab10, Condition("restart", 8, "same", 0.8), req, {"same": donor})
    # 8 steps from 0.8 are the tail of the donor's own 10-step schedule: the same request ends where it ended
    torch.testing.assert_close(latent, donor.final, rtol=1e-5, atol=1e-5)
    assert evals == 8 and fired == []
    other = Request(PROMPT, COMBO, 4)
    swapped, _, _ = run_condition(lab10, Condition("restart", 8, "same", 0.8), other, {"same": donor})
    kept, _, _ = run_condition(lab10, Condition("restart", 8, "same", 0.8, swap=False), other, {"same": donor})
    assert (swapped - donor.final).abs().max() > 1e-3  # another seed: another clip
    torch.testing.assert_close(kept, donor.final, rtol=1e-5, atol=1e-5)  # no swap ignores the seed
    _, fired, _ = run_condition(lab10, Condition("restart", 8, "same", 0.8, both=True), other, {"same": donor})
    assert fired == [4, 5]


def test_velocity_is_the_samplers_guided_velocity(lab10):
    req = Request(PROMPT, COMBO, 5)
    torch.testing.assert_close(euler(lab10.velocity(req), lab10.noise(req), toy_sigmas(4).tolist()),
                               lab10.run(req, 4), rtol=1e-5, atol=1e-5)


def test_restart_runner_end_to_end_on_two_prompts(monkeypatch, capsys):
    from bench import bench_restart_lab as bench

    monkeypatch.setattr(bench, "GT_SET", 24)
    monkeypatch.setattr(bench, "make_lab_items", lambda held, pool, n: make_lab_items(held, pool, 2))
    assert bench.main(["--grid", "distilled", "--cfg", "1", "--full-steps", "4", "--seeds", "2",
                       "--reps", "30"]) == 0
    out = capsys.readouterr().out
    assert "restart 0.75 x3 scene" in out and "A/A" in out and "2 held-out prompts x 2 seeds" in out


def test_a_fixed_reference_keeps_the_distance_of_a_cell_equal_to_it_above_zero():
    rng = np.random.default_rng(4)
    ref = _synthetic(rng, 30, 6)
    fixed = ClusterBootstrap(ref, 30, reps=100, redraw=False)
    # the method this replaces: a resampled copy of the reference meets the whole reference, FD > 0 on most draws
    assert np.mean(fixed.draws(ref) > 1e-6) > 0.9
