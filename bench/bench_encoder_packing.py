"""MiniLM's forward on one lookup's identities: padded batches (before) against packed rows (now), interleaved.

A lookup embeds the identities of its prompt that the cache does not hold, a handful of 3-8-token phrases. Before
the eighth issue-25 pass they ran as one batch padded to its longest phrase, through F.linear on the checkpoint's
(out, in) weights; now they run packed into one row (each phrase attending only to itself) through addmm on
(in, out) weights. Both forwards use the same loaded weights; each prompt's group is timed both ways in a shuffled
order, so drift in the machine's speed falls on both. Prints per-prompt times, their ratio and the lowest cosine
between the two vectors of any phrase. Asserts nothing.

    python -m bench.bench_encoder_packing                       # VBench prompts and the seven style files
    python -m bench.bench_encoder_packing --prompts FILE --repeat 5
"""
from __future__ import annotations

import argparse
import glob
import random
import time
from typing import Any

import numpy as np

from bench._common import DEFAULT_PROMPTS, REPO, load_prompts, table


def out_in(bert: Any) -> list[tuple]:
    """The encoder's blocks with the dense weights back in the checkpoint's (out, in) layout, contiguous."""
    return [tuple(t.t().contiguous() if i in (0, 2, 6, 8) else t for i, t in enumerate(block)) for block in bert.blocks]


def padded_forward(bert: Any, blocks: list[tuple], seqs: list[list[int]]) -> Any:
    """The forward as it was: one batch padded to its longest sequence, F.linear on (out, in) weights."""
    import torch
    import torch.nn.functional as F

    longest = max(map(len, seqs))
    ids = torch.zeros(len(seqs), longest, dtype=torch.int64)
    mask = torch.zeros(len(seqs), longest, dtype=torch.bool)
    for r, s in enumerate(seqs):
        ids[r, :len(s)] = torch.tensor(s)
        mask[r, :len(s)] = True
    b, d, h = len(seqs), bert.hidden, bert.heads
    x = F.layer_norm(bert.word[ids] + bert.pos[:longest] + bert.type0, (d,), *bert.emb_ln, eps=bert.eps)
    for qkv_w, qkv_b, o_w, o_b, ln1_w, ln1_b, i_w, i_b, f_w, f_b, ln2_w, ln2_b in blocks:
        q, k, v = F.linear(x, qkv_w, qkv_b).view(b, longest, 3, h, d // h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        a = a.transpose(1, 2).reshape(b, longest, d)
        x = F.layer_norm(F.linear(a, o_w, o_b) + x, (d,), ln1_w, ln1_b, eps=bert.eps)
        x = F.layer_norm(F.linear(bert.act(F.linear(x, i_w, i_b)), f_w, f_b) + x, (d,), ln2_w, ln2_b, eps=bert.eps)
    m = mask.unsqueeze(-1).to(x.dtype)
    return (x * m).sum(dim=1) / m.sum(dim=1)


def groups_of(prompts: list[str], extractor: Any, tokenizer: Any) -> list[list[list[int]]]:
    """Each prompt's distinct identities as token ids, as a cold lookup would embed them."""
    out = []
    for prompt in prompts:
        identities = sorted({e.identity for e in extractor.extract(prompt)})
        if identities:
            out.append([enc.ids for enc in tokenizer.encode_batch(identities)])
    return out


def measure(bert: Any, groups: list[list[list[int]]], repeat: int, seed: int) -> dict[str, Any]:
    """Per-prompt seconds of both forwards (interleaved, shuffled) and the lowest cosine between their vectors."""
    import torch

    times: dict[str, list[float]] = {"padded": [], "packed": []}
    blocks = out_in(bert)
    ways = {"padded": lambda g: padded_forward(bert, blocks, g), "packed": bert.pooled}
    rng = random.Random(seed)
    worst = 1.0
    with torch.inference_mode():
        for g in groups[:20]:  # warm both paths
            ways["padded"](g), ways["packed"](g)
        for _ in range(repeat):
            for g in groups:
                names = list(ways)
                rng.shuffle(names)
                outs = {}
                for name in names:
                    t0 = time.perf_counter()
                    out = ways[name](g)
                    times[name].append(time.perf_counter() - t0)
                    outs[name] = torch.nn.functional.normalize(out, dim=1)
                worst = min(worst, float((outs["packed"] * outs["padded"]).sum(dim=1).min()))
    return {"times": times, "worst_cos": worst, "tokens": [sum(map(len, g)) for g in groups],
            "padded_tokens": [len(g) * max(map(len, g)) for g in groups]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", action="append", help="prompt files (default: VBench and the style files)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import torch

    from comfyui_chai.cache_store.entities.embedders.minilm import MiniLMEmbedder
    from comfyui_chai.cache_store.entities.extract import EntityExtractor

    torch.set_num_threads(1)
    sets = ({p: [p] for p in args.prompts} if args.prompts else
            {"VBench": [str(DEFAULT_PROMPTS)],
             "style (7 files)": sorted(glob.glob(str(REPO / "bench/data/style_pairs/prompts_*.txt")))})
    embedder = MiniLMEmbedder(cache_size=0, precision="float32").load()  # both forwards as they were
    bert, tokenizer, extractor = embedder._bert, embedder._tokenizer, EntityExtractor()
    rows = []
    for name, files in sets.items():
        prompts = [p for f in files for p in load_prompts(f)]
        groups = groups_of(prompts, extractor, tokenizer)
        r = measure(bert, groups, args.repeat, args.seed)
        pad, pack = (np.array(r["times"][k]) * 1e3 for k in ("padded", "packed"))
        rows.append([name, len(groups), f"{np.mean(r['padded_tokens']):.1f} / {np.mean(r['tokens']):.1f}",
                     f"{np.median(pad):.2f} / {np.percentile(pad, 99):.2f}",
                     f"{np.median(pack):.2f} / {np.percentile(pack, 99):.2f}",
                     f"{np.median(pack / pad):.3f}", f"{r['worst_cos']:.7f}"])
    print(f"MiniLM forward per prompt's identities, torch threads 1, {args.repeat} rounds, interleaved (ms)")
    print(table(["prompts", "with entities", "tokens padded / real", "padded p50 / p99", "packed p50 / p99",
                 "packed / padded (median per prompt)", "lowest cosine"], rows))


if __name__ == "__main__":
    main()
