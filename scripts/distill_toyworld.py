"""Distil the lab's toy STDiT3 into a 4-step student at guidance 1 (`lab/distill.py`), resumable and time-budgeted.

    python scripts/distill_toyworld.py --out toy_distill --threads 1 --max-steps 1000 --use-clips 768
                                           # the shipped student (toyworld/weights/toyworld_detail_stdit3_4step)
    python scripts/distill_toyworld.py --out toy_distill --threads 2 --minutes 30    # a part; rerun to continue
    python scripts/distill_toyworld.py --out toy_gpu --device cuda --clips 8192 --max-steps 8000

The teacher's states go to OUT/teacher.pt chunk by chunk, the student's state to OUT/distill_state.pt; a rerun
continues both. At the end the EMA student is written to OUT/toyworld_detail_stdit3_4step.safetensors.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.distill import DistillConfig, Distiller  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Make the teacher data, train, export."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for teacher.pt, the state, the log and the weights")
    for f in fields(DistillConfig):
        if f.name == "out_dir":
            continue
        kind = {"int": int, "float": float, "str": str}.get(str(f.type).split(" ")[0], float)
        p.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default)
    args = vars(p.parse_args(argv))
    config = DistillConfig(out_dir=args.pop("out"), **args)
    distiller = Distiller(config)
    distiller.make_teacher_data()
    distiller.train()
    print(f"weights: {distiller.export()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
