"""The toy world's own video feature extractor (its "I3D"): a small 3-D CNN trained once on ground-truth clips.

It learns two things from rendered clips only: the four attributes (scene, shape, colour, motion: layout and
content), and real vs degraded (blur, speckle noise, per-frame flicker, the average of two clips of one prompt:
what a sampler that averages outcomes produces). Its 32-d penultimate activations are the features of the
Frechet distance in `measures.py`, so the distance sees both layout and detail. Trained with a fixed seed by
`scripts/train_toy_features.py` (a few CPU minutes); the weights ship in `lab/measure_weights/`.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from comfyui_chai.toyworld.prompts import all_combos
from comfyui_chai.toyworld.world import COLOURS, MOTIONS, OBJECTS, SCENES, random_spec, render

FEATURE_DIM = 32
HEADS = {"scene": len(SCENES), "obj": len(OBJECTS), "colour": len(COLOURS), "motion": len(MOTIONS), "real": 2}
# Not in toyworld/weights/: that folder is listed by the model loader nodes, and this is no diffusion model.
WEIGHTS = Path(__file__).resolve().parent / "measure_weights" / "toyworld_features.safetensors"


class VideoFeatures(nn.Module):
    """Clips [B, T, H, W, 3] in [0, 1] -> features [B, 32]; `heads` give the training logits."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv3d(3, 24, 3, padding=1), nn.SiLU(),
            nn.Conv3d(24, 32, 3, stride=2, padding=1), nn.SiLU(),
            nn.Conv3d(32, 48, 3, stride=2, padding=1), nn.SiLU(),
            nn.Flatten(), nn.Linear(48 * 2 * 4 * 4, FEATURE_DIM), nn.SiLU())
        self.heads = nn.ModuleDict({k: nn.Linear(FEATURE_DIM, n) for k, n in HEADS.items()})

    def forward(self, clips: Tensor) -> Tensor:
        """32-d features of each clip."""
        return self.body(clips.permute(0, 4, 1, 2, 3) * 2.0 - 1.0)


def degrade(clip: np.ndarray, other: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One random degradation of a clip: blur, speckle, flicker or the average with another clip of its prompt."""
    kind = int(rng.integers(4))
    if kind == 0:
        w = float(rng.uniform(0.3, 0.8))
        pad = np.pad(clip, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")
        neigh = (pad[:, :-2, 1:-1] + pad[:, 2:, 1:-1] + pad[:, 1:-1, :-2] + pad[:, 1:-1, 2:]) / 4
        out = (1 - w) * clip + w * neigh
    elif kind == 1:
        out = clip + float(rng.uniform(0.03, 0.12)) * rng.standard_normal(clip.shape)
    elif kind == 2:
        out = clip + float(rng.uniform(0.03, 0.10)) * rng.standard_normal((clip.shape[0], *clip.shape[1:3], 1))
    else:
        w = float(rng.uniform(0.3, 0.5))
        out = (1 - w) * clip + w * other
    return np.clip(out, 0, 1).astype(np.float32)


def training_batch(rng: np.random.Generator, size: int) -> tuple[Tensor, dict[str, Tensor]]:
    """A batch of ground-truth clips (half of them degraded) with their labels."""
    combos = all_combos()
    clips, labels = [], {k: [] for k in HEADS}
    for i in range(size):
        combo = combos[int(rng.integers(len(combos)))]
        clip = render(random_spec(*combo, rng))
        real = i % 2 == 0
        if not real:
            clip = degrade(clip, render(random_spec(*combo, rng)), rng)
        clips.append(clip)
        for key, values, value in (("scene", SCENES, combo[0]), ("obj", OBJECTS, combo[1]),
                                   ("colour", COLOURS, combo[2]), ("motion", MOTIONS, combo[3])):
            labels[key].append(values.index(value))
        labels["real"].append(int(real))
    return torch.from_numpy(np.stack(clips)), {k: torch.tensor(v) for k, v in labels.items()}


def train(steps: int = 1500, batch: int = 48, seed: int = 0, lr: float = 2e-3,
          echo: Callable[[str], None] | None = print) -> tuple[VideoFeatures, dict[str, float]]:
    """Train the extractor from scratch (seeded); returns it with its held-out accuracies per head."""
    torch.manual_seed(seed)
    net = VideoFeatures()
    opt = torch.optim.AdamW(net.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
    loss_fn = nn.CrossEntropyLoss()
    t0 = time.perf_counter()
    for step in range(steps):
        x, y = training_batch(np.random.default_rng([seed, step]), batch)
        f = net(x)
        loss = sum(loss_fn(net.heads[k](f), y[k]) for k in HEADS)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if echo and (step + 1) % 100 == 0:
            echo(f"step {step + 1}  loss {float(loss):.3f}  {time.perf_counter() - t0:.0f} s")
    return net.eval(), evaluate(net, seed + 1)


@torch.no_grad()
def evaluate(net: VideoFeatures, seed: int, size: int = 512) -> dict[str, float]:
    """Accuracy of each head on fresh clips."""
    x, y = training_batch(np.random.default_rng([seed, 10**6]), size)
    f = net.eval()(x)
    return {k: float((net.heads[k](f).argmax(1) == y[k]).float().mean()) for k in HEADS}


def save(net: VideoFeatures, path: Path, facts: dict) -> None:
    """Write the weights as safetensors with training facts in the metadata."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path), {"facts": json.dumps(facts)})


_LOADED: dict[str, VideoFeatures] = {}


def load(path: Path | None = None) -> VideoFeatures:
    """The shipped extractor (eval mode, cached per path), with a clear error when the file is missing."""
    path = Path(path or WEIGHTS)
    key = str(path)
    if key not in _LOADED:
        if not path.is_file():
            raise FileNotFoundError(f"toy-world feature weights not found at {path}; rebuild them with "
                                    f"`python scripts/train_toy_features.py`")
        net = VideoFeatures()
        net.load_state_dict(load_file(str(path)))
        _LOADED[key] = net.eval()
    return _LOADED[key]


@torch.no_grad()
def features(clips: np.ndarray, net: VideoFeatures | None = None, batch: int = 256) -> np.ndarray:
    """Features [N, 32] of clips [N, T, H, W, 3]."""
    net = net or load()
    x = torch.as_tensor(np.asarray(clips, np.float32))
    return torch.cat([net(x[i:i + batch]) for i in range(0, len(x), batch)]).numpy().astype(np.float64)
