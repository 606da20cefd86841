"""Benchmark the OpenSora VAE v1.2 decode: time and peak memory per 17 frames (one 5-latent chunk) at 144p and
240p 9:16, for a tiny and the full temporal configuration (random weights), with and without tiling.

Each measurement runs in its own interpreter so that its peak memory is its own. "peak extra" is the highest
resident memory sampled during the decode minus the resident memory just before it (the weights are already
loaded); "weights" is the model size. The 2-D part is the `PatchSpatialDouble` stand-in of the tests
(tests/doubles.py) by default, so the numbers are the temporal VAE plus the pipeline; with `--comfyui DIR` (run
with that ComfyUI's Python) the full rows use ComfyUI's SDXL-sized AutoencoderKL with random weights as the 2-D
part, as the nodes do.

    python bench/bench_opensora_vae.py --quick        # tiny rows + full 144p untiled, a few minutes on 2 cores
    python bench/bench_opensora_vae.py                # all rows (the full 240p rows take minutes each on CPU)
    COMFYUI_DIR=... comfy-python bench/bench_opensora_vae.py --comfyui "$COMFYUI_DIR"
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MIB = 1024 * 1024
RESOLUTIONS = {"144p": (144, 256), "240p": (240, 426)}  # 9:16, H x W
CONFIGS = {
    "tiny": dict(filters=32, num_res_blocks=1, channel_multipliers=(1, 2, 2, 2)),
    "full": {},
}
TILING = dict(tile=16, overlap=4)  # latent pixels: 128-pixel tiles, 32 pixels shared
SDXL_DDCONFIG = {"double_z": True, "z_channels": 4, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 128,
                 "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [], "dropout": 0.0}


def rss_bytes() -> int:
    """Current resident memory of this process (0 where /proc is absent)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class PeakSampler:
    """Samples resident memory in a thread; `peak` is the highest value seen."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval, self.peak, self._stop = interval, rss_bytes(), False

    def _run(self) -> None:
        while not self._stop:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.interval)

    def __enter__(self) -> "PeakSampler":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def comfy_spatial(comfyui: str):
    """ComfyUI's SDXL-sized AutoencoderKL with random weights, wrapped as a SpatialVAE."""
    import torch

    sys.path.insert(0, comfyui)
    from comfy.cli_args import args

    args.cpu = True
    from comfy.ldm.models.autoencoder import AutoencoderKL

    from comfyui_chai.opensora.comfy_vae import ComfySpatialVAE

    model = AutoencoderKL(ddconfig=SDXL_DDCONFIG, embed_dim=4).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.ones_like(p) if "norm" in name and name.endswith("weight") else torch.zeros_like(p))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p[0].numel() ** 0.5)

    class Shim:  # the three attributes ComfySpatialVAE reads from comfy.sd.VAE
        first_stage_model, device, vae_dtype = model, torch.device("cpu"), torch.float32

    return ComfySpatialVAE(Shim()), "SDXL (ComfyUI)", sum(p.numel() for p in model.parameters())


