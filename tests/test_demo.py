"""What the demo and the benchmarks say when a run goes wrong or has nothing to compare: a message, no traceback."""
from __future__ import annotations

from pathlib import Path

import pytest

from comfyui_chai.toyworld.stream import Request, summary_text

COMBO = ("beach", "ball", "red", "bouncing")


def _requests(*modes: str) -> list[Request]:
    return [Request(i, "a red ball bouncing across a sunny beach", COMBO, mode, 30 if mode == "full" else 8,
                    0.4 if mode == "full" else 0.1) for i, mode in enumerate(modes, 1)]


@pytest.mark.parametrize("modes, says", [(("full", "full"), "no hits"), (("fast", "fast"), "no misses"),
                                         ((), "no requests")])
def test_the_summary_says_what_it_cannot_compare_instead_of_nan(modes, says):
    text = summary_text(_requests(*modes))
    assert "nan" not in text and says in text


def test_the_summary_of_hits_and_misses_keeps_its_figures():
    text = summary_text(_requests("full", "fast", "full", "fast"))
    assert "hit rate 50%; a hit is 4.00x faster than a miss; the stream took 1.0 s, 1.60x faster than all misses" \
        in text


def test_a_garbage_weights_file_is_a_message_not_a_traceback(tmp_path, capsys):
    from bench import demo_chai

    garbage = tmp_path / "weights.safetensors"
    garbage.write_bytes(b"\xff" * 4096)
    code = demo_chai.main(["--n", "1", "--weights", str(garbage), "--cache", str(tmp_path / "c"),
                           "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "is not a readable STDiT3 checkpoint" in err and str(garbage) in err
    assert not (tmp_path / "c").exists()


def test_the_demo_defaults_to_one_torch_thread(capsys):
    from bench import demo_chai

    with pytest.raises(SystemExit):
        demo_chai.main(["--help"])
    assert "torch CPU threads (default 1" in " ".join(capsys.readouterr().out.split())


def test_an_empty_prompt_file_is_a_message_not_a_traceback(tmp_path):
    from bench import bench_hit_rate

    empty = tmp_path / "prompts.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(SystemExit) as stopped:
        bench_hit_rate.main(["--prompts", str(empty), "--no-plot"])
    assert "holds no prompts" in str(stopped.value.code)


def test_the_stream_speedup_counts_fast_hits_and_only_same_prompt_re_rolls_on_the_few_step_path(capsys):
    from bench import bench_hit_rate

    run = bench_hit_rate.Run("entity", 0.65, 0.1, 10, served=10, hits=5, restart_hits=3, same_prompt_hits=2)
    bench_hit_rate.print_stream_speedup(run)
    out = capsys.readouterr().out
    assert f"{300 / (5 * 30 + 5 * 8):.2f}x" in out  # 1.58x: 5 misses at 30, 5 hits at 8
    assert f"{40 / 38:.2f}x" in out  # 1.05x: two re-rolls save one of 4 evaluations each


def test_the_weights_hint_matches_the_readme_training_run(tmp_path):
    from comfyui_chai.toyworld.model import load_toy_model

    with pytest.raises(FileNotFoundError) as missing:
        load_toy_model(tmp_path / "absent.safetensors")
    assert "--steps 12500 --threads 2" in str(missing.value) and "--minutes 95" not in str(missing.value)
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert "train_toyworld.py --out toy_ckpt --steps 12500 --threads 2` replays the run of the shipped" in readme
