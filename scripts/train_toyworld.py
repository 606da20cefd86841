"""Train the toy world's tiny STDiT3 with rectified flow (CPU by default), resumable and time-budgeted.

    python scripts/train_toyworld.py --out toy_ckpt --preset cpu                        # the first lab recipe
    python scripts/train_toyworld.py --out toy_wide --preset cpu-wide                   # the wide lab model, then
    python scripts/train_toyworld.py --out toy_wide_t --init-from toy_wide/train_state.pt --preset cpu-wide \
        --lr 3e-4 --temporal-weight 1 --steps 15200 --decay-steps 15200                 # its shipped fine-tune
    python scripts/train_toyworld.py --out toy_gpu --preset cuda                        # the wide model, GPU
    python scripts/train_toyworld.py --out toy_ckpt --minutes 50 --threads 2            # a first part
    python scripts/train_toyworld.py --out toy_ckpt --minutes 50 --threads 2 --resume   # the next part
    python scripts/train_toyworld.py --out toy_ckpt --export mid.safetensors            # weights of the last checkpoint

Every `--checkpoint-every` steps (and every `--checkpoint-minutes`) the full state is saved to
OUT/train_state.pt; `--resume` continues from it exactly. At the end the EMA weights are written to
OUT/toyworld_stdit3.safetensors and the loss / throughput log is OUT/log.jsonl.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.train import TrainConfig, Trainer  # noqa: E402


# The first lab recipe on this project's 2-core CPU (about 75 minutes at one thread), the wide one (the shipped lab
# model), and the wide model with four times the batch for an accelerator (17.8 MB; sized for about 10 minutes on an
# H100/H200-class GPU with 12 data workers rendering batches; not yet run on one).
PRESETS: dict[str, dict[str, object]] = {
    "cpu": {"hidden_size": 128, "depth": 4, "num_heads": 4, "batch_size": 16, "lr": 1e-3, "timesteps": "mixed",
            "timestep_shift": 2.0, "steps": 8500, "decay_steps": 8500, "threads": 1},
    # The wide lab model (issue 12): hidden 176 carries each token's 128 input values (8 frames x 2 x 2 x 4) with
    # room to spare; at 128 the model drew its grain anew in every frame. About 55 minutes at two threads.
    "cpu-wide": {"hidden_size": 176, "depth": 4, "num_heads": 4, "batch_size": 16, "lr": 1e-3, "timesteps": "mixed",
                 "timestep_shift": 2.0, "steps": 12500, "decay_steps": 12500, "threads": 2},
    "cuda": {"hidden_size": 176, "depth": 4, "num_heads": 4, "batch_size": 64, "lr": 5e-4, "timesteps": "mixed",
             "timestep_shift": 2.0, "steps": 6000, "decay_steps": 6000, "device": "cuda", "data_workers": 12,
             "minutes": 10.0},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (defaults: those of TrainConfig, or of --preset; explicit options win)."""
    d = TrainConfig(out_dir="-")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="a ready recipe: cpu (the first lab model), cpu-wide (the wide lab model) or cuda (a larger "
                        "model for a GPU)")
    p.add_argument("--data-workers", type=int, default=d.data_workers,
                   help="processes rendering upcoming batches (same batches as 0)")
    p.add_argument("--out", required=True, help="folder for the checkpoint, the log and the exported weights")
    p.add_argument("--resume", action="store_true", help="continue from OUT/train_state.pt if it exists")
    p.add_argument("--init-from", type=Path, default=None,
                   help="fine-tune: start from another run's train_state.pt (its step, weights and optimizer) or "
                        "exported .safetensors weights (fresh optimizer) with this run's settings; the earlier "
                        "settings are recorded in the weights' metadata")
    p.add_argument("--export", type=Path, default=None,
                   help="only write the EMA weights of OUT/train_state.pt to this file (no training; the run's "
                        "options must match the checkpoint's)")
    p.add_argument("--minutes", type=float, default=None, help="stop after this many minutes (this invocation)")
    p.add_argument("--steps", type=int, default=None, help="stop once this many steps are done in total")
    p.add_argument("--device", default=d.device, help="torch device (default cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--ema-decay", type=float, default=d.ema_decay)
    p.add_argument("--caption-dropout", type=float, default=d.caption_dropout)
    p.add_argument("--timesteps", choices=["logit_normal", "uniform", "mixed"], default=d.timesteps)
    p.add_argument("--decay-steps", type=int, default=d.decay_steps,
                   help="cosine-decay the learning rate to lr * --final-lr-ratio at this step (0 = constant)")
    p.add_argument("--final-lr-ratio", type=float, default=d.final_lr_ratio)
    p.add_argument("--timestep-shift", type=float, default=d.timestep_shift,
                   help="shift training sigmas toward high noise (1 = none)")
    p.add_argument("--object-weight", type=float, default=d.object_weight,
                   help="loss weight of object pixels relative to background (1 = plain MSE)")
    p.add_argument("--temporal-weight", type=float, default=d.temporal_weight,
                   help="weight of a loss on frame-to-frame differences of the velocity error (0 = none)")
    p.add_argument("--hidden-size", type=int, default=d.hidden_size)
    p.add_argument("--depth", type=int, default=d.depth)
    p.add_argument("--num-heads", type=int, default=d.num_heads)
    p.add_argument("--patch-t", type=int, default=d.patch_t, help="frames per patch (a divisor of the 8 frames)")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, help="steps between checkpoints")
    p.add_argument("--checkpoint-minutes", type=float, default=d.checkpoint_minutes)
    p.add_argument("--log-every", type=int, default=d.log_every)
    first, _ = p.parse_known_args(argv)
    if first.preset:
        p.set_defaults(**PRESETS[first.preset])
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run (or continue) training as the options say."""
    a = parse_args(argv)
    if a.minutes is None and a.steps is None and a.export is None:
        print("give --minutes and/or --steps (a budget)", file=sys.stderr)
        return 2
    config = TrainConfig(out_dir=a.out, seed=a.seed, batch_size=a.batch_size, lr=a.lr,
                         warmup_steps=a.warmup_steps, ema_decay=a.ema_decay, caption_dropout=a.caption_dropout,
                         timesteps=a.timesteps, timestep_shift=a.timestep_shift, decay_steps=a.decay_steps,
                         final_lr_ratio=a.final_lr_ratio, object_weight=a.object_weight,
                         temporal_weight=a.temporal_weight,
                         hidden_size=a.hidden_size, depth=a.depth, num_heads=a.num_heads,
                         patch_t=a.patch_t,
                         max_steps=a.steps, minutes=a.minutes, checkpoint_every=a.checkpoint_every,
                         checkpoint_minutes=a.checkpoint_minutes, log_every=a.log_every, device=a.device,
                         threads=a.threads, data_workers=a.data_workers)
    trainer = Trainer(config)
    if a.export is not None:
        if not trainer.state_path.exists():
            print(f"no checkpoint at {trainer.state_path}", file=sys.stderr)
            return 2
        trainer.load()
        print(f"step {trainer.step}: EMA weights written to {trainer.export(a.export)}")
        return 0
    if a.init_from is not None and not (a.resume and trainer.state_path.exists()):
        if a.init_from.suffix == ".safetensors":  # exported weights: a fresh optimizer
            trainer.init_from_weights(a.init_from)
        else:  # a train_state.pt: weights, optimizer and step, other settings
            trainer.load(a.init_from, strict=False)
        trainer.save()
        print(f"initialised from {a.init_from} at step {trainer.step}")
    trainer.run(resume=a.resume or a.init_from is not None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
