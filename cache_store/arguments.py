"""Checks of the public API's arguments at its entry: a wrong type or size fails here, naming the argument."""
from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import CacheArgumentError, InvalidEntryError
from .types import EmbeddedEntities
from .validate import MAX_TEXT


def _kind(value: Any) -> str:
    """The type of `value` as a message names it: None, bytes, numpy.ndarray."""
    kind = type(value)
    if value is None:
        return "None"
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"


def check_prompt(prompt: Any) -> str:
    """The prompt as text ("" for None); one length limit for embedding and storing alike."""
    if prompt is None:
        return ""
    if isinstance(prompt, (bytes, bytearray)):
        raise CacheArgumentError(f"prompt must be a str, got {_kind(prompt)}: decode it first "
                                 "(prompt.decode('utf-8'))")
    if not isinstance(prompt, str):
        raise CacheArgumentError(f"prompt must be a str, got {_kind(prompt)}")
    if len(prompt) > MAX_TEXT:
        raise InvalidEntryError(f"prompt is {len(prompt):,} characters; the cache takes prompts of at most "
                                f"{MAX_TEXT:,} characters")
    return prompt


def check_entities(entities: Any) -> EmbeddedEntities:
    """The EmbeddedEntities that embed_prompt / embed_entities returned."""
    if not isinstance(entities, EmbeddedEntities):
        raise CacheArgumentError(f"entities must be the EmbeddedEntities that embed_prompt returns, "
                                 f"got {_kind(entities)}")
    return entities


def check_entity_list(entities: Any) -> list[Any]:
    """A list or tuple of extracted entities (the extractor's Entity objects)."""
    if isinstance(entities, (str, bytes)) or not isinstance(entities, Sequence):
        raise CacheArgumentError(f"entities must be a list of extracted entities, got {_kind(entities)}")
    return list(entities)


def check_fingerprint(fingerprint: Any) -> str:
    """A non-empty model fingerprint string."""
    if not isinstance(fingerprint, str) or not fingerprint:
        got = "an empty str" if fingerprint == "" else _kind(fingerprint)
        raise CacheArgumentError(f"fingerprint must be a non-empty str naming the model, got {got}")
    if "\0" in fingerprint:
        raise CacheArgumentError("fingerprint holds a NUL character, which no backend can store alike; remove it")
    return fingerprint


def check_shape(shape: Any) -> tuple[int, ...]:
    """A latent shape as a tuple of positive ints."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise CacheArgumentError(f"shape must be a sequence of ints (the latent's shape), got {_kind(shape)}")
    dims = tuple(shape)
    if not dims or not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) and int(d) > 0 for d in dims):
        raise CacheArgumentError(f"shape must be a non-empty sequence of positive ints, got {dims!r}")
    return tuple(int(d) for d in dims)


def check_optional_shape(shape: Any) -> tuple[int, ...] | None:
    """None (the latents' own shape) or a latent shape."""
    return None if shape is None else check_shape(shape)


def check_latents(latents: Any) -> dict[str, Any]:
    """A mapping of tensor names to torch tensors."""
    if not isinstance(latents, Mapping):
        raise CacheArgumentError(f"latents must be a dict of name -> torch.Tensor, got {_kind(latents)}")
    import torch

    for name, tensor in latents.items():
        if not isinstance(tensor, torch.Tensor):
            hint = " (torch.from_numpy(array) converts one)" if type(tensor).__module__ == "numpy" else ""
            raise CacheArgumentError(f"latents[{name!r}] must be a torch.Tensor, got {_kind(tensor)}{hint}")
    return dict(latents)


def check_sigmas(sigmas: Any) -> Sequence[Any]:
    """A sequence of noise levels (their values are checked with the entry)."""
    if isinstance(sigmas, (str, bytes)) or not hasattr(sigmas, "__iter__"):
        raise CacheArgumentError(f"sigmas must be a sequence of numbers, got {_kind(sigmas)}")
    return sigmas


def check_threshold(threshold: Any) -> float | None:
    """None (the cache's threshold) or a real number."""
    if threshold is None:
        return None
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
        raise CacheArgumentError(f"threshold must be a number or None, got {_kind(threshold)}")
    return float(threshold)


def check_meta(meta: Any) -> Mapping[str, Any] | None:
    """None or a mapping of extra metadata."""
    if meta is not None and not isinstance(meta, Mapping):
        raise CacheArgumentError(f"meta must be a dict or None, got {_kind(meta)}")
    return meta
