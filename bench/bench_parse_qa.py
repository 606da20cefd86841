"""Parser QA on fresh prompts: the extractor's main subjects and scenes against a labeller's (issue 25).

`bench/data/parse_qa/prompts.jsonl` holds 350 prompts in seven styles, written for the twentieth pass by a writer
who saw no other prompt of the pack, each with the main subject(s) and scene(s) an independent labeller read in it
(the labeller saw only the prompts). Half of each style is `dev` (read to find parse errors), half `test` (only
scored). A gold phrase is found when its last word (singular) is a word of an entity of that role; a predicted main
subject is right when its head noun is a word of a gold main phrase. Scenes count as found in a main or scene entity
(a place the prompt is about, "lighthouse", may be either). The labeller copied the prompts' typos; they are read
with the extractor's own spelling repair.

    python -m bench.bench_parse_qa                 # both splits, per style
    python -m bench.bench_parse_qa --split test
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from bench._common import table

DATA = Path(__file__).resolve().parent / "data" / "parse_qa" / "prompts.jsonl"
SPLITS = ("dev", "test")


def _words(texts, singular) -> set[str]:
    return {singular(w) for t in texts for w in t.lower().replace("-", " ").split() if w.isalpha()}


def _last(texts, singular) -> set[str]:
    out = set()
    for t in texts:
        ws = [w for w in t.lower().replace("-", " ").split() if w.isalpha()]
        if ws:
            out.add(singular(ws[-1]))
    return out


def score(rows: list[dict], extractor) -> dict[str, Counter]:
    """Per style: counts of gold mains found, predicted mains right, gold scenes found, prompts with no entity."""
    from comfyui_chai.cache_store.entities.casual import casual_spelling

    sing = extractor.words.singular

    def spelt(phrases: list[str]) -> list[str]:
        # the labeller copied the prompts' typos ("feild"); read them as the extractor reads the prompt
        return [extractor.words.correct_text(casual_spelling(p)) for p in phrases]

    out: dict[str, Counter] = {}
    for row, ents in zip(rows, extractor.extract_many([r["prompt"] for r in rows])):
        c = out.setdefault(row["style"], Counter())
        main = [e.text for e in ents if e.role == "main"]
        main_heads = {sing(e.head or e.text.split()[-1]) for e in ents if e.role == "main"}
        scene = [e.text for e in ents if e.role == "scene"]
        gold_main, gold_scene = _last(spelt(row["main"]), sing), _last(spelt(row["scene"]), sing)
        c["prompts"] += 1
        c["none"] += not ents
        c["gold_main"] += len(gold_main)
        c["main_found"] += len(gold_main & _words(main, sing))
        c["main_anywhere"] += len(gold_main & _words([e.text for e in ents], sing))
        said = _words(spelt(row["main"]), sing)
        predicted = main_heads  # a generic person's entity ends on its activity ("person slicing loaf")
        c["pred_main"] += len(predicted)
        c["pred_main_right"] += len(predicted & said)
        c["gold_scene"] += len(gold_scene)
        c["scene_found"] += len(gold_scene & _words(main + scene, sing))
    return out


def _rate(n: int, d: int) -> str:
    return f"{n / d:.3f}" if d else "-"


def main(argv: list[str] | None = None) -> int:
    """Print the per-style table of each split."""
    from comfyui_chai.cache_store.entities.extract import EntityExtractor

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=(*SPLITS, "both"), default="both")
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args(argv)
    rows = [json.loads(line) for line in args.data.read_text(encoding="utf-8").splitlines() if line.strip()]
    extractor = EntityExtractor()
    for split in SPLITS if args.split == "both" else (args.split,):
        per = score([r for r in rows if r["split"] == split], extractor)
        lines = []
        for style in [*sorted(per), "all"]:
            c = per[style] if style != "all" else sum(per.values(), Counter())
            lines.append([style, c["prompts"], _rate(c["main_found"], c["gold_main"]),
                          _rate(c["pred_main_right"], c["pred_main"]), _rate(c["main_anywhere"], c["gold_main"]),
                          _rate(c["scene_found"], c["gold_scene"]), c["none"]])
        print(f"\n{split}: {sum(per[s]['prompts'] for s in per)} prompts")
        print(table(["style", "prompts", "main found", "main right", "main anywhere", "scene found", "no entity"],
                    lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
