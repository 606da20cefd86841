"""Build the (request, donor) pairs of the hit-precision label set (issue 11): candidates, not labels.

Each prompt source (VBench and the prompt files we wrote in other styles, bench/data/hit_pairs/prompts_*.txt) is
shuffled with a fixed seed and split in half: donors fill one cache, requests are looked up. For each sampled
request the candidate donors are
  pack        the donor the pack picked at the given threshold (its hit, when it hit),
  near        the pack's pick at a low threshold (0.5) when it differs (its near misses),
  prompt_nn   the nearest donor by one MiniLM vector of the whole prompt (the NIRVANA-style baseline),
  shared_word a random donor sharing a noun lemma with the request (lexical overlap, any role),
  random      a random donor (a few, as negatives).
Pairs are deduplicated and written without any of the above (labellers see requests and donors only) to
pairs.jsonl; provenance.jsonl keeps the candidate kinds per pair id. Requests are assigned to the calibration or
held-out split by a hash of the request text (a held-out request never appears in calibration).

    .venv/bin/python scripts/make_hit_pairs.py --out bench/data/hit_pairs
    .venv/bin/python scripts/make_hit_pairs.py --out bench/data/style_pairs --no-vbench --requests 80 --id-prefix s \
        --extra

The second line builds issue 25's ComfyUI-style set from the prompt files in its folder alone (every request of a
style up to --requests; the source is the style).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
import tempfile
from comfyui_chai.cache_store.lookup.rule import HitRule
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import DEFAULT_PROMPTS, load_prompts  # noqa: E402

SHAPE = (1, 4, 2, 4, 4)
FINGERPRINT = "pairs"
REQUESTS_PER_SOURCE = {"vbench": 150, "short": 75, "cinematic": 60, "plain": 50, "nonenglish": 15}
HELD_OUT_SHARE = 1 / 3


def split_of(request: str) -> str:
    """'heldout' for about a third of the requests (by a hash of the text), else 'calib'."""
    h = int(hashlib.sha256(request.encode("utf-8")).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "heldout" if h < HELD_OUT_SHARE else "calib"


def sources(data: Path, vbench: bool = True) -> dict[str, list[str]]:
    """Prompt lists by source name."""
    out = {"vbench": load_prompts(DEFAULT_PROMPTS)} if vbench else {}
    for path in sorted(data.glob("prompts_*.txt")):
        out[path.stem.removeprefix("prompts_")] = load_prompts(path)
    return out


def main(argv: list[str] | None = None) -> int:
    """Write pairs.jsonl and provenance.jsonl."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "data" / "hit_pairs")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--threshold", type=float, default=0.70)
    ap.add_argument("--no-vbench", action="store_true", help="only the folder's prompts_*.txt files")
    ap.add_argument("--requests", type=int, default=None, help="requests per source (default: issue 11's counts)")
    ap.add_argument("--id-prefix", default="p", help="pair ids are this letter and a number")
    ap.add_argument("--extra", action="store_true",
                    help="also the second-nearest donor by whole prompt and a second donor sharing a noun")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from comfyui_chai.cache_store.config import StoreConfig
    from comfyui_chai.cache_store.entities.embedders import get_embedder
    from comfyui_chai.cache_store.entities.extract import EntityExtractor
    from comfyui_chai.cache_store.folder.store import CacheStore
    from comfyui_chai.cache_store.types import EmbeddedEntities

    rng = random.Random(args.seed)
    extractor, embedder = EntityExtractor(), get_embedder("minilm")
    donors: list[tuple[str, str]] = []   # (source, prompt)
    requests: list[tuple[str, str]] = []
    for name, prompts in sources(args.out, vbench=not args.no_vbench).items():
        prompts = list(dict.fromkeys(prompts))
        rng.shuffle(prompts)
        half = len(prompts) // 2
        donors += [(name, p) for p in prompts[:half]]
        per = args.requests if args.requests is not None else REQUESTS_PER_SOURCE.get(name, 50)
        requests += [(name, p) for p in prompts[half:][:per]]
    print(f"{len(donors)} donors, {len(requests)} requests", flush=True)

    def embed(prompt_list: list[str]) -> list[EmbeddedEntities]:
        ents = extractor.extract_many(prompt_list)
        return [EmbeddedEntities(tuple(e), embedder.embed([x.text for x in e]) if e else
                                 np.zeros((0, embedder.dim), np.float32), embedder.identity) for e in ents]

    donor_prompts = [p for _, p in donors]
    donor_ee = embed(donor_prompts)
    request_ee = embed([p for _, p in requests])
    donor_vec = embedder.embed(donor_prompts)
    request_vec = embedder.embed([p for _, p in requests])
    heads = [{e.head for e in ee.entities} for ee in donor_ee]

    work = Path(tempfile.mkdtemp(prefix="chai-pairs-"))
    try:
        store = CacheStore(work / "c", StoreConfig(budget_bytes=1 << 40))
        latents = {"a": torch.zeros(SHAPE)}
        by_prompt = {}
        for prompt, ee in zip(donor_prompts, donor_ee):
            if len(ee):
                by_prompt[prompt] = ee
                store.insert(prompt, ee, FINGERPRINT, latents, [0.5])

        def pick(ee: EmbeddedEntities, thr: float) -> str | None:
            if not len(ee):
                return None
            res = store.lookup(ee, FINGERPRINT, SHAPE, HitRule(thr), touch=False, load=False)
            return res.entry.prompt if res.hit else None

        pairs: dict[tuple[str, str], set[str]] = {}
        meta: dict[str, str] = {}
        for i, ((source, request), ee) in enumerate(zip(requests, request_ee)):
            meta[request] = source
            found: list[tuple[str, str]] = []
            for kind, thr in (("pack", args.threshold), ("near", 0.5)):
                donor = pick(ee, thr)
                if donor is not None:
                    found.append((kind, donor))
            order = np.argsort(-(donor_vec @ request_vec[i]))
            found.append(("prompt_nn", donor_prompts[int(order[0])]))
            mine = {e.head for e in ee.entities}
            sharing = [j for j, h in enumerate(heads) if h & mine and donor_prompts[j] != request]
            if sharing:
                found.append(("shared_word", donor_prompts[rng.choice(sharing)]))
            if args.extra:
                found.append(("prompt_nn2", donor_prompts[int(order[1])]))
                if len(sharing) > 1:
                    found.append(("shared_word2", donor_prompts[rng.choice(sharing)]))
            if rng.random() < 0.25:
                found.append(("random", donor_prompts[rng.randrange(len(donor_prompts))]))
            for kind, donor in found:
                if donor != request:
                    pairs.setdefault((request, donor), set()).add(kind)
        store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    items = list(pairs.items())
    rng.shuffle(items)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "pairs.jsonl", "w", encoding="utf-8") as f, \
            open(args.out / "provenance.jsonl", "w", encoding="utf-8") as g:
        for n, ((request, donor), kinds) in enumerate(items):
            pid = f"{args.id_prefix}{n:04d}"
            f.write(json.dumps({"id": pid, "request": request, "donor": donor}, ensure_ascii=False) + "\n")
            g.write(json.dumps({"id": pid, "source": meta[request], "split": split_of(request),
                                "candidates": sorted(kinds)}, ensure_ascii=False) + "\n")
    counts: dict[str, int] = {}
    for _, kinds in items:
        for k in kinds:
            counts[k] = counts.get(k, 0) + 1
    print(f"{len(items)} pairs; candidates by kind: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
