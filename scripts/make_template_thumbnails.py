"""Write the template-browser thumbnails of the shipped workflows (workflows/<name>.jpg).

    python scripts/make_template_thumbnails.py

ComfyUI's template browser shows a custom node pack's workflow `<name>.json` with the picture `<name>.jpg` next
to it. The toy workflow's picture is a real frame strip: its prompt rendered by the shipped toy model with the
workflow's seed, steps and cfg (the reference sampler, which equals the workflow's output to float rounding).
The OpenSora, Wan, HunyuanVideo, LTXV and warm-up workflows get a diagram of their graph (their models are too
large to run here), and so does the one-node toy workflow (its picture would repeat the toy one's).
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from PIL import Image, ImageDraw, ImageFont  # noqa: E402

SIZE = (512, 384)
FRAME = 128
BG, INK, MUTED = (24, 26, 32), (236, 238, 242), (150, 156, 168)
MISS, HIT, BOX = (200, 120, 60), (70, 170, 110), (52, 58, 72)
DIAGRAMS = {
    "chai_opensora_t2v": ("CHAI on OpenSora 1.2", "text to video: hits run 8 steps, misses 30",
                          ["STDiT3 + T5", "Entity Extract", "Cache Lookup", "CHAI Sampler", "Cache Write",
                           "VAE Decode -> video"]),
    "chai_wan21_t2v": ("CHAI on Wan 2.1 T2V 1.3B", "ComfyUI's Wan loaders + Cache Attention",
                       ["Wan 2.1 + umT5", "Entity Extract", "Cache Lookup", "CHAI Sampler", "Cache Write",
                        "VAE Decode -> video"]),
    "chai_opensora_warmup": ("Warm up a CHAI cache", "a prompt list, each stored for later hits",
                             ["Prompt List", "STDiT3 + T5", "Entity Extract", "CHAI Sampler (full)",
                              "Cache Write", "Cache Stats"]),
    "chai_wan22_a14b_t2v": ("CHAI on Wan 2.2 A14B", "two experts, two KSamplerAdvanced, CHAI Apply",
                            ["Cache Lookup (both experts)", "CHAI Apply (high-noise)", "KSamplerAdvanced high",
                             "KSamplerAdvanced low", "CHAI Apply Trace", "Cache Write"]),
    "chai_wan22_5b_i2v": ("CHAI on Wan 2.2 TI2V 5B", "image to video: donors of the same image",
                          ["Start image + Wan 2.2 VAE", "Cache Lookup (image)", "CHAI Apply",
                           "SamplerCustomAdvanced", "CHAI Apply Trace", "Cache Write"]),
    "chai_hunyuan_video_t2v": ("CHAI on HunyuanVideo", "ComfyUI's HunyuanVideo loaders + Cache Attention",
                               ["HunyuanVideo + CLIP-L/LLaMA", "Entity Extract", "Cache Lookup", "CHAI Sampler",
                                "Cache Write", "VAE Decode -> video"]),
    "chai_ltxv_t2v": ("CHAI on LTX-Video 2B", "ComfyUI's LTXV loaders + Cache Attention",
                      ["LTXV + T5", "Entity Extract", "Cache Lookup", "CHAI Sampler", "Cache Write",
                       "VAE Decode -> video"]),
    "chai_wan22_a14b_4step": ("CHAI on Wan 2.2, 4-step LoRAs", "cfg 1, 4 passes: a hit is a miss that says why",
                              ["Wan 2.2 experts + LoRAs", "Cache Lookup (both experts)", "CHAI Apply (4 steps)",
                               "KSamplerAdvanced high / low", "CHAI Apply Trace", "Cache Write"]),
    "chai_toy_one_node": ("One CHAI node (toy world)", "between the loader and any sampler, any CPU",
                          ["Toy model + text encode", "CHAI (Lookup + Apply)", "KSamplerAdvanced",
                           "CHAI Store (Cache Write)", "Toy Decode -> video"]),
}


def font(size: int) -> ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def diagram(title: str, subtitle: str, steps: list[str]) -> Image.Image:
    """A dark card: title, subtitle, and the workflow's stages as a column of boxes joined by arrows."""
    im = Image.new("RGB", SIZE, BG)
    d = ImageDraw.Draw(im)
    d.text((24, 18), title, fill=INK, font=font(28))
    d.text((24, 54), subtitle, fill=MUTED, font=font(16))
    top, h, gap, left, width = 92, 34, 14, 96, 320
    for i, step in enumerate(steps):
        y = top + i * (h + gap)
        colour = HIT if "Lookup" in step else MISS if "Sampler" in step else BOX
        d.rounded_rectangle((left, y, left + width, y + h), radius=8, fill=colour)
        d.text((left + width / 2, y + h / 2), step, fill=INK, font=font(17), anchor="mm")
        if i:
            d.line((left + width / 2, y - gap, left + width / 2, y - 2), fill=MUTED, width=3)
    return im


