"""The CHAI request nodes: entity extraction, cache lookup, the CHAI sampler, cache write, and a prompt list.

Data between them (CHAI_ENTITIES, CHAI_HIT, CHAI_TRACE) is defined in chai_attention.payloads; the request itself
lives in chai_attention.comfy (lookup, prepare, sample). Entities are embedded lazily by the lookup and write nodes
with the cache's embedder, or with the workflow's text encoder when a CLIP is connected to the extract node (its
identity names the encoder's weights, so one cache never mixes two embedders).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any

from comfy_api.v0_0_2 import io

from ..cache_store import CacheUnavailableError, EmbedderMismatchError, EntryTooLargeError
from ..cache_store.entities.embedders.function import FunctionEmbedder
from ..cache_store.entities.extract import EntityExtractor, truncate_prompt
from ..cache_store.entities.language import english_only_note, foreign_language, language_name
from ..cache_store.service import ChaiCache, note_lookup, reader_generation
from ..chai_attention.adapters import supported_families
from ..chai_attention.cache_io import WriteOutcome, WriteReport, write_trace
from ..chai_attention.comfy.lookup import chai_lookup
from ..chai_attention.comfy.sample import chai_sample
from ..chai_attention.comfy.text import TEXT_ENCODER_THRESHOLD, kept_prompt, text_encoder_embedder
from ..chai_attention.constants import DEFAULT_RESTART_SIGMA, DEFAULT_REUSE, WAN22_BOUNDARY
from ..chai_attention.payloads import CacheHit, PromptEntities, SampleTrace
from ..chai_attention.status import (entities_report, entities_status, lookup_status, same_prompt_note,
                                     sampler_status, write_status)
from .canvas import executing_node_id, show
from .errors import ChaiNodeError, user_errors
from .schedule_inputs import (SAMPLERS, SCHEDULERS, chai_plan_inputs, reuse_inputs, schedule_inputs,
                              validate_steps)
from .sockets import CATEGORY, CHAI_CACHE, CHAI_ENTITIES, CHAI_HIT, CHAI_TRACE
from .widgets import combo

log = logging.getLogger(__name__)

_EXTRACTOR: Any = None
_EXTRACTOR_LOCK = threading.Lock()  # guards _EXTRACTOR only


def shared_extractor() -> Any:
    """The process-wide spaCy entity extractor (spaCy loads on first use)."""
    global _EXTRACTOR
    with _EXTRACTOR_LOCK:
        if _EXTRACTOR is None:
            _EXTRACTOR = EntityExtractor()
        return _EXTRACTOR


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _families() -> str:
    """The model families CHAI supports, for tooltips (from the adapter registry)."""
    return "; ".join(supported_families())


class EntityExtract(io.ComfyNode):
    """Extract the entities (objects, scenes) of a prompt for the CHAI cache."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_EntityExtract",
            display_name="CHAI Entity Extract",
            category=CATEGORY,
            description="Finds the entities of a prompt (noun phrases such as 'golden retriever', 'beach'; "
                        "camera and style words are ignored) for CHAI Cache Lookup and Write.",
            inputs=[
                io.String.Input(
                    "prompt", multiline=True, default="",
                    tooltip="The same prompt the text encoder gets (feed both from one primitive string). Plain "
                            "descriptive English works best; a prompt without entities is a valid miss."),
                io.Clip.Input(
                    "clip", optional=True,
                    tooltip="Optional: embed entities with this text encoder instead of the cache's embedder "
                            "(MiniLM, calibrated). Leave empty unless you want the workflow's own encoder; a cache "
                            "keeps the embedder it was built with, and this one's threshold is uncalibrated "
                            f"(auto = {TEXT_ENCODER_THRESHOLD})."),
            ],
            outputs=[
                CHAI_ENTITIES.Output("entities", display_name="entities",
                                     tooltip="The prompt and its entities; connect to CHAI Cache Lookup and Write."),
                io.String.Output("entity_list", display_name="entity list",
                                 tooltip="The entities found, comma-separated ('(none)' when there are none)."),
            ],
        )

    @classmethod
    def execute(cls, prompt: str, clip: Any = None) -> io.NodeOutput:
        node = "CHAI Entity Extract"
        with user_errors(node):
            prompt = prompt or ""
            # With the workflow's encoder connected, the entities come from the words it conditions on.
            text, kept, total = kept_prompt(clip, prompt) if clip is not None else (prompt, 0, 0)
            entities = tuple(shared_extractor().extract(text))
            embedder = text_encoder_embedder(clip, FunctionEmbedder) if clip is not None else None
            language = foreign_language(truncate_prompt(text)) if not entities else None
            result = PromptEntities(prompt, entities, embedder, language=language)
        listing = result.listing()
        cut = (kept, total) if kept < total else None
        status = entities_status(result.texts, language_name(language) if language else None, cut)
        report = entities_report(result.texts, cut, english_only_note(language) if language else "")
        return io.NodeOutput(result, listing, ui=show(status, report))


