"""The HunyuanVideo and LTX-Video adapters without ComfyUI: which networks they take, which K/V rows they swap,
which calls they refuse. (Tier 2 runs them on ComfyUI's own classes: tests/tier2/test_comfy_chai_families.py.)

The networks here are bare module trees with the attribute names ComfyUI's classes have: recognition goes by
structure, so that is all it sees. The attention calls are bound to a plain function with ComfyUI's attention
signature.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from comfyui_chai.chai_attention.adapters import UnsupportedModelError, get_adapter
from comfyui_chai.chai_attention.adapters.hunyuan_video import HunyuanVideoAdapter
from comfyui_chai.chai_attention.adapters.ltxv import LTXVAdapter
from comfyui_chai.chai_attention.attention_call import AttentionCall, DonorKV

IMG, TXT, HEADS, D = 6, 3, 2, 4


def attention(q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False,
              **kwargs):
    """ComfyUI's attention signature (only bound here, never run)."""
    raise AssertionError("not called")


def tree(**children: Any) -> nn.Module:
    """A module with the given children (modules) and attributes (anything else)."""
    m = nn.Module()
    for name, value in children.items():
        setattr(m, name, value)
    return m


def hunyuan_like(in_channels: int = 16, patch: tuple = (1, 2, 2), vector_in: bool = True,
                 refiner: bool = True) -> nn.Module:
    block = tree(img_attn=nn.Identity(), txt_attn=nn.Identity(), img_mod=nn.Identity(), txt_mod=nn.Identity(),
                 flipped_img_txt=True)
    txt_in = tree(individual_token_refiner=nn.Identity()) if refiner else nn.Linear(2, 2)
    return tree(img_in=nn.Identity(), txt_in=txt_in, time_in=nn.Identity(), double_blocks=nn.ModuleList([block]),
                single_blocks=nn.ModuleList(), vector_in=nn.Identity() if vector_in else None,
                patch_size=list(patch), in_channels=in_channels, out_channels=16)


def ltxv_like() -> nn.Module:
    block = tree(attn1=nn.Identity(), attn2=nn.Identity(), ff=nn.Identity(),
                 scale_shift_table=nn.Parameter(torch.zeros(6, 4)))
    return tree(patchify_proj=nn.Linear(128, 8), adaln_single=nn.Identity(),
                transformer_blocks=nn.ModuleList([block]))


def joint_call(gen: torch.Generator, mask: torch.Tensor | None = None) -> AttentionCall:
    """HunyuanVideo's joint call: q/k/v [B, heads, IMG + TXT, d], skip_reshape, the text-padding mask."""
    q, k, v = (torch.randn(2, HEADS, IMG + TXT, D, generator=gen) for _ in range(3))
    return AttentionCall.bind(attention, (q, k, v, HEADS), {"mask": mask, "skip_reshape": True,
                                                          "transformer_options": {}})


def donor_of(call: AttentionCall, gen: torch.Generator, **block_args: Any) -> DonorKV:
    k, v = torch.randn(call.k.shape, generator=gen), torch.randn(call.v.shape, generator=gen)
    return DonorKV(k, v, call.mask, call.token_dim, block_args)


def test_registry_tells_the_families_apart_by_structure():
    assert isinstance(get_adapter(hunyuan_like()), HunyuanVideoAdapter)
    assert isinstance(get_adapter(ltxv_like()), LTXVAdapter)
    assert not HunyuanVideoAdapter.recognise(ltxv_like()) and not LTXVAdapter.recognise(hunyuan_like())
    # Flux-like networks embed their text with a plain linear layer: not HunyuanVideo, and no family at all.
    with pytest.raises(UnsupportedModelError, match="supported: .*hunyuan_video .*ltxv"):
        get_adapter(hunyuan_like(refiner=False))


