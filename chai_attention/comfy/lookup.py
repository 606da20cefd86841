"""What identifies a ComfyUI request to the cache (`request_key`), and CHAI Cache Lookup's one call (`chai_lookup`).

CHAI Cache Lookup, CHAI Sampler and CHAI Apply all key a request through `request_key`, so a hit looked up for a
MODEL (and second expert, and image conditioning) is recognised by the sampler it is handed to.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..adapters import get_adapter
from ..cache_io import CacheLike, lookup_hit
from ..identity import comfy_request_fingerprint
from ..payloads import CacheHit, PromptEntities
from .schedule import latent_shape


@dataclass(frozen=True)
class RequestKey:
    """A request as the cache sees it: the fingerprint and latent shape entries are keyed by; the model's adapter."""

    adapter: Any  # adapters.ModelAdapter of `model`
    fingerprint: str
    shape: tuple[int, ...]


def request_key(model: Any, latent: Mapping[str, Any], *, model_2: Any = None, positive: Sequence[Any] | None = None,
                conditionings: Sequence[Any] | None = None) -> RequestKey:
    """The key of a request on `model` (and Wan 2.2 A14B's low-noise `model_2`) from `latent` and `positive`.

    An unsupported model (either expert) is refused here, before anything else, naming the supported ones; with
    `conditionings` (the CONDITIONING lists the sampler gets) so is a request an adapter refuses (`check_request`,
    e.g. image-to-video on a text-to-video adapter), before the fingerprint reads any weights.
    """
    adapter = get_adapter(model)
    adapters = [adapter] if model_2 is None else [adapter, get_adapter(model_2)]
    if conditionings is not None:
        for each in adapters:
            each.check_request(latent, conditionings)
    fingerprint = comfy_request_fingerprint(model, latent, model_2, positive)
    return RequestKey(adapter, fingerprint, latent_shape(model, latent))


def chai_lookup(cache: CacheLike, entities: PromptEntities, model: Any, latent: Mapping[str, Any],
                threshold: float | None = None, *, model_2: Any = None,
                positive: Sequence[Any] | None = None) -> CacheHit:
    """Look the prompt's entities up for this request's key; a hit carries CPU donors."""
    key = request_key(model, latent, model_2=model_2, positive=positive)
    return lookup_hit(cache, entities, key.fingerprint, key.shape, threshold)


__all__ = ["RequestKey", "request_key", "chai_lookup"]
