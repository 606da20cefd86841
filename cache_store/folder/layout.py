"""Names inside a cache folder."""
from __future__ import annotations

LATENT_DIR = "latents"      # one <32 hex>.safetensors file per entry
INDEX_DIR = "index"         # state.json + entities-<epoch>-<seq>.idx (derived, rebuilt when refused)
LOCK_NAME = ".writer.lock"  # writes serialise on this file lock
