"""CHAI inside ComfyUI: sample with or without Cache Attention on a ModelPatcher clone, fingerprints, text encoders.

The only module of chai_attention that touches ComfyUI, and only inside functions (importing it needs no ComfyUI).
The shared MODEL is never modified: sampling runs on a clone, per-run state travels in its transformer_options,
and everything added is removed in a `finally` (docs/cache-attention.md says where state lives and which
samplers fire at which steps).
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import weakref
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from .adapters import get_adapter
from .config import ChaiConfig
from .constants import CAPTURE_KEY, RUN_KEY
from .donors import DonorCapture
from .conditioning import conditioning_digest
from .fingerprint import model_fingerprint
from .hooks import WRAPPER_KEY as HOOK_WRAPPER_KEY
from .flow import Schedule, finish_fast, finish_full, plan_request, trace_for
from .payloads import CacheHit, SampleTrace
from .run import COND, CacheAttentionRun
from .steps import CapturePlan, as_sigmas, first_value, match_step

log = logging.getLogger(__name__)

SAMPLE_ELEMENTS = 256  # elements read from each weight tensor for the weights digest
WAN22_BOUNDARY = 0.875  # Wan 2.2 A14B text-to-video: the low-noise expert samples below this sigma (i2v: 0.9)



class SharedRun(CacheAttentionRun):
    """A CacheAttentionRun that copies of the model options share instead of duplicating.

    ModelPatcher.clone() deep-copies model_options; a copy of the run would record firings nobody reads and
    duplicate the donor latents.
    """

    def __copy__(self) -> "SharedRun":
        return self

    def __deepcopy__(self, memo: dict) -> "SharedRun":
        return self


# ---------------------------------------------------------------------------------------------------- fingerprints

_BIT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _sample_bytes(t: Tensor, elements: int = SAMPLE_ELEMENTS) -> bytes:
    """Shape, dtype and the raw bits of up to `elements` evenly spaced values of a tensor, as bytes."""
    head = f"{tuple(t.shape)}|{t.dtype}|".encode()
    bits = _BIT_VIEWS.get(t.element_size())
    if t.is_meta or t.numel() == 0 or bits is None:
        return head
    flat = t.detach().reshape(-1)
    if flat.dtype != bits:
        flat = flat.view(bits)  # raw bits: exact for every dtype, fp8 included
    n = flat.numel()
    idx = torch.linspace(0, n - 1, steps=min(n, elements), device=flat.device).round().long()
    return head + flat[idx].cpu().numpy().tobytes()


def _digest(value: Any, h: "hashlib._Hash", depth: int = 0) -> None:
    """Feed a patch value (tensors, nested tuples, adapter objects) into a hash."""
    if depth > 8:
        h.update(b"<deep>")
    elif isinstance(value, Tensor):
        h.update(_sample_bytes(value))
    elif isinstance(value, (list, tuple)):
        h.update(f"[{len(value)}".encode())
        for item in value:
            _digest(item, h, depth + 1)
    elif isinstance(value, Mapping):
        for key in sorted(value, key=str):
            h.update(str(key).encode())
            _digest(value[key], h, depth + 1)
    elif value is None or isinstance(value, (bool, int, float, str)):
        h.update(repr(value).encode())
    else:  # e.g. a comfy.weight_adapter LoRA object: its class and its tensors
        h.update(type(value).__name__.encode())
        weights = getattr(value, "weights", None)
        if weights is not None:
            _digest(weights, h, depth + 1)


def original_weights_digest(module: torch.nn.Module, backup: Mapping[str, Any] | None = None,
                            prefix: str = "") -> str:
    """sha256 over every tensor's name, shape, dtype and a sample of its values, as loaded from disk.

    `backup` is a ModelPatcher's backup of weights it patched in place (keys with `prefix`): those originals are
    read instead, so a loaded LoRA never leaks into the digest.
    """
    h = hashlib.sha256()
    backup = backup or {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        saved = backup.get(prefix + name)
        if saved is not None:
            tensor = getattr(saved, "weight", saved)
        h.update(name.encode())
        h.update(_sample_bytes(tensor))
    return h.hexdigest()


_WEIGHT_DIGESTS: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
_DIGEST_LOCK = threading.Lock()


def _base_digest(patcher: Any, module: torch.nn.Module, prefix: str) -> str:
    """original_weights_digest memoised per module (weights are only ever patched through the backups)."""
    with _DIGEST_LOCK:
        found = _WEIGHT_DIGESTS.get(module)
    if found is None:
        found = original_weights_digest(module, getattr(patcher, "backup", None), prefix)
        with _DIGEST_LOCK:
            _WEIGHT_DIGESTS[module] = found
    return found


def patches_digest(patcher: Any) -> str:
    """sha256 over a ModelPatcher's weight patches: keys, strengths, offsets, functions and patch tensors."""
    h = hashlib.sha256()
    patches = getattr(patcher, "patches", None) or {}
    for key in sorted(patches):
        h.update(key.encode())
        for patch in patches[key]:
            strength, value = patch[0], patch[1]
            rest = patch[2:]
            h.update(repr((strength, *[getattr(r, "__name__", r) for r in rest])).encode())
            _digest(value, h)
    return h.hexdigest()


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def comfy_model_fingerprint(model: Any) -> str:
    """Fingerprint of a ComfyUI MODEL: architecture, original weights, LoRA-style patches and strengths, dtype.

    The weights are identified by a digest of their names, shapes, dtypes and a sample of every tensor's values
    (a ModelPatcher does not know which file it came from; two files with the same tensors are the same model).
    """
    base = model.model
    net = base.diffusion_model
    weights = _base_digest(model, net, "diffusion_model.")
    config = getattr(getattr(base, "model_config", None), "unet_config", None)
    extra = {
        "base_model": type(base).__name__,
        "unet_config": {k: _jsonable(v) for k, v in (config or {}).items()},
        "patches": patches_digest(model) if getattr(model, "patches", None) else "",
        "compute_dtype": str(getattr(base, "manual_cast_dtype", None) or model.model_dtype()),
    }
    return model_fingerprint(net, weights_id=f"sampled:{weights[:24]}", dtype=model.model_dtype(), extra=extra)


