"""A render farm sharing one cache on PostgreSQL (issue 16): hit rate, latency at 100k entries, kills, budget.

    nice -n 5 .venv/bin/python -m bench.bench_farm            # the README's run (~15 min on 2 cores)
    nice -n 5 .venv/bin/python -m bench.bench_farm --quick    # 300 prompts, 10k entries, 20 kills
    ... --url postgresql://user@host/db                       # an existing server (else a throwaway one)

1. Stream replay. The VBench prompt list shuffled (seed 0), the first 10% warm the cache, the rest are served by
   1, 2, 4, 8 worker processes taking requests in order from one queue, as a farm's dispatcher hands them out.
   A served request is looked up; a hit renders fast (8/30 of --render-ms), a miss renders for --render-ms and
   then stores its entry, so while one worker renders a miss the others serve the next requests without it, as
   on a real farm. Entries are padded to 16 KB and the budget holds 10% of the prompt count (bench_hit_rate's
   protocol). Side by side: one shared cache on the server; private caches (each worker its own, each with the
   whole budget, warmed with its share of the warm prompts); and the single-process replay of bench_hit_rate
   through a cache folder.
2. Latency at 100k entries. A cache filled with 100k synthetic entries (farm_fill: COPY, 60k distinct 384-d
   entities, two per entry; ~5.5 kB blobs each), at its budget, so every insert evicts. Each worker keeps the
   hnswlib index it inherited (built once from the server, as a long-running worker keeps its own) and catches
   up from the change log before each lookup. Each of N workers runs lookups (a stored entity plus noise) and
   inserts in random order without pauses: wall-clock p50/p99 per call, on 2 shared cores.
3. Kills. 4 workers insert ~400 kB entries back to back; one chosen at random is SIGKILLed at a random moment
   and replaced, 100 times. Then: every insert that returned is on the server with its exact latents (lost), no
   served latents differ from what was written (corrupted), verify finds nothing (no bytes without a row, the
   byte counter exact). A monitor samples bytes against the budget throughout phases 1 and 2.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from comfyui_chai.cache_store.lookup.rule import HitRule

from bench._common import DEFAULT_PROMPTS, load_prompts, ms_pct, table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench import farm_fill, farm_phases  # noqa: E402

WORKERS = (1, 2, 4, 8)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def server_url(args) -> tuple[object, object | None]:
    from comfyui_chai.cache_store.postgres.url import ServerURL

    if args.url:
        return ServerURL(args.url, "--url"), None
    from pg_server import CHAI_PASSWORD, PgServer

    server = PgServer.start()
    log(f"throwaway PostgreSQL in {server.base}")
    return ServerURL(server.url("chai", password=CHAI_PASSWORD), "CHAI_CACHE_URL"), server


# ---------------------------------------------------------------------------------------------- phase 1
def phase_replay(args, url, work: Path) -> list:
    import torch

    from bench.bench_hit_rate import ENTRY_BYTES, FINGERPRINT, LATENT_NAMES, SHAPE, SIGMAS, WARM_SHARE, Replayer
    from bench.hit_labels import embed_all
    from comfyui_chai.cache_store.config import StoreConfig
    from comfyui_chai.cache_store.entities.embedders import get_embedder
    from comfyui_chai.cache_store.postgres.store import PgCacheStore
    from comfyui_chai.cache_store.types import EmbeddedEntities

    prompts = load_prompts(args.prompts, seed=0)[: args.n or None]
    n_warm = max(1, round(WARM_SHARE * len(prompts)))
    capacity = max(1, round(0.1 * len(prompts)))
    budget = capacity * ENTRY_BYTES
    log(f"phase 1: {len(prompts)} VBench prompts, {n_warm} warm, budget {capacity} entries; extracting + embedding")
    ents, vec, _ = embed_all(prompts)
    embedder = get_embedder("minilm")
    dim = embedder.dim
    items = [EmbeddedEntities(tuple(ents[p]), np.stack([vec[e.identity] for e in ents[p]]) if ents[p]
                              else np.zeros((0, dim), np.float32), embedder.identity) for p in prompts]
    threshold = float(embedder.default_threshold)
    replayer = Replayer(work / "folder", embedder.identity)
    latents = {name: torch.zeros(SHAPE) for name in LATENT_NAMES}
    real_fsync = os.fsync
    os.fsync = lambda fd: None  # the folder reference: durability is irrelevant to hit counts (as bench_hit_rate)
    try:
        single = replayer.replay("entity", items, prompts, threshold, 0.1, n_warm)
    finally:
        os.fsync = real_fsync
    log(f"  single process, cache folder: {single.hit_rate:.1%} ({single.hits}/{single.served})")
    tag = f"farm{os.getpid()}"

    def open_cache(name: str, index: str) -> PgCacheStore:
        return PgCacheStore(url, name, StoreConfig(budget), index_root=work / "idx" / index)

    def warm(name: str, indices) -> None:
        with open_cache(name, "warm") as s:
            for i in indices:
                if len(items[i]):
                    s.insert(prompts[i], items[i], FINGERPRINT, latents, SIGMAS,
                             meta=replayer._pad_meta(prompts[i], items[i]))

    from comfyui_chai.cache_store.postgres.db import PgDb
    from comfyui_chai.cache_store.postgres.schema import schema_name

    results = []
    for n in args.workers:
        for mode in ("shared", "private") if n > 1 else ("shared",):
            names = [f"{tag}-{mode}{n}"] if mode == "shared" else [f"{tag}-p{n}-{k}" for k in range(n)]
            for k, name in enumerate(names):
                warm(name, range(k, n_warm, len(names)))
            stop, _ = farm_phases.budget_monitor(lambda: PgDb(url, schema_name(names[0])))
            got = farm_phases.replay(n, mode, lambda k: open_cache(names[k % len(names)], f"{names[0]}-w{k}"), items,
                                     prompts, replayer._pad_meta, n_warm, args.render_ms / 1000, threshold,
                                     FINGERPRINT, SHAPE, latents, SIGMAS)
            seen = stop()
            got.budget = seen
            results.append(got)
            log(f"  {n} worker(s), {mode}: {got.hit_rate:.1%} ({got.hits}/{got.served}) in {got.seconds:.0f} s; "
                f"max bytes/budget {seen['max_ratio']:.3f} over {seen['samples']} samples"
                + (f"; ERRORS {got.errors}" if got.errors else ""))
    return [single, results, len(prompts), n_warm, capacity]


# ---------------------------------------------------------------------------------------------- phase 2
def phase_latency(args, url, work: Path, entries: int, workers: list[int]) -> dict:
    import torch

    from comfyui_chai.cache_store.config import StoreConfig
    from comfyui_chai.cache_store.entities.extract import Entity
    from comfyui_chai.cache_store.postgres.db import PgDb
    from comfyui_chai.cache_store.postgres.schema import schema_name
    from comfyui_chai.cache_store.postgres.store import PgCacheStore
    from comfyui_chai.cache_store.types import EmbeddedEntities

    name = f"farm{os.getpid()}-{entries}"
    n_entities = max(1000, int(entries * 0.6))
    log(f"phase 2: filling {entries} synthetic entries ({n_entities} entities) with COPY")
    PgCacheStore(url, name, StoreConfig(10**12), index_root=work / "fill").close()  # creates the schema
    db = PgDb(url, schema_name(name))
    fill = farm_fill.fill(db, entries, n_entities, log=log)
    sizes = dict(db.query("SELECT relname, pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n ON "
                          "n.oid = c.relnamespace WHERE n.nspname = ? AND c.relkind = 'r'", (schema_name(name),)))
    db.query("UPDATE state SET budget_bytes = total_bytes RETURNING 1")  # at budget: every insert evicts
    db.close()
    log(f"  filled in {fill.seconds:.0f} s ({fill.total_bytes / 1e6:.0f} MB of latents); building the worker index")
    t0 = time.perf_counter()
    store = PgCacheStore(url, name, None, index_root=work / "worker")
    build_s = time.perf_counter() - t0
    index_bytes = sum(p.stat().st_size for p in store.index_dir.glob("entities-*"))
    log(f"  index of {len(store.keeper.index)} entities built and saved in {build_s:.0f} s "
        f"({store.keeper.index.backend}, {index_bytes / 1e6:.0f} MB on disk)")

    def make_entities(pairs):
        return EmbeddedEntities(tuple(Entity(t, "object", t, "main") for t, _ in pairs),
                                np.stack([v for _, v in pairs]), farm_fill.EMBEDDER)

    latents = {f"x_t_{k}": torch.zeros(farm_fill.SHAPE) for k in range(3)}
    out = {"fill": fill, "build_s": build_s, "index_bytes": index_bytes, "sizes": sizes, "runs": {}}
    for n in workers:
        stop, _ = farm_phases.budget_monitor(lambda: PgDb(url, schema_name(name)), every=0.5)
        times, hits, errors, wall = farm_phases.latency(store, n, args.lookups, args.inserts, fill, make_entities,
                                                        farm_fill.FINGERPRINT, farm_fill.SHAPE, latents,
                                                        farm_fill.SIGMAS)
        seen = stop()
        out["runs"][n] = (times, hits, errors, wall, seen)
        log(f"  {n} worker(s): lookup p50 {ms_pct(times['lookup'], 50):.2f} ms p99 {ms_pct(times['lookup'], 99):.2f}"
            f" ms, insert p50 {ms_pct(times['insert'], 50):.2f} ms p99 {ms_pct(times['insert'], 99):.2f} ms; "
            f"hits {hits}/{len(times['lookup'])}; max bytes/budget {seen['max_ratio']:.4f}"
            + (f"; ERRORS {errors}" if errors else ""))
    # a real-size donor: one 240p entry (3 fp32 tensors of [1, 4, 15, 30, 53], 1.1 MB) read back, for scale
    big = {f"x_t_{k}": torch.randn(1, 4, 15, 30, 53) for k in range(3)}
    ee = make_entities([("ent1", fill.vectors[0])])
    store.set_budget(fill.total_bytes + 10**8)
    entry = store.insert("240p donor", ee, farm_fill.FINGERPRINT, big, farm_fill.SIGMAS).entry_id
    reads = []
    for _ in range(20):
        t = time.perf_counter()
        store.load_latents(entry)
        reads.append(time.perf_counter() - t)
    out["read_240p"] = (ms_pct(reads, 50), store.entry(entry).nbytes)
    store.clear()  # frees the server's disk for the next phase
    store.db.close()
    return out


# ---------------------------------------------------------------------------------------------- phase 3
def phase_kills(args, url, work: Path) -> farm_phases.Kills:
    import torch

    from comfyui_chai.cache_store.config import StoreConfig
    from comfyui_chai.cache_store.postgres.store import PgCacheStore
    from farm_worker import parse_log
    from store_helpers import SIGMAS, ents, latents

    name, shape, fp = f"farm{os.getpid()}-kills", (1, 4, 8, 32, 32), "model-a"
    log(f"phase 3: {args.kills} kills of random workers among 4, mid-insert")

    def open_store():
        return PgCacheStore(url, name, StoreConfig(10**11), index_root=work / "kills" / str(os.getpid()))

    def make(seed):
        return ents(f"thing{seed}", "dog"), latents(seed, shape)

    open_store().close()
    out, logs = farm_phases.kills(open_store, args.kills, 4, work, make, shape, fp, SIGMAS)
    done, unfinished = {}, []
    for path in logs:
        d, _, u = parse_log(path)
        done.update(d)
        unfinished += u
    out.committed = len(done)
    with open_store() as s:
        present = {int(e.prompt.split("=")[1]): e.id for e in s.entries()}
        out.lost = sum(present.get(seed) != entry_id for seed, entry_id in done.items())
        out.unreported_commits = len(set(present) - set(done))
        for seed, entry_id in present.items():
            tensors, _ = s.load_latents(entry_id)
            out.corrupted += not all(torch.equal(tensors[k], v) for k, v in latents(seed, shape).items())
        for seed in list(done)[:: max(1, len(done) // 50)]:
            res = s.lookup(ents(f"thing{seed}"), fp, shape, HitRule(0.99))
            out.lookups_checked += 1
            ok = res.hit and all(torch.equal(res.latents[k], v)
                                 for k, v in latents(int(res.entry.prompt.split("=")[1]), shape).items())
            out.corrupted += not ok
        report = s.verify()
        out.verify_ok, out.verify_report = report.ok and not report.problems, report.report()
        blobs = s.db.query("SELECT COUNT(*) FROM blobs")[0][0]
        if blobs != len(present):
            out.verify_ok = False
            out.verify_report += f"\n{blobs} blobs for {len(present)} entries"
        s.clear()
    log(f"  {out.kills} kills ({out.mid_insert} inside insert()), {out.committed} inserts returned: lost "
        f"{out.lost}, corrupted {out.corrupted}, verify {'clean' if out.verify_ok else 'PROBLEMS'}")
    return out


# ---------------------------------------------------------------------------------------------- report
def report_replay(single, results, n_prompts: int, n_warm: int, capacity: int) -> None:
    print(f"\nstream replay: {n_prompts} VBench prompts (seed 0), {n_warm} warm, {n_prompts - n_warm} served; budget "
          f"{capacity} entries (10%); MiniLM threshold 0.65; hit rate = hits / served")
    by = {(r.workers, r.mode): r for r in results}
    rows = []
    for n in sorted({r.workers for r in results}):
        shared, private = by.get((n, "shared")), by.get((n, "private"))
        rows.append([n, f"{shared.hit_rate:.1%}" if shared else "-",
                     f"{(shared.hit_rate - single.hit_rate) * 100:+.1f} pt" if shared else "-",
                     f"{private.hit_rate:.1%}" if private else "(= shared)",
                     f"{single.hit_rate:.1%}",
                     f"{max(r.budget['max_ratio'] for r in (shared, private) if r):.3f}"])
    print(table(["workers", "shared cache (PostgreSQL)", "vs single process", "private caches (one each)",
                 "single process (folder)", "max bytes / budget"], rows))


def report_latency(lat: dict, args) -> None:
    fill = lat["fill"]
    print(f"\nlatency at {fill.entries // 1000}k entries ({fill.entities // 1000}k distinct entities, synthetic "
          f"384-d; cache at its budget so every insert evicts); wall clock per call on 2 shared cores, each "
          f"worker {args.lookups} lookups + {args.inserts} inserts in random order, no pauses")
    rows = []
    for n, (times, hits, errors, wall, seen) in lat["runs"].items():
        ops = len(times["lookup"]) + len(times["insert"])
        rows.append([n, f"{ms_pct(times['lookup'], 50):.2f}", f"{ms_pct(times['lookup'], 99):.2f}",
                     f"{ms_pct(times['sync'], 50):.2f} / {ms_pct(times['search'], 50):.2f}",
                     f"{ms_pct(times['search'], 99):.2f}",
                     f"{ms_pct(times['insert'], 50):.2f}", f"{ms_pct(times['insert'], 99):.2f}",
                     f"{hits / max(len(times['lookup']), 1):.0%}", f"{ops / wall:.0f}", f"{seen['max_ratio']:.4f}",
                     len(errors)])
    print(table(["workers", "lookup p50 ms", "lookup p99 ms", "of which catch-up / index search p50",
                 "index search p99", "insert p50 ms", "insert p99 ms", "hits", "ops/s (all)", "max bytes/budget",
                 "errors"], rows))
    p50, nbytes = lat["read_240p"]
    print(f"  reading one real-size 240p donor ({nbytes / 1e6:.2f} MB) back from the server: p50 {p50:.1f} ms")


def report_kills(k) -> None:
    print("\nkills: 4 workers inserting ~400 kB entries back to back, a random one SIGKILLed at a random moment "
          "and replaced")
    print(table(["kills", "inside insert()", "inserts returned", "lost", "corrupted served", "committed, unreported",
                 "verify"], [[k.kills, k.mid_insert, k.committed, k.lost, k.corrupted, k.unreported_commits,
                              "clean" if k.verify_ok else "PROBLEMS"]]))
    if not k.verify_ok:
        print(k.verify_report)


def report_growth(lat: dict, small: dict) -> None:
    fill, sizes = lat["fill"], lat["sizes"]
    meta = sum(v for t, v in sizes.items() if t != "blobs")
    per_entry = meta / fill.entries
    blob = sizes.get("blobs", 0) / fill.entries
    idx = lat["index_bytes"] / fill.entities
    build = lat["build_s"] / fill.entities * 1000
    print("\ngrowth, one worker, measured at two sizes:")
    rows = []
    for got in (small, lat):
        times = got["runs"][1][0]
        f = got["fill"]
        rows.append([f"{f.entries:,}", f"{f.entities:,}", f"{ms_pct(times['lookup'], 50):.2f}",
                     f"{ms_pct(times['insert'], 50):.2f}",
                     f"{sum(v for t, v in got['sizes'].items() if t != 'blobs') / f.entries:.0f}",
                     f"{got['index_bytes'] / 1e6:.0f} MB", f"{got['build_s']:.0f} s"])
    print(table(["entries", "entities", "lookup p50 ms", "insert p50 ms", "server B/entry (no blobs)",
                 "worker index", "index build"], rows))
    print(f"\non paper, from the {fill.entries // 1000}k figures: server metadata {per_entry:.0f} B per entry (rows + "
          f"indexes; latent blobs {blob / 1e3:.1f} kB each here, synthetic); worker index {idx:.0f} B per entity, "
          f"built from the server in {build:.2f} s per 1k entities")
    rows = []
    for entries, mb in ((10**5, 1.1), (10**6, 1.1), (10**6, 10.4)):
        entities = entries * fill.entities / fill.entries
        rows.append([f"{entries:,}", f"{mb:g} MB", f"{entries * per_entry / 1e9:.1f} GB",
                     f"{entries * mb / 1e3:,.0f} GB", f"{entities * idx / 1e9:.2f} GB",
                     f"{entities * build / 1000 / 60:.0f} min"])
    print(table(["entries", "latents each", "server metadata", "latent bytes", "index per worker",
                 "index rebuild per worker"], rows))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="an existing server (default: a throwaway one, tests/pg_server.py)")
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--n", type=int, default=None, help="use only the first N shuffled prompts")
    ap.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=list(WORKERS))
    ap.add_argument("--render-ms", type=float, default=60.0, help="simulated full-run time (a hit: 8/30 of it)")
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--growth-entries", type=int, default=10_000, help="a smaller fill, one worker: the growth")
    ap.add_argument("--lookups", type=int, default=200, help="lookups per worker in the latency phase")
    ap.add_argument("--inserts", type=int, default=40, help="inserts per worker in the latency phase")
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--skip", default="", help="phases to skip: replay,latency,kills")
    ap.add_argument("--quick", action="store_true", help="300 prompts, 10k entries, 20 kills")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.entries, args.growth_entries, args.kills, args.lookups, args.inserts = 300, 10_000, 2000, 20, 100, 20
    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.ERROR)
    url, server = server_url(args)
    work = Path(tempfile.mkdtemp(prefix="chai-farm-"))
    skip = set(args.skip.split(","))
    t0 = time.perf_counter()
    try:
        replay = phase_replay(args, url, work) if "replay" not in skip else None
        small = phase_latency(args, url, work, args.growth_entries, [1]) if "latency" not in skip else None
        lat = phase_latency(args, url, work, args.entries, args.workers) if "latency" not in skip else None
        kills = phase_kills(args, url, work) if "kills" not in skip else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if server is not None:
            server.destroy()
    print(f"\nbench_farm: PostgreSQL {'at ' + url.label if server is None else '15, throwaway, unix socket'}; "
          f"{os.cpu_count()} CPU cores shared by the server and every worker")
    if replay:
        report_replay(*replay)
    if lat:
        report_latency(lat, args)
    if kills:
        report_kills(kills)
    if lat:
        report_growth(lat, small)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
