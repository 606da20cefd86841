"""Benchmark VectorIndex: exact numpy vs hnswlib latency, hnsw recall per ef, build and save/load cost.

Prints tables only (no assertions on time). Data is embedding-like: unit vectors scattered around a fixed set of
cluster centres, which is how entity embeddings behave; i.i.d. Gaussian vectors are a pathological case for HNSW
and are not representative.

    python bench/bench_index.py --quick            # about half a minute
    python bench/bench_index.py                    # sizes 100 .. 100k, several minutes (100k hnsw build dominates)
    python bench/bench_index.py --sizes 3000,5000,10000 --queries 1000
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from comfyui_chai.cache_store.index.vector_index import DEFAULT_EF, DEFAULT_EF_CONSTRUCTION, DEFAULT_M, VectorIndex  # noqa: E402

FULL_SIZES = (100, 1_000, 3_000, 10_000, 30_000, 100_000)
QUICK_SIZES = (100, 1_000, 3_000, 10_000)


class Clustered:
    """Embedding-like unit vectors: a shared direction, 2000 cluster centres grouped under 200 topics, and noise.

    Sentence-encoder embeddings are anisotropic (unrelated phrases still score about 0.2) and clustered at more
    than one scale. Energy shares: shared 0.20, topic 0.25, cluster 0.30, noise 0.25, so two random points score
    about 0.2, two points of one topic about 0.45, of one cluster about 0.75, and a point scores about 0.87
    against its cluster centre.
    """

    SHARES = (0.20, 0.25, 0.30, 0.25)

    def __init__(self, dim: int, n_centres: int, n_topics: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.dim = dim
        w_shared, w_topic, w_cluster, self.w_noise = (s**0.5 for s in self.SHARES)
        shared = self._unit(rng, 1)[0]
        topics = self._unit(rng, n_topics)
        topic_of = rng.integers(0, n_topics, n_centres)
        self.centres = w_shared * shared + w_topic * topics[topic_of] + w_cluster * self._unit(rng, n_centres)

    def _unit(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = rng.standard_normal((n, self.dim)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    def sample(self, n: int, seed: list[int]) -> np.ndarray:
        """Draw n unit vectors; the same seed gives the same vectors."""
        rng = np.random.default_rng(seed)
        out = np.empty((n, self.dim), dtype=np.float32)
        for start in range(0, n, 20_000):
            m = min(20_000, n - start)
            x = self.centres[rng.integers(0, len(self.centres), m)] + self.w_noise * self._unit(rng, m)
            out[start : start + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
        return out


def pct(ts: list[float], p: float) -> float:
    """Percentile of timings in milliseconds."""
    return float(np.percentile(np.asarray(ts) * 1e3, p))


def timed_queries(indices: list[VectorIndex], qs: np.ndarray, batch: int, k: int,
                  cpu: list[list[float]] | None = None) -> list[list[float]]:
    """Wall time of query calls of `batch` vectors, interleaving the indices so they see the same conditions.

    If `cpu` is given, the calling thread's CPU time per call is appended to it as well: on a shared machine
    wall-clock tails are dominated by scheduler preemption, CPU time is what the search itself costs.
    """
    times: list[list[float]] = [[] for _ in indices]
    for ix in indices:  # warm-up
        ix.query(qs[:batch], k)
    for start in range(0, len(qs) - batch + 1, batch):
        q = qs[start : start + batch]
        for j, ix in enumerate(indices):
            c0, t0 = time.thread_time(), time.perf_counter()
            ix.query(q, k)
            times[j].append(time.perf_counter() - t0)
            if cpu is not None:
                cpu[j].append(time.thread_time() - c0)
    return times


def recall(found: np.ndarray, truth: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Fraction of the true top-k labels found (only those where mask is true, if given)."""
    if mask is None:
        mask = np.ones(truth.shape, dtype=bool)
    hits = total = 0
    for f, t, m in zip(found, truth, mask):
        want = set(t[m].tolist())
        hits += len(set(f.tolist()) & want)
        total += len(want)
    return hits / total if total else 1.0


def file_mb(path: Path) -> float:
    return path.stat().st_size / 1e6


