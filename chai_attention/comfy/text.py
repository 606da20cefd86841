"""The workflow's own text encoder (a ComfyUI CLIP) as CHAI's entity embedder: its name, its phrase vectors.

ComfyUI glue by argument only: a CLIP is used through its methods (tokenize, encode_from_tokens); nothing is
imported from ComfyUI. The embedder class is handed in (cache_store's FunctionEmbedder), since the method never
imports the cache.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from ..identity import text_encoder_digest

# Provisional threshold for the workflow's own text encoder (pooled or mean-pooled features). Unlike MiniLM's it is
# not calibrated: set the lookup's threshold explicitly after checking a few reports.
TEXT_ENCODER_THRESHOLD = 0.85

# make_embedder(name, fn(phrases) -> [n, dim] vectors, dim, threshold) -> an embedder (cache_store FunctionEmbedder)
EmbedderFactory = Callable[[str, Callable[[list[str]], Tensor], int, float], Any]

_EMBEDDERS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()  # CLIP -> its embedder
_EMBEDDERS_LOCK = threading.Lock()  # guards _EMBEDDERS only


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


def _word_ids(tokens: Any) -> list[int]:
    """The word ids of a ComfyUI tokenize(..., return_word_ids=True) result ({name: [[(token, weight, id)]]})."""
    ids: list[int] = []
    for batches in (tokens.values() if isinstance(tokens, dict) else [tokens]):
        for batch in batches:
            ids.extend(int(t[2]) for t in batch if isinstance(t, (tuple, list)) and len(t) > 2)
    return ids


_PROBE = "red green blue"


def kept_prompt(clip: Any, prompt: str) -> tuple[str, int, int]:
    """(the start of `prompt` the encoder conditions on, words kept, words in the prompt): asked of the CLIP's
    tokenizer (the highest word id it returns); the whole prompt when it keeps every word or cannot say."""
    words = prompt.split()
    try:
        # Some tokenizers (ComfyUI's T5 ones) give every token word id 1: only one that numbers a probe's three
        # words 1..3 can say how many words it kept.
        if max(_word_ids(clip.tokenize(_PROBE, return_word_ids=True)), default=0) != len(_PROBE.split()):
            return prompt, len(words), len(words)
        ids = _word_ids(clip.tokenize(prompt, return_word_ids=True))
    except Exception:  # a tokenizer without word ids: it cannot say what it keeps
        return prompt, len(words), len(words)
    kept = max(ids, default=0)
    if not ids or kept <= 0 or kept >= len(words):
        return prompt, len(words), len(words)
    return " ".join(words[:kept]), kept, len(words)


def text_encoder_name(clip: Any) -> str:
    """Embedder name for a ComfyUI CLIP: its encoder class and a digest of its original weights and patches, so
    a cache never mixes vectors of two encoders (or of one encoder with and without a LoRA)."""
    return f"text-encoder:{type(clip.cond_stage_model).__name__}@{text_encoder_digest(clip)}"


def encode_phrases(clip: Any, phrases: Sequence[str]) -> Tensor:
    """[len(phrases), dim] float32 CPU vectors of entity phrases from a ComfyUI CLIP (one encoder call each)."""
    return torch.stack([_phrase_vector(clip, p) for p in phrases])


def text_encoder_embedder(clip: Any, make_embedder: EmbedderFactory) -> Any:
    """The embedder over the workflow's CLIP, built by `make_embedder` once per CLIP object."""
    with _EMBEDDERS_LOCK:
        found = _EMBEDDERS.get(clip)
    if found is not None:
        return found
    dim = int(encode_phrases(clip, ["object"]).shape[-1])
    embedder = make_embedder(text_encoder_name(clip), lambda phrases: encode_phrases(clip, phrases), dim,
                             TEXT_ENCODER_THRESHOLD)
    with _EMBEDDERS_LOCK:
        _EMBEDDERS[clip] = embedder
    return embedder


__all__ = ["TEXT_ENCODER_THRESHOLD", "encode_phrases", "kept_prompt", "text_encoder_embedder", "text_encoder_name"]
