"""Cache handles belong to their opener; a lookup's fingerprint follows only the cache it reads."""
from __future__ import annotations

import math

from comfyui_chai.cache_store.service import close_all, note_lookup, open_cache, reader_generation
from store_helpers import SIGMAS, ents, latents


def test_a_lookup_fingerprint_changes_only_with_the_cache_it_reads(tmp_path):
    close_all()
    try:
        a = open_cache(tmp_path, "a", budget_bytes=10**8, owner="open-a")
        b = open_cache(tmp_path, "b", budget_bytes=10**8, owner="open-b")
        assert math.isnan(reader_generation("lookup-1"))           # never ran: always re-run
        note_lookup("lookup-1", a)
        first = reader_generation("lookup-1")
        assert first == reader_generation("lookup-1")
        b.store.insert("p", ents("dog"), "m", latents(1), SIGMAS)
        assert reader_generation("lookup-1") == first              # another cache changed: no re-run
        a.store.insert("p", ents("dog"), "m", latents(1), SIGMAS)
        assert reader_generation("lookup-1") != first              # its own cache changed: re-run
    finally:
        close_all()


def test_two_owners_with_different_budgets_keep_their_handles_open(tmp_path):
    close_all()
    try:
        one = open_cache(tmp_path, "shared", budget_bytes=10**8, owner="node-1")
        two = open_cache(tmp_path, "shared", budget_bytes=2 * 10**8, owner="node-2")
        one.store.insert("p", ents("dog"), "m", latents(1), SIGMAS)  # would raise on a closed manifest
        assert two.store.stats().entries == 1 and not one.closed
        assert one.store.budget_bytes == 2 * 10**8                    # the last explicit open set the cache's budget
    finally:
        close_all()
