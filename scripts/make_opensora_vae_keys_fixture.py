"""Write tests/fixtures/opensora_vae_v12_keys.json: names and shapes of the temporal part of OpenSora-VAE-v1.2.

The list covers `temporal_vae.*` plus the top-level `scale` and `shift` buffers of
`hpcai-tech/OpenSora-VAE-v1.2/model.safetensors` (the `spatial_vae.module.*` SDXL part is ComfyUI's business). It is
written out from the documented layer rules (causal convs stored under `.conv`, ResBlocks with bias-free 3^3 convs
and a 1^3 `conv3` shortcut when the width changes, Identity slots without tensors), independently of the model code,
so that the parity test compares two separate derivations.

    python scripts/make_opensora_vae_keys_fixture.py
"""
from __future__ import annotations

import json
import math
from pathlib import Path

IN_OUT, LATENT, FILTERS, RES_BLOCKS, GROUP_WIDTHS = 4, 4, 128, 4, (128, 256, 256, 512)
TIME_DOWN = (False, True, True)


def _conv(keys: dict[str, list[int]], name: str, cin: int, cout: int, k: int, bias: bool) -> None:
    keys[f"{name}.conv.weight"] = [cout, cin, k, k, k]
    if bias:
        keys[f"{name}.conv.bias"] = [cout]


def _norm(keys: dict[str, list[int]], name: str, width: int) -> None:
    keys[f"{name}.weight"] = [width]
    keys[f"{name}.bias"] = [width]


def _resblock(keys: dict[str, list[int]], name: str, cin: int, cout: int) -> None:
    _norm(keys, f"{name}.norm1", cin)
    _conv(keys, f"{name}.conv1", cin, cout, 3, False)
    _norm(keys, f"{name}.norm2", cout)
    _conv(keys, f"{name}.conv2", cout, cout, 3, False)
    if cin != cout:
        _conv(keys, f"{name}.conv3", cin, cout, 1, False)


def expected_keys() -> dict[str, list[int]]:
    """Ordered mapping of checkpoint tensor name to shape (temporal part, then scale and shift)."""
    keys: dict[str, list[int]] = {}
    enc = "temporal_vae.encoder"
    _conv(keys, f"{enc}.conv_in", IN_OUT, FILTERS, 3, False)
    prev = FILTERS
    for i, width in enumerate(GROUP_WIDTHS):
        for j in range(RES_BLOCKS):
            _resblock(keys, f"{enc}.block_res_blocks.{i}.{j}", prev, width)
            prev = width
        if i < len(TIME_DOWN) and TIME_DOWN[i]:
            _conv(keys, f"{enc}.conv_blocks.{i}", width, width, 3, True)
    for j in range(RES_BLOCKS):
        _resblock(keys, f"{enc}.res_blocks.{j}", prev, prev)
    _norm(keys, f"{enc}.norm1", prev)
    _conv(keys, f"{enc}.conv2", prev, 2 * LATENT, 1, True)
    _conv(keys, "temporal_vae.quant_conv", 2 * LATENT, 2 * LATENT, 1, True)
    _conv(keys, "temporal_vae.post_quant_conv", LATENT, LATENT, 1, True)

    dec = "temporal_vae.decoder"
    top = GROUP_WIDTHS[-1]
    _conv(keys, f"{dec}.conv1", LATENT, top, 3, True)
    for j in range(RES_BLOCKS):
        _resblock(keys, f"{dec}.res_blocks.{j}", top, top)
    prev = top
    for i in reversed(range(len(GROUP_WIDTHS))):
        width = GROUP_WIDTHS[i]
        for j in range(RES_BLOCKS):
            _resblock(keys, f"{dec}.block_res_blocks.{i}.{j}", prev, width)
            prev = width
        if i > 0 and TIME_DOWN[i - 1]:
            _conv(keys, f"{dec}.conv_blocks.{i - 1}", width, 2 * width, 3, True)
    _norm(keys, f"{dec}.norm1", prev)
    _conv(keys, f"{dec}.conv_out", prev, IN_OUT, 3, True)
    keys["scale"] = [1, LATENT, 1, 1, 1]
    keys["shift"] = [1, LATENT, 1, 1, 1]
    return keys


def main() -> None:
    """Write the fixture next to the tests."""
    keys = expected_keys()
    count = lambda pred: sum(math.prod(s) for k, s in keys.items() if pred(k))  # noqa: E731
    data = {
        "source": "hpcai-tech/OpenSora-VAE-v1.2 model.safetensors, temporal_vae.* + scale/shift, derived from the "
                  "documented layer rules",
        "num_tensors": len(keys),
        "temporal_tensors": sum(k.startswith("temporal_vae.") for k in keys),
        "temporal_parameters": count(lambda k: k.startswith("temporal_vae.")),
        "encoder_parameters": count(lambda k: k.startswith("temporal_vae.encoder.")),
        "decoder_parameters": count(lambda k: k.startswith("temporal_vae.decoder.")),
        "total_elements": count(lambda k: True),  # the notes' 309,687,152 counts scale and shift too
        "buffers": ["scale", "shift"],
        "spatial_prefix": "spatial_vae.module.",
        "keys": keys,
    }
    out = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "opensora_vae_v12_keys.json"
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out}: {data['num_tensors']} tensors, {data['temporal_parameters']:,} temporal parameters "
          f"(encoder {data['encoder_parameters']:,}, decoder {data['decoder_parameters']:,})")


if __name__ == "__main__":
    main()
