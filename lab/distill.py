"""Distil the lab's toy STDiT3 (30 Euler steps, CFG 2) into a 4-step student at guidance 1: the toy world's
analogue of the 4-step "lightning" LoRAs ComfyUI users run on Wan.

Method (segment distillation, one round of progressive distillation with guidance folded in): the teacher
integrates each caption's flow from noise with CFG on a fine grid that contains the student's schedule
(sigmas 1, 0.75, 0.5, 0.25, 0; `substeps` Euler steps per segment, 32 in all, about the teacher's own 30), and
keeps the latent at each student sigma. The student, initialised from the teacher, learns one Euler step per
segment: at (x_teacher(s_i), s_i), without the uncond pass, its velocity must carry x to x_teacher(s_{i+1}),
v* = (x_{i+1} - x_i) / (s_i - s_{i+1}). A restart that skips steps starts from a donor's x(s_i), which is a state of
the same kind, so the student needs no other sigmas.

Files in `out_dir`: `teacher.pt` (the teacher's states, filled in chunks: a killed run keeps what it made),
`distill_state.pt` (student, EMA, optimizer, step; atomic), `log.jsonl`, and at the end
`toyworld_detail_stdit3_4step.safetensors` (the EMA student with the recipe in its metadata).
"""
from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor, nn

from comfyui_chai.opensora.loading import read_checkpoint_header, save_stdit3
from comfyui_chai.opensora.sampler import make_noise, sample
from comfyui_chai.toyworld.model import DEFAULT_CFG, ToyVideoSpec, lab_weights, load_toy_model, toy_text_encoder
from comfyui_chai.toyworld.prompts import caption, make_split
from lab.train import _atomic_save, update_ema

TEACHER_FILE = "teacher.pt"
STATE_FILE = "distill_state.pt"
LOG_FILE = "log.jsonl"
STUDENT_NAME = "toyworld_detail_stdit3_4step.safetensors"
STUDENT_STEPS = 4


def student_sigmas(steps: int = STUDENT_STEPS) -> list[float]:
    """The student's schedule: uniform sigmas from 1 to 0 (the toy schedule, shift 1)."""
    return [1.0 - i / steps for i in range(steps + 1)]