def run_size(n: int, gen: Clustered, args: argparse.Namespace, tmp: Path) -> dict:
    """Build both backends at size n and measure everything for one table row."""
    data = gen.sample(n, [args.seed, n])
    labels = np.arange(n, dtype=np.int64) * 3 + 1_000_000  # sparse, large ids like a growing manifest
    qs = gen.sample(args.queries, [args.seed, n, 1])
    res: dict = {"n": n}

    exact = VectorIndex(args.dim, backend="exact")
    t0 = time.perf_counter()
    exact.add(labels, data)
    res["build_exact"] = time.perf_counter() - t0

    kept = args.reuse / f"hnsw_n{n}_s{args.seed}_M{args.M}_efc{args.ef_construction}.idx" if args.reuse else None
    if kept is not None and kept.exists():  # graph built by an earlier run on the same data
        hnsw = VectorIndex.load(kept, args.dim, backend="hnsw", ef=args.ef, num_threads=args.threads)
        res["build_hnsw"] = float("nan")
    else:
        hnsw = VectorIndex(args.dim, backend="hnsw", ef=args.ef, M=args.M, ef_construction=args.ef_construction,
                           num_threads=args.threads)
        t0 = time.perf_counter()
        hnsw.add(labels, data)
        res["build_hnsw"] = time.perf_counter() - t0
        if kept is not None:
            args.reuse.mkdir(parents=True, exist_ok=True)
            hnsw.save(kept)

    truth, tsims = exact.query(qs, args.k)
    close = tsims >= args.match
    res["close"] = float(close.sum(axis=1).mean())
    res["recall"], res["recall_close"], res["p50_ef"] = {}, {}, {}  # p50_ef: (p50, p99)
    for ef in args.efs:
        hnsw.ef = ef
        found, _ = hnsw.query(qs, args.k)
        res["recall"][ef] = recall(found, truth)
        res["recall_close"][ef] = recall(found, truth, close)
        cpu: list[list[float]] = [[]]
        timed_queries([hnsw], qs[: min(len(qs), 500)], 1, args.k, cpu)
        res["p50_ef"][ef] = (pct(cpu[0], 50), pct(cpu[0], 99))
    hnsw.ef = args.ef

    for batch in (1, 3):
        cpu = [[], []]
        te, th = timed_queries([exact, hnsw], qs, batch, args.k, cpu)
        res[f"b{batch}"] = (pct(te, 50), pct(te, 99), pct(th, 50), pct(th, 99))
        res[f"cpu{batch}"] = (pct(cpu[0], 50), pct(cpu[0], 99), pct(cpu[1], 50), pct(cpu[1], 99))

    for name, ix in (("exact", exact), ("hnsw", hnsw)):
        path = tmp / f"{name}_{n}.idx"
        t0 = time.perf_counter()
        ix.save(path)
        res[f"save_{name}"] = time.perf_counter() - t0
        res[f"mb_{name}"] = file_mb(path)
        t0 = time.perf_counter()
        loaded = VectorIndex.load(path, args.dim, backend=name, num_threads=args.threads)
        res[f"load_{name}"] = time.perf_counter() - t0
        same = np.array_equal(loaded.query(qs[:50], args.k)[0], ix.query(qs[:50], args.k)[0])
        res[f"roundtrip_{name}"] = same and loaded.ef == ix.ef
        path.unlink()
    return res


