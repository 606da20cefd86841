"""A stand-in for a ComfyUI DiT and its ModelPatcher, for the public-hook Cache Attention tests (no ComfyUI).

What the double keeps of ComfyUI's protocol (checked against v0.3.64, and by tier 2 on the real thing):
APPLY_MODEL and DIFFUSION_MODEL wrappers read from transformer_options["wrappers"] and chained like
comfy.patcher_extension.WrapperExecutor; `patches_replace["dit"][("double_block", i)]` block replacement with
{"img", "txt", "vec", "pe", "transformer_options"} and {"original_block"}; an attention function that honours
transformer_options["optimized_attention_override"] as comfy.ldm.modules.attention.wrap_attn does.

What it hides: its patch embedding, time embedding, modulation, q/k/v projections and RoPE are plain tensors
and closures created from a secret seed, reachable by no attribute, and they refuse to run outside the double's
own forward (`ForeignComputation`). Code that computed a donor's keys itself could neither find the weights nor
call them; the double logs every K/V its block-0 self-attention produced, so a test can check which ones an
attention call received.
"""
from __future__ import annotations

import copy
import math
from typing import Any, Callable

import torch
from torch import Tensor

HEADS, HEAD_DIM, CHANNELS, TEXT_DIM = 2, 4, 3, 5
DIM = HEADS * HEAD_DIM


class ForeignComputation(RuntimeError):
    """A part of the model ran outside the model's own forward."""


