"""The custom socket types the CHAI nodes hand each other, and their menu category."""
from __future__ import annotations

from comfy_api.v0_0_2 import io

CATEGORY = "CHAI"
CHAI_CACHE = io.Custom("CHAI_CACHE")  # cache_store.service.ChaiCache
CHAI_ENTITIES = io.Custom("CHAI_ENTITIES")  # chai_attention.payloads.PromptEntities
CHAI_HIT = io.Custom("CHAI_HIT")  # chai_attention.payloads.CacheHit
CHAI_TRACE = io.Custom("CHAI_TRACE")  # chai_attention.payloads.SampleTrace
CHAI_APPLIED = io.Custom("CHAI_APPLIED")  # chai_attention.comfy.apply.AppliedRun
