"""The three measured phases of bench/bench_farm.py: stream replay, latency at 100k entries, kills.

Workers are forked from the bench process (imports and, for the latency phase, the 100k-entity index are
inherited, as a long-running worker would have them); each opens its own connection. The parent closes its
own connections before forking: a forked child never touches them and leaves through os._exit.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from comfyui_chai.cache_store.lookup.rule import HitRule

CTX = mp.get_context("fork")


def budget_monitor(db_factory: Callable[[], Any], every: float = 0.05) -> tuple[Callable[[], dict], Any]:
    """Poll the cache's bytes against its budget in a thread; stop() -> {max_ratio, samples, over}."""
    seen: dict = {"max_ratio": 0.0, "samples": 0, "over": 0}
    halt = threading.Event()
    db = db_factory()

    def poll() -> None:
        while not halt.is_set():
            try:
                (total, counter, budget), = db.query("SELECT (SELECT COALESCE(SUM(nbytes), 0) FROM entries), "
                                                     "total_bytes, budget_bytes FROM state")
            except Exception:  # the server is busy being benchmarked; a missed sample is fine
                time.sleep(every)
                continue
            seen["samples"] += 1
            seen["max_ratio"] = max(seen["max_ratio"], max(total, counter) / budget)
            seen["over"] += total > budget or counter > budget
            time.sleep(every)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()

    def stop() -> dict:
        halt.set()
        thread.join()
        db.close()
        return seen

    return stop, db


# ---------------------------------------------------------------------------------------------- stream replay
@dataclass
class Replay:
    """Outcome of one farm replay of the served stream."""

    workers: int
    mode: str                # "shared" or "private"
    served: int = 0
    hits: int = 0
    no_entities: int = 0
    seconds: float = 0.0
    errors: list = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.hits / max(self.served, 1)


def _replay_worker(open_store, items, prompts, pad, queue, results, render_s: float, threshold: float,
                   fp: str, shape, latents, sigmas) -> None:
    try:
        store = open_store()
        while True:
            i = queue.get()
            if i is None:
                break
            ee = items[i]
            if len(ee) == 0:
                results.put((i, "none"))
                continue
            res = store.lookup(ee, fp, shape, HitRule(threshold))
            if res.hit:
                time.sleep(render_s * 8 / 30)  # a fast run: 8 of 30 steps
                results.put((i, "hit"))
                continue
            time.sleep(render_s)  # a full run; other workers serve requests meanwhile
            store.insert(prompts[i], ee, fp, latents, sigmas, meta=pad(prompts[i], ee))
            results.put((i, "miss"))
        store.db.close()
    except BaseException as exc:  # reported by the parent
        results.put((-1, f"{type(exc).__name__}: {exc}"))


def replay(n_workers: int, mode: str, open_store: Callable[[int], Any], items, prompts, pad, n_warm: int,
           render_s: float, threshold: float, fp: str, shape, latents, sigmas) -> Replay:
    """Serve prompts[n_warm:] with n_workers processes taking requests in order from one queue."""
    out = Replay(n_workers, mode)
    queue, results = CTX.Queue(), CTX.Queue()
    served = list(range(n_warm, len(prompts)))
    for i in served:
        queue.put(i)
    for _ in range(n_workers):
        queue.put(None)
    t0 = time.perf_counter()
    procs = [CTX.Process(target=_replay_worker, args=(lambda k=k: open_store(k), items, prompts, pad, queue,
                                                        results, render_s, threshold, fp, shape, latents, sigmas))
             for k in range(n_workers)]
    for p in procs:
        p.start()
    got = 0
    while got < len(served):
        i, what = results.get(timeout=600)
        if i < 0:
            out.errors.append(what)
            break
        got += 1
        out.served += 1
        out.hits += what == "hit"
        out.no_entities += what == "none"
    for p in procs:
        p.join(timeout=120)
    out.seconds = time.perf_counter() - t0
    return out