def run_wrappers(kind: str, options: dict, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call `original` through the `kind` wrappers in options["wrappers"], outermost first (as ComfyUI does)."""
    wrappers = [w for ws in (options.get("wrappers", {}).get(kind, {}) or {}).values() for w in ws]

    def at(i: int) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            return original(*a, **k) if i == len(wrappers) else wrappers[i](at(i + 1), *a, **k)
        return call

    return at(0)(*args, **kwargs)


ATTENDED: list[tuple[Tensor, Tensor, Tensor]] = []  # (q, k, v) of every attention computed, in order


def attention(q: Tensor, k: Tensor, v: Tensor, heads: int, mask: Tensor | None = None, skip_reshape: bool = False,
              **kwargs: Any) -> Tensor:
    """Plain softmax attention over [B, L, heads * d] (ComfyUI's default layout); logged in ATTENDED."""
    ATTENDED.append((q, k, v))
    b = q.shape[0]
    q, k, v = (t.view(b, -1, heads, t.shape[-1] // heads).transpose(1, 2) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2).reshape(b, -1, heads * out.shape[-1])


def optimized_attention(*args: Any, **kwargs: Any) -> Tensor:
    """`attention` behind ComfyUI's override protocol: options["optimized_attention_override"](func, ...)."""
    options = kwargs.get("transformer_options")
    if "_inside_attn_wrapper" not in kwargs and options is not None and "optimized_attention_override" in options:
        kwargs["_inside_attn_wrapper"] = True
        return options["optimized_attention_override"](attention, *args, **kwargs)
    return attention(*args, **kwargs)


class SecretDiT:
    """Two blocks of self-attention (RoPE, adaLN modulation), cross-attention and an MLP; everything private."""

    def __init__(self, seed: int = 1234) -> None:
        gen = torch.Generator().manual_seed(seed)

        def w(*shape: int, scale: float = 1.0) -> Tensor:
            return torch.randn(*shape, generator=gen) * scale / math.sqrt(shape[0])

        secret = {"patch": w(CHANNELS, DIM), "time": w(16, DIM), "text": w(TEXT_DIM, DIM),
                  "theta": 7.0 + torch.rand((), generator=gen).item(), "head": w(DIM, CHANNELS)}
        for i in range(2):
            secret.update({f"mod{i}": w(DIM, 2 * DIM), **{f"{n}{i}": w(DIM, DIM) for n in "qkvo"},
                           f"cq{i}": w(DIM, DIM), f"ck{i}": w(DIM, DIM), f"cv{i}": w(DIM, DIM), f"mlp{i}": w(DIM, DIM)})
        self.kv_log: list[tuple[Tensor, Tensor]] = []  # (k, v) block 0's self-attention computed, in call order
        self.forward_t: list[float] = []  # first timestep of every forward
        self._inside = False
        self._secret = secret

    # -- private pieces: each refuses to run outside `forward` ---------------------------------------------------

    def _guard(self) -> None:
        if not self._inside:
            raise ForeignComputation("model code ran outside the model's own forward")

    def _rope(self, x: Tensor, pe: Tensor) -> Tensor:
        self._guard()
        b, n, _ = x.shape
        x = x.view(b, n, -1, 2)
        cos, sin = pe.cos()[None], pe.sin()[None]
        return torch.stack([x[..., 0] * cos - x[..., 1] * sin, x[..., 0] * sin + x[..., 1] * cos], -1).view(b, n, -1)

    def _pe(self, tokens: int, options: dict) -> Tensor:
        self._guard()
        scale = float(options.get("rope_options", {}).get("scale", 1.0))  # a "RoPE-scaling node" option
        pos = torch.arange(tokens, dtype=torch.float32)[:, None] * scale
        return pos / self._secret["theta"] ** (torch.arange(DIM // 2, dtype=torch.float32)[None] / (DIM // 2))

    def _block(self, i: int, x: Tensor, txt: Tensor, vec: Tensor, pe: Tensor, options: dict) -> Tensor:
        self._guard()
        s = self._secret
        shift, scale = (vec @ s[f"mod{i}"]).chunk(2, dim=-1)
        h = torch.nn.functional.layer_norm(x, (DIM,)) * (1 + scale[:, None]) + shift[:, None]
        q, k, v = self._rope(h @ s[f"q{i}"], pe), self._rope(h @ s[f"k{i}"], pe), h @ s[f"v{i}"]
        if i == 0:
            self.kv_log.append((k.detach().clone(), v.detach().clone()))
        x = x + optimized_attention(q, k, v, HEADS, transformer_options=options) @ s[f"o{i}"]
        x = x + optimized_attention(x @ s[f"cq{i}"], txt @ s[f"ck{i}"], txt @ s[f"cv{i}"], HEADS,
                                    transformer_options=options)
        return x + torch.tanh(x @ s[f"mlp{i}"])

    # -- the ComfyUI-shaped entry points ----------------------------------------------------------------------------

    def forward(self, x: Tensor, t: Tensor, context: Tensor, transformer_options: dict = {}, **kw: Any) -> Tensor:
        """The diffusion model: x [B, C, N] -> [B, C, N], behind DIFFUSION_MODEL wrappers."""
        return run_wrappers("diffusion_model", transformer_options, self._forward, x, t, context,
                            transformer_options=transformer_options, **kw)

    def _forward(self, x: Tensor, t: Tensor, context: Tensor, transformer_options: dict = {}, **kw: Any) -> Tensor:
        self.forward_t.append(float(t.reshape(-1)[0]))
        self._inside = True
        try:
            s, options = self._secret, transformer_options
            tokens = x.transpose(1, 2) @ s["patch"]
            freqs = torch.pow(100.0, -torch.arange(8, dtype=torch.float32) / 8)
            emb = torch.cat([torch.cos(t[:, None] * freqs), torch.sin(t[:, None] * freqs)], dim=1)
            vec = torch.tanh(emb @ s["time"])
            txt = context @ s["text"]
            pe = self._pe(tokens.shape[1], options)
            replaces = options.get("patches_replace", {}).get("dit", {})
            for i in range(2):
                def original(args: dict, i: int = i) -> dict:
                    return {"img": self._block(i, args["img"], args["txt"], args["vec"], args["pe"],
                                               args["transformer_options"])}
                args = {"img": tokens, "txt": txt, "vec": vec, "pe": pe, "transformer_options": options}
                if ("double_block", i) in replaces:
                    tokens = replaces[("double_block", i)](args, {"original_block": original})["img"]
                else:
                    tokens = original(args)["img"]
            return (tokens @ s["head"]).transpose(1, 2)
        finally:
            self._inside = False


class BaseModelDouble:
    """ComfyUI's BaseModel.apply_model shape: (x, t, c_concat, c_crossattn, control, transformer_options, **kw)
    behind APPLY_MODEL wrappers; the flow model's denoised output x - sigma * v."""

    def __init__(self, net: SecretDiT) -> None:
        self.diffusion_model = net

    def apply_model(self, x: Tensor, t: Tensor, c_concat: Any = None, c_crossattn: Any = None, control: Any = None,
                    transformer_options: dict = {}, **kwargs: Any) -> Tensor:
        return run_wrappers("apply_model", transformer_options, self._apply_model, x, t, c_concat, c_crossattn,
                            control, transformer_options, **kwargs)

    def _apply_model(self, x: Tensor, t: Tensor, c_concat: Any, c_crossattn: Any, control: Any,
                     transformer_options: dict, **kwargs: Any) -> Tensor:
        out = self.diffusion_model.forward(x, t * 1000.0, c_crossattn, transformer_options=transformer_options)
        return x - t.view(-1, 1, 1) * out


class PatcherDouble:
    """The slice of ModelPatcher that installs use: model_options, wrappers, set_model_patch_replace, clone."""

    def __init__(self, model: BaseModelDouble) -> None:
        self.model = model
        self.model_options: dict = {"transformer_options": {}}
        self.wrappers: dict = {}

    def clone(self) -> "PatcherDouble":
        n = PatcherDouble(self.model)
        n.model_options = copy.deepcopy(self.model_options)  # as ModelPatcher.clone does
        n.wrappers = {k: {k1: list(w) for k1, w in v.items()} for k, v in self.wrappers.items()}
        return n

    def set_model_patch_replace(self, patch: Any, name: str, block_name: str, number: int) -> None:
        to = dict(self.model_options["transformer_options"])
        to["patches_replace"] = {**to.get("patches_replace", {})}
        to["patches_replace"][name] = {**to["patches_replace"].get(name, {}), (block_name, number): patch}
        self.model_options["transformer_options"] = to

    def add_wrapper_with_key(self, kind: str, key: str, wrapper: Callable[..., Any]) -> None:
        self.wrappers.setdefault(kind, {}).setdefault(key, []).append(wrapper)

    def remove_wrappers_with_key(self, kind: str, key: str) -> None:
        self.wrappers.get(kind, {}).pop(key, None)

    def get_model_object(self, name: str) -> Any:
        return self.model.diffusion_model if name == "diffusion_model" else getattr(self.model, name)

    def evaluate(self, x: Tensor, sigma: float, context: Tensor, cond_or_uncond: list[int], **extra: Any) -> Tensor:
        """One evaluation as the sampler makes it: options with wrappers merged, sigmas and the CFG layout."""
        options = {**self.model_options["transformer_options"], **extra,
                   "wrappers": self.wrappers, "sigmas": torch.full((x.shape[0],), sigma),
                   "cond_or_uncond": cond_or_uncond}
        with torch.no_grad():
            return self.model.apply_model(x, torch.full((x.shape[0],), sigma), c_crossattn=context,
                                          transformer_options=options)


def make_patcher(seed: int = 1234) -> PatcherDouble:
    """A fresh double and its patcher."""
    return PatcherDouble(BaseModelDouble(SecretDiT(seed)))
