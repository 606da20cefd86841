"""A worker process that writes to a shared cache on a PostgreSQL server (concurrent writers, kills).

    python tests/farm_worker.py URL NAME INDEX_ROOT START COUNT BUDGET LOG [SHAPE]

Inserts entries "seed=i" for i in START..START+COUNT-1 (entities thing<i> and dog, latents(i, SHAPE)) into cache
NAME with a budget of BUDGET bytes, appending to LOG "begin i" before each insert and "done i <entry id>
<evicted id,...>" once it returned (each line flushed, so a killed worker's log shows how far it got).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from comfyui_chai.cache_store.config import StoreConfig  # noqa: E402
from comfyui_chai.cache_store.postgres.store import PgCacheStore  # noqa: E402
from comfyui_chai.cache_store.postgres.url import ServerURL  # noqa: E402
from store_helpers import SIGMAS, ents, latents  # noqa: E402

FP = "model-a"


def parse_log(path: Path) -> tuple[dict[int, int], dict[int, list[int]], list[int]]:
    """(seed -> entry id of completed inserts, entry id -> evicted ids, seeds begun but not completed)."""
    done: dict[int, int] = {}
    evicted: dict[int, list[int]] = {}
    begun: list[int] = []
    if not path.exists():
        return done, evicted, begun
    for line in path.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["begin"] and len(parts) == 2:
            begun.append(int(parts[1]))
        elif parts[:1] == ["done"] and len(parts) >= 3:
            done[int(parts[1])] = int(parts[2])
            evicted[int(parts[2])] = [int(x) for x in parts[3].split(",") if x] if len(parts) > 3 else []
    return done, evicted, [s for s in begun if s not in done]


def main(argv: list[str]) -> None:
    url, name, index_root, start, count, budget, log_path = argv[:7]
    shape = tuple(int(x) for x in argv[7].split("x")) if len(argv) > 7 else (1, 4, 2, 4, 4)
    store = PgCacheStore(ServerURL(url, "CHAI_CACHE_URL"), name, StoreConfig(int(budget)), index_root=index_root)
    with open(log_path, "a", buffering=1) as log:
        for i in range(int(start), int(start) + int(count)):
            log.write(f"begin {i}\n")
            res = store.insert(f"seed={i}", ents(f"thing{i}", "dog"), FP, latents(i, shape), SIGMAS)
            log.write(f"done {i} {res.entry_id} {','.join(map(str, res.evicted))}\n")
    store.close()


if __name__ == "__main__":
    main(sys.argv[1:])
