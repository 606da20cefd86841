"""Demo of the CHAI entity cache without a video model: stream VBench prompts through a real cache folder.

For each prompt: extract entities (spaCy), embed them (MiniLM), look the cache up; on a miss store three dummy
donor latents of the OpenSora 1.2 240p / 51-frame shape ([1, 4, 15, 30, 53] float32, about 1.3 MB per entry)
with fake sigmas, as a full-mode generation would. Prints one line per request and a summary. No GPU needed.

    python -m bench.demo_store                       # ~120 prompts into ./demo_cache (cleared first)
    python -m bench.demo_store --quick               # 30 prompts
    python -m bench.demo_store --keep --n 50         # keep what an earlier run stored
    python -m bench.demo_store --threshold 0.7 --budget-gb 0.05
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench import demo_cache
from bench._common import DEFAULT_PROMPTS, load_prompts, ms_mean, shorten, table

LATENT_SHAPE = (1, 4, 15, 30, 53)          # OpenSora 1.2 VAE latent of a 240p, 51-frame video
LATENT_NAMES = ("x_t_0", "x_t_1", "x_t_2")  # three donor latents per entry (the paper's default)
FAKE_SIGMAS = (0.92, 0.78, 0.61)
FINGERPRINT = "demo:opensora-1.2:240p:51f"
STAGES = ("extract", "embed", "lookup", "write")


def dummy_latents(seed: int) -> dict:
    """Three random float32 latents of the OpenSora 240p shape."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(LATENT_SHAPE, generator=gen, dtype=torch.float32) for name in LATENT_NAMES}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path("demo_cache"), help="cache folder (default ./demo_cache)")
    ap.add_argument("--keep", action="store_true", help="keep the cache folder's content instead of clearing it")
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="prompt list, one per line")
    ap.add_argument("--n", type=int, default=120, help="prompts to stream (default 120)")
    ap.add_argument("--quick", action="store_true", help="30 prompts")
    ap.add_argument("--seed", type=int, default=7, help="shuffle seed")
    ap.add_argument("--threshold", type=float, default=None, help="cosine threshold (default: the embedder's)")
    ap.add_argument("--budget-gb", type=float, default=1.0, help="latent budget in GB (default 1.0)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads for MiniLM (default 1: on a shared 2-core machine more threads are slower)")
    args = ap.parse_args(argv)
    n = 30 if args.quick else args.n

    prompts = load_prompts(args.prompts, seed=args.seed)[:n]
    refused = demo_cache.prepare(args.cache, args.keep)
    if refused:
        raise SystemExit(f"demo: {refused}")

    import torch

    torch.set_num_threads(max(args.threads, 1))
    from comfyui_chai.cache_store.config import budget_from_gb
    from comfyui_chai.cache_store.service import ChaiCache

    t0 = time.perf_counter()
    print(f"opening cache {args.cache} (budget {args.budget_gb:g} GB) ...", flush=True)
    cache = ChaiCache(args.cache, budget_bytes=budget_from_gb(args.budget_gb))
    demo_cache.mark(args.cache)
    print("loading spaCy pipeline ...", flush=True)
    extractor = cache.extractor
    print(f"  {extractor.pipeline_name}; loading MiniLM ...", flush=True)
    embedder = cache.embedder
    embedder.load()
    threshold = cache.threshold if args.threshold is None else args.threshold
    startup = time.perf_counter() - t0
    print(f"  {embedder.identity}; threshold {threshold:.2f}; ready in {startup:.1f} s\n", flush=True)

    times: dict[str, list[float]] = {s: [] for s in STAGES}
    hits = no_entities = 0
    width = len(str(n))
    for i, prompt in enumerate(prompts, 1):
        t = time.perf_counter()
        entities = extractor.extract(prompt)
        t_extract = time.perf_counter() - t
        t = time.perf_counter()
        embedded = cache.embed_entities(entities)
        t_embed = time.perf_counter() - t
        t = time.perf_counter()
        result = cache.lookup(embedded, FINGERPRINT, LATENT_SHAPE, threshold)
        t_lookup = time.perf_counter() - t
        times["extract"].append(t_extract)
        times["embed"].append(t_embed)
        times["lookup"].append(t_lookup)
        stage_ms = f"[ext {t_extract * 1e3:5.1f} emb {t_embed * 1e3:5.1f} look {t_lookup * 1e3:5.1f}"
        head = f"[{i:{width}d}/{n}]"
        if result.hit:
            hits += 1
            pairs = ", ".join(f"{m.query}~{m.entity} {m.similarity:.2f}" for m in result.matches)
            donor = shorten(result.entry.prompt if result.entry else "?", 48)
            print(f"{head} HIT  {stage_ms} ms] {shorten(prompt, 50)!r}\n"
                  f"{' ' * len(head)}      matched {pairs} | donor {donor!r}", flush=True)
            continue
        if not entities:
            no_entities += 1
        t = time.perf_counter()
        write = cache.write(prompt, embedded, FINGERPRINT, dummy_latents(args.seed * 100_000 + i), FAKE_SIGMAS)
        t_write = time.perf_counter() - t
        times["write"].append(t_write)
        ents = ", ".join(e.text for e in entities) or "(none)"
        stored = "stored" if write.stored else f"not stored ({write.reason})"
        print(f"{head} MISS {stage_ms} wr {t_write * 1e3:5.1f} ms] {shorten(prompt, 50)!r}\n"
              f"{' ' * len(head)}      {stored}: {shorten(ents, 50)} | {shorten(result.reason, 90)}",
              flush=True)

    stats = cache.store.stats()
    wall = time.perf_counter() - t0
    cache.close()
    print("\nsummary")
    print(f"  requests {n}, hits {hits} ({hits / max(n, 1):.1%}), misses {n - hits} "
          f"({no_entities} without entities), threshold {threshold:.2f}")
    print(f"  entries {stats.entries}, distinct entities {stats.entities}, index {stats.index_backend}, "
          f"latents {stats.bytes / 1e6:.1f} MB of {stats.budget_bytes / 1e6:.0f} MB")
    print(f"  startup {startup:.1f} s, total {wall:.1f} s\n")
    rows = []
    for stage in STAGES:
        ts = times[stage]
        rows.append([stage, len(ts), f"{ms_mean(ts):.1f}",
                     f"{statistics.median(ts) * 1e3:.1f}" if ts else "nan",
                     f"{max(ts) * 1e3:.1f}" if ts else "nan"])
    print(table(["stage (ms)", "calls", "mean", "median", "max"], rows))


if __name__ == "__main__":
    main()
