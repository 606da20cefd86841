"""Cache Attention for Open-Sora 1.2's STDiT3 through its `attn_replace` hook on `spatial_blocks[0]`.

The donor latent takes the live latent's path into block 0: patch embedding plus the position table
(`embed_video`, same nominal height/width), then block 0's norm1 and adaLN modulation with the current step's
t_mlp (`modulated_attn_input`), then block 0's own fused qkv projection (called as a module, so that ComfyUI's
comfy.ops layers apply LoRA-style weight patches and casts under partial loading) and its k-norm.
Spatial attention runs per frame, so the donor is laid out per frame too: live frame i attends to donor frame i.
Nothing before block 0's attention depends on the text, so the donor K/V are computed once per step and shared
by the CFG halves and by split cond/uncond calls.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from torch import Tensor, nn

from ...opensora.stdit3 import DEFAULT_FPS, STDiT3
from ..constants import RUN_KEY, TIMESTEP_SCALE
from ..hooks import track_prompts
from ..kv import cache_attention, chunk_row_mask
from ..run import BATCHED_CFG, COND, CacheAttentionRun, StepPlan
from ..steps import first_value, options_sigma
from .base import ModelAdapter


@dataclass(frozen=True)
class STDiT3Context:
    """One self-attention call of block 0 and the sigma at which the donor is modulated (None: the call's)."""

    call: Any  # opensora.stdit3.SelfAttnCall
    modulation_sigma: float | None = None


def sigma_of_call(call: Any) -> float:
    """Flow sigma of an STDiT3 self-attention call, from its forward timestep (first element)."""
    t = first_value(call.info.get("timestep"))
    if t is None:
        raise ValueError("the STDiT3 call carries no timestep; pass sigma explicitly")
    return t / TIMESTEP_SCALE


def _attend_through(call: Any, previous: Callable[[Any], Tensor] | None) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """Block 0's attention on given q/k/v: the block's own, or another pack's patch of the slot (chained)."""
    if previous is None:
        return call.block.attn.attend
    return lambda q, k, v: previous(dataclasses.replace(call, q=q, k=k, v=v))


class STDiT3Adapter(ModelAdapter):
    """Open-Sora 1.2 STDiT3: block 0 is `spatial_blocks[0]`, patched via `forward(..., attn_replace=...)`."""

    family = "stdit3"
    description = "Open-Sora 1.2 STDiT3, spatial_blocks[0]"
    PATCH_KEY = ("spatial_attn", 0)
    pure_torch = True

    @classmethod
    def recognise(cls, model: Any) -> bool:
        """An STDiT3 instance, or a module with STDiT3's blocks and input hooks."""
        if isinstance(model, STDiT3):
            return True
        return isinstance(model, nn.Module) and all(
            hasattr(model, name) for name in ("spatial_blocks", "temporal_blocks", "embed_video", "embed_timestep"))

    def first_block(self) -> nn.Module:
        """`spatial_blocks[0]`."""
        return self.model.spatial_blocks[0]

    def block_self_attention(self) -> nn.Module:
        """`spatial_blocks[0].attn`."""
        return self.first_block().attn

    def donor_tokens(self, donor: Tensor, context: STDiT3Context) -> Tensor:
        """Donor [C, T, H, W] or [Bd, C, T, H, W] -> block 0's modulated input [Bd, T*S, C] at the step's t_mlp."""
        model, call = self.model, context.call
        z = donor[None] if donor.dim() == 4 else donor
        # The live call's device, not the weights': under ComfyUI's partial offload they may differ.
        z = z.to(device=call.x_mod.device)
        grid = model.patch_grid(*z.shape[2:])
        if grid[0] != call.T or grid[1] * grid[2] != call.S:
            raise ValueError(f"donor latent {tuple(z.shape)} gives a {grid[0]}x{grid[1] * grid[2]} token grid, the "
                             f"live latent {call.T}x{call.S}: donor and live latents need the same shape")
        tokens = model.embed_video(z, call.info.get("height"), call.info.get("width"))
        if context.modulation_sigma is None:
            t_mlp = call.t_mlp[:1]  # every row of a call shares the timestep
        else:
            fps = first_value(call.info.get("fps"))
            _, t_mlp = model.embed_timestep(context.modulation_sigma * TIMESTEP_SCALE,
                                            DEFAULT_FPS if fps is None else fps, 1)
        return self.first_block().modulated_attn_input(tokens, t_mlp.to(tokens.dtype))

    def donor_kv(self, donor: Tensor, context: STDiT3Context) -> tuple[Tensor, Tensor]:
        """Donor K/V [(Bd*T), heads, S, head_dim]: per-frame layout, block 0's qkv projection and k-norm."""
        block, call = self.first_block(), context.call
        h = block.to_attn_layout(self.donor_tokens(donor, context), call.T, call.S)
        # qkv_heads calls the `qkv` module exactly as the live block does; `kv_heads` would read qkv.weight
        # directly and miss weight patches that comfy.ops applies only when the layer is called.
        _, k, v = block.attn.qkv_heads(h)
        return k, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, context: Any = None) -> Tensor:
        """`spatial_blocks[0].attn.attend` (softmax attention, heads merged, output projection)."""
        return self.block_self_attention().attend(q, k, v)

    def _context(self, call: Any, plan: StepPlan) -> STDiT3Context:
        own = plan.modulation_sigma == plan.sigma
        return STDiT3Context(call, None if own else plan.modulation_sigma)

    def replace_fn(self, run: CacheAttentionRun, cond_or_uncond: Sequence[int] = BATCHED_CFG,
                   sigma: float | None = None,
                   previous: Callable[[Any], Tensor] | None = None,
                   ids: Sequence[Any] | None = None) -> Callable[[Any], Tensor]:
        """The callable for block 0's `attn_replace` slot (see `attn_replace`); `previous` is another pack's patch of
        that slot, which then computes every attention of the block (with the donor's K/V at cache steps)."""
        flags = run.chunk_flags(cond_or_uncond, ids)

        def replace(call: Any) -> Tensor:
            attend = _attend_through(call, previous)
            plan = run.plan_for(sigma_of_call(call) if sigma is None else sigma)
            if plan is None or not any(flags):
                return attend(call.q, call.k, call.v)
            if call.kind != "spatial" or call.index != 0:
                raise RuntimeError(f"Cache Attention is for spatial block 0, not {call.kind} block {call.index}")
            context = self._context(call, plan)
            key = (call.T, call.S, str(call.q.device), call.q.dtype)
            k_d, v_d = run.donor_kv(plan, key, lambda: self.donor_kv(plan.donor_latent, context))
            rows = chunk_row_mask(flags, call.q.shape[0], call.q.device)
            out = cache_attention(call.q, call.k, call.v, k_d, v_d, attend, mode=run.config.kv_mode, rows=rows)
            run.record(plan, call.kind, call.index, int(rows.sum()), int(rows.numel()))
            return out

        return replace

    def attn_replace(self, run: CacheAttentionRun, cond_or_uncond: Sequence[int] = BATCHED_CFG,
                     sigma: float | None = None) -> dict[tuple[str, int], Callable[[Any], Tensor]]:
        """`attn_replace` mapping for one STDiT3 forward call.

        cond_or_uncond: one entry per batch chunk, 0 = cond, 1 = uncond (ComfyUI's convention); the default
        (0, 1) is the reference sampler's batched [cond; uncond]; a split call passes (0,) or (1,). sigma: the
        call's flow sigma (default: its timestep / 1000).
        """
        return {self.PATCH_KEY: self.replace_fn(run, cond_or_uncond, sigma)}

    def options_replace_fn(self, run: CacheAttentionRun | None = None, run_key: str = RUN_KEY,
                           previous: Callable[[Any], Tensor] | None = None) -> Callable[[Any], Tensor]:
        """Block-0 patch that reads each call's `call.info["transformer_options"]` (as ComfyUI's STDiT3 wrapper
        provides them): the run (the one given, else options[run_key]; none = plain attention), the batch layout
        (options["cond_or_uncond"]; absent = the whole batch is cond) and the sigma (options["sigmas"][0]; absent =
        the timestep / 1000)."""

        def replace(call: Any) -> Tensor:
            options = call.info.get("transformer_options") or {}
            active = run if run is not None else options.get(run_key)
            if active is None:
                return _attend_through(call, previous)(call.q, call.k, call.v)
            layout = tuple(int(c) for c in options.get("cond_or_uncond") or (COND,))
            return self.replace_fn(active, layout, options_sigma(options), previous, options.get("uuids"))(call)

        replace.chai_previous = previous  # type: ignore[attr-defined]
        return replace

    def comfy_install(self, patcher: Any, run_key: str = RUN_KEY) -> None:
        """Replace block 0's spatial self-attention on a ModelPatcher clone (patches_replace["dit"]), chaining
        another pack's patch of that slot (installing twice replaces our own patch instead of stacking it).

        The patch reads the run from transformer_options[run_key] on every call and attends as usual without one,
        so the clone itself holds no per-run state.
        """
        options = patcher.model_options.get("transformer_options", {})
        previous = ((options.get("patches_replace") or {}).get("dit") or {}).get(self.PATCH_KEY)
        while previous is not None and hasattr(previous, "chai_previous"):
            previous = previous.chai_previous
        patcher.set_model_patch_replace(self.options_replace_fn(run_key=run_key, previous=previous), "dit",
                                        *self.PATCH_KEY)
        track_prompts(patcher, run_key)

    def check_run(self, run: CacheAttentionRun, latent_shape: Sequence[int] | None = None) -> None:
        """Donor latents must be 4-D or 5-D STDiT3 latents with the model's channel count."""
        shape = run.donors.shape
        channels = self.model.config.in_channels
        if len(shape) not in (4, 5) or shape[-4] != channels:
            raise ValueError(f"donor latents of shape {shape} are not {channels}-channel STDiT3 latents")
