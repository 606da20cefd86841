"""Store at scale (issue benchmark 1): 100,000 entries with real MiniLM entity vectors, latency of every stage.

Entities come from the VBench prompt list: the extractor's entities of all prompts, plus new phrases made by
putting the modifiers seen in VBench entities in front of the head nouns seen there ("wooden" + "umbrella"), so
the vectors have the clustered structure of real entity embeddings. As in the product, a vector is made of what
each thing is (`Entity.identity`: "umbrella" for "wooden umbrella"), so the many texts of one identity share it;
each identity is embedded once, in batches, and the vectors are reused (and cached in the system temp folder,
keyed by the phrases and the embedder). Each
entry holds 1-6 entities (VBench's distribution): a share drawn from the VBench entities by their frequency, the
rest uniformly from the generated phrases. Latents are three small dummy tensors of shape [1, 4, 2, 4, 4].

Measured: insert latency (with and without fsync, at the start and at full size), per-stage lookup latency for
real VBench prompts, or `--query-prompts` files (extraction, embedding cold, cached and as the product does it
with the vectors the cache holds, the store's index / selection / latent-load stages, the store's own index query
(one point per identity) and its recall against exact search over every stored text), whether read-back vectors
give the same answers as fresh ones, `store.lookup` with its ranking in SQL against held postings (just
dropped, right after an insert, and warm), the layout before identity points (one point per text) as exact numpy search
and as hnswlib, with recall counted by similarity (tied labels are arbitrary), reopen time, file sizes and peak
memory. Prints tables with the targets beside the figures; asserts nothing.

    python -m bench.bench_store_scale --quick      # 5,000 entries, under a minute
    python -m bench.bench_store_scale              # 100,000 entries, takes a while on 2 cores
    python -m bench.bench_store_scale --entries 20000 --phrases 20000 --dir /some/folder --keep-dir
    python -m bench.bench_store_scale --reuse /some/folder/chai-scale-xxxx   # lookups only, on a kept store
    python -m bench.bench_store_scale --reuse FOLDER --query-prompts bench/data/style_pairs/prompts_tags.txt ...

"Whole lookup" is the sum of the stages measured for the same request (extraction, embedding, store.lookup).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from bench._common import DEFAULT_PROMPTS, REPO, load_prompts, ms_mean, ms_pct, table

SHAPE = (1, 4, 2, 4, 4)
FINGERPRINT = "bench:dummy-model"
LATENT_NAMES = ("x_t_0", "x_t_1", "x_t_2")
SIGMAS = (0.9, 0.7, 0.5)
TARGETS = {"index_p99_ms": 1.0, "recall": 0.99, "whole_p50_ms": 15.0, "whole_p99_ms": 100.0,
           "noextract_p50_ms": 5.0, "reopen_s": 5.0, "rss_gb": 1.5}


def log(msg: str) -> None:
    """Progress line with a timestamp."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------ data
def phrase_pool(extracted: list[list], n_generated: int, seed: int) -> tuple[list, list[float], list]:
    """VBench entities (with their frequencies) and `n_generated` new modifier + head phrases."""
    from comfyui_chai.cache_store.entities.extract import Entity

    counts: Counter = Counter()
    first: dict[str, Entity] = {}
    head_kind: dict[str, Counter] = {}
    modifiers: set[str] = set()
    for ents in extracted:
        for e in ents:
            counts[e.text] += 1
            first.setdefault(e.text, e)
            head_kind.setdefault(e.head, Counter())[e.kind] += 1
            if " " in e.text and "-" not in e.head:
                modifiers.update(w for w in e.text.split()[:-1] if w.isalpha())
    originals = sorted(first.values(), key=lambda e: -counts[e.text])
    weights = [float(counts[e.text]) for e in originals]
    heads = sorted(h for h in head_kind if h.isalpha())
    mods = sorted(modifiers)
    rng = random.Random(seed)
    seen = set(first)
    generated: list[Entity] = []
    combos = [(m, h) for m in mods for h in heads if m != h]
    rng.shuffle(combos)
    extra = 0
    while len(generated) < n_generated:
        if combos:
            m, h = combos.pop()
            text = f"{m} {h}"
        else:  # two modifiers once the single-modifier combinations run out
            m1, m2, h = rng.choice(mods), rng.choice(mods), rng.choice(heads)
            text = f"{m1} {m2} {h}"
            extra += 1
            if extra > 20 * n_generated:
                break
        if text in seen:
            continue
        seen.add(text)
        generated.append(Entity(text=text, kind=head_kind[h].most_common(1)[0][0], head=h))
    return originals, weights, generated


def embed_cached(embedder, phrases: list[str], cache_dir: Path) -> np.ndarray:
    """Embed phrases in batches, memoised on disk by (embedder identity, phrase list)."""
    key = hashlib.sha256((embedder.identity + "\n" + "\n".join(phrases)).encode()).hexdigest()[:16]
    path = cache_dir / f"chai-bench-vectors-{key}.npy"
    if path.is_file():
        vecs = np.load(path)
        if vecs.shape == (len(phrases), embedder.dim):
            log(f"  {len(phrases)} phrase vectors from {path}")
            return vecs
    out = np.empty((len(phrases), embedder.dim), np.float32)
    t0 = time.perf_counter()
    step = 2048
    for start in range(0, len(phrases), step):
        out[start:start + step] = embedder.embed(phrases[start:start + step])
        done = min(start + step, len(phrases))
        rate = done / max(time.perf_counter() - t0, 1e-9)
        log(f"  embedded {done}/{len(phrases)} phrases ({rate:.0f}/s, ~{(len(phrases) - done) / rate:.0f} s left)")
    try:
        np.save(path, out)
    except OSError:
        pass
    return out


