"""The labelled (request, donor) pairs of bench/data/hit_pairs and the precision/recall of a hit rule on them.

Labels (RUBRIC.md): 2 = the donor shows the request's main subject or setting, 1 = only a secondary element,
0 = nothing visual worth borrowing. Two independent labellers (A, B) labelled every pair; a third labeller
decided the pairs they disagreed on (labels_c.jsonl); a pair's label is the majority of the three.
Precision "main" = share of accepted pairs labelled 2; precision "any" = share labelled >= 1;
recall = share of the pairs labelled 2 that are accepted.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

DATA = Path(__file__).resolve().parent / "data" / "hit_pairs"
STYLE_DATA = Path(__file__).resolve().parent / "data" / "style_pairs"  # issue 25: prompts in users' styles
# issue 25, sealed: new prompts by a new writer, labelled after the seventeenth pass; never read to fit or choose
FRESH_DATA = Path(__file__).resolve().parent / "data" / "fresh_pairs"
# issue 25, twenty-first pass: fresh prompts read to find errors, never fitted on (`--data bench/data/dev_pairs`)
DEV_DATA = Path(__file__).resolve().parent / "data" / "dev_pairs"


@dataclass(frozen=True)
class Pair:
    """One labelled pair."""

    id: str
    request: str
    donor: str
    source: str
    split: str  # "calib" or "heldout"
    label: int
    votes: tuple[int, ...]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _labels(pattern: str, data: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for path in sorted(data.glob(pattern)):
        for row in _jsonl(path):
            out[row["id"]] = int(row["label"])
    return out


def majority(votes: Iterable[int]) -> int | None:
    """The label most voters gave (None on a three-way split or no votes)."""
    counts = Counter(votes).most_common()
    if not counts or (len(counts) > 1 and counts[0][1] == counts[1][1]):
        return None
    return counts[0][0]


def load_pairs(data: Path = DATA) -> list[Pair]:
    """Every pair with a decided label, with its source and split."""
    pairs = {row["id"]: row for row in _jsonl(data / "pairs.jsonl")}
    # A folder of someone else's pairs may name no provenance: its pairs are one group, held out.
    prov = {row["id"]: row for row in _jsonl(data / "provenance.jsonl")} if (data / "provenance.jsonl").is_file() \
        else {pid: {"source": row.get("style") or row.get("source") or "all"} for pid, row in pairs.items()}
    a, b, c = _labels("labels_a*.jsonl", data), _labels("labels_b*.jsonl", data), _labels("labels_c*.jsonl", data)
    out = []
    for pid, row in pairs.items():
        votes = tuple(v[pid] for v in (a, b, c) if pid in v)
        label = majority(votes)
        if label is None:
            continue
        # The issue-25 set names each pair's style; it has no calibration split (styles are held out instead).
        source = prov[pid].get("style") or prov[pid]["source"]
        out.append(Pair(pid, row["request"], row["donor"], source, prov[pid].get("split", "heldout"), label, votes))
    return out


@dataclass
class Scores:
    """Acceptance counts of one rule on a set of pairs."""

    pairs: int = 0
    accepted: int = 0
    accepted_main: int = 0
    accepted_any: int = 0
    main: int = 0

    @property
    def precision_main(self) -> float:
        return self.accepted_main / self.accepted if self.accepted else float("nan")

    @property
    def precision_any(self) -> float:
        return self.accepted_any / self.accepted if self.accepted else float("nan")

    @property
    def recall(self) -> float:
        return self.accepted_main / self.main if self.main else float("nan")


def score(pairs: Iterable[Pair], accepts: Callable[[Pair], bool]) -> Scores:
    """Precision and recall of `accepts` against the labels."""
    s = Scores()
    for p in pairs:
        s.pairs += 1
        s.main += p.label == 2
        if accepts(p):
            s.accepted += 1
            s.accepted_main += p.label == 2
            s.accepted_any += p.label >= 1
    return s


def agreement(data: Path = DATA) -> tuple[int, float, float]:
    """(pairs labelled by both A and B, exact agreement, agreement on 'label 2 or not')."""
    a, b = _labels("labels_a*.jsonl", data), _labels("labels_b*.jsonl", data)
    both = [k for k in a if k in b]
    if not both:
        return 0, float("nan"), float("nan")
    exact = sum(a[k] == b[k] for k in both) / len(both)
    main = sum((a[k] == 2) == (b[k] == 2) for k in both) / len(both)
    return len(both), exact, main


def embed_all(prompts: Iterable[str]) -> tuple[dict, dict, dict]:
    """(prompt -> entities with roles, text -> vector for every entity's text and identity, prompt -> vector of
    the whole prompt), extracted and embedded once for every distinct prompt."""
    from comfyui_chai.cache_store.entities.embedders import get_embedder
    from comfyui_chai.cache_store.entities.extract import EntityExtractor

    prompts = sorted(set(prompts))
    embedder = get_embedder("minilm")
    ents = dict(zip(prompts, EntityExtractor().extract_many(prompts)))
    texts = sorted({t for es in ents.values() for e in es for t in (e.text, e.identity)})
    vec = dict(zip(texts, embedder.embed(texts))) if texts else {}
    whole = dict(zip(prompts, embedder.embed(prompts))) if prompts else {}
    return ents, vec, whole


def rule_accepts(pairs: Iterable[Pair]) -> Callable[[float], Callable[[Pair], bool]]:
    """threshold -> accepts(pair) under the pack's hit rule, on entities extracted and embedded once."""
    from comfyui_chai.cache_store.lookup.rule import HitRule

    pairs = list(pairs)
    ents, vec, _ = embed_all([p.request for p in pairs] + [p.donor for p in pairs])

    def at(threshold: float) -> Callable[[Pair], bool]:
        rule = HitRule(threshold)

        def sim(q: Any, d: Any) -> float:
            return float(vec[q.identity] @ vec[d.identity])

        def accepts(p: Pair) -> bool:
            return (any(rule.accepts(q, d, sim(q, d)) for q in ents[p.request] for d in ents[p.donor])
                    and rule.scenes_agree(ents[p.request], ents[p.donor], sim))
        return accepts

    return at