def request_fingerprint(model: Any, model_2: Any = None, conditioning: str | None = None) -> str:
    """The fingerprint a cache entry is keyed by: the MODEL's, or, for a pair of experts (Wan 2.2 A14B: high-noise
    `model`, low-noise `model_2`) and/or an image conditioning digest (`conditioning.conditioning_digest`), one over
    all of them ('<class>+<class>@...' / '...+image@...'), so an entry only serves the same pair and image.
    The switching boundary is not part of it: the donors are captured at high-noise steps, before any switch."""
    base = comfy_model_fingerprint(model)
    if model_2 is None and not conditioning:
        return base
    parts, names = [base], [base.split("@")[0]]
    if model_2 is not None:
        second = comfy_model_fingerprint(model_2)
        parts.append(second)
        names.append(second.split("@")[0])
    if conditioning:
        parts.append(conditioning)
        names.append("image")
    return f"{'+'.join(names)}@{hashlib.sha256('|'.join(parts).encode()).hexdigest()[:16]}"


# ---------------------------------------------------------------------------------------------- text encoders

def _phrase_vector(clip: Any, phrase: str) -> Tensor:
    """One vector per phrase: the encoder's pooled output, else the mean of its (masked) token features."""
    out = clip.encode_from_tokens(clip.tokenize(phrase), return_pooled=True, return_dict=True)
    pooled = out.get("pooled_output")
    if isinstance(pooled, Tensor) and pooled.numel():
        return pooled.reshape(pooled.shape[0], -1)[0].float().cpu()
    cond = out["cond"][0].float()
    mask = out.get("attention_mask")
    if isinstance(mask, Tensor) and mask.shape[-1] == cond.shape[0]:
        weights = mask.reshape(-1, cond.shape[0])[0].to(cond)
        return ((cond * weights[:, None]).sum(0) / weights.sum().clamp_min(1.0)).cpu()
    return cond.mean(0).cpu()