def toy_strip(frames: np.ndarray, prompt: str) -> Image.Image:
    """The clip's 8 frames in two rows of four (each 16x16 frame upscaled 8x, as CHAI Toy Decode does)."""
    im = Image.new("RGB", SIZE, BG)
    d = ImageDraw.Draw(im)
    d.text((SIZE[0] / 2, 30), "CHAI toy world (CPU, no download)", fill=INK, font=font(24), anchor="mm")
    d.text((SIZE[0] / 2, 358), prompt, fill=MUTED, font=font(16), anchor="mm")
    clip = (np.clip(frames, 0.0, 1.0) * 255).round().astype(np.uint8)
    for i, frame in enumerate(clip[:8]):
        tile = Image.fromarray(frame).resize((FRAME - 8, FRAME - 8), Image.NEAREST)
        im.paste(tile, (4 + (i % 4) * FRAME + 4, 52 + (i // 4) * (FRAME + 8)))
    return im


def toy_frames() -> tuple[np.ndarray, str]:
    """The toy workflow's clip: its prompt, seed, steps and cfg through the reference sampler."""
    import torch

    from make_chai_workflows import TOY_PROMPT, toy_t2v

    from comfyui_chai.toyworld.model import load_toy_model
    from lab.evaluate import generate

    sampler = next(n for n in toy_t2v().to_json()["nodes"] if n["type"] == "CHAI_Sampler")
    seed, _, cfg, _, _, full_steps = sampler["widgets_values"][:6]
    torch.manual_seed(0)
    return generate(load_toy_model(), [TOY_PROMPT], [seed], steps=full_steps, cfg=cfg)[0], TOY_PROMPT


def thumbnail_path(name: str) -> Path:
    """workflows/<the UI file's name>.jpg for a workflow key such as 'chai_toy_t2v'."""
    from make_chai_workflows import TEMPLATE_FILES

    return REPO / "workflows" / f"{TEMPLATE_FILES[name]}.jpg"


def render() -> dict[Path, Image.Image]:
    out = {thumbnail_path(name): diagram(*spec) for name, spec in DIAGRAMS.items()}
    frames, prompt = toy_frames()
    out[thumbnail_path("chai_toy_t2v")] = toy_strip(frames, prompt)
    return out


def main() -> int:
    rendered = render()
    for path in (REPO / "workflows").glob("*.jpg"):
        if path not in rendered:
            path.unlink()
            print(f"removed {path.relative_to(REPO)}")
    for path, image in rendered.items():
        image.save(path, "JPEG", quality=95)
        print(f"wrote {path.relative_to(REPO)}")
    names = sorted(p.stem for p in (REPO / "workflows").glob("*.json"))
    missing = [n for n in names if not (REPO / "workflows" / f"{n}.jpg").is_file()]
    if missing:
        print(f"no thumbnail for: {', '.join(missing)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
