"""Issue 23 item 3: the demos clear only a cache folder they made (or an empty one), never a folder of the user's."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def demo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.demo_chai", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("keep", [False, True])
def test_the_demo_refuses_a_folder_that_is_not_its_cache(tmp_path, keep):
    folder = tmp_path / "thesis"
    (folder / "src").mkdir(parents=True)
    (folder / "thesis.txt").write_text("three years of work")
    out = demo("--cache", str(folder), "--n", "1", *(["--keep"] if keep else []))
    assert out.returncode == 2 and "refusing" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert (folder / "thesis.txt").read_text() == "three years of work" and (folder / "src").is_dir()


def test_the_demo_says_so_when_cache_names_a_file(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("keep")
    out = demo("--cache", str(target), "--n", "1")
    assert out.returncode == 2 and "is a file, not a folder" in out.stderr and "Traceback" not in out.stderr
    assert target.read_text() == "keep"


def test_the_demo_clears_its_own_cache_and_an_empty_folder(tmp_path):
    sys.path.insert(0, str(REPO))
    from bench import demo_cache
    from comfyui_chai.cache_store.folder.store import CacheStore

    made = tmp_path / "made"
    CacheStore(made).close()
    demo_cache.mark(made)
    assert demo_cache.prepare(made, keep=True) is None and made.exists()
    assert demo_cache.prepare(made, keep=False) is None and not made.exists()
    unmarked = tmp_path / "old-demo-cache"  # made by an earlier demo, before the marker: still a cache folder
    CacheStore(unmarked).close()
    assert demo_cache.prepare(unmarked, keep=False) is None and not unmarked.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert demo_cache.prepare(empty, keep=False) is None
    (unmarked / "latents").mkdir(parents=True)
    (unmarked / "my-notes.md").write_text("x")
    assert "refusing" in demo_cache.prepare(unmarked, keep=False) and (unmarked / "my-notes.md").exists()
