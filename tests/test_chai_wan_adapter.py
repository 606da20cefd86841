"""Wan adapter, tier 1 (no ComfyUI): recognition, refusals, donor checks, where it hooks, and that it holds no model
code of its own (the Cache Attention mechanism itself is tested in test_chai_hooks.py on a model double; Wan's own
classes in tests/tier2/test_comfy_chai_wan.py).

The stand-in below only has the *structure* the adapter recognises a Wan network by (a Conv3d patch embedding,
blocks whose first one holds norm1, a modulation parameter and a self_attn with q/k/v/o); it never runs.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import hook_doubles as hd
from comfyui_chai.chai_attention import hooks
from comfyui_chai.chai_attention.adapters import UnsupportedModelError, get_adapter, supported_families
from comfyui_chai.chai_attention.adapters.wan import WanAdapter
from comfyui_chai.chai_attention.config import ChaiConfig
from comfyui_chai.chai_attention.donors import Donor, DonorSet
from comfyui_chai.chai_attention.run import CacheAttentionRun

DIM, CHANNELS = 16, 4
SHAPE = (1, CHANNELS, 3, 4, 6)
SIGMAS = torch.linspace(1.0, 0.0, 9)
WAN_SOURCE = Path(__file__).resolve().parents[1] / "chai_attention" / "adapters" / "wan.py"


class StandInAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))


class StandInBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(DIM, elementwise_affine=False)
        self.modulation = nn.Parameter(torch.zeros(1, 6, DIM))
        self.self_attn = StandInAttention()


class StandInNet(nn.Module):
    """Wan-shaped structure only."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv3d(CHANNELS, DIM, (1, 2, 2), stride=(1, 2, 2))
        self.blocks = nn.ModuleList([StandInBlock(), StandInBlock()])
        self.model_type, self.out_dim = "t2v", CHANNELS


def make_run(donor: torch.Tensor) -> CacheAttentionRun:
    return CacheAttentionRun(ChaiConfig(fast_steps=8), SIGMAS, DonorSet([Donor(float(SIGMAS[1]), donor)]))


def test_registry_lists_wan_and_picks_it_by_structure():
    net = StandInNet()
    assert get_adapter(net).family == "wan"
    assert any(f.startswith("wan (Wan 2.1 / 2.2") for f in supported_families())
    with pytest.raises(UnsupportedModelError, match="supported: stdit3 .*; wan "):
        get_adapter(nn.Linear(2, 2))
    headless = StandInNet()
    del headless.blocks[0].self_attn.k
    assert not WanAdapter.recognise(headless)
    assert not WanAdapter.recognise(nn.Sequential(nn.Conv3d(1, 1, 1)))


@pytest.mark.parametrize("change, message", [
    (lambda m: setattr(m, "patch_embedding", nn.Conv3d(CHANNELS + 32, DIM, (1, 2, 2))), "36 channels"),
    (lambda m: setattr(m, "vace_patch_embedding", nn.Conv3d(8, DIM, 1)), "Wan VACE model"),
    (lambda m: setattr(m, "control_adapter", nn.Linear(1, 1)), "Wan Camera model"),
])
def test_unsupported_wan_variants_are_refused_with_what_is_supported(change, message):
    model = StandInNet()
    change(model)
    with pytest.raises(UnsupportedModelError, match=message) as err:
        get_adapter(model)
    assert "Supported: Wan 2.1 T2V" in str(err.value)


def test_check_run_wants_the_latent_channels_and_the_sampled_shape():
    adapter = WanAdapter(StandInNet())
    adapter.check_run(make_run(torch.zeros(SHAPE)), SHAPE)
    with pytest.raises(ValueError, match="same resolution and frame count"):
        adapter.check_run(make_run(torch.zeros(SHAPE)), (2, CHANNELS, 5, 4, 6))
    with pytest.raises(ValueError, match="not 4-channel Wan video latents"):
        adapter.check_run(make_run(torch.zeros(1, 3, 3, 4, 6)))


def test_install_hooks_block_0s_first_attention_through_public_hooks_only():
    patcher = hd.PatcherDouble(hd.BaseModelDouble(hd.SecretDiT()))
    adapter = WanAdapter(StandInNet())
    adapter.comfy_install(patcher)
    dit = patcher.model_options["transformer_options"]["patches_replace"]["dit"]
    assert list(dit) == [("double_block", 0)] and isinstance(dit[("double_block", 0)], hooks.BlockPatch)
    assert [type(w).__name__ for w in patcher.wrappers["apply_model"][hooks.WRAPPER_KEY]] == ["CacheAttentionWrapper"]
    assert adapter.attention_index == 0 and adapter.firing_kind == "self_attn"
    # The donor's model input: the donor in the live latent's place, over the live batch.
    x = torch.zeros(2, *SHAPE[1:])
    donor = torch.arange(float(torch.tensor(SHAPE).prod())).view(SHAPE)
    z = adapter.donor_input(donor[0], x)
    assert z.shape == x.shape and torch.equal(z[1], donor[0])
    with pytest.raises(ValueError, match="live latent's shape"):
        adapter.donor_input(torch.zeros(1, CHANNELS, 3, 4, 8), x)


def test_the_adapter_holds_no_model_code():
    """No q/k/v, RoPE, modulation or time embedding of its own, no reads of ComfyUI functions out of globals."""
    tree = ast.parse(WAN_SOURCE.read_text())
    called = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    model_parts = {"q", "k", "v", "o", "norm_q", "norm_k", "norm1", "time_embedding", "time_projection",
                   "patch_embedding", "rope_encode", "rope_embedder"}
    assert not called & model_parts, called & model_parts
    assert not {"__globals__", "apply_rope1", "optimized_attention", "sinusoidal_embedding_1d"} & names
