"""The identities cache entries are keyed by (chai_attention.identity) keep their values: a saved cache must still hit.

Every value below was computed by the pack before the digests were gathered into one module; a change of any of
them turns every stored entry of that kind into a miss, so it must be a deliberate, announced one.
"""
from __future__ import annotations

import hashlib

import torch

from comfyui_chai.chai_attention.comfy.text import text_encoder_name
from comfyui_chai.chai_attention.identity import (CONDITIONING_HASHER, PATCH_HASHER, comfy_model_fingerprint,
                                                  comfy_request_fingerprint, conditioning_digest, model_fingerprint,
                                                  original_weights_digest, patches_digest, request_fingerprint)


def _net() -> torch.nn.Module:
    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))
    with torch.no_grad():
        for i, p in enumerate(net.parameters()):
            p.copy_(torch.arange(p.numel(), dtype=torch.float32).reshape(p.shape) * 0.1 + i)
    return net


class _ModelConfig:
    unet_config = {"dim": 5, "layers": 2, "obj": object}


class Base:  # its class name is part of the fingerprint, as it was when the values below were taken
    def __init__(self) -> None:
        self.diffusion_model = _net()
        self.model_config = _ModelConfig()
        self.manual_cast_dtype = None


class LoraW:  # the shape of a comfy.weight_adapter object: a class and its `weights`
    def __init__(self, weights) -> None:
        self.weights = weights


class _Patcher:  # the attributes of a ComfyUI ModelPatcher that the fingerprint reads
    def __init__(self, patches=None) -> None:
        self.model = Base()
        self.patches = patches or {}
        self.backup = {}

    def model_dtype(self) -> torch.dtype:
        return torch.float32


class Vision:  # the shape of comfy.clip_vision.Output: tensors as attributes
    def __init__(self) -> None:
        self.penultimate_hidden_states = torch.arange(12.0).reshape(1, 3, 4)
        self.name = "x"


class _Clip:
    def __init__(self) -> None:
        self.cond_stage_model = _net()
        self.patcher = _Patcher(_patches())


def _patches() -> dict:
    up = torch.arange(8.0).reshape(4, 2)
    return {"diffusion_model.0.weight": [(0.8, ("lora", (up, up.T, None, None)), 1.0, None, None),
                                         (0.5, LoraW((up * 2, None)), 1.0, None, None)]}


def _cond() -> list:
    return [[torch.zeros(1, 2, 3), {"concat_latent_image": torch.arange(32.0).reshape(1, 2, 2, 2, 4),
                                    "concat_mask": torch.ones(1, 1, 2, 2, 4), "clip_vision_output": Vision(),
                                    "reference_latents": [torch.ones(1, 2)], "pooled_output": torch.ones(3)}]]


LATENT = {"samples": torch.arange(16.0).reshape(1, 1, 4, 4), "noise_mask": torch.ones(1, 1, 4, 4)}


def test_model_fingerprints_keep_their_values():
    assert model_fingerprint(_net()) == "Sequential@43b843e432df9a4a"
    assert model_fingerprint(_net(), weights_id="file-a", dtype=torch.bfloat16,
                             extra={"x": 1}) == "Sequential@92dc8b123889073e"
    assert comfy_model_fingerprint(_Patcher()) == "Sequential@703d183449f20170"
    assert comfy_model_fingerprint(_Patcher(_patches())) == "Sequential@89b590d39158dbab"


def test_weight_and_patch_digests_keep_their_values():
    assert original_weights_digest(_net()) == "48cccf4270fcb5b85a9614da98fe73b6b5d893b280b06ada7b788b3e22ee43e6"
    assert patches_digest(_Patcher(_patches())) == \
        "8acfa8bff35a471eb68b653a6754afd0c79079e35a66c4eb034401177c4fc049"
    assert text_encoder_name(_Clip()) == "text-encoder:Sequential@52c631b6acd5"


def test_request_and_conditioning_digests_keep_their_values():
    assert conditioning_digest(_cond()) == "image:032321080cc1ded5"
    assert conditioning_digest([[torch.zeros(1), {}]], LATENT) == "image:3de8d802292ac382"
    image = conditioning_digest(_cond(), LATENT)
    pair = request_fingerprint(_Patcher(), _Patcher(_patches()), image)
    assert pair == "Sequential+Sequential+image@3843a84e7ef8107a"
    assert comfy_request_fingerprint(_Patcher(), LATENT, _Patcher(_patches()), _cond()) == pair
    assert comfy_request_fingerprint(_Patcher(), {"samples": torch.zeros(1)}) == comfy_model_fingerprint(_Patcher())


def test_the_two_hashing_policies_differ_only_where_they_always_did():
    def digest(hasher, value) -> str:
        h = hashlib.sha256()
        hasher.feed(value, h)
        return h.hexdigest()

    t = torch.arange(1000.0)
    nested = {"b": [t, None, 1, "s"], "a": (True, 2.5)}
    assert digest(PATCH_HASHER, nested) == digest(PATCH_HASHER, {"a": (True, 2.5), "b": [t.clone(), None, 1, "s"]})
    assert digest(PATCH_HASHER, nested) != digest(CONDITIONING_HASHER, nested)
    # Patches sample a tensor's values; conditioning reads every one of them.
    changed = t.clone()
    changed[1] += 1.0  # not among the 256 sampled elements of 1000
    assert digest(PATCH_HASHER, changed) == digest(PATCH_HASHER, t)
    assert digest(CONDITIONING_HASHER, changed) != digest(CONDITIONING_HASHER, t)

    def nested_leaf(leaf: int, depth: int) -> list:
        value: list = [leaf]
        for _ in range(depth - 1):
            value = [value]
        return value

    # A leaf 8 lists deep counts for patches (cut off below 8), not for conditioning (cut off below 6).
    assert digest(PATCH_HASHER, nested_leaf(1, 8)) != digest(PATCH_HASHER, nested_leaf(2, 8))
    assert digest(CONDITIONING_HASHER, nested_leaf(1, 8)) == digest(CONDITIONING_HASHER, nested_leaf(2, 8))
    assert digest(PATCH_HASHER, nested_leaf(1, 10)) == digest(PATCH_HASHER, nested_leaf(2, 10))
