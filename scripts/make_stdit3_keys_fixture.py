"""Write tests/fixtures/stdit3_xl2_keys.json: the tensor names and shapes of the official STDiT3-XL/2 checkpoint.

The list is written out from the documented key rules of `hpcai-tech/OpenSora-STDiT-v3/model.safetensors`
(bare module names, 28 spatial and 28 temporal blocks, fp32, the null-caption buffer and `rope.freqs` included),
independently of the model code, so that the parity test compares two separate derivations.

    python scripts/make_stdit3_keys_fixture.py
"""
from __future__ import annotations

import json
import math
from pathlib import Path

HIDDEN, DEPTH, HEADS, MLP, CAPTION, TOKENS, FREQ = 1152, 28, 16, 4608, 4096, 300, 256
HEAD_DIM = HIDDEN // HEADS
OUT = 2 * 2 * 8  # patch (1, 2, 2) times 8 output channels (pred_sigma)


def expected_keys() -> dict[str, list[int]]:
    """Ordered mapping of checkpoint tensor name to shape."""
    keys: dict[str, list[int]] = {
        "y_embedder.y_embedding": [TOKENS, CAPTION],
        "y_embedder.y_proj.fc1.weight": [HIDDEN, CAPTION],
        "y_embedder.y_proj.fc1.bias": [HIDDEN],
        "y_embedder.y_proj.fc2.weight": [HIDDEN, HIDDEN],
        "y_embedder.y_proj.fc2.bias": [HIDDEN],
        "x_embedder.proj.weight": [HIDDEN, 4, 1, 2, 2],
        "x_embedder.proj.bias": [HIDDEN],
    }
    for emb in ("t_embedder", "fps_embedder"):
        keys[f"{emb}.mlp.0.weight"] = [HIDDEN, FREQ]
        keys[f"{emb}.mlp.0.bias"] = [HIDDEN]
        keys[f"{emb}.mlp.2.weight"] = [HIDDEN, HIDDEN]
        keys[f"{emb}.mlp.2.bias"] = [HIDDEN]
    keys["t_block.1.weight"] = [6 * HIDDEN, HIDDEN]
    keys["t_block.1.bias"] = [6 * HIDDEN]
    keys["rope.freqs"] = [HEAD_DIM // 2]
    for kind in ("spatial_blocks", "temporal_blocks"):
        for i in range(DEPTH):
            p = f"{kind}.{i}"
            keys[f"{p}.scale_shift_table"] = [6, HIDDEN]
            keys[f"{p}.attn.qkv.weight"] = [3 * HIDDEN, HIDDEN]
            keys[f"{p}.attn.qkv.bias"] = [3 * HIDDEN]
            keys[f"{p}.attn.q_norm.weight"] = [HEAD_DIM]
            keys[f"{p}.attn.k_norm.weight"] = [HEAD_DIM]
            keys[f"{p}.attn.proj.weight"] = [HIDDEN, HIDDEN]
            keys[f"{p}.attn.proj.bias"] = [HIDDEN]
            keys[f"{p}.cross_attn.q_linear.weight"] = [HIDDEN, HIDDEN]
            keys[f"{p}.cross_attn.q_linear.bias"] = [HIDDEN]
            keys[f"{p}.cross_attn.kv_linear.weight"] = [2 * HIDDEN, HIDDEN]
            keys[f"{p}.cross_attn.kv_linear.bias"] = [2 * HIDDEN]
            keys[f"{p}.cross_attn.proj.weight"] = [HIDDEN, HIDDEN]
            keys[f"{p}.cross_attn.proj.bias"] = [HIDDEN]
            keys[f"{p}.mlp.fc1.weight"] = [MLP, HIDDEN]
            keys[f"{p}.mlp.fc1.bias"] = [MLP]
            keys[f"{p}.mlp.fc2.weight"] = [HIDDEN, MLP]
            keys[f"{p}.mlp.fc2.bias"] = [HIDDEN]
    keys["final_layer.scale_shift_table"] = [2, HIDDEN]
    keys["final_layer.linear.weight"] = [OUT, HIDDEN]
    keys["final_layer.linear.bias"] = [OUT]
    return keys


def main() -> None:
    """Write the fixture next to the tests."""
    keys = expected_keys()
    total = sum(math.prod(s) for s in keys.values())
    buffers = ("y_embedder.y_embedding", "rope.freqs")
    learnable = total - sum(math.prod(keys[b]) for b in buffers)
    doc = {
        "source": "hpcai-tech/OpenSora-STDiT-v3 model.safetensors (STDiT3-XL/2), derived from the documented key rules",
        "num_tensors": len(keys),
        "total_elements": total,
        "learnable_parameters": learnable,
        "non_learnable": list(buffers),
        "fp32_bytes": 4 * total,
        "keys": keys,
    }
    out = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "stdit3_xl2_keys.json"
    head = json.dumps({k: v for k, v in doc.items() if k != "keys"}, indent=1)[:-2]
    rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in keys.items())
    out.write_text(f'{head},\n "keys": {{\n{rows}\n }}\n}}\n')  # one tensor per line, easy to diff
    print(f"{out.name}: {len(keys)} tensors, {total:,} elements, {learnable:,} learnable")


if __name__ == "__main__":
    main()
