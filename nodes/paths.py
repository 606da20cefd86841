"""Folders the pack registers with `folder_paths`: where caches live, and where its toy-world weights ship."""
from __future__ import annotations

import os

FOLDER_KEY = "chai_cache"
MODELS_KEY = "diffusion_models"
# The pack's own trained toy-world STDiT3 (toyworld/weights/toyworld_stdit3.safetensors) lives under a folder key
# of its own: only CHAI OpenSora Model Loader lists it (core loaders such as UNETLoader read diffusion_models and
# would fail on it).
TOY_KEY = "chai_toy_weights"
TOY_EXTENSIONS = {".safetensors"}
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
    """Register the pack's toyworld/weights folder under its own `chai_toy_weights` key (idempotent)."""
    import folder_paths

    if TOY_KEY not in folder_paths.folder_names_and_paths:
        folder_paths.folder_names_and_paths[TOY_KEY] = ([TOY_WEIGHTS_DIR], set(TOY_EXTENSIONS))
    else:
        folder_paths.add_model_folder_path(TOY_KEY, TOY_WEIGHTS_DIR)


def loader_model_files() -> list[str]:
    """What CHAI OpenSora Model Loader lists: the user's diffusion_models files, then the pack's toy weights."""
    import folder_paths

    register_toy_weights_folder()
    files = list(folder_paths.get_filename_list(MODELS_KEY))
    files += [f for f in folder_paths.get_filename_list(TOY_KEY) if f not in files]
    return files


def loader_model_path(name: str) -> str | None:
    """The file behind a loader entry: the user's diffusion_models first (a file of the same name there wins)."""
    import folder_paths

    register_toy_weights_folder()
    return folder_paths.get_full_path(MODELS_KEY, name) or folder_paths.get_full_path(TOY_KEY, name)
