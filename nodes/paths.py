"""Folders the pack registers with `folder_paths`: where caches live, and where its toy-world weights ship."""
from __future__ import annotations

import os

FOLDER_KEY = "chai_cache"
MODELS_KEY = "diffusion_models"
# The pack's own trained toy-world STDiT3 (toyworld/weights/toyworld_stdit3.safetensors), found through the
# diffusion_models folder list so that CHAI OpenSora Model Loader offers it.
TOY_WEIGHTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "toyworld", "weights")


def register_cache_folder() -> None:
    """Register `models/chai_cache` under the `chai_cache` key (idempotent).

    The default is appended, so a `chai_cache:` entry from extra_model_paths.yaml (read before custom nodes
    load) stays first and wins.
    """
    import folder_paths

    folder_paths.add_model_folder_path(FOLDER_KEY, os.path.join(folder_paths.models_dir, FOLDER_KEY))


def cache_root() -> str:
    """The folder that holds all named caches, resolved now so later path configuration applies."""
    import folder_paths

    register_cache_folder()
    return folder_paths.get_folder_paths(FOLDER_KEY)[0]


def register_toy_weights_folder() -> None:
    """Append the pack's toyworld/weights folder to `diffusion_models` (idempotent)."""
    # Appended, so the user's own folders come first: a file of the same name there is the one that loads.
    import folder_paths

    folder_paths.add_model_folder_path(MODELS_KEY, TOY_WEIGHTS_DIR)
