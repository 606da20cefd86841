"""Rectified-flow training of the toy world's tiny STDiT3: seeded, reproducible, resumable, time-budgeted.

Each step draws its batch, noise, timesteps and caption dropout from generators seeded by (seed, step) only,
so a run resumed from a checkpoint continues exactly as an uninterrupted one would (same thread count and
device). The loss is the mean squared error of the predicted velocity v = x0 - noise at
x_t = (1 - sigma) x0 + sigma noise, Open-Sora's convention (timestep = 1000 sigma); the shipped weights are an
exponential moving average of the trained ones.

Files in `out_dir`: `train_state.pt` (model, EMA, optimizer, step; written atomically every
`checkpoint_every` steps or `checkpoint_minutes`, and at the end), `log.jsonl` (one line per `log_every` steps:
step, loss, clips/s) and, at the end, `toyworld_stdit3.safetensors` (the EMA model, loadable by
`opensora.loading.load_stdit3`, toy-world facts in its metadata).
"""
from __future__ import annotations

import copy
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from comfyui_chai.opensora import stdit3
from comfyui_chai.opensora.loading import save_stdit3
from comfyui_chai.toyworld.latent import LATENT_SCALE
from comfyui_chai.toyworld.model import (DEFAULT_SHIFT, TEXT_DIM, TEXT_TOKENS, ToyVideoSpec, toy_config,
                                          toy_text_encoder)
from comfyui_chai.toyworld.prompts import make_split
from comfyui_chai.toyworld.world import FRAMES, SIZE, WORLD_VERSION
from lab.data import Prefetcher, step_generator

STATE_FILE = "train_state.pt"
LOG_FILE = "log.jsonl"
WEIGHTS_FILE = "toyworld_stdit3.safetensors"
TIMESTEP_SAMPLERS = ("logit_normal", "uniform", "mixed")
# Fields that change what is trained; a resumed run must keep them (budgets, logging and device may change; the
# lr decay's end, decay_steps, is a budget: a run resumed with a new step budget may move it).
RUN_FIELDS = ("seed", "batch_size", "lr", "warmup_steps", "weight_decay", "grad_clip", "ema_decay",
              "caption_dropout", "timesteps", "timestep_shift", "object_weight", "temporal_weight", "hidden_size",
              "depth", "num_heads", "mlp_ratio", "patch_t", "split_seed", "held_out_fraction")


