"""Both store backends behind one opener, for the tests that claim the same behaviour of each.

"folder": a CacheStore in a temporary folder. "server": a PgCacheStore on the session's throwaway PostgreSQL
(tests/pg_server.py), under a cache name of its own per test, each handle with its own local index folder (as
a separate worker would have). The password travels in the URL, as CHAI_CACHE_URL carries it on a worker.
"""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from comfyui_chai.cache_store.config import StoreConfig
from comfyui_chai.cache_store.postgres.url import ServerURL
from comfyui_chai.cache_store.folder.store import CacheStore

BACKENDS = ("folder", "server")


class Opener:
    """open(name, config) -> a store of this backend; the same name reaches the same cache."""

    def __init__(self, kind: str, tmp_path: Path, url: str | None = None) -> None:
        self.kind = kind
        self.tmp = tmp_path
        self.url = url
        self.prefix = "t" + uuid.uuid4().hex[:10]

    def server(self) -> ServerURL:
        assert self.url is not None
        return ServerURL(self.url, "CHAI_CACHE_URL")

    def __call__(self, name: str = "c", config: StoreConfig | None = None, **kwargs: Any) -> Any:
        if self.kind == "folder":
            return CacheStore(self.tmp / name, config, **kwargs)
        from comfyui_chai.cache_store.postgres.store import PgCacheStore

        kwargs.setdefault("index_root", self.tmp / "workers" / uuid.uuid4().hex[:8])  # a worker of its own
        return PgCacheStore(self.server(), f"{self.prefix}-{name}", config, **kwargs)


def total_counter(store: Any) -> int:
    """The byte total the store keeps (and checks budgets against)."""
    if isinstance(store, CacheStore):
        return int(store.manifest.meta("total_bytes"))
    return int(store.db.query("SELECT total_bytes FROM state")[0][0])


def stored_blobs(store: Any) -> int:
    """How many entries' latent bytes the store holds (files, or blobs on the server)."""
    if isinstance(store, CacheStore):
        return len(list(store.latent_dir.glob("*.safetensors")))
    return int(store.db.query("SELECT COUNT(*) FROM blobs")[0][0])
