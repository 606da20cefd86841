"""The Comfy Registry archive (.comfyignore, reproduced by scripts/registry_archive.py) keeps what the pack runs
on and leaves out the development folders."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "registry_archive.py"
# What ComfyUI, ComfyUI-Manager and the frontend read from an installed pack.
RUNTIME_FILES = ("__init__.py", "install.py", "requirements.txt", "pyproject.toml", "LICENSE", "README.md")
RUNTIME_DIRS = ("nodes", "chai_attention", "cache_store", "opensora", "toyworld", "web", "workflows", "locales",
                "subgraphs")
DEV_DIRS = ("tests", "bench", "lab", "scripts", ".ci", ".github")


def run_script(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.fixture(scope="module")
def tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc}): the archive is built from git-tracked files")
    return out.stdout.splitlines()


@pytest.fixture(scope="module")
def archive(tracked: list[str]) -> set[str]:
    return set(run_script("--list"))


def test_the_runtime_files_are_in_the_archive(tracked, archive):
    runtime = [p for p in tracked if p in RUNTIME_FILES or p.split("/")[0] in RUNTIME_DIRS]
    assert len(runtime) > 100 and "toyworld/weights/toyworld_stdit3.safetensors" in runtime
    assert [p for p in runtime if p not in archive] == []


def test_the_development_folders_are_not_in_the_archive(tracked, archive):
    dev = [p for p in tracked if p.split("/")[0] in DEV_DIRS]
    assert any(p.startswith("tests/") for p in dev) and any(p.startswith("bench/data/") for p in dev)
    assert sorted(p for p in archive if p.split("/")[0] in DEV_DIRS) == []


def test_the_docs_keep_their_text_and_lose_their_plots(tracked, archive):
    assert {p for p in tracked if p.startswith("docs/") and p.endswith(".md")} <= archive
    assert [p for p in archive if p.startswith("docs/") and p.endswith((".png", ".json"))] == []


def test_the_patterns_stay_in_the_subset_the_script_matches_without_pathspec():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import registry_archive as ra
    finally:
        sys.path.remove(str(SCRIPT.parent))
    patterns = ra.read_patterns(REPO)
    assert patterns and [p for p in patterns if not ra.is_simple(p)] == []


def test_the_simple_matcher_follows_gitignore_rules():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import registry_archive as ra
    finally:
        sys.path.remove(str(SCRIPT.parent))
    patterns = ["/tests/", "/docs/*.png", "!/docs/icon.png", "/notes"]
    match = lambda path: ra.simple_match(patterns, path)  # noqa: E731
    assert match("tests/test_x.py") and match("tests/a/b.py") and not match("tests")
    assert not match("nodes/tests/x.py")  # anchored at the root
    assert match("docs/plot.png") and not match("docs/icon.png") and not match("docs/sub/plot.png")
    assert not match("docs/map.md")
    assert match("notes") and match("notes/a.txt")  # a non-directory pattern also names a directory


def test_pathspec_agrees_with_the_simple_matcher(tracked):
    pytest.importorskip("pathspec")
    assert run_script("--list") == run_script("--list", "--no-pathspec")