class CacheLookup(io.ComfyNode):
    """Find an earlier generation that shares an entity with this prompt (same model and latent shape)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_CacheLookup",
            display_name="CHAI Cache Lookup",
            category=CATEGORY,
            description="Looks the prompt's entities up in the cache. A hit needs an entity at or above the "
                        "threshold, made by the same model (weights, LoRAs, dtype) at the same latent shape; the "
                        "report names the matched entities, their similarity and the donor prompt, or why it "
                        "missed. Queued again, it runs only if the cache it reads gained or lost an entry since "
                        "(a write, an eviction, a clear, here or in another process); otherwise ComfyUI serves it "
                        "from its output cache and its box says so.",
            inputs=[
                CHAI_CACHE.Input("cache", tooltip="The cache from a CHAI Cache node."),
                CHAI_ENTITIES.Input("entities", tooltip="The prompt's entities from CHAI Entity Extract."),
                io.Model.Input("model", tooltip="The MODEL the sampler uses (the same one, after any LoRA or "
                                                "model-sampling node): only its own generations can serve as "
                                                "donors."),
                io.Latent.Input("latent", tooltip="The LATENT the sampler starts from; donors must have its shape."),
                io.Float.Input(
                    "threshold", display_name="threshold (0 = auto)", default=0.0, min=0.0, max=1.0, step=0.01, round=0.001,
                    tooltip="Cosine similarity what a thing is (its noun, not its colour or looks) needs to match a "
                            "cached one; only the main subject or the scene can make a hit. 0 = auto: the "
                            "embedder's calibrated value (MiniLM 0.65, chosen on labelled request/donor pairs). "
                            "Raise towards 0.85 for stricter, fewer hits."),
                io.Model.Input("model_2", optional=True,
                               tooltip="Wan 2.2 A14B: the low-noise expert (the sampler's model_2 or the second "
                                       "sampler's MODEL); a cache entry serves the same pair of experts only."),
                io.Conditioning.Input("positive", optional=True,
                                      tooltip="Image-to-video: the positive conditioning the sampler gets (it "
                                              "holds the start image); a donor must come from the same image(s)."),
            ],
            outputs=[
                CHAI_HIT.Output("hit", display_name="hit",
                                tooltip="The lookup result (donor latents on a hit); connect to CHAI Sampler."),
                io.String.Output("report", display_name="report",
                                 tooltip="Hit or miss, matched entities with similarities and the donor prompt, "
                                         "or the reason for the miss."),
            ],
        )

    @classmethod
    def fingerprint_inputs(cls, threshold: float = 0.0, **kwargs: Any) -> Any:
        """Re-run when the cache this node read changed: ComfyUI passes only widget values here, so the node
        remembers (by its id) which cache it read; before its first run the fingerprint is a fresh NaN."""
        return threshold, reader_generation(f"CHAI_CacheLookup:{executing_node_id()}")

    @classmethod
    def execute(cls, cache: ChaiCache, entities: PromptEntities, model: Any, latent: dict, threshold: float,
                model_2: Any = None, positive: Any = None) -> io.NodeOutput:
        node = "CHAI Cache Lookup"
        with user_errors(node):
            note_lookup(f"CHAI_CacheLookup:{executing_node_id()}", cache)
            hit = chai_lookup(cache, entities, model, latent, threshold, model_2=model_2, positive=positive)
        if not hit.hit and not hit.entities and entities.language:
            hit = replace(hit, reason=f"not English ({language_name(entities.language)}): extraction is "
                                      "English-only", report=f"{hit.report}\n{english_only_note(entities.language)}")
        report = format_lookup(hit)
        log.info("[CHAI] lookup: %s", hit.report)
        return io.NodeOutput(hit, report, ui=show(lookup_status(hit), report))


def format_lookup(hit: CacheHit) -> str:
    """The lookup node's report."""
    lines = [f"CHAI lookup: {'HIT' if hit.hit else 'miss'}", f"entities: {', '.join(hit.entities) or '(none)'}",
             hit.report,
             f"threshold {hit.threshold:.2f}" + (f" ({hit.threshold_source})" if hit.threshold_source else ""),
             f"latent {list(hit.shape)}; model {hit.fingerprint}"]
    lines.append("time: " + ", ".join(f"{k} {_ms(v)}" for k, v in hit.timings.items()))
    note = same_prompt_note(hit)
    if note:
        lines.append(note)
    return "\n".join(lines)


