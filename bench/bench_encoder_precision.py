"""MiniLM's forward on one lookup's identities: float32 dense products against bf16 ones, interleaved.

On a CPU with native bf16 (AVX512-BF16 or AMX) the embedder multiplies its dense layers in bf16 with float32
accumulation, and keeps the residual stream, LayerNorm and attention in float32 (`precision="auto"`). Both
forwards load the same checkpoint; each prompt's identities are timed both ways in a shuffled order, so drift in
the machine's speed falls on both. Prints per-prompt times, their ratio, how far the vectors move (cosine to the
float32 vector) and how far the similarities between a prompt's identity and every other prompt's move. Asserts
nothing; whether decisions move is `bench_hit_precision` / `fit_decision` with CHAI_MINILM_PRECISION set.

    python -m bench.bench_encoder_precision                     # VBench prompts and the seven style files
    python -m bench.bench_encoder_precision --threads 2 --repeat 5
    python -m bench.bench_encoder_precision --no-prepack         # bf16 with plain matrices (no oneDNN prepacking)
"""
from __future__ import annotations

import argparse
import glob
import random
import time
from typing import Any

import numpy as np

from bench._common import DEFAULT_PROMPTS, REPO, load_prompts, table
from bench.bench_encoder_packing import groups_of


def measure(berts: dict[str, Any], groups: list[list[list[int]]], repeat: int, seed: int) -> dict[str, Any]:
    """Per-prompt seconds of each forward (interleaved, shuffled) and each phrase's unit vector both ways."""
    import torch

    times: dict[str, list[float]] = {name: [] for name in berts}
    vectors: dict[str, list[np.ndarray]] = {name: [] for name in berts}
    rng = random.Random(seed)
    with torch.inference_mode():
        for g in groups[:20]:  # warm both paths
            for bert in berts.values():
                bert.pooled(g)
        for r in range(repeat):
            for g in groups:
                names = list(berts)
                rng.shuffle(names)
                for name in names:
                    t0 = time.perf_counter()
                    out = berts[name].pooled(g)
                    times[name].append(time.perf_counter() - t0)
                    if r == 0:
                        vectors[name].append(torch.nn.functional.normalize(out.float(), dim=1).numpy())
    return {"times": times, "vectors": {k: np.concatenate(v) for k, v in vectors.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", action="append", help="prompt files (default: VBench and the style files)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-prepack", action="store_true", help="bf16 weights as plain matrices")
    args = parser.parse_args()
    import torch

    from comfyui_chai.cache_store.entities.embedders import precision
    from comfyui_chai.cache_store.entities.embedders.minilm import MiniLMEmbedder
    from comfyui_chai.cache_store.entities.extract import EntityExtractor

    precision.PREPACK = not args.no_prepack
    torch.set_num_threads(max(args.threads, 1))
    sets = ({p: [p] for p in args.prompts} if args.prompts else
            {"VBench": [str(DEFAULT_PROMPTS)],
             "style (7 files)": sorted(glob.glob(str(REPO / "bench/data/style_pairs/prompts_*.txt")))})
    embedders = {p: MiniLMEmbedder(cache_size=0, precision=p).load() for p in ("float32", "bfloat16")}
    berts = {p: e._bert for p, e in embedders.items()}
    tokenizer, extractor = embedders["float32"]._tokenizer, EntityExtractor()
    rows, moves = [], []
    for name, files in sets.items():
        prompts = [p for f in files for p in load_prompts(f)]
        groups = groups_of(prompts, extractor, tokenizer)
        r = measure(berts, groups, args.repeat, args.seed)
        f32, b16 = (np.array(r["times"][k]) * 1e3 for k in ("float32", "bfloat16"))
        a, b = r["vectors"]["float32"], r["vectors"]["bfloat16"]
        cos = (a * b).sum(axis=1)
        sims_a, sims_b = a @ a.T, b @ b.T
        off = ~np.eye(len(a), dtype=bool)
        delta = np.abs(sims_a - sims_b)[off]
        near = np.abs(sims_a[off] - 0.65) < 0.05  # pairs within 0.05 of the default identity threshold
        rows.append([name, len(groups), f"{np.mean([sum(map(len, g)) for g in groups]):.1f}",
                     f"{np.median(f32):.2f} / {np.percentile(f32, 99):.2f}",
                     f"{np.median(b16):.2f} / {np.percentile(b16, 99):.2f}",
                     f"{np.median(b16 / f32):.3f}"])
        moves.append([name, len(a), f"{cos.min():.6f}", f"{np.median(cos):.7f}",
                      f"{np.percentile(delta, 50):.1e} / {np.percentile(delta, 99.9):.1e} / {delta.max():.1e}",
                      f"{int(near.sum())}: {np.percentile(delta[near], 99.9) if near.any() else 0:.1e}"])
    print(f"MiniLM forward per prompt's identities, torch threads {torch.get_num_threads()}, {args.repeat} rounds, "
          f"interleaved (ms); this CPU has native bf16: {precision.native_bf16()}; bf16 weights prepacked: "
          f"{berts['bfloat16'].blocks[0][0].is_mkldnn}")
    print(table(["prompts", "with entities", "tokens", "float32 p50 / p99", "bf16 p50 / p99",
                 "bf16 / float32 (median per prompt)"], rows))
    print("\nHow far bf16 moves the vectors (cosine to float32) and the similarities between phrases")
    print(table(["prompts", "phrases", "lowest cosine", "median cosine",
                 "|similarity change| p50 / p99.9 / max", "pairs near 0.65: p99.9 change"], moves))


if __name__ == "__main__":
    main()