def label_index(data: Path = DATA) -> dict[tuple[str, str], int]:
    """(request, donor) -> decided label, for every labelled pair (the label sets and the replay's own pairs)."""
    out = {(p.request, p.donor): p.label for p in load_pairs(data)}
    if data == DATA and (STYLE_DATA / "pairs.jsonl").is_file():
        out.update({(p.request, p.donor): p.label for p in load_pairs(STYLE_DATA)})
    for folder in (data, STYLE_DATA) if data == DATA else (data,):
        replay = folder / "replay_pairs.jsonl"
        if not replay.is_file():
            continue
        votes: dict[str, list[int]] = {}
        for pattern in ("replay_labels_a.jsonl", "replay_labels_b.jsonl", "replay_labels_c.jsonl"):
            for path in folder.glob(pattern):
                for row in _jsonl(path):
                    votes.setdefault(row["id"], []).append(int(row["label"]))
        for row in _jsonl(replay):
            label = majority(votes.get(row["id"], ()))
            if label is not None:
                out[(row["request"], row["donor"])] = label
    return out


def score_through_store(pairs: Iterable[Pair], threshold: float | None = None) -> Scores:
    """Precision and recall of the pack itself: each pair looked up in a fresh ChaiCache holding only its donor."""
    pairs = list(pairs)
    looked = look_up_through_store(pairs, threshold)
    return score(pairs, lambda p: looked[p.id][0])


# Why the pack missed a pair: another language on either side, else its lookup's reason (`lookup.flow`).
OTHER_LANGUAGE, ANOTHER_SCENE, DECISION, NEVER_PROPOSED = ("other language", "another scene", "hit decision",
                                                           "never proposed")
MISS_CLASSES = (OTHER_LANGUAGE, ANOTHER_SCENE, DECISION, NEVER_PROPOSED)


def miss_class(pair: Pair, reason: str) -> str:
    """Why the pack missed `pair`: a prompt in another language (no entities on that side), a donor of another
    scene (the scene rule, which the quality lab asks for), the learned decision's refusal, or no main subject or
    scene matched as the rule requires (`NEVER_PROPOSED`: parse, roles, identity or similarity; an English donor
    without entities, which is never stored, is here too). The reasons are read from `lookup.flow`'s and
    `lookup.ranking`'s miss messages (tests/test_bench_misses.py checks they still say so)."""
    from comfyui_chai.cache_store.entities.language import foreign_language, other_script

    if any(other_script(t) or foreign_language(t) for t in (pair.request, pair.donor)):
        return OTHER_LANGUAGE
    if "show another scene" in reason:
        return ANOTHER_SCENE
    if "refused by the hit decision" in reason:
        return DECISION
    return NEVER_PROPOSED


def look_up_through_store(pairs: Iterable[Pair], threshold: float | None = None) -> dict[str, tuple[bool, str]]:
    """Pair id -> (hit, the lookup's reason): each request looked up in a fresh ChaiCache holding only its donor."""
    import shutil
    import tempfile

    import torch

    from comfyui_chai.cache_store.service import ChaiCache

    pairs = list(pairs)
    shape = (1, 4, 1, 2, 2)
    work = Path(tempfile.mkdtemp(prefix="chai-labels-"))
    try:
        base = ChaiCache(work / "base", budget_bytes=1 << 30)
        decided: dict[str, tuple[bool, str]] = {}
        for n, p in enumerate(pairs):
            cache = ChaiCache(work / f"c{n}", budget_bytes=1 << 30, embedder=base.embedder)
            cache._extractor = base.extractor  # one spaCy pipeline for all the caches
            written = cache.write(p.donor, cache.embed_prompt(p.donor), "labels", {"x": torch.zeros(shape)}, [0.5])
            if not written.stored:
                decided[p.id] = (False, "the donor was not stored")
            else:
                found = cache.lookup(cache.embed_prompt(p.request), "labels", shape, threshold)
                decided[p.id] = (found.hit, found.reason)
            cache.close()
            shutil.rmtree(work / f"c{n}", ignore_errors=True)
        base.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return decided
