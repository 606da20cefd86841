"""Benchmark: STDiT3 sampling through ComfyUI's KSampler path versus the pure-torch reference sampler (CPU).

Both sides run the same weights (fp32), the same noise, the same sigmas (the model's "simple" schedule) and CFG
with the cond/uncond pair batched; the ComfyUI side is `nodes.common_ksampler`, exactly what the KSampler node
calls (model loading, conditioning setup, preview callback and progress bar included). Runs alternate between
the two sides; the table shows the median time per denoising step and the ratio ComfyUI / reference (target:
<= 1.05). Needs a ComfyUI checkout and a Python that runs it:

    COMFYUI_DIR=/path/to/ComfyUI /path/to/comfy-venv/bin/python bench/bench_opensora_comfy.py --quick
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (STDiT3 config, latent [C, T, H, W], caption tokens)
CONFIGS = {
    "tiny": (dict(hidden_size=64, depth=2, num_heads=4, caption_channels=32, model_max_length=16), (4, 3, 8, 8), 8),
    "medium": (dict(hidden_size=384, depth=4, num_heads=6, caption_channels=1024, model_max_length=64),
               (4, 6, 16, 16), 64),
}


def setup_comfy() -> None:
    """Make ComfyUI importable (CPU mode) ahead of this repo, whose `nodes` package would shadow ComfyUI's."""
    comfy_dir = os.environ.get("COMFYUI_DIR")
    if not comfy_dir or not (Path(comfy_dir) / "nodes.py").is_file():
        raise SystemExit("set COMFYUI_DIR to a ComfyUI checkout and run with a Python that runs it")
    sys.path[:0] = [str(Path(comfy_dir).resolve()), str(REPO)]
    from comfy.cli_args import args

    args.cpu = True
    import comfy.model_management  # noqa: F401  (after args.cpu)


def build(name: str, seed: int = 0):
    """A random, well-scaled STDiT3 of configuration `name` (eval mode, fp32)."""
    import torch

    from comfyui_chai.opensora.stdit3 import STDiT3, STDiT3Config

    cfg, _, _ = CONFIGS[name]
    torch.manual_seed(seed)
    model = STDiT3(STDiT3Config(**cfg))
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim > 1:
                p.normal_(0.0, 0.5 / p.shape[-1] ** 0.5 if p.ndim == 2 else 0.2)
    return model.eval()


def bench_config(name: str, steps: int, repeats: int, cfg_scale: float) -> dict:
    """Median seconds per step on both paths, plus the largest output difference."""
    import torch

    import comfy.sample
    import comfy.samplers
    import nodes

    from comfyui_chai.opensora.comfy_model import load_opensora_model, null_caption
    from comfyui_chai.opensora.loading import save_stdit3
    from comfyui_chai.opensora.sampler import sample

    _, (c, t, h, w), tokens = CONFIGS[name]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.safetensors"
        save_stdit3(build(name), path)
        patcher = load_opensora_model(path, "fp32")
        from comfyui_chai.opensora.loading import load_stdit3

        reference = load_stdit3(path)
    caption_channels = reference.config.caption_channels
    cond = torch.randn(1, tokens, caption_channels, generator=torch.Generator().manual_seed(1))
    uncond = null_caption(patcher, tokens)
    latent = {"samples": torch.zeros(1, c, t, h, w)}
    seed = 42
    noise = comfy.sample.prepare_noise(latent["samples"], seed)
    sigmas = comfy.samplers.calculate_sigmas(patcher.get_model_object("model_sampling"), "simple", steps)
    kwargs = {"height": float(h * 8), "width": float(w * 8), "fps": 24.0}

    def run_reference() -> torch.Tensor:
        return sample(lambda x, ts, y, **kw: reference(x, ts, y, **kw), noise, cond, uncond, sigmas, cfg_scale,
                      model_kwargs=kwargs)

    def run_comfy() -> torch.Tensor:
        (out,) = nodes.common_ksampler(patcher, seed, steps, cfg_scale, "euler", "simple", [[cond, {}]],
                                       [[uncond, {}]], latent, denoise=1.0)
        return out["samples"]

    diff = (run_comfy() - run_reference()).abs().max().item()  # also warms both paths up
    wall: dict[str, list[float]] = {"reference": [], "comfy": []}
    cpu: dict[str, list[float]] = {"reference": [], "comfy": []}
    for _ in range(repeats):
        for side, fn in (("reference", run_reference), ("comfy", run_comfy)):
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            wall[side].append((time.perf_counter() - start) / steps)
            cpu[side].append((time.process_time() - start_cpu) / steps)
    out = {"name": name, "params": sum(p.numel() for p in reference.parameters()), "tokens": t * (h // 2) * (w // 2),
           "diff": diff}
    for kind, series in (("wall", wall), ("cpu", cpu)):
        ref_s, comfy_s = statistics.median(series["reference"]), statistics.median(series["comfy"])
        out[kind] = (ref_s, comfy_s, comfy_s / ref_s)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and repetitions (about a minute)")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps per run (default 10, quick 6)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per side (default 7, quick 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--configs", default="tiny,medium", help="comma-separated: tiny, medium")
    parser.add_argument("--cfg", type=float, default=7.0, help="guidance scale (default 7, Open-Sora's)")
    args = parser.parse_args()
    steps = args.steps or (6 if args.quick else 10)
    repeats = args.repeats or (3 if args.quick else 7)
    setup_comfy()
    import logging

    import torch

    logging.getLogger().setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    from bench._common import table

    import comfy.utils

    comfy.utils.PROGRESS_BAR_ENABLED = False
    rows = []
    for name in args.configs.split(","):
        r = bench_config(name.strip(), steps, repeats, args.cfg)
        rows.append([r["name"], f"{r['params'] / 1e6:.2f} M", r["tokens"],
                     *(f"{v * 1e3:.2f}" for v in r["cpu"][:2]), f"{r['cpu'][2]:.3f}",
                     *(f"{v * 1e3:.2f}" for v in r["wall"][:2]), f"{r['wall'][2]:.3f}", f"{r['diff']:.1e}"])
    print(f"STDiT3 per-step time, CPU fp32, {torch.get_num_threads()} thread(s), batch 1 with CFG (2 samples per "
          f"forward), {steps} euler steps, median of {repeats} alternating runs per side")
    print(table(["config", "params", "tokens", "ref cpu ms", "comfy cpu ms", "cpu ratio", "ref wall ms",
                 "comfy wall ms", "wall ratio", "max |diff|"], rows))
    print("ms per denoising step; ratio = ComfyUI KSampler / reference sampler (target <= 1.05). CPU time is the "
          "process's own; wall time also counts other load on the machine. max |diff| = largest difference of "
          "the final latents.")


if __name__ == "__main__":
    main()
