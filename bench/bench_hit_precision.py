"""Precision and recall of hit rules on the labelled (request, donor) pairs (issue 11), calibration vs held-out.

Every pair is judged in isolation, as with a cache holding only the donor: the rule accepts the pair when a
request entity matches a donor entity as the rule requires. Rules:
  any entity (no roles)    the rule before roles, on today's entities: any entity pair at similarity >= threshold
  roles, phrase vectors    main subject or scene on both sides, same kind of thing, vectors of the whole phrase
  roles + identity         the same, with vectors of what each thing is (Entity.core)
  pack: ... + scenes agree the pack's rule: the same, and when both prompts name a scene, some pair of their
                           scenes matches (the lookup compares the request's scenes with the index's neighbours)
  pack + learned decision  the pack's rule proposes, its learned decision (lookup/decision.py) accepts: what the
                           lookup does (the decision was fitted at the calibrated threshold, 0.65)
  prompt                   the whole-prompt MiniLM similarity >= threshold (the NIRVANA-style baseline)

    python -m bench.bench_hit_precision                      # default thresholds, both splits
    python -m bench.bench_hit_precision --thresholds 0.6,0.7,0.8 --split calib
    python -m bench.bench_hit_precision --labels style --thresholds 0.65 --by-style   # the issue-25 set, per style
    python -m bench.bench_hit_precision --labels fresh --thresholds 0.65 --by-style --through-store  # the sealed set
    python -m bench.bench_hit_precision --data FOLDER --thresholds 0.65 --misses   # any labelled folder, and why
                                                                                   # the pack missed its label-2 pairs

`--misses` (through ChaiCache) sorts the label-2 pairs the pack misses by why: a prompt in another language, a donor
of another scene (the scene rule: the quality lab measured such restarts worse than the miss), the learned
decision, or never proposed (no main subject or scene matched as the rule requires). Its last column is the recall
over the label-2 pairs the scene rule lets through.
"""
from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path


from bench._common import table
from bench.hit_labels import ANOTHER_SCENE, DATA, FRESH_DATA, MISS_CLASSES, STYLE_DATA, Pair, agreement, \
    embed_all, load_pairs, look_up_through_store, miss_class, score

THRESHOLDS = (0.6, 0.65, 0.7, 0.75, 0.8)


def rules(ents, vec, whole, threshold: float):
    """name -> accepts(pair) for each rule at this threshold."""
    from comfyui_chai.cache_store.lookup.rule import HitRule

    def entity_rule(rule, sim):
        def accepts(p: Pair) -> bool:
            return (any(rule.accepts(q, d, sim(q, d)) for q in ents[p.request] for d in ents[p.donor])
                    and rule.scenes_agree(ents[p.request], ents[p.donor], sim))
        return accepts

    def text_sim(q, d):
        return float(vec[q.text] @ vec[d.text])

    def core_sim(q, d):
        return float(vec[q.identity] @ vec[d.identity])

    from comfyui_chai.cache_store.lookup import prompt_vector
    from comfyui_chai.cache_store.lookup.decision import default_decision, features, side_of

    model = default_decision()

    def side(prompt: str, donor: bool = False):
        es = ents[prompt]
        # a donor's prompt vector as the lookup reads it back from the entry (float16 in its metadata)
        whole_vector = prompt_vector.as_stored(whole[prompt]) if donor else None
        return side_of(es, [e.role for e in es], [vec[e.identity] for e in es], whole_vector)

    def decided(p: Pair) -> bool:
        pack = entity_rule(HitRule(threshold), core_sim)
        if not pack(p) or model is None:
            return pack(p)
        donor = side(p.donor, donor=True)
        deciding = model.for_donor(donor)
        return deciding.accepts(features(side(p.request), donor, HitRule(threshold)))

    return {
        "pack + learned decision": decided,
        "any entity (no roles)": lambda p: any(float(vec[q.text] @ vec[d.text]) >= threshold
                                    for q in ents[p.request] for d in ents[p.donor]),
        "roles, phrase vectors": entity_rule(HitRule(threshold, scenes_must_agree=False), text_sim),
        "roles + identity": entity_rule(HitRule(threshold, scenes_must_agree=False), core_sim),
        "pack: roles + identity + scenes agree": entity_rule(HitRule(threshold), core_sim),
        "prompt": lambda p: float(whole[p.request] @ whole[p.donor]) >= threshold,
    }


