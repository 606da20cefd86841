"""bench.fit_decision's measured-but-not-shipped signals (issue 25, ninth pass): the mention windows it embeds and
the two window features it reads from them, and the gate without the scene rule it compares against."""
from __future__ import annotations

import numpy as np
import pytest

from bench import fit_decision as fd
from comfyui_chai.cache_store.entities.extract import Entity
from comfyui_chai.cache_store.lookup.rule import HitRule


def _doc(text: str):
    spacy = pytest.importorskip("spacy")
    return spacy.blank("en")(text)


def test_a_window_takes_the_mention_and_three_words_either_side_skipping_punctuation():
    doc = _doc("sliced kiwi , on a white plate , under warm light")
    head = [t.text for t in doc].index("kiwi")
    assert fd._window(doc, head, 2) == "sliced kiwi on a white"
    plate = [t.text for t in doc].index("plate")
    assert fd._window(doc, plate, 2) == "kiwi on a white plate under warm light"
    assert fd._window(doc, 0, 1) == "sliced kiwi on a"


def _unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def test_window_features_read_the_top_main_pair_and_the_best_pair_above_the_threshold():
    kiwi_fruit = Entity("sliced kiwi", "object", "kiwi", "main")
    kiwi_bird = Entity("kiwi", "object", "kiwi", "main")
    plate, floor = Entity("plate", "object", "plate", "secondary"), Entity("floor", "scene", "floor", "scene")
    vec = {"kiwi": _unit(1, 0, 0), "plate": _unit(0, 1, 0), "floor": _unit(0, 0, 1)}
    here = [_unit(1, 1, 0), _unit(0, 1, 0)]  # "sliced kiwi on a white", "on a white plate"
    there = [_unit(1, 0, 1), _unit(0, 0, 1)]  # "a kiwi foraging on the forest", "on the forest floor"
    sim, best = fd.window_features([kiwi_fruit, plate], [kiwi_bird, floor], vec, here, there, HitRule(0.65))
    assert sim == pytest.approx(float(here[0] @ there[0]))  # the one main pair: same word, other surroundings
    assert best == pytest.approx(float(here[0] @ there[0]))  # plate/floor is no pair naming the same thing
    # No pair naming the same kind of thing: both features stay 0.
    assert fd.window_features([plate], [floor], vec, here[1:], there[1:], HitRule(0.65)) == [0.0, 0.0]


def test_window_features_leave_a_look_alike_compound_below_the_identity_threshold_out():
    sea_lion = Entity("sea lion", "object", "lion", "main", "sea lion")
    lion = Entity("lion", "object", "lion", "main")
    vec = {"sea lion": _unit(1, 1, 0), "lion": _unit(1, 0, 0)}  # 0.707: under the compound threshold 0.85
    assert fd.window_features([sea_lion], [lion], vec, [_unit(1, 0, 0)], [_unit(1, 0, 0)],
                              HitRule(0.65)) == [0.0, 0.0]
    # The same pair measured with a lower identity threshold names the same thing.
    assert fd.window_features([sea_lion], [lion], vec, [_unit(1, 0, 0)], [_unit(1, 0, 0)],
                              HitRule(0.65, identity_threshold=0.70)) == pytest.approx([1.0, 1.0])


def test_the_precision_first_criterion_keeps_precision_where_the_worst_style_one_chases_recall(monkeypatch):
    # Two styles. Each has a label-2 pair on top; below them wrong pairs (label 0 or 1) lie above the rest of the
    # label-2 pairs, so recall costs precision.
    prob = np.array([0.8, 0.6, 0.5, 0.3, 0.2, 0.1, 0.6, 0.3, 0.9, 0.2])
    labels = np.array([2, 1, 1, 2, 2, 2, 0, 1, 2, 2])
    styles = np.array(["a"] * 5 + ["b"] * 5)
    gate = np.ones(len(prob), bool)
    monkeypatch.setattr(fd, "MIN_STYLE_PROPOSED", 1)
    monkeypatch.setattr(fd, "CRITERION", "precision-first")
    first = fd.choose_threshold(prob, gate, labels, styles)
    monkeypatch.setattr(fd, "CRITERION", "worst-style")
    worst = fd.choose_threshold(prob, gate, labels, styles)
    assert worst < first
    for thr in (first, worst):
        accepted = gate & (prob >= thr)
        per = [fd.rates(accepted[styles == s], labels[styles == s]) for s in ("a", "b")]
        if thr == first:  # style-mean precision meets both targets
            assert np.mean([r[0] for r in per]) >= fd.TARGET_MAIN and np.mean([r[1] for r in per]) >= fd.TARGET_ANY
        else:  # the worst-style criterion gave precision away for style b's recall
            assert np.mean([r[0] for r in per]) < fd.TARGET_MAIN


def test_a_feature_set_ranks_by_styles_meeting_targets_then_its_mean_target_ratio():
    nan = float("nan")
    precise = [("a", 10, 5, 0.9, 1.0, 0.5, 0.5), ("b", 10, 5, 0.85, 0.96, 0.4, 0.5)]
    more_recall = [("a", 10, 7, 0.85, 0.96, 0.6, 0.5), ("b", 10, 7, 0.8, 0.95, 0.55, 0.5)]
    assert fd.selection_key(more_recall) > fd.selection_key(precise)
    meets = [("a", 10, 5, 0.9, 1.0, 0.75, 0.5), ("b", 10, 5, 0.5, 0.8, 0.2, 0.5)]
    assert fd.selection_key(meets)[0] == 1 and fd.selection_key(meets) > fd.selection_key(more_recall)
    assert fd.selection_key(precise + [("other", 10, 0, nan, nan, nan, 0.5)])[1] < fd.selection_key(precise)[1]