# ---------------------------------------------------------------------------------------------- latency
def _latency_worker(store, seed: int, n_lookups: int, n_inserts: int, vectors: np.ndarray, holders: np.ndarray,
                    make_entities, fp: str, shape, latents, sigmas, results) -> None:
    try:
        rng = np.random.default_rng(seed)
        ops = ["lookup"] * n_lookups + ["insert"] * n_inserts
        random.Random(seed).shuffle(ops)
        times: dict[str, list[float]] = {"lookup": [], "insert": [], "sync": [], "search": []}
        keeper = store.keeper
        for part, method in (("sync", keeper.sync), ("search", keeper.query)):  # time the local index's parts
            def timed(*a, _method=method, _part=part, **k):
                t = time.perf_counter()
                try:
                    return _method(*a, **k)
                finally:
                    times[_part].append(time.perf_counter() - t)
            setattr(keeper, method.__name__, timed)
        hits = 0
        for j, op in enumerate(ops):
            if op == "lookup":
                eid = int(holders[rng.integers(len(holders)), 0])
                q = vectors[eid - 1] + 0.01 * rng.standard_normal(vectors.shape[1]).astype(np.float32)
                ee = make_entities([(f"ent{eid}", q / np.linalg.norm(q))])
                t = time.perf_counter()
                res = store.lookup(ee, fp, shape, HitRule(0.8))
                times["lookup"].append(time.perf_counter() - t)
                hits += res.hit
            else:
                picks = rng.integers(1, len(vectors) + 1, 2)
                ee = make_entities([(f"ent{int(e)}", vectors[int(e) - 1]) for e in picks])
                t = time.perf_counter()
                n_sync = len(times["sync"])
                store.insert(f"new {seed}-{j}", ee, fp, latents, sigmas)
                times["insert"].append(time.perf_counter() - t)
                del times["sync"][n_sync:]  # an insert's own catch-up is part of the insert
        results.put((seed, times, hits))
    except BaseException as exc:
        results.put((seed, f"{type(exc).__name__}: {exc}", 0))


def latency(store, n_workers: int, n_lookups: int, n_inserts: int, fill, make_entities, fp: str, shape, latents,
            sigmas) -> tuple[dict[str, list[float]], int, list[str], float]:
    """n_workers forked workers, each n_lookups lookups and n_inserts inserts in random order, no pauses."""
    store.db.close()  # children connect on their own
    results = CTX.Queue()
    t0 = time.perf_counter()
    procs = [CTX.Process(target=_latency_worker, args=(store, 1000 * n_workers + k, n_lookups, n_inserts,
                                                       fill.vectors, fill.holders, make_entities, fp, shape,
                                                       latents, sigmas, results)) for k in range(n_workers)]
    for p in procs:
        p.start()
    times: dict[str, list[float]] = {"lookup": [], "insert": [], "sync": [], "search": []}
    hits, errors = 0, []
    for _ in procs:
        _, got, h = results.get(timeout=1800)
        if isinstance(got, str):
            errors.append(got)
            continue
        for k in times:
            times[k] += got[k]
        hits += h
    for p in procs:
        p.join(timeout=120)
    return times, hits, errors, time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------- kills
def _kill_worker(open_store, life: int, log_path: Path, make, shape, fp: str, sigmas) -> None:
    store = open_store()
    with open(log_path, "a", buffering=1) as log:
        for j in range(10_000):
            seed = life * 10_000 + j
            ee, tensors = make(seed)
            log.write(f"begin {seed}\n")
            res = store.insert(f"seed={seed}", ee, fp, tensors, sigmas)
            log.write(f"done {seed} {res.entry_id}\n")


@dataclass
class Kills:
    """Outcome of the kill phase."""

    kills: int = 0
    mid_insert: int = 0
    committed: int = 0
    lost: int = 0
    corrupted: int = 0
    lookups_checked: int = 0
    unreported_commits: int = 0
    verify_ok: bool = False
    verify_report: str = ""
    seconds: float = 0.0


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def kills(open_store: Callable[[], Any], n_kills: int, n_workers: int, work: Path, make, shape, fp: str, sigmas,
          seed: int = 0) -> tuple[Kills, list[Path]]:
    """Keep n_workers inserting; SIGKILL a random one at random moments until n_kills kills; respawn each."""
    out, rng = Kills(), random.Random(seed)
    logs: list[Path] = []
    t0 = time.perf_counter()
    live: list[tuple[Any, Path]] = []
    life = 0

    def spawn() -> None:
        nonlocal life
        life += 1
        path = work / f"life{life}.log"
        logs.append(path)
        proc = CTX.Process(target=_kill_worker, args=(open_store, life, path, make, shape, fp, sigmas))
        proc.start()
        live.append((proc, path))

    for _ in range(n_workers):
        spawn()
    time.sleep(1.0)
    while out.kills < n_kills:
        time.sleep(rng.uniform(0.15, 0.6))
        proc, path = live.pop(rng.randrange(len(live)))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        out.kills += 1
        out.mid_insert += _last_line(path).startswith("begin")
        spawn()
    for proc, _ in live:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
    out.seconds = time.perf_counter() - t0
    return out, logs