def text_encoder_name(clip: Any) -> str:
    """Embedder name for a ComfyUI CLIP: its encoder class and a digest of its original weights and patches, so
    a cache never mixes vectors of two encoders (or of one encoder with and without a LoRA)."""
    encoder = clip.cond_stage_model
    patcher = getattr(clip, "patcher", None)
    digest = hashlib.sha256(_base_digest(patcher, encoder, "").encode())
    digest.update(patches_digest(patcher).encode())
    return f"text-encoder:{type(encoder).__name__}@{digest.hexdigest()[:12]}"


def encode_phrases(clip: Any, phrases: Sequence[str]) -> Tensor:
    """[len(phrases), dim] float32 CPU vectors of entity phrases from a ComfyUI CLIP (one encoder call each)."""
    return torch.stack([_phrase_vector(clip, p) for p in phrases])


# ---------------------------------------------------------------------------------------------- latents, schedules

def prepared_latent(model: Any, latent: Mapping[str, Any]) -> Tensor:
    """The LATENT's samples as the sampler will see them (empty latents widened to the model's channels)."""
    import comfy.sample

    return comfy.sample.fix_empty_latent_channels(model, latent["samples"])


def latent_shape(model: Any, latent: Mapping[str, Any]) -> tuple[int, ...]:
    """Shape of the latent the sampler will run on (what cache entries are keyed by)."""
    return tuple(prepared_latent(model, latent).shape)


def check_sampler_name(sampler_name: str) -> None:
    """ValueError naming the choices when ComfyUI has no sampler of that name."""
    import comfy.samplers

    samplers = comfy.samplers.KSampler.SAMPLERS
    if sampler_name not in samplers:
        raise ValueError(f"unknown sampler {sampler_name!r}; choose one of {', '.join(samplers)}")


def comfy_schedule(model: Any, sampler_name: str, scheduler: str) -> Schedule:
    """steps -> the sigmas ComfyUI's KSampler would use (including its penultimate-sigma rule), on the CPU."""
    import comfy.samplers

    schedulers = comfy.samplers.KSampler.SCHEDULERS
    if scheduler not in schedulers:  # KSampler itself would silently fall back to its first choice
        raise ValueError(f"unknown scheduler {scheduler!r}; choose one of {', '.join(schedulers)}")
    check_sampler_name(sampler_name)

    def sigmas(steps: int) -> Tensor:
        ks = comfy.samplers.KSampler(model, steps=steps, device="cpu", sampler=sampler_name, scheduler=scheduler,
                                     denoise=1.0, model_options=model.model_options)
        return ks.sigmas.detach().to("cpu", torch.float32)

    return sigmas


# ---------------------------------------------------------------------------------------------- donor capture

