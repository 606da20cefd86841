"""Hit rate of entity matching vs whole-prompt matching on VBench (issue benchmark 2), drawn to docs/hit_rate.png.

Protocol (after CHAI's VidProM run, arXiv 2602.16132 section 4.2: 100 prompts warm the cache, 1,000 are served
under an LRU cache of 10% of the prompt count): the VBench prompt list (all_dimension.txt, 946 prompts) is
shuffled with a fixed seed; the first 10% are inserted to warm the cache, the rest are served in order. A served
prompt is looked up; a hit counts and refreshes the donor (LRU), a miss stores the prompt as a new entry (a hit
runs fast mode, which stores nothing). The budget is a number of entries given as a share of the prompt count:
every entry is padded to the same byte size (through its metadata), so the store's byte budget is exactly
`entries x entry size`.

Both matchers run through the real CacheStore (lookup, LRU eviction, index), with durability off (os.fsync
patched out; it changes no decision):
  entity      the pack's path: EntityExtractor (default stop list, roles, identity) + MiniLM vectors of each
              entity's core; a hit under CacheStore.lookup's rule (main subject or scene on both sides, same kind
              of thing, similarity >= threshold).
  prompt      the NIRVANA-style baseline: one MiniLM vector of the whole prompt stored as a single pseudo-entity
              whose text is the prompt; a hit when a cached prompt reaches the threshold. (NIRVANA used CLIP
              text embeddings; MiniLM keeps both matchers on one encoder, so the comparison is about granularity.)
Prompt-level hit rate = hits / served prompts. Entity-level hit rate = served entities that reach the threshold
against any cached entity (the index's nearest neighbour), and, stricter, entities matched in the chosen donor.

What the hits are worth: every (request, donor) pair of the default run's hits is looked up in the labels of
bench/data/hit_pairs (the label set, and replay_pairs.jsonl: the replay's own hit pairs, labelled the same way);
the useful-hit rate is the share of served prompts whose hit is labelled 2 (main subject or setting shared).
Precision and recall on the labelled calibration and held-out pairs are measured through ChaiCache itself, one
donor per cache. `--export-unlabelled FILE` writes the hit pairs that still lack a label.

The stop-list check replays the default setting once with an empty StopEntities and counts the donor matches in
which either side is a phrase the default list removes.

    python -m bench.bench_hit_rate --quick          # 300 prompts, 3 thresholds x 3 budgets, < 1 minute
    python -m bench.bench_hit_rate                  # all prompts, 8 thresholds x 5 budgets (a few minutes)
    python -m bench.bench_hit_rate --out docs/hit_rate.png --thresholds 0.6,0.7,0.8 --budgets 0.05,0.1
    python -m bench.bench_hit_rate --style-set --no-plot   # the issue-25 prompts in users' styles instead

`--style-set` replays the 840 prompts of bench/data/style_pairs (seven styles, shuffled together) instead of
VBench; its hits are looked up in both label sets.
"""
from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from comfyui_chai.cache_store.lookup.ranking import same_prompt
from comfyui_chai.cache_store.lookup.rule import HitRule

from bench._common import DEFAULT_PROMPTS, REPO, load_prompts, shorten, table