class Sampler(io.ComfyNode):
    """KSampler with CHAI: a miss runs the full schedule and captures donors, a hit runs fast (restart or Cache
    Attention)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_Sampler",
            display_name="CHAI Sampler",
            category=CATEGORY,
            description="Samples like KSampler. Without a usable hit it runs full_steps and captures the donor "
                        "latents for CHAI Cache Write; with a hit it runs fast_steps: by default from the donor's "
                        "latent at restart_sigma with this seed's noise (reuse 'restart'), or from noise with the "
                        "first block's self-attention taking its keys and values from the donor's latents at "
                        "cache_steps ('cache_attention'), or both. The MODEL itself is never changed.",
            inputs=[
                io.Model.Input("model", tooltip=f"The video model, of a supported family ({_families()}); use "
                                                "the same MODEL for the lookup."),
                io.Conditioning.Input("positive", tooltip="The prompt's conditioning."),
                io.Conditioning.Input("negative", tooltip="The negative conditioning (OpenSora: the null caption "
                                                          "from CHAI OpenSora Text Encode)."),
                io.Latent.Input("latent", tooltip="The empty video latent to sample (same one as the lookup's)."),
                io.Int.Input("seed", default=0, min=0, max=0xFFFFFFFFFFFFFFFF, control_after_generate=True,
                             tooltip="Noise seed; the same seed and settings give the same video as KSampler on a "
                                     "miss."),
                io.Float.Input("cfg", default=7.0, min=0.0, max=100.0, step=0.1, round=0.01,
                               tooltip="Classifier-free guidance scale, as the model's own workflows set it (for "
                                       "example OpenSora 1.2 7.0, Wan 2.1 5-6, LTX-Video 3; HunyuanVideo 1.0 is "
                                       "guidance-distilled: its guidance comes from FluxGuidance)."),
                combo("sampler_name", options=SAMPLERS, default="euler",
                               tooltip="Sampler. 'euler' (OpenSora's own), 'uni_pc' (Wan's template); in the "
                                       "pack's quality lab 'dpmpp_2m' at 8 steps matched 30 Euler steps "
                                       "without a donor, while a restart hit was as good or better with 'euler'. "
                                       "Two-evaluation samplers (heun, dpm_2) are supported, Cache Attention "
                                       "fires only where the model is evaluated at a cache step's noise level."),
                combo("scheduler", options=SCHEDULERS, default="simple",
                               tooltip="Noise schedule. 'opensora' is OpenSora 1.2's exact schedule from the "
                                       "latent's nominal size (OpenSora models only; for a fixed-size checkpoint "
                                       "such as the toy-world model, the uniform schedule with the shift stored "
                                       "in its file); 'simple' suits Wan and matches OpenSora's at 8 steps."),
                *schedule_inputs(),
                *reuse_inputs(),
            ],
            outputs=[
                io.Latent.Output("samples", display_name="LATENT", tooltip="The sampled latent (decode it as usual)."),
                CHAI_TRACE.Output("trace", display_name="trace",
                                  tooltip="What the run did and, on a miss, its donor latents; connect to CHAI "
                                          "Cache Write."),
                io.String.Output("report", display_name="report",
                                 tooltip="Mode (full on a miss, fast on a hit), steps, the cache steps that fired, "
                                         "time per stage."),
            ],
        )

    @classmethod
    def validate_inputs(cls, cache_steps: str | None = None) -> bool | str:
        """Reject cache steps that do not parse before anything runs (reported once, under cache_steps)."""
        return validate_steps(cache_steps)

    @classmethod
    def execute(cls, model: Any, positive: Any, negative: Any, latent: dict, seed: int, cfg: float,
                sampler_name: str, scheduler: str, full_steps: int, fast_steps: int, cache_steps: str,
                kv_mode: str, apply_to: str, hit: CacheHit | None = None, model_2: Any = None,
                boundary: float = WAN22_BOUNDARY, reuse: str = DEFAULT_REUSE,
                restart_sigma: float = DEFAULT_RESTART_SIGMA) -> io.NodeOutput:
        node = "CHAI Sampler"
        with user_errors(node):
            config, schedule = chai_plan_inputs(model, latent, sampler_name, scheduler, full_steps, fast_steps,
                                                cache_steps, kv_mode, apply_to, reuse, restart_sigma)
            out, trace = chai_sample(model, positive, negative, latent, seed=seed, cfg=cfg,
                                     sampler_name=sampler_name, scheduler=scheduler, config=config,
                                     schedule=schedule, hit=hit, model_2=model_2, boundary=boundary)
        report = (f"{trace.report.text()}\nsampler {sampler_name}, scheduler {scheduler}, cfg {cfg:g}, seed {seed}")
        return io.NodeOutput(out, trace, report, ui=show(sampler_status(trace.report), report))


class CacheWrite(io.ComfyNode):
    """Store a full run's donor latents under the prompt's entities; a fast run only refreshes its donor."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_CacheWrite",
            display_name="CHAI Cache Write",
            category=CATEGORY,
            description="Stores what a full (miss) run captured so later prompts that share an entity can hit. "
                        "A fast (hit) run stores nothing and only marks its donor as recently used.",
            inputs=[
                CHAI_CACHE.Input("cache", tooltip="The cache from a CHAI Cache node (the lookup's cache)."),
                CHAI_ENTITIES.Input("entities", tooltip="The prompt's entities from CHAI Entity Extract (the "
                                                        "lookup's)."),
                CHAI_TRACE.Input("trace", tooltip="The trace output of CHAI Sampler."),
            ],
            outputs=[io.String.Output("report", display_name="report",
                                      tooltip="What was stored (entry, size, evictions) or why nothing was.")],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, cache: ChaiCache, entities: PromptEntities, trace: SampleTrace) -> io.NodeOutput:
        with user_errors("CHAI Cache Write"):
            try:
                written = write_trace(cache, entities, trace)
            except (EmbedderMismatchError, EntryTooLargeError, CacheUnavailableError) as exc:
                # The video is fine; only this cache cannot take the entry (or its server is restarting). Say so
                # instead of failing the run.
                written = WriteReport(WriteOutcome.NOT_STORED, f"not stored: {exc}")
                log.warning("[CHAI] cache write skipped: %s", exc)
            try:
                stats = cache.store.stats()
            except CacheUnavailableError:
                stats = None
        size = (f"cache: {stats.entries} entries, {stats.bytes / 1e6:.2f} of {stats.budget_bytes / 1e6:.0f} MB"
                if stats is not None else "cache: its server cannot be reached now")
        report = f"CHAI cache write: {written.line}\n{size}"
        log.info("[CHAI] write: %s", written.line)
        entries = stats.entries if stats is not None else 0
        return io.NodeOutput(report, ui=show(write_status(written, entries), report))