class ModelInputCapture(DonorCapture):
    """A miss's donor capture: an APPLY_MODEL wrapper that keeps the latent the model is evaluated on at each
    planned sigma of the full schedule (the last such evaluation of a step: for heun that is the step's own
    latent, not the previous step's corrector guess).

    It reads the model input rather than the sampler callback's x, which some samplers (uni_pc) keep in another
    scaling. Latents are copied to the CPU in float32, cond chunk only. `check` (the adapter's `check_call`) sees
    every call's extra arguments first and may refuse the request (ValueError) before the model runs.
    """

    def __init__(self, plan: CapturePlan, full_sigmas: Sequence[float], shape: Sequence[int],
                 check: Callable[[Mapping[str, Any]], None] | None = None) -> None:
        super().__init__(plan, device="cpu")
        self.full_sigmas = tuple(float(s) for s in full_sigmas)
        self.shape = tuple(shape)
        self.check = check

    def observe(self, step: int, x: Tensor, sigma: float) -> None:
        """Record x for a planned step, replacing an earlier evaluation at the same sigma."""
        if step in self.plan.indices:
            self._kept.pop(step, None)
        super().observe(step, x, sigma)

    def _chunk(self, x: Tensor, cond_or_uncond: Sequence[int] | None) -> Tensor | None:
        chunks = list(cond_or_uncond or [COND])
        if x.shape[0] % len(chunks):
            return None
        rows = x.shape[0] // len(chunks)
        at = chunks.index(COND) if COND in chunks else 0
        part = x[at * rows:(at + 1) * rows]
        return part if tuple(part.shape) == self.shape else None

    def __call__(self, executor: Any, *args: Any, **kwargs: Any) -> Any:
        """APPLY_MODEL wrapper: (x, t, c_concat, c_crossattn, control, transformer_options, ...)."""
        if self.check is not None:
            self.check(kwargs)
        x, t = args[0], args[1]
        options = args[5] if len(args) > 5 else kwargs.get("transformer_options") or {}
        step = match_step(first_value(t), self.full_sigmas)
        if step is not None and step in self.plan.indices:
            part = self._chunk(x, options.get("cond_or_uncond"))
            if part is None:
                self.skipped.append(f"step {step + 1}: model input {tuple(x.shape)} is not the latent {self.shape}")
            else:
                self.observe(step, part, self.full_sigmas[step])
        return executor(*args, **kwargs)


# ---------------------------------------------------------------------------------------------- sampling

def _restore_object_patches(clone: Any, keys: set[str]) -> None:
    """Undo object patches that the adapter added to the clone, on the shared model, right now."""
    if not keys:
        return
    import comfy.utils

    backup = getattr(clone, "object_patches_backup", {})
    for key in keys:
        if key in backup:
            comfy.utils.set_attr(clone.model, key, backup.pop(key))


def expert_stages(sigmas: Any, model: Any, model_2: Any = None,
                  boundary: float = WAN22_BOUNDARY) -> list[tuple[Any, Any]]:
    """(MODEL, sigmas) per sampling stage: one stage, or with a second expert (Wan 2.2 A14B) the steps at sigma >=
    boundary on `model` and the rest on `model_2`, as the two-KSamplerAdvanced graph splits them."""
    values = as_sigmas(sigmas)
    switch = sum(1 for s in values[:-1] if s >= boundary)
    if model_2 is None or switch == 0:
        return [(model_2 if model_2 is not None else model, sigmas)]
    if switch >= len(values) - 1:
        return [(model, sigmas)]
    return [(model, sigmas[:switch + 1]), (model_2, sigmas[switch:])]