def print_tables(rows: list[dict], args: argparse.Namespace) -> None:
    print(f"\nLatency per query call, ms (k={args.k}, hnsw ef={args.ef}, M={args.M}, "
          f"efC={args.ef_construction}; ratio = exact / hnsw, > 1 means hnsw is faster).\n"
          f"wall: elapsed time; cpu: the calling thread's CPU time (wall tails on a busy machine are scheduler "
          f"preemption)")
    for batch in (1, 3):
        for kind in ("b", "cpu"):
            print(f"\n  {'wall' if kind == 'b' else 'cpu'}, batch of {batch} query vector{'s' if batch > 1 else ''}")
            print(f"  {'size':>7} | {'exact p50':>9} {'exact p99':>9} | {'hnsw p50':>9} {'hnsw p99':>9} | "
                  f"{'ratio p50':>9} {'ratio p99':>9}")
            for r in rows:
                e50, e99, h50, h99 = r[f"{kind}{batch}"]
                print(f"  {r['n']:>7} | {e50:9.3f} {e99:9.3f} | {h50:9.3f} {h99:9.3f} | "
                      f"{e50 / h50:9.2f} {e99 / h99:9.2f}")

    print(f"\nhnsw recall@{args.k} against exact search (single-query cpu p50 / p99 ms in brackets)")
    print(f"  {'size':>7} | " + " ".join(f"{'ef=' + str(ef):>22}" for ef in args.efs))
    for r in rows:
        cells = " ".join(f"{r['recall'][ef]:>7.4f} ({r['p50_ef'][ef][0]:.3f}/{r['p50_ef'][ef][1]:.3f})"
                         for ef in args.efs)
        print(f"  {r['n']:>7} | {cells}")
    print(f"\nhnsw recall of the true top-{args.k} neighbours with cosine >= {args.match} (what a hit needs)")
    print(f"  {'size':>7} | {'per query':>9} | " + " ".join(f"{'ef=' + str(ef):>8}" for ef in args.efs))
    for r in rows:
        cells = " ".join(f"{r['recall_close'][ef]:>8.4f}" for ef in args.efs)
        print(f"  {r['n']:>7} | {r['close']:>9.1f} | {cells}")

    print(f"\nBuild, save and load, seconds; file size MB (hnsw build with {args.threads} thread(s))")
    print(f"  {'size':>7} | {'build ex':>8} {'build hn':>8} | {'save ex':>7} {'load ex':>7} {'MB ex':>7} | "
          f"{'save hn':>7} {'load hn':>7} {'MB hn':>7} | round trip")
    for r in rows:
        ok = "ok" if r["roundtrip_exact"] and r["roundtrip_hnsw"] else "MISMATCH"
        print(f"  {r['n']:>7} | {r['build_exact']:8.3f} {r['build_hnsw']:8.2f} | {r['save_exact']:7.3f} "
              f"{r['load_exact']:7.3f} {r['mb_exact']:7.1f} | {r['save_hnsw']:7.3f} {r['load_hnsw']:7.3f} "
              f"{r['mb_hnsw']:7.1f} | {ok}")

    faster = [r["n"] for r in rows if r["cpu1"][0] > r["cpu1"][2]]
    good = [ef for ef in args.efs if all(r["recall"][ef] >= 0.99 for r in rows)]
    print(f"\nhnsw faster (single-query cpu p50) at sizes: {faster or 'none measured'}")
    print(f"smallest ef with recall >= 0.99 at every measured size: {good[0] if good else 'none'}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="comma-separated index sizes (default: 100,1000,3000,10000,30000,100000)")
    ap.add_argument("--quick", action="store_true", help="sizes up to 10k and fewer queries (under a minute)")
    ap.add_argument("--queries", type=int, default=None, help="query vectors per size (default 1000, quick 200)")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--ef", type=int, default=DEFAULT_EF, help="hnsw ef for the latency tables")
    ap.add_argument("--efs", type=lambda s: [int(x) for x in s.split(",")], default=[32, 64, 128, 256])
    ap.add_argument("--M", type=int, default=DEFAULT_M)
    ap.add_argument("--ef-construction", type=int, default=DEFAULT_EF_CONSTRUCTION)
    ap.add_argument("--threads", type=int, default=1, help="hnswlib build threads (queries use one)")
    ap.add_argument("--centres", type=int, default=2000)
    ap.add_argument("--topics", type=int, default=200, help="groups of cluster centres")
    ap.add_argument("--match", type=float, default=0.7, help="cosine counted as a candidate match")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reuse", type=Path, default=None,
                    help="folder to keep built hnsw graphs in and load them from on later runs (build shows nan)")
    args = ap.parse_args(argv)
    args.sizes = args.sizes or list(QUICK_SIZES if args.quick else FULL_SIZES)
    args.queries = args.queries or (200 if args.quick else 1000)

    gen = Clustered(args.dim, args.centres, args.topics, args.seed)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n in args.sizes:
            t0 = time.perf_counter()
            rows.append(run_size(n, gen, args, Path(d)))
            print(f"size {n}: done in {time.perf_counter() - t0:.1f} s", flush=True)
    print_tables(rows, args)


if __name__ == "__main__":
    main()
