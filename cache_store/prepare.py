"""What every backend does before it stores an entry: validate it and encode it to self-describing bytes."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from . import latents as lat
from .arguments import check_prompt
from .errors import CacheError, EntryTooLargeError, InvalidEntryError
from .lookup.mention_order import with_order
from .naming import encodable_text
from .types import EmbeddedEntities
from .validate import EntryRecord, check_record


class NothingToStoreError(CacheError):
    """An insert without entities: such an entry could never be found again."""


def prepare_entry(prompt: str, entities: EmbeddedEntities, fingerprint: str, latents: Mapping[str, Any],
                  sigmas: Sequence[float], shape: Sequence[int] | None = None,
                  meta: Mapping[str, Any] | None = None) -> tuple[EntryRecord, bytes]:
    """The validated record of an entry and its safetensors bytes (latents, entity vectors, JSON metadata)."""
    if len(entities) == 0:
        raise NothingToStoreError("the prompt has no entities, so the entry could never be matched; not stored")
    if not fingerprint:
        raise ValueError("a model fingerprint is required")
    tensors = dict(latents)
    if not tensors:
        raise InvalidEntryError("an entry needs at least one latent tensor")
    rows = [(_storable(e.text), e.kind, e.role, _storable(e.head), _storable(e.core)) for e in entities.entities]
    meta = with_order(meta, [r[0] for r in rows])  # the manifest's postings keep no order; the lookup reads this
    record = check_record(encodable_text(check_prompt(prompt)), rows,
                          entities.vectors, entities.embedder, fingerprint, tensors, sigmas, shape, meta)
    payload = {"prompt": record.prompt, "fingerprint": record.fingerprint, "shape": list(record.shape),
               "dtype": record.dtype, "sigmas": list(record.sigmas), "embedder": record.embedder,
               "entities": [{"text": t, "kind": k, "role": r, "head": h, "core": c}
                            for t, k, r, h, c in record.entities], "extra": dict(record.extra)}
    return record, lat.encode_entry(tensors, record.vectors, payload)


def _storable(text: str) -> str:
    """An entity text as every backend stores it (NUL and lone surrogates as U+FFFD); non-text is left to
    validation."""
    return encodable_text(text) if isinstance(text, str) else text


def check_fits(nbytes: int, budget: int) -> None:
    """EntryTooLargeError when one entry is larger than the whole budget."""
    if nbytes > budget:
        raise EntryTooLargeError(f"this entry needs {nbytes / 1e6:.2f} MB but the whole cache budget is "
                                 f"{budget / 1e6:.2f} MB; raise the budget (GB) to store it")