def test_a_family_is_one_registered_module_and_every_family_is_a_hook_adapter(monkeypatch):
    from comfyui_chai.chai_attention import adapters, hooks
    from comfyui_chai.chai_attention.adapters import registry

    assert [c.family for c in registry.adapter_classes()] == ["stdit3", "wan", "hunyuan_video", "ltxv"]
    assert all(issubclass(c, hooks.HookAdapter) for c in registry.adapter_classes())
    monkeypatch.setattr(registry, "_REGISTERED", dict(registry._REGISTERED))

    class LinearAdapter(adapters.ModelAdapter):  # a new family: recognise and the hook declarations
        family, description = "linear", "a plain Linear layer"
        block_key = ("double_block", 3)

        @classmethod
        def recognise(cls, model: Any) -> bool:
            return isinstance(model, nn.Linear)

    assert adapters.register_adapter(LinearAdapter) is LinearAdapter
    adapter = adapters.get_adapter(nn.Linear(2, 2))
    assert isinstance(adapter, LinearAdapter) and "linear (a plain Linear layer)" in adapters.supported_families()
    assert isinstance(get_adapter(ltxv_like()), LTXVAdapter)  # the built-ins are still asked first
    with pytest.raises(ValueError, match="no family name"):
        adapters.register_adapter(type("Nameless", (LinearAdapter,), {"family": ""}))


def test_the_adapter_base_and_registry_import_no_family_module():
    import grimp

    graph = grimp.build_graph("comfyui_chai")
    package = "comfyui_chai.chai_attention.adapters"
    families = {f"{package}.{name}" for name in ("stdit3", "wan", "hunyuan_video", "ltxv")}
    for module in (f"{package}.base", f"{package}.registry", "comfyui_chai.chai_attention.hooks"):
        assert not {m for m in families if graph.chain_exists(importer=module, imported=m)}, module


@pytest.mark.parametrize("variant, reason", [
    (dict(in_channels=33), "33 channels for a 16-channel latent"),
    (dict(vector_in=False), "no CLIP-L pooled-text input"),
    (dict(patch=(1, 2)), "not a video patch"),
])
def test_hunyuan_variants_other_than_text_to_video_are_refused_with_the_reason(variant, reason):
    with pytest.raises(UnsupportedModelError, match=reason) as err:
        get_adapter(hunyuan_like(**variant))
    assert "Supported: HunyuanVideo T2V" in str(err.value)


def test_hunyuan_replace_takes_the_donors_image_rows_and_keeps_the_live_text_rows():
    gen = torch.Generator().manual_seed(0)
    adapter = HunyuanVideoAdapter(hunyuan_like())
    live = joint_call(gen)
    donor = donor_of(live, gen)
    out = adapter.splice_kv(live, donor, "replace", {"img": torch.zeros(2, IMG, 8)})
    assert torch.equal(out.q, live.q)
    assert torch.equal(out.k[:, :, :IMG], donor.k[:, :, :IMG]) and torch.equal(out.v[:, :, :IMG], donor.v[:, :, :IMG])
    assert torch.equal(out.k[:, :, IMG:], live.k[:, :, IMG:]) and torch.equal(out.v[:, :, IMG:], live.v[:, :, IMG:])
    assert out.arguments["skip_reshape"] is True and out.mask is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_hunyuan_concat_appends_the_donors_image_rows_and_opens_the_mask_to_them(dtype):
    gen = torch.Generator().manual_seed(1)
    adapter = HunyuanVideoAdapter(hunyuan_like())
    if dtype == torch.bool:
        mask = torch.tensor([True] * (IMG + 2) + [False]).reshape(1, 1, -1)
    else:
        mask = torch.zeros(1, 1, IMG + TXT)
        mask[..., -1] = -1e9  # a padded text token
    live = joint_call(gen, mask)
    donor = donor_of(live, gen)
    out = adapter.splice_kv(live, donor, "concat", {"img": torch.zeros(2, IMG, 8)})
    assert torch.equal(out.k, torch.cat([live.k, donor.k[:, :, :IMG]], dim=2))
    assert torch.equal(out.v, torch.cat([live.v, donor.v[:, :, :IMG]], dim=2))
    assert out.mask.shape == (1, 1, IMG + TXT + IMG) and torch.equal(out.mask[..., :IMG + TXT], mask)
    open_value = True if dtype == torch.bool else 0.0
    assert bool((out.mask[..., IMG + TXT:] == open_value).all())


def test_hunyuan_splice_refuses_mismatched_donors_and_calls_without_image_tokens():
    gen = torch.Generator().manual_seed(2)
    adapter = HunyuanVideoAdapter(hunyuan_like())
    live = joint_call(gen)
    short = DonorKV(live.k[:, :, 1:], live.v[:, :, 1:], None, 2, {})
    with pytest.raises(ValueError, match="do not match the live keys"):
        adapter.splice_kv(live, short, "replace", {"img": torch.zeros(2, IMG, 8)})
    with pytest.raises(ValueError, match="no image tokens"):
        adapter.splice_kv(live, donor_of(live, gen), "replace", {})
    with pytest.raises(ValueError, match="K/V mode"):
        adapter.splice_kv(live, donor_of(live, gen), "mix", {"img": torch.zeros(2, IMG, 8)})