SHAPE = (1, 4, 2, 4, 4)
FINGERPRINT = "bench:hit-rate"
LATENT_NAMES = ("x_t_0", "x_t_1", "x_t_2")
SIGMAS = (0.9, 0.7, 0.5)
ENTRY_BYTES = 16_384          # every entry is padded to exactly this size
PAD_KEY = "pad"
PSEUDO_CHARS = 480  # the whole-prompt matcher's entity text (the store takes at most 500 characters)
THRESHOLDS = (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
BUDGETS = (0.02, 0.05, 0.10, 0.25, 1.0)
WARM_SHARE = 0.10
PAPER = {"entity": 0.52, "prompt": 0.147}   # VidProM, 10% budget ([S-notes] section 4.2)


def log(msg: str) -> None:
    """Progress line with a timestamp."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Run:
    """Counts of one replay."""

    matcher: str
    threshold: float
    budget: float
    capacity: int
    served: int = 0
    hits: int = 0
    no_entities: int = 0
    entities: int = 0
    entity_any: int = 0      # served entities with a cached entity >= threshold
    entity_donor: int = 0    # served entities matched in the chosen donor entry
    evicted: int = 0
    held_end: int = 0
    size_mismatch: int = 0
    seconds: float = 0.0
    restart_hits: int = 0    # hits with a scene match (a restart on a many-step model; the rest borrow attention)
    same_prompt_hits: int = 0  # hits on an entry of the very same prompt (the only few-step restart)
    identities_stored: int = 0  # served entities whose identity the cache already held a vector for
    prompts_stored: int = 0    # served prompts all of whose identities it held (no encoder forward)
    matches: list = field(default_factory=list)   # (query prompt, query entity, stored entity, sim, donor prompt)
    hit_pairs: list = field(default_factory=list)  # (query prompt, donor prompt) of every hit

    @property
    def hit_rate(self) -> float:
        return self.hits / max(self.served, 1)

    @property
    def entity_rate(self) -> float:
        return self.entity_any / max(self.entities, 1)

    @property
    def donor_entity_rate(self) -> float:
        return self.entity_donor / max(self.entities, 1)


class Replayer:
    """Replays a prompt stream through a fresh CacheStore per setting."""

    def __init__(self, work: Path, identity: str, prompt_vectors: dict[str, np.ndarray] | None = None) -> None:
        import torch

        self.work = work
        self.identity = identity
        self.latents = {name: torch.zeros(SHAPE) for name in LATENT_NAMES}
        self.count = 0
        self.prompt_vectors = prompt_vectors or {}  # whole-prompt vectors, stored as ChaiCache.write stores them

    def _pad_meta(self, prompt: str, ee, matcher: str) -> dict:
        """Metadata that pads the encoded entry to ENTRY_BYTES (mirrors the record CacheStore.insert writes), with
        the prompt's vector where ChaiCache.write would add it (the entity matcher's entries)."""
        from comfyui_chai.cache_store import latents as lat
        from comfyui_chai.cache_store.lookup import prompt_vector

        extra: dict = {PAD_KEY: ""}
        if matcher == "entity" and prompt in self.prompt_vectors:
            extra = prompt_vector.with_prompt_vector(extra, self.prompt_vectors[prompt], ee.embedder)
        record = {"prompt": prompt, "fingerprint": FINGERPRINT, "shape": list(SHAPE), "dtype": "float32",
                  "sigmas": [float(s) for s in SIGMAS], "embedder": ee.embedder,
                  "entities": [{"text": e.text, "kind": e.kind, "role": e.role, "head": e.head, "core": e.core}
                               for e in ee.entities], "extra": extra}
        size = len(lat.encode_entry(self.latents, ee.vectors, record))
        return {**extra, PAD_KEY: "x" * max(ENTRY_BYTES - size, 0)}

    def replay(self, matcher: str, items: list, prompts: list[str], threshold: float, budget: float,
               n_warm: int, keep_matches: bool = False) -> Run:
        """Warm with the first n_warm items, serve the rest; items[i] is prompt i's EmbeddedEntities."""
        from comfyui_chai.cache_store.config import StoreConfig
        from comfyui_chai.cache_store.folder.store import CacheStore

        capacity = max(1, round(budget * len(prompts)))
        run = Run(matcher, threshold, budget, capacity)
        self.count += 1
        root = self.work / f"run{self.count}"
        store = CacheStore(root, StoreConfig(budget_bytes=capacity * ENTRY_BYTES))
        t0 = time.perf_counter()

        def insert(i: int) -> None:
            if len(items[i]) == 0:
                return
            res = store.insert(prompts[i], items[i], FINGERPRINT, self.latents, SIGMAS,
                               meta=self._pad_meta(prompts[i], items[i], matcher))
            run.evicted += len(res.evicted)
            run.size_mismatch += res.nbytes != ENTRY_BYTES

        # The whole-prompt baseline is a hit when a cached prompt reaches the threshold, as documented above: the
        # learned decision reads entities, and a prompt stored as one pseudo-entity would meet only its fallback.
        rule = HitRule(threshold) if matcher == "entity" else HitRule(threshold, decision=None)
        for i in range(n_warm):
            insert(i)
        for i in range(n_warm, len(prompts)):
            ee = items[i]
            run.served += 1
            if len(ee) == 0:
                run.no_entities += 1
                continue
            run.entities += len(ee)
            if matcher == "entity":  # what ChaiCache.embed_entities would read back instead of embedding
                wanted = [e.identity for e in ee.entities]
                known = store.stored_vectors(wanted, ee.embedder, ee.vectors.shape[1])
                run.identities_stored += sum(w in known for w in wanted)
                run.prompts_stored += all(w in known for w in wanted)
            index = store._index  # nearest cached entity per query entity (no public API for this)
            if index is not None and len(index):
                _, sims = index.query(ee.vectors, 1)
                run.entity_any += int(np.sum(sims[:, 0] >= threshold))
            res = store.lookup(replace(ee, prompt=prompts[i]), FINGERPRINT, SHAPE, rule, load=False)
            if res.hit:
                run.hits += 1
                run.restart_hits += any(m.role == "scene" for m in res.matches)
                run.same_prompt_hits += same_prompt(prompts[i], res.entry.prompt if res.entry else "")
                run.hit_pairs.append((prompts[i], res.entry.prompt if res.entry else "?"))
                run.entity_donor += len(res.matches)
                if keep_matches:
                    donor = res.entry.prompt if res.entry else "?"
                    run.matches += [(prompts[i], m.query, m.entity, m.similarity, donor) for m in res.matches]
            else:
                insert(i)
        run.held_end = store.stats().entries
        store.close()
        shutil.rmtree(root, ignore_errors=True)
        run.seconds = time.perf_counter() - t0
        return run