def entry_plan(n: int, n_orig: int, weights: list[float], n_gen: int, size_counts: Counter,
               orig_share: float, seed: int) -> list[list[int]]:
    """Entity indices (into originals + generated) of each entry."""
    rng = np.random.default_rng(seed)
    sizes = np.array(sorted(k for k in size_counts if k > 0))
    probs = np.array([size_counts[k] for k in sizes], float)
    ks = rng.choice(sizes, size=n, p=probs / probs.sum())
    w = np.asarray(weights) / np.sum(weights)
    plan = []
    total = int(ks.sum())
    from_orig = rng.random(total) < orig_share
    orig_draw = rng.choice(n_orig, size=total, p=w)
    gen_draw = n_orig + rng.integers(0, max(n_gen, 1), size=total) if n_gen else orig_draw
    picks = np.where(from_orig, orig_draw, gen_draw)
    pos = 0
    for k in ks:
        plan.append(list(dict.fromkeys(picks[pos:pos + k].tolist())))
        pos += k
    return plan


@contextlib.contextmanager
def no_fsync(enabled: bool):
    """Make os.fsync a no-op inside the block (bulk fill only)."""
    if not enabled:
        yield
        return
    real = os.fsync
    os.fsync = lambda fd: None  # type: ignore[assignment]
    try:
        yield
    finally:
        os.fsync = real


class LogCapture(logging.Handler):
    """Collect the store's log messages (to tell an index load from a rebuild)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def dir_bytes(path: Path) -> tuple[int, int]:
    """(total bytes, file count) of the files directly in a folder."""
    total = count = 0
    with os.scandir(path) as it:
        for item in it:
            if item.is_file():
                total += item.stat().st_size
                count += 1
    return total, count


def rss_now() -> int:
    """Resident set size of this process in bytes."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        return 0


def peak_rss() -> int:
    """Peak resident set size of this process in bytes: VmHWM where /proc exists, else ru_maxrss.

    VmHWM belongs to the address space, so a child started with exec begins afresh; ru_maxrss on Linux carries the
    parent's peak over fork + exec and would make a small child look as big as its parent.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak * (1 if sys.platform == "darwin" else 1024))


def chunked_query(index, queries: np.ndarray, k: int, chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """index.query in chunks (an exact query of m vectors materialises an m x n similarity matrix)."""
    parts = [index.query(queries[i:i + chunk], k) for i in range(0, len(queries), chunk)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


SIM_EPS = 1e-5  # float noise between hnswlib's and numpy's inner products


def recall_at(hl: np.ndarray, hs: np.ndarray, el: np.ndarray, es: np.ndarray) -> float:
    """Mean share of the exact top-k that the approximate top-k matched, counted by similarity: a returned entity
    counts when it is as similar as the exact k-th one. (Every text of one identity shares one vector, so at scale
    the exact top-k holds ties, and which of the tied labels either search returns is arbitrary.)"""
    shares = []
    for a, sa, b, sb in zip(hl, hs, el, es):
        valid = sb[b >= 0]
        if len(valid):
            shares.append(min(int(np.sum(sa[a >= 0] >= valid.min() - SIM_EPS)), len(valid)) / len(valid))
    return float(np.mean(shares)) if shares else float("nan")


def recall_above(hl: np.ndarray, hs: np.ndarray, el: np.ndarray, es: np.ndarray, threshold: float) -> tuple[float, int]:
    """Share of the exact top-k entities at or above the threshold that the approximate top-k also has there
    (by count, as above), and how many there are."""
    found = total = 0
    for a, sa, b, sb in zip(hl, hs, el, es):
        n_exact = int(np.sum((b >= 0) & (sb >= threshold)))
        found += min(int(np.sum((a >= 0) & (sa >= threshold - SIM_EPS))), n_exact)
        total += n_exact
    return found / max(total, 1), total


def identity_recall(pl: np.ndarray, ps: np.ndarray, el: np.ndarray, es: np.ndarray) -> float:
    """Mean share of the distinct similarities in the exact per-text top-k (one per identity: its texts share a
    vector) that a search over identity points returned."""
    shares = []
    for a, sa, b, sb in zip(pl, ps, el, es):
        want = {round(float(x), 4) for x in sb[b >= 0]}
        if want:
            got = {round(float(x), 4) for x in sa[a >= 0]}
            shares.append(len(want & got) / len(want))
    return float(np.mean(shares)) if shares else float("nan")


FRESH_PROCESS = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from bench.bench_store_scale import peak_rss
t0 = time.perf_counter()
from comfyui_chai.cache_store.config import StoreConfig
from comfyui_chai.cache_store.folder.store import CacheStore
from comfyui_chai.cache_store.types import EmbeddedEntities
from comfyui_chai.cache_store.entities.extract import Entity
from comfyui_chai.cache_store.lookup.rule import HitRule
t1 = time.perf_counter()
store = CacheStore(sys.argv[2], StoreConfig(budget_bytes=int(sys.argv[3])))
t2 = time.perf_counter()
data = np.load(sys.argv[4])
ident = sys.argv[5]
hits = 0
for row in data[:200]:
    ee = EmbeddedEntities((Entity("q", "object", "q"),), row[None, :], ident)
    hits += store.lookup(ee, sys.argv[6], json.loads(sys.argv[7]), HitRule(0.8), touch=False).hit
store.close()
print(json.dumps({"import_s": t1 - t0, "open_s": t2 - t1, "hits": hits,
                  "peak_rss": peak_rss()}))
"""


