"""Cache Attention through a model's public hooks only: no model code of ours computes q/k/v, RoPE or modulation.

Three callables, all plain Python with ComfyUI's calling conventions (so this module imports no ComfyUI):

* `CacheAttentionWrapper`, an APPLY_MODEL wrapper: on an evaluation at a cache step it first runs a *capture pass*,
  the model's own forward on the donor latent (same call arguments, the donor in place of the live latent), which
  stops as soon as the hooked block's attention has been handed its keys and values; then the *live pass*, the
  unchanged call, in which that attention attends with the donor's keys and values.
* `BlockPatch`, the `patches_replace["dit"][block_key]` replacement of the hooked block: during a pass it sets
  ComfyUI's `optimized_attention_override` transformer option in the options it hands that block only, chaining
  whatever block patch and attention override were there before.
* `AttentionOverride`: counts the attention calls of one block call; the adapter's call (the self-attention)
  raises `_KVCaptured` in the capture pass and attends with the donor's K/V in the live pass; every other call
  goes through unchanged (through the previous override, if any).

An adapter (see `HookAdapter`) only says where: which block, which attention call in it, how a donor latent
becomes the model input, how donor keys/values enter the live call (by default through `kv.combine_kv`, the one
K/V combine). What a model must honour: it calls `transformer_options["patches_replace"]["dit"][block_key]` for
that block, and the block's attention calls `transformer_options["optimized_attention_override"]`, as ComfyUI's
own DiTs and the pack's STDiT3 do. `install` puts both hooks on a ModelPatcher clone; `with_block_patch` puts the
block patch into a plain transformer_options dict (the pure-torch pipeline). docs/cache-attention.md has the
details, docs/adding-a-model-family.md the recipe for a new family.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence

import torch
from torch import Tensor

from .attention_call import AttentionCall, AttentionFn, DonorKV, same_tensors
from .constants import RUN_KEY
from .kv import chunk_row_mask, combine_kv
from .run import COND, CacheAttentionRun, StepPlan
from .steps import first_value

PASS_KEY = "chai_pass"  # transformer_options key (of our per-call copies only): the pass under way
OVERRIDE_KEY = "optimized_attention_override"  # ComfyUI's attention override transformer option
APPLY_MODEL = "apply_model"  # comfy.patcher_extension.WrappersMP.APPLY_MODEL
OUTER_SAMPLE = "outer_sample"  # comfy.patcher_extension.WrappersMP.OUTER_SAMPLE
DIFFUSION_MODEL = "diffusion_model"  # comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL
WRAPPER_KEY = "chai_cache_attention"  # our APPLY_MODEL wrapper's key on a ModelPatcher
PROMPTS_KEY = "chai_prompts"  # our OUTER_SAMPLE wrapper's key
DIT = "dit"  # the patches_replace group of DiT block replacements

Override = Callable[..., Tensor]


class _KVCaptured(Exception):
    """Raised inside the capture pass to stop the model right after the hooked attention got its K/V."""

    def __init__(self, donor: DonorKV) -> None:
        super().__init__("CHAI capture pass (caught by CacheAttentionWrapper; seeing this is a bug)")
        self.donor = donor


# ---------------------------------------------------------------------------------------------- passes

@dataclass
class CapturePass:
    """The pass that runs the model on the donor latent and stops inside the hooked attention."""


@dataclass
class LivePass:
    """The live evaluation at a cache step: attend with `donor` on the rows of the CFG chunks flagged in `flags`."""

    donor: DonorKV
    flags: Sequence[bool]  # per CFG chunk of the call: does it attend to the donor
    mode: str
    on_fire: Callable[[int, int], None]  # (rows that attended to the donor, all rows)
    fired: int = 0


# ---------------------------------------------------------------------------------------------- the adapter contract

class HookAdapter:
    """Where Cache Attention hooks into a model (the base of every `adapters.ModelAdapter`).

    Subclasses set `block_key` (the `patches_replace["dit"]` key of the block whose attention is replaced) and
    `attention_index` (which attention call of that block, counted from 0, is the self-attention); they may
    override `donor_input`, `splice_kv` and `check_donor` when the defaults do not fit. `shares_donor_kv`: the
    hooked attention's donor K/V depend on the donor latent, the call's shape and timestep only (not on its
    conditioning), so one capture pass per step serves every call of that step (split CFG calls).
    """

    block_key: ClassVar[tuple[Any, ...]] = ("double_block", 0)
    attention_index: ClassVar[int] = 0
    firing_kind: ClassVar[str] = "self_attn"
    shape_hint: ClassVar[str] = "the live latent's shape"
    shares_donor_kv: ClassVar[bool] = False

    def donor_input(self, donor: Tensor, x: Tensor) -> Tensor:
        """The model input of the capture pass: the donor latent in place of the live latent x.

        Default: the donor [C, ...] or [1 | B, C, ...] must have x's shape apart from the batch; it is moved to x's
        device and dtype and repeated over x's batch (every row of the call sees the same donor).
        """
        z = donor[None] if donor.dim() == x.dim() - 1 else donor
        if tuple(z.shape[1:]) != tuple(x.shape[1:]):
            raise ValueError(f"donor latent {tuple(donor.shape)} does not have {self.shape_hint} "
                             f"{tuple(x.shape[1:])}: Cache Attention needs the same resolution and frame count")
        if z.shape[0] not in (1, x.shape[0]):
            raise ValueError(f"donor latent batch {z.shape[0]} cannot serve a batch of {x.shape[0]}")
        z = z.to(device=x.device, dtype=x.dtype)
        return z.expand(x.shape[0], *z.shape[1:]).contiguous() if z.shape[0] != x.shape[0] else z

    def splice_kv(self, live: AttentionCall, donor: DonorKV, mode: str,
                  block_args: Mapping[str, Any]) -> AttentionCall:
        """The live call with the donor's keys/values: instead of its own ("replace") or after them ("concat").

        block_args: the hooked block's arguments in the live pass (e.g. "img" to tell image from text tokens in a
        joint attention). Default: the whole K/V tensors (a self-attention over the latent's tokens only).
        """
        if tuple(donor.k.shape) != tuple(live.k.shape) or tuple(donor.v.shape) != tuple(live.v.shape):
            raise ValueError(f"donor keys {tuple(donor.k.shape)} do not match the live keys {tuple(live.k.shape)}: "
                             f"Cache Attention needs the donor latent to have {self.shape_hint}")
        if mode == "concat" and live.mask is not None:
            raise ValueError("'concat' K/V mode is not supported on an attention call with a mask; use 'replace'")
        k, v = combine_kv(live.k, live.v, donor.k, donor.v, mode, dim=live.token_dim)
        return live.replace(k=k, v=v)

    def check_donor(self, donor: DonorKV, live_block_args: Mapping[str, Any]) -> None:
        """ValueError when the donor pass's tokens sit at other positions than the live ones.

        Default: the positional embedding the block received ("pe", computed by the model itself in both passes,
        with whatever transformer options RoPE-scaling nodes set) must be the same.
        """
        if not same_tensors(donor.block_args.get("pe"), live_block_args.get("pe")):
            raise ValueError("the donor latent's tokens have other positions than the live latent's: Cache "
                             f"Attention needs the donor latent to have {self.shape_hint}")

    def check_call(self, extra: Mapping[str, Any]) -> None:
        """ValueError when a model call of a Cache Attention run is one this adapter refuses, told by the call's
        extra arguments (APPLY_MODEL keyword arguments: the model's extra conds, e.g. a reference latent).

        Checked at every model evaluation of a CHAI request (by CacheAttentionWrapper on a hit, by the donor capture
        on a miss) before the model runs; `ModelAdapter.check_request` refuses what the nodes' inputs already show,
        before sampling. Default: every call is accepted.
        """

    def comfy_install(self, patcher: Any, run_key: str = RUN_KEY) -> None:
        """Install on a ModelPatcher clone (see `install`); per-run state travels in transformer_options[run_key]."""
        install(patcher, self, run_key)


# ---------------------------------------------------------------------------------------------- the block hook

class AttentionOverride:
    """ComfyUI `optimized_attention_override` for one call of the hooked block (see the module docstring)."""

    def __init__(self, adapter: HookAdapter, state: CapturePass | LivePass, block_args: Mapping[str, Any],
                 previous: Override | None) -> None:
        self.adapter, self.state, self.block_args, self.previous = adapter, state, block_args, previous
        self.calls = 0

    def __call__(self, func: AttentionFn, *args: Any, **kwargs: Any) -> Tensor:
        index = self.calls
        self.calls += 1
        if index != self.adapter.attention_index:
            return self.previous(func, *args, **kwargs) if self.previous is not None else func(*args, **kwargs)
        call = AttentionCall.bind(func, args, kwargs)
        if isinstance(self.state, CapturePass):
            mask = call.mask if isinstance(call.mask, Tensor) else None
            raise _KVCaptured(DonorKV(call.k.detach(), call.v.detach(), mask, call.token_dim,
                                      {k: v for k, v in self.block_args.items() if k != "transformer_options"}))
        return self.live(call)

    def live(self, call: AttentionCall) -> Tensor:
        """Attend with the donor's K/V on the flagged rows; the other rows exactly as unpatched."""
        state, adapter = self.state, self.adapter
        assert isinstance(state, LivePass)
        adapter.check_donor(state.donor, self.block_args)
        # Rows of the attention call (q's dim 0: batch entries, or (entry, frame) pairs for a per-frame attention)
        # split evenly over the call's CFG chunks.
        rows = chunk_row_mask(state.flags, call.q.shape[0], call.q.device)
        if bool(rows.all()):
            out = adapter.splice_kv(call, state.donor, state.mode, self.block_args).run(self.previous)
        else:
            # The rows that keep their own K/V come out of the very computation the unpatched block runs, on the
            # whole batch, so they stay bit-identical whatever batch-size-dependent kernel the attention picks.
            out = call.run(self.previous)
            donor = _donor_rows(state.donor, rows)
            patched = adapter.splice_kv(call.rows(rows), donor, state.mode, self.block_args).run(self.previous)
            out[rows] = patched.to(out.dtype)
        state.fired += 1
        state.on_fire(int(rows.sum()), int(rows.numel()))
        return out


def _donor_rows(donor: DonorKV, rows: Tensor) -> DonorKV:
    mask = donor.mask
    if isinstance(mask, Tensor) and mask.dim() >= 3 and mask.shape[0] == rows.numel() and rows.numel() > 1:
        mask = mask[rows]
    return DonorKV(donor.k[rows], donor.v[rows], mask, donor.token_dim, donor.block_args)


BlockFn = Callable[[dict, dict], dict]


class BlockPatch:
    """The `patches_replace["dit"][block_key]` callable: sets the attention override for this block's call during
    a CHAI pass; outside a pass (and around our override) it calls the previous patch or the original block."""

    def __init__(self, adapter: HookAdapter, previous: BlockFn | None = None) -> None:
        self.adapter = adapter
        self.previous = previous

    def __deepcopy__(self, memo: dict) -> "BlockPatch":
        return self  # stateless; ModelPatcher.clone() deep-copies model_options, never the model we point to

    def _next(self, args: dict, extra: dict) -> dict:
        return self.previous(args, extra) if self.previous is not None else extra["original_block"](args)

    def __call__(self, args: dict, extra: dict) -> dict:
        options = args.get("transformer_options")
        if not isinstance(options, Mapping):
            return self._next(args, extra)
        state = options.get(PASS_KEY)
        if state is None:
            return self._next(args, extra)
        override = AttentionOverride(self.adapter, state, args, options.get(OVERRIDE_KEY))
        return self._next({**args, "transformer_options": {**options, OVERRIDE_KEY: override}}, extra)


# ---------------------------------------------------------------------------------------------- the model wrapper

def _split_apply_model_args(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any], dict]:
    """(args, kwargs, transformer_options) of an APPLY_MODEL call (x, t, c_concat, c_crossattn, control,
    transformer_options, **extra)."""
    args, kwargs = list(args), dict(kwargs)
    if len(args) > 5:
        options = args[5]
    else:
        options = kwargs.get("transformer_options")
    return args, kwargs, dict(options or {})


def _with_options(args: list[Any], kwargs: dict[str, Any], options: dict) -> tuple[list[Any], dict[str, Any]]:
    args, kwargs = list(args), dict(kwargs)
    if len(args) > 5:
        args[5] = options
    else:
        kwargs["transformer_options"] = options
    return args, kwargs


def _without_diffusion_model_wrappers(options: dict) -> dict:
    """Options for the capture pass: other packs' diffusion-model wrappers (step caches such as EasyCache, which
    would count the pass as a step or answer it from their cache) stay out of it."""
    wrappers = options.get("wrappers")
    if not isinstance(wrappers, Mapping) or not wrappers.get(DIFFUSION_MODEL):
        return options
    return {**options, "wrappers": {**wrappers, DIFFUSION_MODEL: {}}}


class CacheAttentionWrapper:
    """APPLY_MODEL wrapper: at a cache step of transformer_options[run_key]'s run, capture pass then live pass."""

    def __init__(self, adapter: HookAdapter, run_key: str = RUN_KEY) -> None:
        self.adapter = adapter
        self.run_key = run_key

    def __deepcopy__(self, memo: dict) -> "CacheAttentionWrapper":
        return self  # stateless (see BlockPatch)

    def __call__(self, executor: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        call_args, call_kwargs, options = _split_apply_model_args(args, kwargs)
        run = options.get(self.run_key)
        if not isinstance(run, CacheAttentionRun):
            return executor(*call_args, **call_kwargs)
        self.adapter.check_call(call_kwargs)
        t = call_args[1]
        sigma = first_value(t)
        plan = run.plan_for(sigma) if sigma is not None else None
        if plan is None:
            return executor(*call_args, **call_kwargs)
        layout = tuple(int(c) for c in options.get("cond_or_uncond") or (COND,))
        flags = run.chunk_flags(layout, options.get("uuids"))
        if not any(flags):
            return executor(*call_args, **call_kwargs)
        donor = self.capture(executor, call_args, call_kwargs, options, plan, run)
        live = LivePass(donor, flags, run.config.kv_mode,
                        lambda used, total: run.record(plan, self.adapter.firing_kind, self._block_index(), used,
                                                       total))
        live_args, live_kwargs = _with_options(call_args, call_kwargs, {**options, PASS_KEY: live})
        # A step cache (EasyCache) may answer this step without running the model: then nothing fires, and the
        # run's summary reports the cache step that never fired.
        return executor(*live_args, **live_kwargs)

    def _block_index(self) -> int:
        key = self.adapter.block_key
        return int(key[1]) if len(key) > 1 and isinstance(key[1], int) else 0

    def capture(self, executor: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], options: dict,
                plan: StepPlan, run: CacheAttentionRun) -> DonorKV:
        """The donor's K/V at the hooked attention: a capture pass, or the one of an earlier call of this step
        when the adapter `shares_donor_kv` and the call has the same shape and timestep (run.donor_kv)."""
        x, t = args[0], args[1]
        t_donor = t if plan.modulation_sigma == plan.sigma else torch.full_like(t, plan.modulation_sigma)
        if not self.adapter.shares_donor_kv:
            return self._capture(executor, args, kwargs, options, plan, t_donor)
        key = (tuple(x.shape), str(x.device), x.dtype, first_value(t_donor))
        return run.donor_kv(plan, key, lambda: self._capture(executor, args, kwargs, options, plan, t_donor))

    def _capture(self, executor: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], options: dict,
                 plan: StepPlan, t_donor: Any) -> DonorKV:
        """Run the model on the donor latent until the hooked attention has its K/V; return them."""
        donor_x = self.adapter.donor_input(plan.donor_latent, args[0])
        capture_options = _without_diffusion_model_wrappers({**options, PASS_KEY: CapturePass()})
        capture_args, capture_kwargs = _with_options([donor_x, t_donor, *args[2:]], kwargs, capture_options)
        try:
            executor(*capture_args, **capture_kwargs)
        except _KVCaptured as done:
            return done.donor
        raise RuntimeError(f"CHAI: the capture pass never reached attention call {self.adapter.attention_index} of "
                           f"block {self.adapter.block_key}; this model does not honour the block hook")