def stop_checker(default_texts: list[set[str]], prompts: list[str]):
    """stopped(text, prompt_index): True when the default stop list removes this phrase from that prompt."""
    from comfyui_chai.cache_store.entities.stop_entities import StopEntities

    stop = StopEntities.default()
    index = {p: i for i, p in enumerate(prompts)}

    def stopped(text: str, prompt: str) -> bool:
        if not stop.is_stop(text):
            return False
        words = text.split(" ")
        if words[-1] in stop.strip_heads and len(words) > 1:
            # a strip head gives way to its noun modifier ("desert scene" -> "desert"): rewritten, not removed,
            # when the default extraction of the same prompt holds the shortened phrase
            i = index.get(prompt)
            return i is None or " ".join(words[:-1]) not in default_texts[i]
        return True

    return stopped


def plot(path: Path, by_thr: dict, by_budget: dict, thresholds: list[float], budgets: list[float],
         default_thr: float, n_prompts: int) -> None:
    """Two panels: hit rate vs threshold (10% budget) and vs budget (default threshold)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), dpi=110)
    styles = {"entity": dict(color="tab:blue", marker="o", label="entity match, prompt hit rate"),
              "entity_ent": dict(color="tab:blue", marker=".", ls="--", label="entity match, entity-level rate"),
              "prompt": dict(color="tab:orange", marker="s", label="whole-prompt match (NIRVANA-style)")}
    ax = axes[0]
    ax.plot(thresholds, [by_thr[("entity", t)].hit_rate * 100 for t in thresholds], **styles["entity"])
    ax.plot(thresholds, [by_thr[("entity", t)].entity_rate * 100 for t in thresholds], **styles["entity_ent"])
    ax.plot(thresholds, [by_thr[("prompt", t)].hit_rate * 100 for t in thresholds], **styles["prompt"])
    ax.axvline(default_thr, color="grey", lw=0.8, ls=":")
    ax.text(default_thr, 2, f" default {default_thr:.2f}", color="grey", fontsize=8)
    ax.set_xlabel("cosine threshold (MiniLM)")
    ax.set_ylabel("hit rate (%)")
    ax.set_title("vs threshold, LRU budget 10% of prompts", fontsize=10)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax = axes[1]
    xs = [b * 100 for b in budgets]
    ax.plot(xs, [by_budget[("entity", b)].hit_rate * 100 for b in budgets], **styles["entity"])
    ax.plot(xs, [by_budget[("entity", b)].entity_rate * 100 for b in budgets], **styles["entity_ent"])
    ax.plot(xs, [by_budget[("prompt", b)].hit_rate * 100 for b in budgets], **styles["prompt"])
    ax.plot([10], [PAPER["entity"] * 100], ls="none", marker="*", ms=11, color="tab:blue", mfc="white",
            label="CHAI paper, VidProM (other data, CLIP-family encoder)")
    ax.plot([10], [PAPER["prompt"] * 100], ls="none", marker="*", ms=11, color="tab:orange", mfc="white")
    ax.set_xscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:g}%" for x in xs])
    ax.set_xlabel("LRU budget (share of the prompt count, log scale)")
    ax.set_title(f"vs budget, threshold {default_thr:.2f}", fontsize=10)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    fig.suptitle(f"CHAI cache hit rate on VBench ({n_prompts} prompts, shuffled, first 10% warm the cache)",
                 fontsize=11)
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8.5, frameon=False)
    fig.tight_layout(rect=(0, 0.11, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def style_set_prompts(seed: int) -> list[str]:
    """The issue-25 prompts (every style), deduplicated and shuffled together."""
    import random as _random

    from bench.hit_labels import STYLE_DATA

    prompts = list(dict.fromkeys(p for path in sorted(STYLE_DATA.glob("prompts_*.txt")) for p in load_prompts(path)))
    _random.Random(seed).shuffle(prompts)
    return prompts


def print_usefulness(entity: Run, prompt: Run, threshold: float, export: Path | None,
                     label_sets: bool = True) -> None:
    """Useful-hit rate of the replay (hits whose pair is labelled 2) and precision/recall on the labelled pairs."""
    import json

    from bench.hit_labels import label_index, load_pairs, score_through_store

    labels = label_index()
    print(f"\nwhat the hits are worth (threshold {threshold:.2f}, budget 10%; labels: bench/data/hit_pairs and "
          "style_pairs)")
    rows = []
    unlabelled: dict[tuple[str, str], None] = {}
    for name, run in (("entity (this pack)", entity), ("whole prompt", prompt)):
        pairs = list(dict.fromkeys(run.hit_pairs))
        known = [labels[p] for p in pairs if p in labels]
        unlabelled.update({p: None for p in pairs if p not in labels})
        useful = sum(v == 2 for v in known)
        share = useful / len(known) if known else float("nan")
        anything = sum(v >= 1 for v in known) / len(known) if known else float("nan")
        rows.append([name, f"{run.hit_rate:.1%}", f"{len(known)}/{len(pairs)}", f"{share:.1%}", f"{anything:.1%}",
                     f"{run.hit_rate * share:.1%}"])
    print(table(["matcher", "hit rate", "hits labelled", "useful among labelled (2)", "anything visible (>= 1)",
                 "useful-hit rate"], rows))
    pairs = load_pairs() if label_sets else []
    for split in ("calib", "heldout") if pairs else ():
        s = score_through_store([p for p in pairs if p.split == split], threshold)
        print(f"  labelled pairs, {split} split ({s.pairs}; one donor per cache, through ChaiCache): accepted "
              f"{s.accepted}, precision main {s.precision_main:.3f}, any {s.precision_any:.3f}, "
              f"recall {s.recall:.3f}")
    if export is not None:
        with open(export, "w", encoding="utf-8") as f:
            for request, donor in unlabelled:
                f.write(json.dumps({"request": request, "donor": donor}, ensure_ascii=False) + "\n")
        print(f"  {len(unlabelled)} unlabelled hit pairs written to {export}")


def print_stream_speedup(run: Run, full: int = 30, fast: int = 8, few: int = 4) -> None:
    """The stream's speedup in model evaluations per CFG branch: on the 30-step path every hit samples `fast`
    steps (a restart or Cache Attention); on a few-step model only a same-prompt hit restarts, one step short.
    (Few-step: counted on this replay, where every hit was served fast and not stored; there the other hits
    would be misses and stored, so later lookups could differ slightly.)"""
    served, hits = max(run.served, 1), run.hits
    many = served * full / ((served - hits) * full + hits * fast)
    few_step = served * few / (served * few - run.same_prompt_hits)
    print(f"\nstream speedup in model evaluations ({run.served} served, threshold {run.threshold:.2f}, budget "
          f"{run.budget:.0%})")
    print(table(["path", "hits served fast", "of them restarts", "speedup against all misses"], [
        [f"{full} full / {fast} fast steps", f"{hits} ({run.hit_rate:.1%})", f"{run.restart_hits}", f"{many:.2f}x"],
        [f"{few} full steps (distilled): same-prompt re-rolls only", f"{run.same_prompt_hits}",
         f"{run.same_prompt_hits}", f"{few_step:.2f}x"]]))


def print_stored_vectors(run: Run) -> None:
    """How often the stream's lookups could skip the encoder: identities the cache already held vectors for."""
    with_entities = max(run.served - run.no_entities, 1)
    print(f"\nstored vectors (threshold {run.threshold:.2f}, budget {run.budget:.0%}): {run.identities_stored} of "
          f"{run.entities} served entities ({run.identities_stored / max(run.entities, 1):.1%}) were the same kind "
          f"of thing as a cached one, so their vectors were read back; {run.prompts_stored} of {with_entities} "
          f"prompts with entities ({run.prompts_stored / with_entities:.1%}) needed no encoder forward")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="VBench all_dimension.txt")
    ap.add_argument("--n", type=int, default=None, help="use only the first N shuffled prompts (quick: 300)")
    ap.add_argument("--seed", type=int, default=0, help="shuffle seed")
    ap.add_argument("--thresholds", type=lambda s: [float(x) for x in s.split(",")], default=None)
    ap.add_argument("--budgets", type=lambda s: [float(x) for x in s.split(",")], default=None,
                    help="budgets as shares of the prompt count, e.g. 0.02,0.1,1")
    ap.add_argument("--threshold", type=float, default=None, help="default threshold (default: the embedder's)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "hit_rate.png", help="plot file")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--samples", type=int, default=15, help="sample entity hits to list")
    ap.add_argument("--quick", action="store_true", help="300 prompts, 3 thresholds, 3 budgets")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--style-set", action="store_true", help="replay the issue-25 prompts (bench/data/style_pairs)")
    ap.add_argument("--export-unlabelled", type=Path, default=None,
                    help="write the default run's (request, donor) hits without a label to this JSONL file")
    args = ap.parse_args(argv)

    import os

    import torch

    torch.set_num_threads(max(args.threads, 1))
    from comfyui_chai.cache_store.entities.embedders import get_embedder
    from comfyui_chai.cache_store.entities.extract import Entity, EntityExtractor
    from comfyui_chai.cache_store.entities.stop_entities import StopEntities
    from comfyui_chai.cache_store.types import EmbeddedEntities

    t_start = time.perf_counter()
    prompts = style_set_prompts(args.seed) if args.style_set else load_prompts(args.prompts, seed=args.seed)
    n = args.n or (300 if args.quick else len(prompts))
    prompts = prompts[:n]
    embedder = get_embedder("minilm").load()
    default_thr = embedder.default_threshold if args.threshold is None else args.threshold
    thresholds = args.thresholds or ([0.6, 0.9] if args.quick else list(THRESHOLDS))
    thresholds = sorted(set(thresholds) | {round(default_thr, 4)})
    budgets = sorted(set(args.budgets or ([0.05, 0.1, 1.0] if args.quick else list(BUDGETS))) | {0.1})
    n_warm = max(1, round(WARM_SHARE * n))

    log(f"{n} prompts (seed {args.seed}), {n_warm} warm the cache; extracting entities")
    extractor = EntityExtractor()
    ents_default = extractor.extract_many(prompts)
    ents_nostop = EntityExtractor(stop_entities=StopEntities.empty()).extract_many(prompts)
    phrases = sorted({e.identity for es in ents_default + ents_nostop for e in es})
    log(f"embedding {len(phrases)} distinct entity phrases and {len(set(prompts))} whole prompts "
        f"({embedder.identity})")
    vec_of = dict(zip(phrases, embedder.embed(phrases)))
    prompt_vecs = dict(zip(sorted(set(prompts)), embedder.embed(sorted(set(prompts)))))

    def embedded(ents: list) -> EmbeddedEntities:
        # the store's own embedding: what each thing is (ChaiCache.embed_entities)
        vecs = (np.stack([vec_of[e.identity] for e in ents]) if ents
                else np.zeros((0, embedder.dim), np.float32))
        return EmbeddedEntities(tuple(ents), vecs, embedder.identity)

    items = {"entity": [embedded(es) for es in ents_default],
             # the pseudo-entity's text only names the prompt: cut to the store's entity-text limit (long prose)
             "prompt": [EmbeddedEntities((Entity(p[:PSEUDO_CHARS], "other", p[:PSEUDO_CHARS]),),
                                         prompt_vecs[p][None, :], embedder.identity) for p in prompts]}
    items_nostop = [embedded(es) for es in ents_nostop]

    work = Path(tempfile.mkdtemp(prefix="chai-hitrate-"))
    replayer = Replayer(work, embedder.identity, prompt_vecs)
    real_fsync = os.fsync
    os.fsync = lambda fd: None  # type: ignore[assignment]  # durability is irrelevant to hit counts
    by_thr: dict = {}
    by_budget: dict = {}
    try:
        settings = [(m, t, 0.1) for m in ("entity", "prompt") for t in thresholds]
        settings += [(m, default_thr, b) for m in ("entity", "prompt") for b in budgets if b != 0.1]
        for k, (matcher, thr, budget) in enumerate(settings, 1):
            keep = matcher == "entity" and thr == default_thr and budget == 0.1
            run = replayer.replay(matcher, items[matcher], prompts, thr, budget, n_warm, keep_matches=keep)
            log(f"  [{k}/{len(settings) + 1}] {matcher:6s} t={thr:.2f} budget {budget:>5.0%} ({run.capacity} entries): "
                f"hit rate {run.hit_rate:6.1%}  ({run.seconds:.1f} s)")
            if budget == 0.1:
                by_thr[(matcher, thr)] = run
            if thr == default_thr:
                by_budget[(matcher, budget)] = run
        nostop = replayer.replay("entity", items_nostop, prompts, default_thr, 0.1, n_warm, keep_matches=True)
        log(f"  [{len(settings) + 1}/{len(settings) + 1}] entity without stop list t={default_thr:.2f} budget 10%: "
            f"hit rate {nostop.hit_rate:.1%}")
    finally:
        os.fsync = real_fsync
        shutil.rmtree(work, ignore_errors=True)

    # ------------------------------------------------------------------------------------------ report
    served = n - n_warm
    mism = sum(r.size_mismatch for r in list(by_thr.values()) + list(by_budget.values()))
    print()
    source = "issue-25 style-set" if args.style_set else "VBench"
    print(f"hit-rate replay: {n} {source} prompts shuffled (seed {args.seed}), {n_warm} warm, {served} served; "
          f"entries padded to {ENTRY_BYTES} B{' (size mismatches: ' + str(mism) + ')' if mism else ''}; "
          f"embedder {embedder.identity}; default threshold {default_thr:.2f}; "
          f"{sum(1 for es in ents_default if not es)} prompts without entities\n")
    print("vs threshold, LRU budget 10% of prompts "
          f"({by_thr[('entity', thresholds[0])].capacity} entries)")
    rows = []
    for t in thresholds:
        e, p = by_thr[("entity", t)], by_thr[("prompt", t)]
        rows.append([f"{t:.2f}" + (" *" if t == default_thr else ""), f"{e.hit_rate:.1%}", f"{e.entity_rate:.1%}",
                     f"{e.donor_entity_rate:.1%}", f"{p.hit_rate:.1%}",
                     f"{e.hit_rate / p.hit_rate:.1f}x" if p.hits else "-"])
    print(table(["threshold", "entity: prompt hits", "entity-level (any)", "entity-level (donor)",
                 "whole-prompt hits", "ratio"], rows))
    print(f"\nvs budget, threshold {default_thr:.2f}")
    rows = []
    for b in budgets:
        e, p = by_budget[("entity", b)], by_budget[("prompt", b)]
        rows.append([f"{b:.0%}", e.capacity, f"{e.hit_rate:.1%}", f"{e.entity_rate:.1%}", f"{p.hit_rate:.1%}",
                     e.evicted, p.evicted])
    print(table(["budget", "entries", "entity: prompt hits", "entity-level (any)", "whole-prompt hits",
                 "evictions (entity)", "evictions (prompt)"], rows))

    e10, p10 = by_thr[("entity", default_thr)], by_thr[("prompt", default_thr)]
    print("\nbeside the paper (10% budget; the paper's VidProM numbers cannot be reproduced here: no VidProM "
          "prompts, CLIP-family encoder)")
    print(table(["", "entity matching", "whole-prompt matching", "setting"], [
        ["CHAI paper, VidProM", f"{PAPER['entity']:.1%}", f"{PAPER['prompt']:.1%}",
         "100 warm, 1,000 served, LongCLIP, threshold not stated"],
        ["this pack, VBench", f"{e10.hit_rate:.1%}", f"{p10.hit_rate:.1%}",
         f"{n_warm} warm, {served} served, MiniLM, threshold {default_thr:.2f}"],
    ], "llll"))

    # stop list: share of donor matches that involve a phrase the default list removes
    default_texts = [{e.text for e in es} for es in ents_default]
    stopped = stop_checker(default_texts, prompts)
    n_match = len(nostop.matches)
    stop_matches = [m for m in nostop.matches if stopped(m[1], m[0]) or stopped(m[2], m[4])]
    hit_prompts: dict[str, list] = {}
    for m in nostop.matches:
        hit_prompts.setdefault(m[0], []).append(stopped(m[1], m[0]) or stopped(m[2], m[4]))
    stop_only = sum(1 for flags in hit_prompts.values() if all(flags))
    print(f"\nstop list (threshold {default_thr:.2f}, budget 10%), replay with an empty StopEntities:")
    print(f"  prompt hit rate {nostop.hit_rate:.1%} without the list vs {e10.hit_rate:.1%} with it")
    print(f"  {len(stop_matches)} of {n_match} donor entity matches ({len(stop_matches) / max(n_match, 1):.1%}) "
          f"involve a stop-listed phrase; {stop_only} of {nostop.hits} hits ({stop_only / max(nostop.hits, 1):.1%}) "
          f"rest on stop-listed phrases only")
    from collections import Counter

    common = Counter((m[1], m[2]) for m in stop_matches).most_common(8)
    if common:
        print("  most frequent: " + "; ".join(f"{q}~{s} x{c}" for (q, s), c in common))

    # sample hits at the default setting
    matches = e10.matches
    exact = sum(1 for m in matches if m[1] == m[2])
    print(f"\n{args.samples} sample entity matches at threshold {default_thr:.2f} (budget 10%): {len(matches)} donor "
          f"matches in {e10.hits} hits, {exact} ({exact / max(len(matches), 1):.0%}) with identical text; the sample "
          f"shows non-identical pairs first")
    rng = random.Random(args.seed)
    inexact = [m for m in matches if m[1] != m[2]]
    same = [m for m in matches if m[1] == m[2]]
    rng.shuffle(inexact)
    rng.shuffle(same)
    take = inexact[: max(args.samples * 2 // 3, args.samples - len(same))]
    take += same[: args.samples - len(take)]
    rows = [[m[1], m[2], f"{m[3]:.3f}", shorten(m[0], 48), shorten(m[4], 48)] for m in take]
    print(table(["query entity", "matched entity", "sim", "query prompt", "donor prompt"], rows, "llrll"))

    print_usefulness(e10, p10, default_thr, args.export_unlabelled, label_sets=not args.style_set)
    print_stream_speedup(e10)
    print_stored_vectors(e10)

    if not args.no_plot:
        plot(args.out, by_thr, by_budget, thresholds, budgets, default_thr, n)
        print(f"\nplot written to {args.out}")
    print(f"total {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
