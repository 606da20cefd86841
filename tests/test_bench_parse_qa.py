"""The parser QA bench: its data file and its scoring (issue 25, twentieth pass)."""
from __future__ import annotations

import json
from collections import Counter

from bench.bench_parse_qa import DATA, SPLITS, score


def test_the_qa_prompts_are_seven_styles_split_in_halves_with_labels():
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(rows) == 350 and len({r["id"] for r in rows}) == 350
    per = Counter((r["style"], r["split"]) for r in rows)
    assert len({s for s, _ in per}) == 7 and set(per.values()) == {25} and {sp for _, sp in per} == set(SPLITS)
    assert all(isinstance(r["main"], list) and isinstance(r["scene"], list) and r["prompt"].strip() for r in rows)


def test_score_counts_found_and_right_main_subjects_and_scenes(spacy_pipeline):
    from comfyui_chai.cache_store.entities.extract import EntityExtractor

    rows = [
        {"style": "plain", "prompt": "A red fox trotting through a snowy forest", "main": ["red fox"],
         "scene": ["snowy forest"]},
        {"style": "plain", "prompt": "a dog on a feild", "main": ["dog"], "scene": ["feild"]},  # a typo in the label
        {"style": "plain", "prompt": "A kettle on a stove", "main": ["teapot"], "scene": []},
    ]
    c = score(rows, EntityExtractor(spacy_pipeline))["plain"]
    assert c["prompts"] == 3 and c["gold_main"] == 3 and c["main_found"] == 2
    assert c["pred_main"] == 3 and c["pred_main_right"] == 2  # "kettle" is not the labelled "teapot"
    assert c["gold_scene"] == 2 and c["scene_found"] == 2
