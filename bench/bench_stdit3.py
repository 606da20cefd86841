"""Benchmark STDiT3 on CPU: per-step forward time and peak memory (tiny and medium configurations, fp32 and
bf16), checkpoint loading (time and peak memory against the file size), and the XL/2 size per dtype (meta device).

Prints tables only. Each measurement runs in its own interpreter so that peak RSS belongs to it alone; "peak
extra" is the process's peak resident memory minus its resident memory just before the measured work.

    python bench/bench_stdit3.py --quick          # under a minute
    python bench/bench_stdit3.py                  # more repetitions
    python bench/bench_stdit3.py --threads 2
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (model config, latent [C, T, H, W], caption tokens); batch 2 = one CFG pair
CONFIGS = {
    "tiny": (dict(hidden_size=64, depth=2, num_heads=4, caption_channels=32, model_max_length=8), (4, 3, 8, 8), 8),
    "medium": (dict(hidden_size=384, depth=4, num_heads=6, caption_channels=1024, model_max_length=64),
               (4, 6, 16, 16), 64),
}
DTYPES = ("fp32", "bf16")
MIB = 1024 * 1024


def rss_bytes() -> int:
    """Current resident set size of this process."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: fall back to the peak, which makes "extra" a lower bound
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class AnonPeak:
    """Samples the anonymous (non file-backed) resident memory in a thread; `peak` is the highest value seen."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.peak = self.read()
        self._stop = False

    @staticmethod
    def read() -> int:
        """RssAnon of this process in bytes (0 where /proc is absent)."""
        try:
            with open("/proc/self/status") as fh:
                for line in fh:
                    if line.startswith("RssAnon:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def _run(self) -> None:
        while not self._stop:
            self.peak = max(self.peak, self.read())
            time.sleep(self.interval)

    def __enter__(self) -> "AnonPeak":
        import threading

        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join()
        self.peak = max(self.peak, self.read())


def worker_forward(name: str, dtype: str, reps: int, threads: int) -> dict:
    """Time `reps` forward passes of one configuration in one dtype."""
    import torch

    from comfyui_chai.opensora.loading import parse_dtype
    from comfyui_chai.opensora.stdit3 import STDiT3, STDiT3Config

    torch.set_num_threads(threads)
    cfg_kw, latent, tokens = CONFIGS[name]
    torch.manual_seed(0)
    model = STDiT3(STDiT3Config(**cfg_kw)).to(parse_dtype(dtype)).eval()
    cfg = model.config
    x = torch.randn(2, *latent)
    y = torch.randn(2, 1, tokens, cfg.caption_channels)
    mask = torch.ones(2, tokens, dtype=torch.long)
    mask[:, tokens * 3 // 4:] = 0
    ts = torch.tensor([900.0, 900.0])
    base = rss_bytes()
    times = []
    with torch.no_grad():
        model(x, ts, y, mask)  # warm-up
        for _ in range(reps):
            t0 = time.perf_counter()
            model(x, ts, y, mask)
            times.append(time.perf_counter() - t0)
    grid = model.patch_grid(*latent[1:])
    return {
        "config": name, "dtype": dtype, "params": sum(p.numel() for p in model.parameters()),
        "tokens": math.prod(grid), "ms": 1000 * statistics.median(times), "ms_min": 1000 * min(times),
        "peak_extra_mib": max(0, peak_rss_bytes() - base) / MIB,
    }


def worker_load(path: str, dtype: str, threads: int) -> dict:
    """Load a checkpoint once and report time and peak memory above the interpreter's baseline."""
    import torch

    from comfyui_chai.opensora.loading import load_stdit3

    torch.set_num_threads(threads)
    base, anon_base = rss_bytes(), AnonPeak.read()
    with AnonPeak() as anon:
        t0 = time.perf_counter()
        model = load_stdit3(path, dtype)
        elapsed = time.perf_counter() - t0
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return {"dtype": dtype, "s": elapsed, "peak_extra_mib": max(0, peak_rss_bytes() - base) / MIB,
            "anon_extra_mib": max(0, anon.peak - anon_base) / MIB, "weights_mib": weights / MIB}


def run_worker(args: list[str]) -> dict:
    """Run this script as a worker in a fresh interpreter and parse its JSON line."""
    out = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip()[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def xl2_sizes() -> list[tuple[str, int, float]]:
    """(dtype, bytes of weights+buffers, GB) of STDiT3-XL/2 built on the meta device."""
    import torch

    from comfyui_chai.opensora.stdit3 import STDiT3

    with torch.device("meta"):
        model = STDiT3()
    params = sum(p.numel() for p in model.parameters())
    total = sum(t.numel() for t in model.state_dict().values())
    print(f"\nSTDiT3-XL/2 (meta device): {len(model.state_dict())} tensors, {params:,} parameters "
          f"({params / 1e9:.3f} B), {total:,} elements with buffers (y_embedding, rope.freqs)")
    rows = []
    for name, size in (("fp32", 4), ("fp16", 2), ("bf16", 2)):
        rows.append((name, total * size, total * size / 1e9))
    return rows


def main() -> None:
    """Parse arguments and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="few repetitions (under a minute)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per measurement (default 1)")
    parser.add_argument("--reps", type=int, default=None, help="timed forward passes per row")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        if kind == "forward":
            result = worker_forward(rest[0], rest[1], int(rest[2]), int(rest[3]))
        else:
            result = worker_load(rest[0], rest[1], int(rest[2]))
        print(json.dumps(result))
        return

    reps = args.reps or (3 if args.quick else 10)
    print(f"STDiT3 forward on CPU, batch 2 (one CFG pair), {args.threads} thread(s), median of {reps}")
    print(f"{'config':<8} {'dtype':<5} {'params':>11} {'tokens':>7} {'ms/step':>9} {'min ms':>8} "
          f"{'peak extra MiB':>15}")
    for name in CONFIGS:
        for dtype in DTYPES:
            r = run_worker(["forward", name, dtype, str(reps), str(args.threads)])
            print(f"{r['config']:<8} {r['dtype']:<5} {r['params']:>11,} {r['tokens']:>7} {r['ms']:>9.1f} "
                  f"{r['ms_min']:>8.1f} {r['peak_extra_mib']:>15.1f}")

    import torch

    from comfyui_chai.opensora.loading import save_stdit3
    from comfyui_chai.opensora.stdit3 import STDiT3, STDiT3Config

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        path = save_stdit3(STDiT3(STDiT3Config(**CONFIGS["medium"][0])), Path(tmp) / "medium.safetensors")
        size = path.stat().st_size / MIB
        print(f"\nLoading the medium checkpoint ({size:.1f} MiB fp32 safetensors), streamed tensor by tensor "
              "(RSS counts the file pages read through mmap; anon is the process's own memory)")
        print(f"{'dtype':<5} {'seconds':>8} {'weights MiB':>12} {'peak extra RSS':>15} {'peak extra anon':>16}")
        for dtype in ("fp32", "fp16", "bf16"):
            r = run_worker(["load", str(path), dtype, str(args.threads)])
            print(f"{r['dtype']:<5} {r['s']:>8.3f} {r['weights_mib']:>12.1f} {r['peak_extra_mib']:>15.1f} "
                  f"{r['anon_extra_mib']:>16.1f}")

    rows = xl2_sizes()
    print(f"{'dtype':<5} {'bytes':>15} {'GB':>7}")
    for name, nbytes, gb in rows:
        print(f"{name:<5} {nbytes:>15,} {gb:>7.2f}")


if __name__ == "__main__":
    main()