class GuiderPrompts:
    """OUTER_SAMPLE wrapper: tells the run which cond entries are the guider's prompt ("positive"), so that
    apply_to="cond" means the prompt under every guider (CFGGuider puts it at chunk index 0, DualCFGGuider at 2)."""

    def __init__(self, run_key: str = RUN_KEY) -> None:
        self.run_key = run_key

    def __deepcopy__(self, memo: dict) -> "GuiderPrompts":
        return self

    def __call__(self, executor: Any, *args: Any, **kwargs: Any) -> Any:
        guider = getattr(executor, "class_obj", None)
        options = (getattr(guider, "model_options", None) or {}).get("transformer_options", {})
        run = options.get(self.run_key)
        conds = getattr(guider, "conds", None)
        if isinstance(run, CacheAttentionRun) and isinstance(conds, Mapping):
            run.prompt_ids = frozenset(c["uuid"] for c in conds.get("positive", ()) or ()
                                       if isinstance(c, Mapping) and "uuid" in c)
        return executor(*args, **kwargs)


def track_prompts(patcher: Any, run_key: str = RUN_KEY) -> None:
    """Add (once) the GuiderPrompts wrapper to a ModelPatcher clone."""
    patcher.remove_wrappers_with_key(OUTER_SAMPLE, PROMPTS_KEY)
    patcher.add_wrapper_with_key(OUTER_SAMPLE, PROMPTS_KEY, GuiderPrompts(run_key))