def test_image_to_video_calls_and_moved_tokens_are_refused():
    gen = torch.Generator().manual_seed(3)
    pe = torch.randn(1, 1, IMG + TXT, 2, 2, 2, generator=gen)
    hv = HunyuanVideoAdapter(hunyuan_like())
    live = joint_call(gen)
    img = torch.zeros(2, IMG, 8)
    donor = donor_of(live, gen, img=img, pe=pe)
    hv.check_donor(donor, {"img": img, "pe": pe, "modulation_dims_img": None})
    with pytest.raises(ValueError, match="image-to-video .*guiding frame"):
        hv.check_donor(donor, {"img": img, "pe": pe, "modulation_dims_img": [(0, 4, 0), (4, None, 1)]})
    with pytest.raises(ValueError, match="other positions"):
        hv.check_donor(donor, {"img": img, "pe": pe + 1})
    ltxv = LTXVAdapter(ltxv_like())
    cos_sin = (torch.ones(1, IMG, 8), torch.zeros(1, IMG, 8))
    donor = DonorKV(torch.zeros(2, IMG, 8), torch.zeros(2, IMG, 8), None, 1, {"pe": cos_sin})
    ltxv.check_donor(donor, {"pe": cos_sin, "vec": torch.zeros(2, 1, 48)})
    with pytest.raises(ValueError, match="own timesteps .*LTXVImgToVideo"):
        ltxv.check_donor(donor, {"pe": cos_sin, "vec": torch.zeros(2, IMG, 48)})


def text_conditioning(**extra: Any) -> list:
    """A CONDITIONING list [[features, options]] as ComfyUI's text encoders give it."""
    return [[torch.zeros(1, TXT, 8), {"pooled_output": torch.zeros(1, 8), **extra}]]


def test_image_to_video_requests_are_refused_before_sampling_from_the_latent_and_the_conditioning():
    latent = {"samples": torch.zeros(1, 16, 3, 4, 4)}
    hv = HunyuanVideoAdapter(hunyuan_like())
    hv.check_request(latent, (text_conditioning(guidance=6.0), text_conditioning()))
    hv.check_request({**latent, "noise_mask": torch.ones(1, 1, 3, 4, 4)}, (None,))  # a plain mask: not i2v
    with pytest.raises(ValueError, match="image-to-video .*guiding frame.*'v2 \\(replace\\)'"):
        hv.check_request(latent, (text_conditioning(guiding_frame_index=0), text_conditioning()))
    with pytest.raises(ValueError, match="image-to-video .*reference image latent.*'custom'"):
        hv.check_request(latent, (text_conditioning(ref_latent=torch.zeros(1, 16, 1, 4, 4)),))
    ltxv = LTXVAdapter(ltxv_like())
    ltxv_latent = {"samples": torch.zeros(1, 128, 3, 4, 4)}
    ltxv.check_request(ltxv_latent, (text_conditioning(frame_rate=25.0, keyframe_idxs=None),))  # guides cropped
    with pytest.raises(ValueError, match="noise mask on the latent .*LTXVImgToVideo"):
        ltxv.check_request({**ltxv_latent, "noise_mask": torch.ones(1, 1, 3, 4, 4)}, ())
    with pytest.raises(ValueError, match="guide frames \\(keyframe_idxs\\)"):
        ltxv.check_request(ltxv_latent, (text_conditioning(keyframe_idxs=torch.zeros(1, 3, 1, 2)),))


def test_image_to_video_model_calls_are_refused_by_their_extra_arguments():
    hv, ltxv = HunyuanVideoAdapter(hunyuan_like()), LTXVAdapter(ltxv_like())
    hv.check_call({"guidance": torch.ones(1), "ref_latent": None})
    ltxv.check_call({"frame_rate": 25.0, "attention_mask": torch.ones(1, TXT)})
    with pytest.raises(ValueError, match="reference image latent"):
        hv.check_call({"ref_latent": torch.zeros(1, 16, 1, 4, 4)})
    with pytest.raises(ValueError, match="guiding frame"):
        hv.check_call({"guiding_frame_index": torch.zeros(1)})
    with pytest.raises(ValueError, match="a denoise mask .*text-to-video only"):
        ltxv.check_call({"denoise_mask": torch.ones(1, 1, 3, 4, 4)})