class PromptList(io.ComfyNode):
    """Split a block of text into prompts, one per line, so the nodes after it run once per prompt."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="CHAI_PromptList",
            display_name="CHAI Prompt List",
            category=CATEGORY,
            description="One prompt per line (blank lines and lines starting with # are skipped). Every node "
                        "downstream runs once per prompt: use it to warm a cache up with a batch of prompts.",
            inputs=[io.String.Input(
                "prompts", multiline=True, default="",
                tooltip="Prompts, one per line. For a warm-up pick prompts whose subjects later requests will "
                        "share (a few dozen cover a theme)."),
            ],
            outputs=[
                io.String.Output("prompt", display_name="prompt", is_output_list=True,
                                 tooltip="The prompts, as a list: connected nodes run once per prompt."),
                io.Int.Output("count", display_name="count", tooltip="How many prompts there are."),
            ],
        )

    @classmethod
    def execute(cls, prompts: str) -> io.NodeOutput:
        items = split_prompts(prompts)
        if not items:
            raise ChaiNodeError("CHAI Prompt List: no prompts (write one per line; lines starting with # are "
                                "comments)")
        return io.NodeOutput(items, len(items),
                             ui=show(f"{len(items)} prompts: the nodes after this run once each"))


def split_prompts(text: str) -> list[str]:
    """Non-empty, non-comment lines of text, stripped."""
    return [line.strip() for line in (text or "").splitlines() if line.strip() and not line.strip().startswith("#")]


NODES = [EntityExtract, CacheLookup, Sampler, CacheWrite, PromptList]
