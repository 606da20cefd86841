"""Where caches live inside ComfyUI: the `chai_cache` model folder registered with `folder_paths`."""
from __future__ import annotations

import os

FOLDER_KEY = "chai_cache"


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