@dataclass
class DistillConfig:
    """Teacher data, student training and budget of one distillation run."""

    out_dir: str
    teacher: str = ""  # the teacher's weights (empty: the shipped lab model)
    seed: int = 0
    clips: int = 1536  # teacher trajectories planned (captions of the training combinations, one seed each)
    use_clips: int | None = None  # make and train on only the first this many of them (None: all)
    substeps: int = 8  # teacher Euler steps per student segment
    teacher_cfg: float = DEFAULT_CFG
    chunk: int = 32  # trajectories per teacher batch (and per teacher.pt save)
    batch_size: int = 32
    lr: float = 2e-4
    warmup_steps: int = 50
    max_steps: int = 3000
    final_lr_ratio: float = 0.1
    ema_decay: float = 0.995
    grad_clip: float = 1.0
    minutes: float | None = None
    checkpoint_minutes: float = 5.0
    log_every: int = 25
    threads: int | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not str(self.out_dir):
            raise ValueError("out_dir is required")
        for name in ("clips", "substeps", "chunk", "batch_size", "max_steps", "log_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or not 0.0 <= self.ema_decay < 1.0 or not 0.0 < self.final_lr_ratio <= 1.0:
            raise ValueError("lr must be > 0, ema_decay in [0, 1), final_lr_ratio in (0, 1]")
        if self.minutes is not None and self.minutes <= 0:
            raise ValueError(f"minutes must be > 0, got {self.minutes}")


@torch.no_grad()
def teacher_states(model: Any, prompts: list[str], seeds: list[int], substeps: int, cfg: float,
                   steps: int = STUDENT_STEPS) -> Tensor:
    """[N, steps + 1, C, T, H, W]: the teacher's latent at each student sigma (index 0: the seeded noise)."""
    video, text = ToyVideoSpec(), toy_text_encoder()
    device = next(model.parameters()).device
    fine = torch.linspace(1.0, 0.0, steps * substeps + 1, dtype=torch.float64)
    noise = torch.cat([make_noise(video.latent_shape(1), int(s)) for s in seeds]).to(device)
    y, mask = text.encode(prompts)
    kept: list[Tensor] = []

    def keep(i: int, x: Tensor, s: float, v: Tensor) -> None:
        if i % substeps == 0:
            kept.append(x.detach().cpu().clone())

    uncond = model.null_caption(len(prompts), y.shape[2]) if cfg != 1.0 else None
    kwargs = {"mask": mask.to(device), **video.model_kwargs(len(prompts), device)}
    final = sample(model, noise, y.to(device), uncond, fine, cfg, keep, kwargs)
    kept.append(final.cpu())
    return torch.stack(kept, dim=1)


class Distiller:
    """The teacher data, the student, its EMA and optimizer, with resumable files."""

    def __init__(self, config: DistillConfig) -> None:
        self.config = config
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        self.device = torch.device(config.device)
        self.out = Path(config.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.teacher_path = Path(config.teacher) if config.teacher else lab_weights()
        self.teacher = load_toy_model(self.teacher_path, device=self.device)
        self.student = copy.deepcopy(self.teacher).train().requires_grad_(True)
        self.ema = copy.deepcopy(self.teacher).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.student.parameters(), lr=config.lr, weight_decay=0.0)
        self.text = toy_text_encoder()
        self.video = ToyVideoSpec()
        self.step = 0
        self.train_seconds = 0.0
        self.data: dict[str, Any] = {"prompts": [], "seeds": [], "states": []}

    # ---------------------------------------------------------------------------------------------- data

    def requests(self) -> tuple[list[str], list[int]]:
        """The teacher's captions (seeded phrasings of the training combinations) and noise seeds."""
        rng = np.random.default_rng(self.config.seed)
        train = make_split(0, 0.1).train
        combos = [train[int(i)] for i in rng.integers(0, len(train), size=self.config.clips)]
        return [caption(c, rng) for c in combos], [900_000 + i for i in range(self.config.clips)]

    def make_teacher_data(self, echo: Callable[[str], None] | None = print) -> None:
        """Fill teacher.pt chunk by chunk (continuing a partial file)."""
        cfg, path = self.config, self.out / TEACHER_FILE
        prompts, seeds = self.requests()
        if path.exists():
            self.data = torch.load(path, weights_only=False)
            if self.data["prompts"] != prompts[: len(self.data["prompts"])]:
                raise ValueError(f"{path} was made with other settings; remove it or use another --out")
        done = len(self.data["prompts"])
        wanted = cfg.clips if cfg.use_clips is None else min(cfg.clips, cfg.use_clips)
        t0 = time.perf_counter()
        while done < wanted:
            end = min(done + cfg.chunk, wanted)
            states = teacher_states(self.teacher, prompts[done:end], seeds[done:end], cfg.substeps, cfg.teacher_cfg)
            self.data["prompts"] += prompts[done:end]
            self.data["seeds"] += seeds[done:end]
            self.data["states"].append(states.to(torch.float32))
            _atomic_save(self.data, path)
            done = end
            if echo:
                echo(f"teacher {done}/{wanted} clips, {time.perf_counter() - t0:.0f} s")

    # ---------------------------------------------------------------------------------------------- train

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then cosine decay to lr * final_lr_ratio at max_steps."""
        cfg = self.config
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        done = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
        floor = cfg.lr * cfg.final_lr_ratio
        return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * done))

    def loss_on(self, step: int, states: Tensor, y: Tensor, mask: Tensor) -> Tensor:
        """MSE between the student's velocity and the teacher's segment velocity on a seeded batch."""
        cfg = self.config
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        n = states.shape[0]
        idx = torch.randint(0, n, (cfg.batch_size,), generator=gen)
        seg = torch.randint(0, STUDENT_STEPS, (cfg.batch_size,), generator=gen)
        sig = torch.tensor(student_sigmas(), dtype=torch.float32)
        x_i = states[idx, seg].to(self.device)
        x_next = states[idx, seg + 1].to(self.device)
        s, s_next = sig[seg].to(self.device), sig[seg + 1].to(self.device)
        target = (x_next - x_i) / (s - s_next).view(-1, 1, 1, 1, 1)
        out = self.student(x_i, s * 1000.0, y[idx].to(self.device), mask[idx].to(self.device),
                           **self.video.model_kwargs(cfg.batch_size, self.device))
        return (out[:, : x_i.shape[1]] - target).pow(2).mean()

    def train(self, echo: Callable[[str], None] | None = print) -> None:
        """Train until max_steps or the time budget, checkpointing; resumes from distill_state.pt."""
        cfg = self.config
        if (self.out / STATE_FILE).exists():
            self.load()
            if echo:
                echo(f"resumed at step {self.step}")
        states = torch.cat(self.data["states"])
        y, mask = self.text.encode(self.data["prompts"])
        start = last_ckpt = time.perf_counter()
        losses: list[float] = []
        while self.step < cfg.max_steps:
            if cfg.minutes is not None and time.perf_counter() - start >= cfg.minutes * 60:
                break
            t0 = time.perf_counter()
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr_at(self.step)
            loss = self.loss_on(self.step, states, y, mask)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(self.student.parameters(), cfg.grad_clip)
            self.optimizer.step()
            update_ema(self.ema, self.student, cfg.ema_decay, self.step)
            self.step += 1
            self.train_seconds += time.perf_counter() - t0
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(f"loss became {value} at step {self.step}")
            losses.append(value)
            if self.step % cfg.log_every == 0:
                record = {"step": self.step, "loss": sum(losses) / len(losses), "lr": self.lr_at(self.step - 1),
                          "train_minutes": self.train_seconds / 60}
                with open(self.out / LOG_FILE, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(record) + "\n")
                if echo:
                    echo(f"step {self.step:5d}  loss {record['loss']:.5f}  {record['train_minutes']:.1f} min")
                losses = []
            if time.perf_counter() - last_ckpt >= cfg.checkpoint_minutes * 60:
                self.save()
                last_ckpt = time.perf_counter()
        self.save()

    def save(self) -> None:
        """Write the student's training state atomically."""
        _atomic_save({"config": asdict(self.config), "step": self.step, "train_seconds": self.train_seconds,
                      "student": self.student.state_dict(), "ema": self.ema.state_dict(),
                      "optimizer": self.optimizer.state_dict()}, self.out / STATE_FILE)

    def load(self) -> None:
        """Restore the student's training state."""
        state = torch.load(self.out / STATE_FILE, map_location=self.device, weights_only=True)
        self.student.load_state_dict(state["student"])
        self.ema.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.train_seconds = int(state["step"]), float(state["train_seconds"])

    def export(self, path: Path | None = None) -> Path:
        """The EMA student as safetensors, its recipe (and the teacher's facts) in the metadata."""
        path = Path(path or self.out / STUDENT_NAME)
        teacher_facts = json.loads(read_checkpoint_header(self.teacher_path)[1].get("toyworld", "{}"))
        facts = dict(teacher_facts, distilled={
            "method": "segment distillation, guidance folded in", "steps": STUDENT_STEPS, "cfg": 1.0,
            "sigmas": student_sigmas(), "teacher": self.teacher_path.name, "teacher_cfg": self.config.teacher_cfg,
            "train_steps": self.step, "train_seconds": round(self.train_seconds, 1),
            "recipe": {k: v for k, v in asdict(self.config).items() if k not in ("out_dir", "teacher", "device")}})
        save_stdit3(self.ema.cpu(), path, {"toyworld": json.dumps(facts)})
        self.ema.to(self.device)
        return path


__all__ = ["DistillConfig", "Distiller", "teacher_states", "student_sigmas", "STUDENT_NAME", "STUDENT_STEPS"]
