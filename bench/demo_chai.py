"""The main job: stream toy-world prompts through the full CHAI pipeline with the trained toy STDiT3 (CPU).

Each request extracts the prompt's entities (spaCy), looks them up in a real cache folder (MiniLM + index), and
then either misses (full 30-step schedule; its donor latents are stored) or hits (8 steps, Cache Attention at
the pack's cache steps, 5 and 6, fed by the donor's latents). Every video is written as a GIF and read back by the toy world's
detectors (scene, object, colour, motion), so each line says whether the video shows what the prompt asked for.

    python -m bench.demo_chai                  # 20 requests into ./demo_cache, GIFs in ./demo_out
    python -m bench.demo_chai --n 8 --keep     # keep what an earlier run stored (later requests hit more)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench import demo_cache


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20, help="requests to stream (default 20)")
    ap.add_argument("--seed", type=int, default=3, help="seed of the prompt stream and of the noise")
    ap.add_argument("--cache", type=Path, default=Path("demo_cache"),
                    help="cache folder (default ./demo_cache); cleared first unless --keep, and only if it is empty "
                         "or a cache the demo made")
    ap.add_argument("--out", type=Path, default=Path("demo_out"), help="GIF folder (default ./demo_out)")
    ap.add_argument("--keep", action="store_true", help="keep the cache's content instead of clearing it")
    ap.add_argument("--weights", type=Path, default=None, help="toy STDiT3 weights (default: the shipped ones)")
    ap.add_argument("--cfg", type=float, default=None, help="guidance scale (default: the toy model's)")
    ap.add_argument("--full-steps", type=int, default=30)
    ap.add_argument("--fast-steps", type=int, default=8)
    ap.add_argument("--cache-steps", default=None, help="cache steps of a hit (default: the pack's, 5,6)")
    ap.add_argument("--reuse", default="restart", choices=("restart", "cache_attention", "both"),
                    help="how a hit reuses its donor (default: restart from a same-scene donor's latent)")
    ap.add_argument("--solver", default="euler", choices=("euler", "dpmpp_2m"),
                    help="the sampler of a hit's steps (a miss runs the full Euler schedule)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: two were 12-17x slower while other work shared 2 cores)")
    args = ap.parse_args(argv)
    refused = demo_cache.prepare(args.cache, args.keep)
    if refused:
        print(f"demo: {refused}", file=sys.stderr)
        return 2

    import torch

    torch.set_num_threads(max(1, args.threads))
    from comfyui_chai.cache_store.config import budget_from_gb
    from comfyui_chai.cache_store.service import ChaiCache
    from comfyui_chai.chai_attention.config import ChaiConfig
    from comfyui_chai.chai_attention.torch_pipeline import ChaiPipeline
    from comfyui_chai.toyworld.model import DEFAULT_CFG, ToyVideoSpec, load_toy_model, toy_sigmas, toy_text_encoder
    from comfyui_chai.toyworld.stream import make_stream, request_lines, serve, summary_text

    try:
        steps = ChaiConfig().cache_steps if args.cache_steps is None else args.cache_steps
        config = ChaiConfig(full_steps=args.full_steps, fast_steps=args.fast_steps, cache_steps=steps,
                            reuse=args.reuse)
        stream = make_stream(args.n, args.seed)
        model = load_toy_model(args.weights)
    except (ValueError, FileNotFoundError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    print(f"CHAI demo: {len(stream)} toy-world requests, cache {args.cache}/, videos {args.out}/ "
          f"(full {config.full_steps} steps on a miss, {config.fast_steps} on a hit: reuse {config.reuse}, "
          f"restart at sigma {config.restart_sigma:g} from a same-scene donor, else Cache Attention at steps "
          f"{','.join(map(str, config.cache_steps))}; hits sampled with {args.solver})", flush=True)
    t0 = time.perf_counter()
    cache = ChaiCache(args.cache, budget_bytes=budget_from_gb(0.5))
    demo_cache.mark(args.cache)
    cache.embed_prompt("a red ball")  # load spaCy and MiniLM before the first timed request
    pipe = ChaiPipeline(model, cache, config, text_encode=toy_text_encoder(), video=ToyVideoSpec(),
                        schedule=toy_sigmas, cfg=DEFAULT_CFG if args.cfg is None else args.cfg,
                        fast_solver=args.solver)
    print(f"loaded the model, spaCy and MiniLM in {time.perf_counter() - t0:.1f} s", flush=True)

    requests = []
    try:
        for req in serve(pipe, stream, args.out, args.seed):
            requests.append(req)
            for line in request_lines(req, len(stream)):
                print(line, flush=True)
    finally:
        cache.close()
    print()
    print(summary_text(requests) + f" ({time.perf_counter() - t0:.1f} s in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