# ------------------------------------------------------------------------------------------------ main
def ranking_paths(store, requests: list, threshold: float) -> list[list[str]]:
    """`store.lookup` (no latent load, no recency update) five ways per request, in a shuffled order: the ranking in
    SQL; from held postings just dropped (another index epoch); from held postings right after an insert (its
    postings added to them); right after an insert that evicted an entry, as in a full cache (the held postings
    kept, the ranked candidates checked against `entries`); and from held postings kept warm. The inserts are
    fillers that match nothing; the evicted entry is the previous such filler."""
    if not requests:
        return []
    import torch

    from comfyui_chai.cache_store.entities.extract import Entity
    from comfyui_chai.cache_store.folder.rows import delete_entries
    from comfyui_chai.cache_store.latents import remove_files
    from comfyui_chai.cache_store.lookup.posting_cache import PostingCache
    from comfyui_chai.cache_store.lookup.rule import HitRule
    from comfyui_chai.cache_store.types import EmbeddedEntities

    warm, full = store.postings, PostingCache(prime=False)
    ways = {"SQL ranking (no held postings)": None, "held postings, just dropped (another index epoch)": "cold",
            "held postings, right after an insert": "insert",
            "held postings, right after an insert that evicted (full cache)": "evict",
            "held postings, warm": warm}
    total: dict[str, list[float]] = {w: [] for w in ways}
    select: dict[str, list[float]] = {w: [] for w in ways}
    same = 0
    filler = np.random.default_rng(0).standard_normal((1, requests[0].vectors.shape[1])).astype(np.float32)
    filler /= np.linalg.norm(filler)  # random in 384 dimensions: near nothing a prompt names
    latents = {name: torch.zeros(SHAPE) for name in LATENT_NAMES}

    def insert_filler(name: str) -> int:
        # one stored text for every filler: the index gains one point in all
        return store.insert(name, EmbeddedEntities((Entity("chai bench filler", "object", "filler"),), filler,
                                                   requests[0].embedder), FINGERPRINT, latents, SIGMAS).entry_id

    def evict(entry_id: int) -> None:
        with store.manifest.write() as cur:
            files = delete_entries(cur, [entry_id])
        remove_files(store.latent_dir, files)
        store.keeper.sync()

    store.postings = full  # the full cache's postings, fetched once and then following an eviction
    previous = insert_filler("bench filler evicted first")
    for ee in requests:
        store.lookup(ee, FINGERPRINT, SHAPE, HitRule(threshold), touch=False, load=False)
    for i, ee in enumerate(requests):
        answers = {}
        names = list(ways)
        random.Random(i).shuffle(names)
        for name in names:
            way = ways[name]
            store.postings = (PostingCache(prime=False) if way == "cold" else warm if way == "insert"
                              else full if way == "evict" else way)
            if way == "insert":
                insert_filler(f"bench filler {i}")
            elif way == "evict":
                newest = insert_filler(f"bench filler evicting {i}")
                evict(previous)
                previous = newest
            t = time.perf_counter()
            res = store.lookup(ee, FINGERPRINT, SHAPE, HitRule(threshold), touch=False, load=False)
            total[name].append(time.perf_counter() - t)
            select[name].append(res.timings.get("select", 0.0))
            answers[name] = (res.hit, res.entry.id if res.entry else None, res.reason)
        same += len(set(answers.values())) == 1
    evict(previous)
    store.postings = warm
    return [[name, f"{ms_pct(total[name], 50):.2f} / {ms_pct(total[name], 99):.2f}",
             f"{ms_pct(select[name], 50):.2f}", f"{same} of {len(requests)}"] for name in ways]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=None, help="entries to store (default 100000; quick 5000)")
    ap.add_argument("--phrases", type=int, default=None,
                    help="generated entity phrases besides the VBench ones (default 60000; quick 2000)")
    ap.add_argument("--orig-share", type=float, default=0.4,
                    help="share of entity slots drawn from VBench entities (by frequency); the rest generated")
    ap.add_argument("--queries", type=int, default=None, help="VBench prompts looked up (default 500; quick 100)")
    ap.add_argument("--probe", type=int, default=None,
                    help="inserts timed with and without fsync before the bulk fill (default 2000; quick 150)")
    ap.add_argument("--sample", type=int, default=None,
                    help="inserts with real fsync timed at full size (default 300; quick 50)")
    ap.add_argument("--fsync-fill", action="store_true", help="keep real fsync during the bulk fill")
    ap.add_argument("--efs", type=lambda s: [int(x) for x in s.split(",")], default=[64, 128, 256, 512],
                    help="hnsw search widths for the recall / latency sweep")
    ap.add_argument("--quick", action="store_true", help="5,000 entries, under a minute")
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="VBench all_dimension.txt")
    ap.add_argument("--query-prompts", type=Path, action="append", default=None,
                    help="prompt files looked up instead of --prompts (repeatable): prompts the store was not built "
                         "from, e.g. bench/data/style_pairs/prompts_*.txt")
    ap.add_argument("--dir", type=Path, default=None, help="parent folder for the cache (default: system temp)")
    ap.add_argument("--keep-dir", action="store_true", help="do not delete the cache folder at the end")
    ap.add_argument("--reuse", type=Path, default=None,
                    help="measure an existing cache folder kept by --keep-dir (skips the fill; adds --sample entries)")
    ap.add_argument("--threshold", type=float, default=None, help="cosine threshold (default: the embedder's)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    n_entries = args.entries or (5_000 if args.quick else 100_000)
    n_phrases = args.phrases if args.phrases is not None else (2_000 if args.quick else 60_000)
    n_queries = args.queries or (100 if args.quick else 500)
    probe = args.probe if args.probe is not None else (150 if args.quick else 2_000)
    sample = args.sample if args.sample is not None else (50 if args.quick else 300)
    probe = min(probe, max(n_entries // 4, 1))
    sample = min(sample, max(n_entries // 4, 1))

    import torch

    torch.set_num_threads(max(args.threads, 1))
    from comfyui_chai.cache_store.config import StoreConfig
    from comfyui_chai.cache_store.entities.embedders import get_embedder
    from comfyui_chai.cache_store.entities.extract import EntityExtractor
    from comfyui_chai.cache_store.index.vector_index import VectorIndex
    from comfyui_chai.cache_store.lookup import prompt_vector
    from comfyui_chai.cache_store.lookup.ranking import NEIGHBOURS
    from comfyui_chai.cache_store.folder.store import CacheStore
    from comfyui_chai.cache_store.lookup.rule import HitRule
    from comfyui_chai.cache_store.lookup.stored_vectors import with_stored
    from comfyui_chai.cache_store.types import EmbeddedEntities

    t_start = time.perf_counter()
    peaks: list[tuple[str, int]] = []
    prompts = load_prompts(args.prompts)
    t = time.perf_counter()
    extractor = EntityExtractor()
    t_spacy = time.perf_counter() - t
    t = time.perf_counter()
    embedder = get_embedder("minilm", batch_size=128).load()
    t_minilm = time.perf_counter() - t
    threshold = embedder.default_threshold if args.threshold is None else args.threshold
    log(f"spaCy {extractor.pipeline_name} loaded in {t_spacy:.1f} s, {embedder.identity} in {t_minilm:.1f} s")
    extracted = extractor.extract_many(prompts)
    budget = 10**12  # no eviction: this measures a full store
    latents = {name: torch.zeros(SHAPE) for name in LATENT_NAMES}
    ins_fsync_start: list[float] = []
    ins_nofsync_start: list[float] = []
    ins_bulk: list[float] = []
    t_fill, patch = 0.0, False
    pool_size = 0

    if args.reuse is None:
        originals, weights, generated = phrase_pool(extracted, n_phrases, args.seed)
        pool = originals + generated
        pool_size = len(pool)
        log(f"{len(prompts)} prompts -> {len(originals)} VBench entities + {len(generated)} generated phrases; "
            "embedding")
        # the store's own vectors: what each thing is (ChaiCache.embed_entities), each identity embedded once
        identities = sorted({e.identity for e in pool})
        by_identity = dict(zip(identities, embed_cached(embedder, identities, Path(tempfile.gettempdir()))))
        vectors = np.stack([by_identity[e.identity] for e in pool])
        plan = entry_plan(n_entries, len(originals), weights, len(generated), Counter(map(len, extracted)),
                          args.orig_share, args.seed)
        distinct_planned = len({i for ids in plan for i in ids})
        log(f"plan: {n_entries} entries, {sum(map(len, plan))} entity slots, {distinct_planned} distinct entities")
        parent = args.dir or Path(tempfile.gettempdir())
        parent.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="chai-scale-", dir=parent))
    else:
        root = args.reuse
        if not (root / "manifest.sqlite").is_file():
            raise SystemExit(f"{root} holds no cache manifest")
        plan, pool, vectors = [], [], np.zeros((0, embedder.dim), np.float32)
    peaks.append(("models + phrase vectors", peak_rss()))
    t = time.perf_counter()
    store = CacheStore(root, StoreConfig(budget_bytes=budget))
    t_open_first = time.perf_counter() - t

    def insert_plan(i: int) -> float:
        ids = plan[i]
        ents = tuple(pool[j] for j in ids)
        ee = EmbeddedEntities(ents, vectors[ids], embedder.identity)
        prompt = "a " + " with a ".join(e.text for e in ents)
        # ChaiCache.write stores each entry's prompt vector; the made-up prompts take their entities' mean vector
        # (the decision reads it like any other; embedding 100k made-up prompts would only cost the fill time)
        meta = prompt_vector.with_prompt_vector(None, vectors[ids].mean(axis=0), embedder.identity)
        t0 = time.perf_counter()
        store.insert(prompt, ee, FINGERPRINT, latents, SIGMAS, meta=meta)
        return time.perf_counter() - t0

    def insert_prompt(i: int) -> float:
        ents = extracted[i % len(extracted)]
        if not ents:
            return float("nan")
        ee = EmbeddedEntities(tuple(ents), embedder.embed([e.identity for e in ents]), embedder.identity)
        prompt = prompts[i % len(prompts)]
        meta = prompt_vector.with_prompt_vector(None, embedder.embed([prompt])[0], embedder.identity)
        t0 = time.perf_counter()
        store.insert(prompt, ee, FINGERPRINT, latents, SIGMAS, meta=meta)
        return time.perf_counter() - t0

    # --- inserts: probe with and without fsync, bulk fill, sample at full size
    log(f"cache folder {root}" + (f" (reused, opened in {t_open_first:.2f} s)" if args.reuse else ""))
    if args.reuse is None:
        ins_fsync_start = [insert_plan(i) for i in range(probe)]
        with no_fsync(True):
            ins_nofsync_start = [insert_plan(i) for i in range(probe, 2 * probe)]
        fsync_share = 1 - ms_mean(ins_nofsync_start) / ms_mean(ins_fsync_start)
        patch = not args.fsync_fill and fsync_share > 0.3
        log(f"probe: {probe} inserts with fsync mean {ms_mean(ins_fsync_start):.2f} ms, without "
            f"{ms_mean(ins_nofsync_start):.2f} ms (fsync {fsync_share:.0%} of an insert) -> bulk fill "
            f"{'without' if patch else 'with'} fsync")
        bulk_end = n_entries - sample
        t_fill = time.perf_counter()
        step = max((bulk_end - 2 * probe) // 20, 1)
        with no_fsync(patch):
            for i in range(2 * probe, bulk_end):
                ins_bulk.append(insert_plan(i))
                if (i - 2 * probe + 1) % step == 0:
                    recent = ins_bulk[-step:]
                    done = i + 1
                    rate = len(ins_bulk) / (time.perf_counter() - t_fill)
                    log(f"  {done}/{n_entries} entries, last {step}: p50 {ms_pct(recent, 50):.2f} ms p99 "
                        f"{ms_pct(recent, 99):.2f} ms, {rate:.0f}/s, ~{(bulk_end - done) / rate:.0f} s left")
        t_fill = time.perf_counter() - t_fill
        ins_fsync_end = [insert_plan(i) for i in range(bulk_end, n_entries)]
    else:
        ins_fsync_end = [x for x in (insert_prompt(i) for i in range(sample)) if x == x]
    sums = []
    for _ in range(5):
        t = time.perf_counter()
        store.manifest.query("SELECT COALESCE(SUM(nbytes), 0) FROM entries")
        sums.append(time.perf_counter() - t)
    t_budget_check = min(sums)
    stats = store.stats()
    peaks.append(("after the fill", peak_rss()))
    log(f"filled: {stats.entries} entries, {stats.entities} distinct entities, index {stats.index_backend}")

    # --- close (persists the index), sizes, reopen
    t = time.perf_counter()
    store.close()
    t_close = time.perf_counter() - t
    idx_bytes = sum(p.stat().st_size for p in (root / "index").glob("entities-*"))
    man_bytes = sum(p.stat().st_size for p in root.glob("manifest.sqlite*"))
    lat_bytes, lat_files = dir_bytes(root / "latents")
    capture = LogCapture()
    store_log = logging.getLogger("cache_store.folder.store")
    store_log.addHandler(capture)
    old_level = store_log.level
    store_log.setLevel(logging.DEBUG)
    t = time.perf_counter()
    store = CacheStore(root, StoreConfig(budget_bytes=budget))
    t_reopen = time.perf_counter() - t
    store_log.removeHandler(capture)
    store_log.setLevel(old_level)
    rebuilt = any("rebuilding" in m for m in capture.messages)
    peaks.append(("after close + reopen", peak_rss()))
    log(f"reopened in {t_reopen:.2f} s ({'index REBUILT: ' + capture.messages[-1] if rebuilt else 'index loaded'})")

    # --- exact index over the same vectors
    labels, stored_vecs = store.manifest.entity_vectors()
    t = time.perf_counter()
    exact = VectorIndex(stored_vecs.shape[1], backend="exact")
    exact.add(labels, stored_vecs)
    t_exact_build = time.perf_counter() - t
    # The store's index holds one point per identity (index/points.py); the layout before it, one point per stored
    # text, is built here over the same vectors for comparison, as hnswlib and as exact search.
    points, points_backend = len(store.keeper.points), store._index.backend
    hnsw = VectorIndex(stored_vecs.shape[1], backend="hnsw")
    hnsw.add(labels, stored_vecs)
    hnsw_note = f"one point per text ({len(labels)}), the layout before identity points"
    k = min(NEIGHBOURS, len(hnsw))
    posting_counts = dict(store.manifest.query("SELECT entity_id, COUNT(*) FROM postings GROUP BY entity_id"))

    # --- lookups of real VBench prompts
    qfiles = args.query_prompts or [args.prompts]
    qprompts = [q for path in qfiles for q in load_prompts(path)]
    random.Random(args.seed + 1).shuffle(qprompts)
    qprompts = qprompts[:n_queries]
    st: dict[str, list[float]] = {s: [] for s in (
        "extract", "embed_cold", "embed_cached", "s_index", "s_select", "s_load", "store_lookup",
        "load_latents", "q_hnsw", "q_exact", "q_store", "whole_cold", "whole_cached", "noext_cold", "noext_cached",
        "lookup_miss", "embed_stored", "whole_stored")}
    cpu: dict[str, list[float]] = {s: [] for s in ("extract", "embed_cold", "store_lookup", "whole_cold",
                                                     "embed_stored", "whole_stored")}
    stored_found = stored_all = stored_none = same_answer = answer_flips = donor_changes = 0
    q_rows: list[np.ndarray] = []
    q_requests: list = []
    select_by_postings: list[tuple[int, float]] = []
    hits = empty = 0
    log(f"looking up {len(qprompts)} VBench prompts (threshold {threshold:.2f}, k={k})")
    for warm in qprompts[:5]:  # warm-up, not counted
        ents = extractor.extract(warm)
        if ents:
            ee = EmbeddedEntities(tuple(ents), embedder.embed([e.identity for e in ents]), embedder.identity)
            store.lookup(ee, FINGERPRINT, SHAPE, HitRule(threshold), touch=False)
    held = store.postings
    primed_s, primed_ids, primed_n = held.prime_seconds, held.primed, held.primed_postings
    for qi, prompt in enumerate(qprompts):
        t, c = time.perf_counter(), time.process_time()
        ents = extractor.extract(prompt)
        t_ext, c_ext = time.perf_counter() - t, time.process_time() - c
        if not ents:
            empty += 1
            continue
        texts = [e.identity for e in ents]
        embedder.clear_cache()
        t, c = time.perf_counter(), time.process_time()
        vecs = embedder.embed(texts)
        t_cold, c_cold = time.perf_counter() - t, time.process_time() - c
        t = time.perf_counter()
        vecs = embedder.embed(texts)
        t_cached = time.perf_counter() - t
        embedder.clear_cache()  # what ChaiCache.embed_entities does: the stored vectors, the encoder for the rest
        t, c = time.perf_counter(), time.process_time()
        known = store.stored_vectors(texts, embedder.identity, embedder.dim)
        stored_vecs_q = with_stored(texts, known, embedder.embed)
        t_stored, c_stored = time.perf_counter() - t, time.process_time() - c
        stored_found += sum(p in known for p in texts)
        stored_all += len(texts)
        stored_none += len(set(texts) - set(known)) == 0
        ee = EmbeddedEntities(tuple(ents), vecs, embedder.identity)
        t, c = time.perf_counter(), time.process_time()
        res = store.lookup(ee, FINGERPRINT, SHAPE, HitRule(threshold))
        t_look, c_look = time.perf_counter() - t, time.process_time() - c
        # the same request with fresh and with read-back vectors, both after the timed lookup and untouched
        pair = [store.lookup(EmbeddedEntities(tuple(ents), v, embedder.identity), FINGERPRINT, SHAPE,
                             HitRule(threshold), touch=False, load=False) for v in (vecs, stored_vecs_q)]
        fresh_answer, stored_answer = ((r.hit, r.entry.id if r.entry else None, r.reason) for r in pair)
        same_answer += fresh_answer == stored_answer
        answer_flips += fresh_answer[0] != stored_answer[0]
        donor_changes += fresh_answer[0] and stored_answer[0] and fresh_answer[1] != stored_answer[1]
        for key, value in (("extract", c_ext), ("embed_cold", c_cold), ("store_lookup", c_look),
                           ("whole_cold", c_ext + c_cold + c_look)):
            cpu[key].append(value)
        st["extract"].append(t_ext)
        st["embed_cold"].append(t_cold)
        st["embed_cached"].append(t_cached)
        st["store_lookup"].append(t_look)
        st["s_index"].append(res.timings.get("index", 0.0))
        st["s_select"].append(res.timings.get("select", 0.0))
        if "load" in res.timings:
            st["s_load"].append(res.timings["load"])
        st["whole_cold"].append(t_ext + t_cold + t_look)
        st["embed_stored"].append(t_stored)
        st["whole_stored"].append(t_ext + t_stored + t_look)
        cpu["embed_stored"].append(c_stored)
        cpu["whole_stored"].append(c_ext + c_stored + c_look)
        st["whole_cached"].append(t_ext + t_cached + t_look)
        st["noext_cold"].append(t_cold + t_look)
        st["noext_cached"].append(t_cached + t_look)
        if res.hit:
            hits += 1
            t = time.perf_counter()
            store.load_latents(res.entry.id)
            st["load_latents"].append(time.perf_counter() - t)
        else:
            st["lookup_miss"].append(t_look)
        t = time.perf_counter()
        store.keeper.query(vecs, k)
        st["q_store"].append(time.perf_counter() - t)
        order = (hnsw, exact) if qi % 2 else (exact, hnsw)
        for ix in order:
            t = time.perf_counter()
            labs, sims = ix.query(vecs, k)
            (st["q_hnsw"] if ix is hnsw else st["q_exact"]).append(time.perf_counter() - t)
        matched = {int(lab) for lab, sim in zip(labs.ravel(), sims.ravel()) if lab >= 0 and sim >= threshold}
        select_by_postings.append((sum(posting_counts.get(m, 0) for m in matched), st["s_select"][-1]))
        q_rows.append(vecs)
        q_requests.append(ee)
        if (qi + 1) % max(len(qprompts) // 5, 1) == 0:
            log(f"  {qi + 1}/{len(qprompts)} lookups")
    peaks.append(("after the lookups", peak_rss()))
    paths = ranking_paths(store, q_requests, threshold)

    # --- recall of hnsw against exact, per search width: query entity vectors of the prompts + stored vectors
    rng = np.random.default_rng(args.seed)
    extra_q = stored_vecs[rng.choice(len(stored_vecs), size=min(1000, len(stored_vecs)), replace=False)]
    allq = np.concatenate(q_rows + [extra_q]) if q_rows else extra_q
    el, es = chunked_query(exact, allq, k)
    sl, ss = store.keeper.query(allq, k)
    store_recall = identity_recall(sl, ss, el, es)
    base_ef = hnsw.ef
    sweep = []
    log(f"hnsw sweep over ef {args.efs} ({len(allq)} query vectors)")
    for ef in sorted(set(args.efs) | {base_ef}):
        hnsw.ef = ef
        times = []
        for vecs in q_rows:
            t = time.perf_counter()
            hnsw.query(vecs, k)
            times.append(time.perf_counter() - t)
        hl, hs = chunked_query(hnsw, allq, k)
        recall_thr, n_above = recall_above(hl, hs, el, es, threshold)
        sweep.append({"ef": ef, "recall_k": recall_at(hl, hs, el, es),
                      "recall_1": float(np.mean(hs[:, 0] >= es[:, 0] - SIM_EPS)),
                      "recall_thr": recall_thr, "n_above": n_above, "p50": ms_pct(times, 50), "p99": ms_pct(times, 99)})
    hnsw.ef = base_ef
    base = next(r for r in sweep if r["ef"] == base_ef)
    recall_k = base["recall_k"]
    peaks.append(("after the recall sweep", peak_rss()))

    # --- memory: this process, and a fresh process that only opens the store and looks up
    rss_here, peak_here = rss_now(), peak_rss()
    store.close()
    qfile = root.parent / (root.name + "-q.npy")
    np.save(qfile, allq[:200])
    fresh: dict = {}
    try:
        out = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(REPO), str(root), str(budget), str(qfile),
                              embedder.identity, FINGERPRINT, json.dumps(list(SHAPE))],
                             capture_output=True, text=True, timeout=600, check=True)
        fresh = json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as exc:
        log(f"fresh-process measurement failed: {exc}")
    finally:
        qfile.unlink(missing_ok=True)
    if not args.keep_dir and args.reuse is None:
        shutil.rmtree(root, ignore_errors=True)
    total_wall = time.perf_counter() - t_start

    # ------------------------------------------------------------------------------------------ report
    def row(name: str, key: str, note: str = "") -> list:
        ts = st[key]
        return [name, len(ts), f"{ms_pct(ts, 50):.3f}", f"{ms_pct(ts, 99):.3f}", f"{ms_mean(ts):.3f}",
                f"{max(ts) * 1e3:.2f}" if len(ts) else "nan", note]

    def irow(name: str, ts: list[float], note: str = "") -> list:
        return [name, len(ts), f"{ms_pct(ts, 50):.2f}", f"{ms_pct(ts, 99):.2f}", f"{ms_mean(ts):.2f}",
                f"{max(ts) * 1e3:.1f}" if ts else "nan", note]

    print()
    print(f"store scale benchmark: {stats.entries} entries, {stats.entities} distinct entities "
          f"(index {stats.index_backend}, dim {embedder.dim}), latents {SHAPE} x{len(LATENT_NAMES)}, "
          f"torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs, load avg "
          f"{os.getloadavg()[0]:.1f}" + (f", reused folder {root}" if args.reuse else ""))
    print(f"queries: {len(qprompts)} shuffled prompts of {', '.join(p.name for p in qfiles)} ({empty} without entities skipped), "
          f"{hits} hits at threshold {threshold:.2f}; total wall time {total_wall / 60:.1f} min\n")
    print("insert latency (ms)")
    ins_rows = []
    if args.reuse is None:
        ins_rows += [
            irow("first inserts, fsync", ins_fsync_start, f"store 0..{probe}"),
            irow("first inserts, no fsync", ins_nofsync_start, f"store {probe}..{2 * probe}"),
            irow("bulk fill", ins_bulk, f"{'no fsync' if patch else 'fsync'}, "
                 f"{len(ins_bulk) / max(t_fill, 1e-9):.0f}/s, {t_fill / 60:.1f} min"),
        ]
    ins_rows.append(irow("at full size, fsync", ins_fsync_end, f"last {len(ins_fsync_end)} inserts"))
    print(table(["phase", "n", "p50", "p99", "mean", "max", "note"], ins_rows, "lrrrrrl"))
    print(f"for scale: a full SUM(nbytes) scan at {stats.entries} entries takes {t_budget_check * 1e3:.2f} ms; "
          "inserts read the byte counter kept in the manifest's meta table instead")
    print("\nlookup latency per stage (ms), per prompt")
    print(table(["stage", "n", "p50", "p99", "mean", "max", "note"], [
        row("extraction (spaCy)", "extract", "pipeline loaded"),
        row("embedding, cold", "embed_cold", "MiniLM, phrase cache cleared"),
        row("embedding, cached", "embed_cached", "MiniLM phrase cache"),
        row("embedding, stored vectors", "embed_stored", "the product's: vectors the cache holds, MiniLM for the rest"),
        row("store: index stage", "s_index", "meta + index sync + query"),
        row("store: selection", "s_select", "ranking over postings (held between lookups), scene clause, decision"),
        row("store: latent load", "s_load", "read + checksum + touch (hits)"),
        row("store.lookup total", "store_lookup", "vectors given"),
        row("  of which misses", "lookup_miss", ""),
        row("load_latents()", "load_latents", "separate call, hits"),
        row("index query, the store's", "q_store", f"IndexKeeper.query, k={k} texts, {points} identity points "
            f"({points_backend})"),
        row("index query, hnsw per text", "q_hnsw", f"VectorIndex.query, k={k}, ef={base_ef}, {hnsw_note}"),
        row("index query, exact per text", "q_exact", "numpy over the same vectors"),
        row("whole lookup, cold embed", "whole_cold", "extract + embed + store.lookup"),
        row("whole lookup, cached embed", "whole_cached", ""),
        row("whole lookup, stored vectors", "whole_stored", "extract + the product's embedding + store.lookup"),
        row("no extraction, cold embed", "noext_cold", "embed + store.lookup"),
        row("no extraction, cached embed", "noext_cached", ""),
    ], "lrrrrrl"))
    print(f"stored vectors: {stored_found} of {stored_all} query identities "
          f"({stored_found / max(stored_all, 1):.1%}) were held by the cache; {stored_none} of {len(st['embed_stored'])} "
          f"prompts needed no encoder forward; {same_answer} of {len(st['embed_stored'])} lookups gave the same answer "
          f"(hit, entry, reason) with those vectors as with fresh ones ({answer_flips} hit/miss flips, "
          f"{donor_changes} other donors, the rest a reason's digits)")
    print("\nCPU time of the same stages (time.process_time, this process; less sensitive to other jobs), ms")
    print(table(["stage", "n", "p50", "p99", "mean"],
                [[name, len(cpu[key]), f"{ms_pct(cpu[key], 50):.3f}", f"{ms_pct(cpu[key], 99):.3f}",
                  f"{ms_mean(cpu[key]):.3f}"]
                 for name, key in (("extraction (spaCy)", "extract"), ("embedding, cold", "embed_cold"),
                                   ("embedding, stored vectors", "embed_stored"),
                                   ("store.lookup total", "store_lookup"), ("whole lookup, cold embed", "whole_cold"),
                                   ("whole lookup, stored vectors", "whole_stored"))],
                "lrrrr"))
    buckets = [(0, 100), (100, 1_000), (1_000, 10_000), (10_000, 10**12)]
    brows = []
    for lo, hi in buckets:
        ts = [sel for n_post, sel in select_by_postings if lo <= n_post < hi]
        if ts:
            brows.append([f"{lo}..{hi if hi < 10**12 else ''}", len(ts), f"{ms_pct(ts, 50):.2f}",
                          f"{ms_pct(ts, 99):.2f}"])
    print("\nranking paths: store.lookup without latent load or recency update, interleaved per request, ms")
    print(table(["ranking", "p50 / p99", "selection p50", "same answer every way"], paths))
    print("\nselection time by postings behind the matched entities (k nearest at >= threshold)")
    print(table(["postings", "lookups", "p50 ms", "p99 ms"], brows))
    h50, h99, e50, e99 = (ms_pct(st["q_hnsw"], 50), ms_pct(st["q_hnsw"], 99),
                          ms_pct(st["q_exact"], 50), ms_pct(st["q_exact"], 99))
    i50, i99 = ms_pct(st["q_store"], 50), ms_pct(st["q_store"], 99)
    print(f"\nexact / hnsw query time: p50 {e50 / h50:.1f}x, p99 {e99 / h99:.1f}x (exact index built in "
          f"{t_exact_build:.2f} s); hnsw M={hnsw.M}")
    print(f"hnsw against exact over {len(allq)} query vectors (the prompts' entity vectors + 1000 stored ones), "
          f"counted by similarity (texts of one identity share a vector, so labels tie); latency over the "
          f"{len(q_rows)} per-prompt queries")
    print(table(["ef", f"recall@{k}", "recall@1", f"recall (cos >= {threshold:.2f})", "p50 ms", "p99 ms"],
                [[f"{r['ef']}{' *' if r['ef'] == base_ef else ''}", f"{r['recall_k']:.4f}", f"{r['recall_1']:.4f}",
                  f"{r['recall_thr']:.4f} of {r['n_above']}", f"{r['p50']:.3f}", f"{r['p99']:.3f}"]
                 for r in sweep]))
    print("\nsizes and memory")
    print(table(["item", "value"], [
        ["index file", f"{idx_bytes / 1e6:.1f} MB"],
        ["manifest (sqlite + wal)", f"{man_bytes / 1e6:.1f} MB"],
        ["latent files", f"{lat_files} files, {lat_bytes / 1e6:.1f} MB"],
        ["close (index save)", f"{t_close:.2f} s"],
        ["reopen", f"{t_reopen:.2f} s ({'index rebuilt' if rebuilt else 'index loaded from disk'})"],
        ["postings read at the first lookup", f"{primed_s:.2f} s ({primed_ids} identities, {primed_n} postings; "
                                              "in the warm-up, not in the lookup figures)"],
        ["RSS now / peak, this process", f"{rss_here / 1e9:.2f} / {peak_here / 1e9:.2f} GB (spaCy, MiniLM, "
                                         f"{pool_size} phrase vectors, an exact copy of the index)"],
    ] + [[f"  peak {name}", f"{value / 1e9:.2f} GB"] for name, value in peaks] + [
        ["fresh process: import / open", f"{fresh.get('import_s', float('nan')):.2f} s / "
                                          f"{fresh.get('open_s', float('nan')):.2f} s"],
        ["fresh process peak RSS", f"{fresh.get('peak_rss', float('nan')) / 1e9:.2f} GB (store + torch, "
                                   f"{fresh.get('hits', '?')} hits of 200 lookups)"],
    ], "ll"))

    def verdict(ok: bool) -> str:
        return "ok" if ok else "MISSED"

    whole50, whole99 = ms_pct(st["whole_cold"], 50), ms_pct(st["whole_cold"], 99)
    noext50 = ms_pct(st["noext_cached"], 50)
    stored50, look50 = ms_pct(st["whole_stored"], 50), ms_pct(st["store_lookup"], 50)
    noext50_cold = ms_pct(st["noext_cold"], 50)
    rss_gb = max(peak_here, 0) / 1e9
    fresh_gb = fresh.get("peak_rss", float("nan")) / 1e9
    print("\ntargets")
    print(table(["target", "goal", "measured", ""], [
        ["index query p99 (the store's)", f"<= {TARGETS['index_p99_ms']} ms", f"{i99:.3f} ms (p50 {i50:.3f}; "
         f"hnsw per text {h99:.3f})", verdict(i99 <= TARGETS["index_p99_ms"])],
        [f"index recall@{k} (the store's, by identity)", f">= {TARGETS['recall']}",
         f"{store_recall:.4f} (hnsw per text {recall_k:.4f} at ef={base_ef})",
         verdict(store_recall >= TARGETS["recall"])],
        ["whole lookup p50 (the product's: stored vectors)", f"<= {TARGETS['whole_p50_ms']} ms",
         f"{stored50:.2f} ms", verdict(stored50 <= TARGETS["whole_p50_ms"])],
        ["whole lookup p50 (cold embed)", f"<= {TARGETS['whole_p50_ms']} ms", f"{whole50:.2f} ms",
         verdict(whole50 <= TARGETS["whole_p50_ms"])],
        ["whole lookup p99 (cold embed)", f"<= {TARGETS['whole_p99_ms']} ms", f"{whole99:.2f} ms",
         verdict(whole99 <= TARGETS["whole_p99_ms"])],
        ["lookup p50 without extraction", f"<= {TARGETS['noextract_p50_ms']} ms",
         f"{noext50:.2f} ms cached / {noext50_cold:.2f} ms cold embed",
         verdict(noext50 <= TARGETS["noextract_p50_ms"])],
        ["store.lookup p50 (vectors given)", f"<= {TARGETS['noextract_p50_ms']} ms", f"{look50:.2f} ms",
         verdict(look50 <= TARGETS["noextract_p50_ms"])],
        ["reopen", f"<= {TARGETS['reopen_s']} s", f"{t_reopen:.2f} s", verdict(t_reopen <= TARGETS["reopen_s"])],
        ["peak RSS, store process", f"<= {TARGETS['rss_gb']} GB", f"{fresh_gb:.2f} GB (this bench {rss_gb:.2f})",
         verdict(fresh_gb <= TARGETS["rss_gb"])],
    ], "llll"))


if __name__ == "__main__":
    main()