@dataclass
class TrainConfig:
    """Hyper-parameters, budget and bookkeeping of one training run."""

    out_dir: str
    seed: int = 0
    batch_size: int = 16
    lr: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ema_decay: float = 0.998
    caption_dropout: float = 0.1
    timesteps: str = "logit_normal"
    # Training sigmas are shifted toward high noise (s -> k s / (1 + (k - 1) s)): from pure noise the model must
    # place the object and its motion from the caption alone, and logit-normal(0, 1) puts only 8% of its samples
    # above sigma 0.8, where that happens (a model trained so denoised visible objects perfectly yet sampled blobs).
    timestep_shift: float = 2.0
    # Cosine decay of the learning rate from lr (after warm-up) to lr * final_lr_ratio at decay_steps (0: constant).
    # The last, low-lr stretch is what cleans up fine detail: a constant lr leaves the low-noise end speckled.
    decay_steps: int = 0
    final_lr_ratio: float = 0.05
    object_weight: float = 2.0  # loss weight of the object's pixels (and their neighbours) relative to the rest
    # Weight of an extra loss on the frame-to-frame differences of the velocity error. It has the same minimiser
    # as the plain loss (a quadratic form of the error), but it weighs the temporally incoherent part of the error
    # more: the part that samples show as ghost trails and flicker.
    temporal_weight: float = 0.0
    hidden_size: int = 128
    depth: int = 4
    num_heads: int = 4
    mlp_ratio: float = 4.0
    # Frames per patch. 8 = the whole clip: each token carries its cell's trajectory, so motion can be placed from
    # the caption at high noise (STDiT3 has no absolute frame embedding; 2-frame patches learned motion only once
    # it was visible), and 64 tokens train 3x faster than 256.
    patch_t: int = 8
    split_seed: int = 0
    held_out_fraction: float = 0.1
    max_steps: int | None = None  # stop after this many steps in total (None: no step limit)
    minutes: float | None = None  # stop after this many minutes of this invocation (None: no time limit)
    checkpoint_every: int = 500
    checkpoint_minutes: float = 10.0
    log_every: int = 20
    device: str = "cpu"
    threads: int | None = None
    data_workers: int = 0  # processes rendering upcoming batches (0: in the training process); same batches

    def __post_init__(self) -> None:
        if not str(self.out_dir):
            raise ValueError("out_dir is required")
        for name in ("batch_size", "hidden_size", "depth", "num_heads", "patch_t", "checkpoint_every",
                     "log_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip <= 0:
            raise ValueError("lr and grad_clip must be > 0, warmup_steps and weight_decay >= 0")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
        if not 0.0 <= self.caption_dropout < 1.0:
            raise ValueError(f"caption_dropout must be in [0, 1), got {self.caption_dropout}")
        if not self.timestep_shift > 0:
            raise ValueError(f"timestep_shift must be > 0, got {self.timestep_shift}")
        if self.decay_steps < 0 or not 0.0 < self.final_lr_ratio <= 1.0:
            raise ValueError("decay_steps must be >= 0 and final_lr_ratio in (0, 1]")
        if self.timesteps not in TIMESTEP_SAMPLERS:
            raise ValueError(f"timesteps must be one of {TIMESTEP_SAMPLERS}, got {self.timesteps!r}")
        if self.object_weight < 1.0:
            raise ValueError(f"object_weight must be >= 1, got {self.object_weight}")
        if self.temporal_weight < 0.0:
            raise ValueError(f"temporal_weight must be >= 0, got {self.temporal_weight}")
        if self.max_steps is not None and self.max_steps < 0:
            raise ValueError(f"max_steps must be >= 0, got {self.max_steps}")
        if self.minutes is not None and self.minutes <= 0:
            raise ValueError(f"minutes must be > 0, got {self.minutes}")
        if self.checkpoint_minutes <= 0:
            raise ValueError(f"checkpoint_minutes must be > 0, got {self.checkpoint_minutes}")
        if self.data_workers < 0:
            raise ValueError(f"data_workers must be >= 0, got {self.data_workers}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    def run_fields(self) -> dict[str, Any]:
        """The fields a resumed run must share with the checkpoint."""
        return {k: getattr(self, k) for k in RUN_FIELDS}


@torch.no_grad()
def init_weights(model: nn.Module) -> None:
    """DiT-style initialisation: Xavier linears, zero biases, small embedders, zeroed output projections."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    conv = model.x_embedder.proj
    nn.init.xavier_uniform_(conv.weight.view(conv.weight.shape[0], -1))
    nn.init.zeros_(conv.bias)
    for mlp in (model.t_embedder.mlp, model.fps_embedder.mlp):
        for layer in mlp:
            if isinstance(layer, nn.Linear):
                nn.init.normal_(layer.weight, std=0.02)
    nn.init.normal_(model.t_block[1].weight, std=0.02)
    for layer in (model.y_embedder.y_proj.fc1, model.y_embedder.y_proj.fc2):
        nn.init.normal_(layer.weight, std=0.02)
    # Zero the cross-attention outputs and the final projection: every block starts as the identity on its
    # residual stream and the model starts by predicting zero velocity.
    for block in [*model.spatial_blocks, *model.temporal_blocks]:
        nn.init.zeros_(block.cross_attn.proj.weight)
    nn.init.zeros_(model.final_layer.linear.weight)


def sample_sigmas(kind: str, batch: int, gen: torch.Generator, shift: float = 1.0) -> Tensor:
    """Training sigmas in (0, 1): logit-normal(0, 1) or uniform, then shifted toward high noise by `shift`;
    "mixed": the first half of the batch shifted logit-normal, the second half plain uniform, so the low-noise end
    (where fine detail is settled) is trained as often as the high-noise end (where layout is)."""
    if kind == "mixed":
        half = batch // 2
        return torch.cat([sample_sigmas("logit_normal", half, gen, shift),
                          sample_sigmas("uniform", batch - half, gen, 1.0)])
    if kind == "logit_normal":
        s = torch.sigmoid(torch.randn(batch, generator=gen))
    elif kind == "uniform":
        s = torch.rand(batch, generator=gen).clamp(1e-4, 1 - 1e-4)
    else:
        raise ValueError(f"unknown timestep sampler {kind!r}")
    return shift * s / (1 + (shift - 1) * s)


def object_halo(objects: Tensor) -> Tensor:
    """Object masks [B, 1, T, H, W] grown by one pixel in each direction within each frame (3x3 max-pool)."""
    b, c, t, h, w = objects.shape
    flat = objects.transpose(1, 2).reshape(b * t, c, h, w)
    grown = nn.functional.max_pool2d(flat, kernel_size=3, stride=1, padding=1)
    return grown.reshape(b, t, c, h, w).transpose(1, 2)


@torch.no_grad()
def update_ema(ema: nn.Module, model: nn.Module, decay_cap: float, step: int) -> None:
    """One EMA step of `model` into `ema`, its decay ramping up to `decay_cap` over the first steps; buffers copied."""
    decay = min(decay_cap, (1 + step) / (10 + step))
    for e, p in zip(ema.parameters(), model.parameters()):
        e.mul_(decay).add_(p.detach(), alpha=1 - decay)
    for e, b in zip(ema.buffers(), model.buffers()):
        e.copy_(b)


def _atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temporary file, fsync, then rename over `path`."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class Trainer:
    """One training run: model, EMA copy, optimizer and the step counter, with checkpoint save and resume."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        self.device = torch.device(config.device)
        torch.manual_seed(config.seed)
        self.model_config = toy_config(config.hidden_size, config.depth, config.num_heads, config.mlp_ratio,
                                       config.patch_t)
        self.model = stdit3.STDiT3(self.model_config).to(self.device)
        init_weights(self.model)
        self.ema = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, betas=(0.9, 0.999),
                                           weight_decay=config.weight_decay)
        self.split = make_split(config.split_seed, config.held_out_fraction)
        self.text = toy_text_encoder()
        self.video = ToyVideoSpec()
        self.step = 0
        self.train_seconds = 0.0
        self.lineage: list[dict[str, Any]] = []  # earlier settings of a fine-tuned run, oldest first
        self.out_dir = Path(config.out_dir)
        self.batches = Prefetcher(self.split.train, config.batch_size, config.seed, self.text, 0)

    # ---------------------------------------------------------------------------------------------- steps

    def lr_at(self, step: int) -> float:
        """Learning rate of a step: linear warm-up, then constant or cosine-decayed to `decay_steps`."""
        cfg = self.config
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        if cfg.decay_steps <= cfg.warmup_steps:
            return cfg.lr
        done = min(1.0, (step - cfg.warmup_steps) / (cfg.decay_steps - cfg.warmup_steps))
        floor = cfg.lr * cfg.final_lr_ratio
        return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * done))

    def loss_on(self, step: int) -> Tensor:
        """The training loss of a step's batch under the current weights (with gradients)."""
        return self.losses_on(step)[0]

    def losses_on(self, step: int) -> tuple[Tensor, Tensor]:
        """(training loss, plain velocity MSE) of a step's batch; they differ when object_weight > 1."""
        cfg = self.config
        batch = self.batches.get(step)
        gen = step_generator(cfg.seed, step)
        noise = torch.randn(batch.x0.shape, generator=gen)
        sigma = sample_sigmas(cfg.timesteps, cfg.batch_size, gen, cfg.timestep_shift)
        drop = torch.rand(cfg.batch_size, generator=gen) < cfg.caption_dropout
        dev = self.device
        x0, noise, sigma = batch.x0.to(dev), noise.to(dev), sigma.to(dev)
        s = sigma.view(-1, 1, 1, 1, 1)
        x_t = (1 - s) * x0 + s * noise
        out = self.model(x_t, sigma * 1000.0, batch.y.to(dev), batch.mask.to(dev),
                         y_drop=drop.to(dev), **self.video.model_kwargs(cfg.batch_size, dev))
        diff = out[:, : x0.shape[1]] - (x0 - noise)
        err = diff.pow(2)
        plain = err.mean()
        if cfg.object_weight == 1.0:
            loss = plain
        else:
            weight = 1.0 + (cfg.object_weight - 1.0) * object_halo(batch.objects).to(dev)
            loss = (err * weight).sum() / (weight.sum() * err.shape[1])
        if cfg.temporal_weight > 0.0:
            loss = loss + cfg.temporal_weight * (diff[:, :, 1:] - diff[:, :, :-1]).pow(2).mean()
        return loss, plain

    def train_step(self) -> float:
        """One optimisation step (and EMA update); returns the plain velocity MSE of its batch."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.step)
        self.model.train()
        loss, plain = self.losses_on(self.step)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self._update_ema()
        self.step += 1
        return float(plain.detach())

    def _update_ema(self) -> None:
        update_ema(self.ema, self.model, self.config.ema_decay, self.step)

    # ---------------------------------------------------------------------------------------------- files

    @property
    def state_path(self) -> Path:
        """Path of the resumable training state."""
        return self.out_dir / STATE_FILE

    def save(self, path: Path | None = None) -> Path:
        """Write the training state atomically (default: out_dir/train_state.pt)."""
        path = Path(path or self.state_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_save({"version": 1, "run": self.config.run_fields(), "lineage": self.lineage, "step": self.step,
                      "train_seconds": self.train_seconds, "model": self.model.state_dict(),
                      "ema": self.ema.state_dict(), "optimizer": self.optimizer.state_dict()}, path)
        return path

    def load(self, path: Path | None = None, strict: bool = True) -> None:
        """Restore a training state written by `save`; its run fields must equal this config's unless not strict
        (a fine-tune: the other settings are kept in `lineage`, and in the exported weights' metadata)."""
        path = Path(path or self.state_path)
        state = torch.load(path, map_location=self.device, weights_only=True)
        mine = self.config.run_fields()
        # A field added after a checkpoint was written had its default then.
        theirs = {k: TrainConfig.__dataclass_fields__[k].default for k in RUN_FIELDS} | state.get("run", {})
        diff = {k: (theirs.get(k), v) for k, v in mine.items() if theirs.get(k) != v}
        if diff and strict:
            raise ValueError(f"{path} was trained with other settings (checkpoint, now): {diff}")
        self.lineage = list(state.get("lineage", []))
        if diff:
            self.lineage.append({"until_step": int(state["step"]), "run": theirs})
        self.model.load_state_dict(state["model"])
        self.ema.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.train_seconds = float(state["train_seconds"])

    def init_from_weights(self, path: Path) -> None:
        """Start from exported weights (model and EMA both take them; a fresh optimizer; the step they record)."""
        from comfyui_chai.opensora.loading import load_stdit3, read_checkpoint_header

        facts = json.loads(read_checkpoint_header(path)[1].get("toyworld", "{}"))
        weights = load_stdit3(path, device=self.device).state_dict()
        self.model.load_state_dict(weights)
        self.ema.load_state_dict(weights)
        self.step = int(facts.get("steps", 0))
        self.train_seconds = float(facts.get("train_seconds", 0.0))
        self.lineage = list(facts.get("lineage", [])) + [{"until_step": self.step, "run": facts.get("run", {}),
                                                          "weights": Path(path).name}]

    def export(self, path: Path | None = None) -> Path:
        """Write the EMA model as safetensors with the toy world's facts in the metadata."""
        path = Path(path or self.out_dir / WEIGHTS_FILE)
        path.parent.mkdir(parents=True, exist_ok=True)
        facts = {"world": WORLD_VERSION, "steps": self.step, "train_seconds": round(self.train_seconds, 1), "seed": self.config.seed,
                 "batch_size": self.config.batch_size, "split_seed": self.config.split_seed,
                 "held_out_fraction": self.config.held_out_fraction, "size": SIZE, "frames": FRAMES,
                 "latent_scale": LATENT_SCALE, "text_dim": TEXT_DIM, "text_tokens": TEXT_TOKENS,
                 "shift": DEFAULT_SHIFT, "run": self.config.run_fields(), "lineage": self.lineage}
        save_stdit3(self.ema.cpu(), path, {"toyworld": json.dumps(facts)})
        self.ema.to(self.device)
        return path

    def _log(self, record: dict[str, Any]) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / LOG_FILE, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def _trim_log(self) -> None:
        """Drop log lines past the resumed step (written after the last checkpoint of an interrupted run)."""
        log = self.out_dir / LOG_FILE
        if not log.exists():
            return
        keep = [line for line in log.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= self.step]
        log.write_text("".join(line + "\n" for line in keep), encoding="utf-8")

    # ---------------------------------------------------------------------------------------------- loop

    def run(self, resume: bool = False, echo: Callable[[str], None] | None = print) -> dict[str, Any]:
        """Train until the step or time budget is spent, checkpointing and logging; export at the end."""
        cfg = self.config
        if resume and self.state_path.exists():
            self.load()
            self._trim_log()
            if echo:
                echo(f"resumed at step {self.step} ({self.train_seconds / 60:.1f} min trained)")
        self.batches.close()
        self.batches = Prefetcher(self.split.train, cfg.batch_size, cfg.seed, self.text, cfg.data_workers)
        try:
            return self._loop(echo)
        finally:
            self.batches.close()

    def _loop(self, echo: Callable[[str], None] | None) -> dict[str, Any]:
        cfg = self.config
        start = last_ckpt = last_log = time.perf_counter()
        losses: list[float] = []
        log_step = self.step
        while cfg.max_steps is None or self.step < cfg.max_steps:
            if cfg.minutes is not None and time.perf_counter() - start >= cfg.minutes * 60:
                break
            t0 = time.perf_counter()
            loss = self.train_step()
            self.train_seconds += time.perf_counter() - t0
            if not math.isfinite(loss):
                raise FloatingPointError(f"loss became {loss} at step {self.step}")
            losses.append(loss)
            now = time.perf_counter()
            if self.step % cfg.log_every == 0:
                clips = (self.step - log_step) * cfg.batch_size
                record = {"step": self.step, "loss": sum(losses) / len(losses),
                          "clips_per_s": clips / max(now - last_log, 1e-9), "lr": self.lr_at(self.step - 1),
                          "train_minutes": self.train_seconds / 60}
                self._log(record)
                if echo:
                    echo(f"step {self.step:6d}  loss {record['loss']:.4f}  {record['clips_per_s']:.1f} clips/s  "
                         f"{record['train_minutes']:.1f} min")
                losses, last_log, log_step = [], now, self.step
            if self.step % cfg.checkpoint_every == 0 or now - last_ckpt >= cfg.checkpoint_minutes * 60:
                self.save()
                last_ckpt = time.perf_counter()
        self.save()
        weights = self.export()
        if echo:
            echo(f"stopped at step {self.step}; state {self.state_path}; weights {weights}")
        return {"step": self.step, "train_seconds": self.train_seconds, "weights": str(weights)}

