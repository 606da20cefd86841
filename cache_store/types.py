"""Plain data passed between the extractor, the embedders, the store and the nodes."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .entities.extract import Entity

LOG_KEEP = 200_000  # change-log rows kept for other processes to catch up; older readers rebuild instead


def shape_key(shape: Sequence[int]) -> str:
    """Canonical text of a latent shape, as stored and compared (by every backend)."""
    return json.dumps([int(s) for s in shape])


@dataclass(frozen=True)
class EmbeddedEntities:
    """A prompt's entities with one L2-normalised vector each, tagged with the embedder's identity."""

    entities: tuple["Entity", ...]
    vectors: np.ndarray
    embedder: str
    prompt: str = ""  # the prompt they came from: an entry of the same prompt is preferred among equal donors

    def __post_init__(self) -> None:
        vectors = np.asarray(self.vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(self.entities):
            raise ValueError(
                f"need one vector per entity: {len(self.entities)} entities, vectors of shape {vectors.shape}"
            )
        if not np.all(np.isfinite(vectors)):
            raise ValueError("entity vectors contain NaN or inf")
        object.__setattr__(self, "entities", tuple(self.entities))
        object.__setattr__(self, "vectors", vectors)

    @property
    def texts(self) -> list[str]:
        """The normalised entity phrases."""
        return [e.text for e in self.entities]

    def __len__(self) -> int:
        return len(self.entities)


@dataclass(frozen=True)
class EntryInfo:
    """One cached generation as the manifest describes it."""

    id: int
    prompt: str
    entities: tuple[str, ...]
    fingerprint: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    sigmas: tuple[float, ...]
    tensors: tuple[str, ...]
    created: float
    last_used: float
    hits: int
    file: str
    # The latent file's committed checksum where the row read held it (the lookup then verifies without a second
    # query); '' when it was not read.
    checksum: str = field(default="", repr=False, compare=False)


@dataclass(frozen=True)
class Match:
    """A query entity that matched a stored entity of the chosen entry."""

    query: str
    entity: str
    similarity: float
    role: str = ""  # what the match is to the request: "main subject" or "scene"


@dataclass
class LookupResult:
    """Outcome of a lookup: a hit with its entry (and verified latents) or a miss with its reason."""

    hit: bool
    reason: str
    entry: EntryInfo | None = None
    matches: list[Match] = field(default_factory=list)
    latents: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def report(self) -> str:
        """A short human-readable summary for node outputs and logs."""
        if not self.hit or self.entry is None:
            return f"miss: {self.reason}"
        pairs = ", ".join(f"{m.role + ' ' if m.role else ''}'{m.query}'~'{m.entity}' {m.similarity:.3f}"
                          for m in self.matches)
        return f"hit: entry {self.entry.id} ({pairs}); donor prompt: {self.entry.prompt!r}"


@dataclass(frozen=True)
class InsertResult:
    """What an insert stored and what it evicted to stay within budget."""

    entry_id: int
    nbytes: int
    evicted: tuple[int, ...]


@dataclass(frozen=True)
class StoreStats:
    """Counts and sizes of a store."""

    root: str
    entries: int
    entities: int
    bytes: int
    budget_bytes: int
    policy: str
    embedder: str | None
    generation: int
    format_version: int
    total_hits: int
    index_backend: str
    quarantine_files: int = 0   # what repair or open set aside (quarantine/, or the server's quarantine table)
    quarantine_bytes: int = 0

    def report(self) -> str:
        """Multi-line summary for the CLI and the stats node."""
        used = self.bytes / max(self.budget_bytes, 1) * 100
        return "\n".join([
            f"cache: {self.root}",
            f"entries: {self.entries}  distinct entities: {self.entities}  index: {self.index_backend}",
            f"latent bytes: {self.bytes / 1e6:.2f} MB of {self.budget_bytes / 1e6:.2f} MB budget ({used:.1f}%)",
            f"policy: {self.policy}  embedder: {self.embedder or '(none yet)'}",
            f"hits served: {self.total_hits}  generation: {self.generation}  format: v{self.format_version}",
            f"quarantine: {self.quarantine_files} file(s), {self.quarantine_bytes / 1e6:.2f} MB (not in the budget; "
            "clear/repair --quarantine empties it)",
        ])


@dataclass
class VerifyReport:
    """Problems found by verify (and what repair fixed)."""

    checked: int = 0
    problems: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is wrong (or everything wrong was repaired)."""
        return not self.problems or len(self.repaired) >= len(self.problems)

    def report(self) -> str:
        """Multi-line summary."""
        lines = [f"checked {self.checked} entries: {len(self.problems)} problem(s), {len(self.repaired)} repaired"]
        lines += [f"  problem: {p}" for p in self.problems]
        lines += [f"  repaired: {r}" for r in self.repaired]
        return "\n".join(lines)
