"""The labelled pair sets of issues 11 and 25 as files: every pair decided, the sealed and read sets kept out of
fitting."""
from __future__ import annotations

from bench import fit_decision as fd
from bench.hit_labels import DEV_DATA, FRESH_DATA, STYLE_DATA, _jsonl, _labels, agreement, label_index, load_pairs


def test_every_pair_of_the_sealed_set_has_a_decided_label_from_independent_votes():
    ids = [row["id"] for row in _jsonl(FRESH_DATA / "pairs.jsonl")]
    pairs = load_pairs(FRESH_DATA)
    assert len(ids) >= 700 and {p.id for p in pairs} <= set(ids)
    votes = [_labels(f"labels_{who}*.jsonl", FRESH_DATA) for who in "abc"]
    undecided = set(ids) - {p.id for p in pairs}
    assert len(undecided) <= 2 and all(len({v[i] for v in votes}) == 3 for i in undecided)  # only a three-way split
    assert all(len(p.votes) in (2, 3) and p.votes.count(p.label) >= 2 for p in pairs)
    assert all((len(p.votes) == 3) == (p.votes[0] != p.votes[1]) for p in pairs)  # a third vote only to decide
    n, exact, _ = agreement(FRESH_DATA)
    assert n == len(ids) and exact > 0.85
    styles = {p.source for p in pairs}
    assert {"tags", "extender", "series", "casual", "camera", "traps", "other"} <= styles


def test_the_sealed_set_shares_no_prompt_with_what_the_decision_is_fitted_or_streamed_on():
    sealed = {t for p in load_pairs(FRESH_DATA) for t in (p.request, p.donor)}
    fitted = {t for p in fd.all_pairs() for t in (p.request, p.donor)}
    streamed = {t for pair in label_index() for t in pair} | {t for pair in label_index(STYLE_DATA) for t in pair}
    assert sealed and not sealed & fitted and not sealed & streamed


def test_the_read_set_is_decided_by_independent_votes_and_kept_out_of_fitting_and_the_sealed_set():
    ids = [row["id"] for row in _jsonl(DEV_DATA / "pairs.jsonl")]
    pairs = load_pairs(DEV_DATA)
    assert len(ids) == 391 and {p.id for p in pairs} == set(ids)  # no three-way split here
    assert all(p.votes.count(p.label) >= 2 and (len(p.votes) == 3) == (p.votes[0] != p.votes[1]) for p in pairs)
    n, exact, _ = agreement(DEV_DATA)
    assert n == len(ids) and exact > 0.9
    read = {t for p in pairs for t in (p.request, p.donor)}
    fitted = {t for p in fd.all_pairs() for t in (p.request, p.donor)}
    sealed = {t for p in load_pairs(FRESH_DATA) for t in (p.request, p.donor)}
    streamed = {t for pair in label_index() for t in pair} | {t for pair in label_index(STYLE_DATA) for t in pair}
    assert read and not read & fitted and not read & sealed and not read & streamed
    assert {p.source for p in pairs} == {"tags", "extender", "series", "casual", "camera", "traps"}