# ---------------------------------------------------------------------------------------------- installation

def chained_block_patch(options: Mapping[str, Any], adapter: HookAdapter) -> BlockPatch:
    """Our block patch for transformer_options `options`, chaining the patch they hold at the adapter's block key
    (never our own: installing twice replaces our patch instead of stacking it)."""
    previous = ((options.get("patches_replace") or {}).get(DIT) or {}).get(adapter.block_key)
    while isinstance(previous, BlockPatch):
        previous = previous.previous
    return BlockPatch(adapter, previous)


def with_block_patch(options: Mapping[str, Any], adapter: HookAdapter) -> dict:
    """A copy of a plain transformer_options dict with our block patch at patches_replace["dit"][block_key]
    (no ModelPatcher: the pure-torch pipeline); the nested dicts are copied, never changed in place."""
    replaces = dict(options.get("patches_replace") or {})
    replaces[DIT] = {**(replaces.get(DIT) or {}), tuple(adapter.block_key): chained_block_patch(options, adapter)}
    return {**options, "patches_replace": replaces}


def install(patcher: Any, adapter: HookAdapter, run_key: str = RUN_KEY) -> None:
    """Install Cache Attention on a ModelPatcher *clone*: the block patch (chaining the one there), the
    APPLY_MODEL wrapper and the guider-prompt tracker. Installing twice replaces ours instead of stacking it."""
    options = patcher.model_options.get("transformer_options", {})
    patcher.set_model_patch_replace(chained_block_patch(options, adapter), DIT, *adapter.block_key)
    patcher.remove_wrappers_with_key(APPLY_MODEL, WRAPPER_KEY)
    patcher.add_wrapper_with_key(APPLY_MODEL, WRAPPER_KEY, CacheAttentionWrapper(adapter, run_key))
    track_prompts(patcher, run_key)


__all__ = ["AttentionCall", "AttentionFn", "DonorKV", "same_tensors", "CapturePass", "LivePass", "HookAdapter",
           "AttentionOverride", "BlockPatch", "CacheAttentionWrapper", "GuiderPrompts", "track_prompts",
           "chained_block_patch", "with_block_patch", "install", "PASS_KEY", "OVERRIDE_KEY", "APPLY_MODEL",
           "WRAPPER_KEY", "DIT"]