def chai_sample(model: Any, positive: Any, negative: Any, latent: Mapping[str, Any], *, seed: int, cfg: float,
                sampler_name: str, scheduler: str, config: ChaiConfig, schedule: Schedule,
                hit: CacheHit | None = None, model_2: Any = None,
                boundary: float = WAN22_BOUNDARY) -> tuple[dict[str, Any], SampleTrace]:
    """Sample a LATENT as ComfyUI's KSampler does: fast with Cache Attention on a usable hit, else full with capture.

    schedule(steps) gives the sigmas (e.g. `comfy_schedule`); scheduler is only its label for reports. model_2: a
    second expert (Wan 2.2 A14B low-noise) for the steps below `boundary`. Returns the output LATENT (a copy of the
    input dict with new samples) and the trace for CHAI_CacheWrite.
    """
    import comfy.model_management
    import comfy.patcher_extension
    import comfy.sample
    import comfy.samplers
    import comfy.utils
    import latent_preview

    start = time.perf_counter()
    comfy.model_management.throw_exception_if_processing_interrupted()
    check_sampler_name(sampler_name)
    adapter = get_adapter(model)  # an unsupported model fails here, before any sampling, naming the supported ones
    adapter.check_request(latent, (positive, negative))  # and a request the adapter refuses (image-to-video)
    if model_2 is not None:
        get_adapter(model_2).check_request(latent, (positive, negative))
    fingerprint = request_fingerprint(model, model_2, conditioning_digest(positive, latent))
    samples = prepared_latent(model, latent)
    shape = tuple(samples.shape)
    plan = plan_request(hit, fingerprint=fingerprint, shape=shape, config=config, adapter=adapter,
                        schedule=schedule, run_cls=SharedRun)
    run, report = plan.run, plan.report
    capture = (ModelInputCapture(plan.capture, plan.sigmas, shape, getattr(adapter, "check_call", None))
               if plan.capture is not None else None)

    noise = comfy.sample.prepare_noise(samples, seed, latent.get("batch_index"))
    stages = []
    for expert, sigmas in expert_stages(plan.schedule, model, model_2, boundary):
        clone = expert.clone()
        added: set[str] = set()
        if run is not None:
            before = set(clone.object_patches)
            get_adapter(clone).comfy_install(clone, run_key=RUN_KEY)
            added = set(clone.object_patches) - before
            # After the install: set_model_patch_replace replaces the transformer_options dict.
            clone.model_options.setdefault("transformer_options", {})[RUN_KEY] = run
        else:
            clone.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.APPLY_MODEL, CAPTURE_KEY, capture)
        stages.append((clone, sigmas, added))

    total = len(plan.sigmas) - 1
    preview = latent_preview.prepare_callback(stages[0][0], total)
    offset = 0

    def callback(step: int, x0: Tensor, x: Tensor, total_steps: int) -> None:
        # The progress hook checks too, but only when a server installed it; this works in every host.
        comfy.model_management.throw_exception_if_processing_interrupted()
        preview(step + offset, x0, x, total)

    setup = time.perf_counter()
    out = samples
    try:
        for i, (clone, sigmas, _) in enumerate(stages):
            out = comfy.sample.sample_custom(
                clone, noise if i == 0 else torch.zeros_like(noise), cfg, comfy.samplers.sampler_object(sampler_name),
                sigmas, positive, negative, out, noise_mask=latent.get("noise_mask"), callback=callback,
                disable_pbar=not comfy.utils.PROGRESS_BAR_ENABLED, seed=seed)
            offset += len(sigmas) - 1
    finally:
        if run is not None:
            run.release()
        for clone, _, added in stages:
            clone.model_options.get("transformer_options", {}).pop(RUN_KEY, None)
            clone.remove_wrappers_with_key(comfy.patcher_extension.WrappersMP.APPLY_MODEL, CAPTURE_KEY)
            clone.remove_wrappers_with_key(comfy.patcher_extension.WrappersMP.APPLY_MODEL, HOOK_WRAPPER_KEY)
            _restore_object_patches(clone, added)
    done = time.perf_counter()
    report.timings = {"setup": setup - start, "sample": done - setup}

    donors, problem = None, ""
    if capture is not None:
        donors, problem = finish_full(plan, capture)
    else:
        finish_fast(plan)
    report.timings["total"] = time.perf_counter() - start
    out_latent = dict(latent)
    out_latent["samples"] = out
    trace = trace_for(plan, hit, fingerprint=fingerprint, shape=shape, config=config, sampler_name=sampler_name,
                      scheduler=scheduler, donors=donors, capture_problem=problem)
    log.info("[CHAI] %s run: %d steps in %.2f s (%s)", report.mode, report.steps, report.timings["sample"],
             report.attention)
    return out_latent, trace


__all__ = [
    "SharedRun", "original_weights_digest", "patches_digest", "comfy_model_fingerprint", "text_encoder_name",
    "encode_phrases", "prepared_latent", "latent_shape", "check_sampler_name", "comfy_schedule", "ModelInputCapture",
    "request_fingerprint", "expert_stages", "chai_sample", "WAN22_BOUNDARY",
]