def main(argv: list[str] | None = None) -> int:
    """Print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--thresholds", default=",".join(map(str, THRESHOLDS)))
    ap.add_argument("--split", choices=("calib", "heldout", "both"), default="both")
    ap.add_argument("--labels", choices=("issue11", "style", "fresh"), default="issue11",
                    help="bench/data/hit_pairs (issue 11), bench/data/style_pairs (issue 25) or bench/data/fresh_pairs "
                         "(issue 25's sealed set)")
    ap.add_argument("--by-style", action="store_true", help="one row per style (source) instead of per split")
    ap.add_argument("--through-store", action="store_true",
                    help="also score each pair through ChaiCache itself (a fresh cache holding only its donor)")
    ap.add_argument("--misses", action="store_true",
                    help="through ChaiCache, why the pack missed each label-2 pair (implies --through-store)")
    ap.add_argument("--data", type=Path, default=None,
                    help="a folder of labelled pairs (pairs.jsonl, labels_a/b/c*.jsonl, provenance.jsonl optional) "
                         "instead of --labels (which it overrides)")
    args = ap.parse_args(argv)
    data = args.data or {"style": STYLE_DATA, "fresh": FRESH_DATA}.get(args.labels, DATA)
    if not (data / "pairs.jsonl").is_file():
        ap.error(f"{data} holds no pairs.jsonl")
    args.through_store = args.through_store or args.misses
    pairs = load_pairs(data)
    blank = [p.id for p in pairs if not p.request.strip() or not p.donor.strip()]
    if blank:
        ap.error(f"{data}: pairs with an empty prompt cannot be looked up: {', '.join(blank[:10])}")
    n, exact, main = agreement(data)
    print(f"{len(pairs)} labelled pairs; labellers A/B agree exactly on {exact:.1%} of {n}, on 'main or not' "
          f"on {main:.1%}; labels 0/1/2: {[sum(p.label == k for p in pairs) for k in (0, 1, 2)]}")
    t0 = time.perf_counter()
    ents, vec, whole = embed_all([p.request for p in pairs] + [p.donor for p in pairs])
    print(f"extracted and embedded {len(ents)} prompts in {time.perf_counter() - t0:.1f} s")
    splits = ("calib", "heldout") if args.split == "both" else (args.split,)
    groups = sorted({p.source for p in pairs}) if args.by_style else splits
    rows = []
    for thr in [float(t) for t in args.thresholds.split(",")]:
        for name, accepts in rules(ents, vec, whole, thr).items():
            for split in groups:
                s = score([p for p in pairs if (p.source if args.by_style else p.split) == split], accepts)
                rows.append([name, f"{thr:.2f}", split, s.pairs, s.accepted, f"{s.precision_main:.3f}",
                             f"{s.precision_any:.3f}", f"{s.recall:.3f}"])
    misses = []
    if args.through_store:
        for thr in [float(t) for t in args.thresholds.split(",")]:
            looked = look_up_through_store(pairs, thr)  # each pair once, whatever its groups
            for group in dict.fromkeys([*groups, "all"]):  # a folder without provenance is one group, "all"
                members = [p for p in pairs if group == "all" or (p.source if args.by_style else p.split) == group]
                s = score(members, lambda p: looked[p.id][0])
                rows.append(["ChaiCache (the pack itself)", f"{thr:.2f}", group, s.pairs, s.accepted,
                             f"{s.precision_main:.3f}", f"{s.precision_any:.3f}", f"{s.recall:.3f}"])
                misses.append(miss_row(members, looked, thr, group))
    print(table(["rule", "thr", "style" if args.by_style else "split", "pairs", "accepted", "prec. main",
                 "prec. any", "recall (2)"], rows))
    if args.misses:
        print("\nThe label-2 pairs ChaiCache missed, by why (recall without the scene rule's refusals: hits over the "
              "label-2 pairs less those of another scene):")
        print(table(["thr", "style" if args.by_style else "split", "label 2", "hit", *MISS_CLASSES, "recall",
                     "recall, scene rule's refusals left out"], misses))
    return 0


def miss_row(members: list[Pair], looked: dict[str, tuple[bool, str]], threshold: float, group: str) -> list:
    """One row of the misses table: label-2 pairs, hits, misses per class, recall, recall less another scene."""
    main = [p for p in members if p.label == 2]
    hits = sum(looked[p.id][0] for p in main)
    counts = Counter(miss_class(p, looked[p.id][1]) for p in main if not looked[p.id][0])
    allowed = len(main) - counts[ANOTHER_SCENE]
    return [f"{threshold:.2f}", group, len(main), hits, *(counts[c] for c in MISS_CLASSES),
            f"{hits / len(main):.3f}" if main else "nan", f"{hits / allowed:.3f}" if allowed else "nan"]


if __name__ == "__main__":
    raise SystemExit(main())
