"""Identity in context (issue 25 item 1): which signal tells look-alike words apart ('batter' / 'bat')?

On hand-written look-alike pairs (bench/data/style_pairs/lookalikes.jsonl: an entity of the request, one of the
donor, and whether they are the same kind of thing), each signal's similarity is scored by the area under the
ROC curve (AUC: the chance that a same-kind pair scores above a different-kind pair) and by the best accuracy of
one threshold:
  phrase        the entities' identity phrases embedded alone (what the store indexes today)
  span          the entity's tokens mean-pooled from one forward of its whole prompt (token embeddings in context)
  window        the entity with up to three words either side, embedded as a phrase
  co-mention    the identity vector plus half the mean vector of the prompt's other entities (no extra forward)

    python -m bench.bench_identity_context
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np

from bench._common import table

DATA = Path(__file__).resolve().parent / "data" / "style_pairs" / "lookalikes.jsonl"
CO_MENTION_WEIGHT = 0.5


def auc(scores: list[float], labels: list[int]) -> float:
    """Area under the ROC curve (ties count half)."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def best_accuracy(scores: list[float], labels: list[int]) -> tuple[float, float]:
    """(accuracy, threshold) of the best single threshold."""
    best = (0.0, 0.0)
    for t in sorted(set(scores)):
        acc = sum((s >= t) == bool(y) for s, y in zip(scores, labels)) / len(labels)
        best = max(best, (acc, t))
    return best


def span_of(text: str, phrase: str) -> tuple[int, int]:
    """Character span of a phrase's words in the text (each word may carry an inflection: 'bat' finds 'bats')."""
    words = phrase.split()
    pattern = r"\b" + r"\w*\s+".join(re.escape(w) for w in words) + r"\w*"
    m = re.search(pattern, text, re.IGNORECASE)
    if m is None:
        raise ValueError(f"{phrase!r} not in {text!r}")
    return m.start(), m.end()


def window(text: str, span: tuple[int, int], words: int = 3) -> str:
    """The span with up to `words` words either side."""
    left = text[:span[0]].split()[-words:]
    right = text[span[1]:].split()[:words]
    return " ".join(left + [text[span[0]:span[1]]] + right)


def main(argv: list[str] | None = None) -> int:
    """Print the table."""
    from comfyui_chai.cache_store.entities.embedders import get_embedder
    from comfyui_chai.cache_store.entities.extract import EntityExtractor

    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    emb, ext = get_embedder("minilm"), EntityExtractor()
    labels = [int(r["same"]) for r in rows]
    scores: dict[str, list[float]] = {"phrase": [], "span": [], "window": [], "co-mention": []}
    cost: dict[str, float] = {k: 0.0 for k in scores}

    def co_mention(prompt: str, phrase: str) -> np.ndarray:
        own = emb.embed([phrase])[0]
        others = [e.identity for e in ext.extract(prompt) if e.identity != phrase and phrase not in e.text]
        if not others:
            return own
        v = own + CO_MENTION_WEIGHT * emb.embed(others).mean(axis=0)
        return v / np.linalg.norm(v)

    for r in rows:
        a_span, b_span = span_of(r["request"], r["a"]), span_of(r["donor"], r["b"])
        pairs = {
            "phrase": lambda: emb.embed([r["a"], r["b"]]),
            "span": lambda: np.stack([emb.embed_spans(r["request"], [a_span])[0],
                                      emb.embed_spans(r["donor"], [b_span])[0]]),
            "window": lambda: emb.embed([window(r["request"], a_span), window(r["donor"], b_span)]),
            "co-mention": lambda: np.stack([co_mention(r["request"], r["a"]), co_mention(r["donor"], r["b"])]),
        }
        for name, make in pairs.items():
            emb.clear_cache()
            t0 = time.perf_counter()
            va, vb = make()
            cost[name] += time.perf_counter() - t0
            scores[name].append(float(va @ vb))
    out = []
    for name, s in scores.items():
        acc, thr = best_accuracy(s, labels)
        same = np.mean([x for x, y in zip(s, labels) if y])
        diff = np.mean([x for x, y in zip(s, labels) if not y])
        out.append([name, f"{auc(s, labels):.3f}", f"{acc:.3f} at {thr:.2f}", f"{same:.3f}", f"{diff:.3f}",
                    f"{1000 * cost[name] / len(rows):.1f}"])
    print(f"{len(rows)} look-alike pairs ({sum(labels)} same kind, {len(labels) - sum(labels)} different)")
    print(table(["signal", "AUC", "best accuracy", "mean sim same", "mean sim different", "ms per pair (cold)"],
                out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