def spatial_double() -> Any:
    """The tests' `PatchSpatialDouble` (tests/doubles.py, not part of the pack), loaded from its file."""
    spec = importlib.util.spec_from_file_location("chai_test_doubles", REPO / "tests" / "doubles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PatchSpatialDouble()


def worker(config: str, resolution: str, tiled: bool, dtype: str, reps: int, threads: int, comfyui: str) -> dict:
    """Decode one 17-frame chunk: peak memory of the first decode, median time of the later ones (if any)."""
    import torch

    from comfyui_chai.opensora.loading import parse_dtype
    from comfyui_chai.opensora.vae import OpenSoraVAE, Tiling
    from comfyui_chai.opensora.vae_temporal import TemporalPart, TemporalVAEConfig

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    temporal = TemporalPart(TemporalVAEConfig(**CONFIGS[config])).to(parse_dtype(dtype)).eval()
    spatial, spatial_name, spatial_params = spatial_double(), "double", 0
    if comfyui and config == "full":
        spatial, spatial_name, spatial_params = comfy_spatial(comfyui)
    pipe = OpenSoraVAE(temporal, spatial)
    h, w = RESOLUTIONS[resolution]
    z = torch.randn(pipe.latent_shape(17, h, w))
    tiling = Tiling(**TILING, temporal=True) if tiled else None
    with torch.no_grad():
        base = rss_bytes()
        with PeakSampler() as sampler:  # the first (cold) decode gives the memory figure
            t0 = time.perf_counter()
            out = pipe.decode(z, 17, tiling=tiling)
            times = [time.perf_counter() - t0]
        if reps > 1:  # warm repetitions give the time
            times = []
            for _ in range(reps - 1):
                t0 = time.perf_counter()
                pipe.decode(z, 17, tiling=tiling)
                times.append(time.perf_counter() - t0)
    weights = sum(t.numel() * t.element_size() for t in temporal.state_dict().values())
    return {"config": config, "resolution": resolution, "tiled": tiled, "dtype": dtype, "spatial": spatial_name,
            "out": list(out.shape), "latent": list(z.shape), "s": statistics.median(times),
            "temporal_params": sum(p.numel() for p in temporal.parameters()), "spatial_params": spatial_params,
            "weights_mib": weights / MIB, "peak_extra_mib": max(0, sampler.peak - base) / MIB}


def run_worker(argv: list[str], timeout: float) -> dict:
    """Run one measurement in a fresh interpreter."""
    try:
        out = subprocess.run([sys.executable, __file__, "--worker", *argv], capture_output=True, text=True,
                             timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if out.returncode:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(headers: list[str], rows: list[list[object]]) -> str:
    """Plain-text table, first column left-aligned."""
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def fmt(row: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    return "\n".join([fmt(cells[0]), "  ".join("-" * w for w in widths), *map(fmt, cells[1:])])


def main() -> None:
    """Run the measurements and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny rows and the full 144p untiled row only")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--reps", type=int, default=3,
                        help="decodes per tiny row: the first for memory, the rest timed (full rows: 1)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per measurement")
    parser.add_argument("--comfyui", default="", help="ComfyUI checkout: use its SDXL AutoencoderKL as 2-D part")
    parser.add_argument("--only", default="", help="run only rows whose label contains this, e.g. 'full 144p'")
    parser.add_argument("--worker", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        config, resolution, tiled, dtype, reps, threads, comfyui = args.worker
        print(json.dumps(worker(config, resolution, tiled == "1", dtype, int(reps), int(threads),
                                comfyui if comfyui != "-" else "")))
        return
    plan = [(c, r, t) for c in CONFIGS for r in RESOLUTIONS for t in (False, True)]
    if args.quick:
        plan = [p for p in plan if p[0] == "tiny" or p == ("full", "144p", False)]
    def label_of(config: str, resolution: str, tiled: bool) -> str:
        return f"{config} {resolution} {'tiled' if tiled else 'whole'}"

    plan = [p for p in plan if args.only in label_of(*p)]
    rows = []
    for config, resolution, tiled in plan:
        reps = args.reps if config == "tiny" else 1
        res = run_worker([config, resolution, "1" if tiled else "0", args.dtype, str(reps), str(args.threads),
                          args.comfyui or "-"], args.timeout)
        label = label_of(config, resolution, tiled)
        if "error" in res:
            rows.append([label, "-", "-", "-", "-", "-", res["error"][:60]])
        else:
            rows.append([label, f"{res['temporal_params'] / 1e6:.2f} M", res["spatial"],
                         "x".join(map(str, res["latent"][2:])), f"{res['s']:.2f}", f"{res['weights_mib']:.0f}",
                         f"{res['peak_extra_mib']:.0f}"])
        print(f"done: {label}", file=sys.stderr, flush=True)
    print(f"OpenSora VAE decode of one 17-frame chunk (5 latent frames), {args.dtype}, {args.threads} CPU threads, "
          f"random weights; tiles {TILING['tile'] * 8} px / overlap {TILING['overlap'] * 8} px (both parts)")
    print(table(["config / res / tiling", "temporal", "2-D part", "latent T x h x w", "s / 17 f",
                 "temporal weights MiB", "peak extra MiB"], rows))


if __name__ == "__main__":
    main()
