"""Release metadata: the Comfy Registry fields of pyproject.toml, the icon, the changelog, the version check of the
publish job (the workflow itself: tests/test_ci_workflow.py).

The field rules are the Registry's (its pyproject specification and comfy-cli's config parser, which reads
`[tool.comfy]` PublisherId / DisplayName / Icon / requires-comfyui and `[project.urls]` Homepage / Documentation /
Repository / Issues). `scripts/lint.sh` runs comfy-cli's own `comfy node validate` and actionlint in CI as well.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
COMFY = PYPROJECT["tool"]["comfy"]
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
# comfy-cli's pattern for one part of requires-comfyui (registry/config_parser.py validate_version)
RANGE_PART = re.compile(r"^(?:(==|>=|<=|!=|~=|>|<|<>|=)\s*)?(\d+\.\d+\.\d+(?:-[a-zA-Z0-9]+)?)?$")
VERSION_CHANGED = REPO / "scripts" / "version_changed.py"


def test_node_id_follows_the_registry_rules():
    name = PROJECT["name"]
    assert len(name) < 100
    assert re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]*", name), "alphanumerics, - _ . only; must start with a letter"
    assert not re.search(r"[._-]{2}", name), "no consecutive special characters"
    assert "comfyui" not in name.lower(), "the Registry asks node ids not to include 'ComfyUI'"


def test_version_is_x_y_z():
    assert SEMVER.match(PROJECT["version"]), PROJECT["version"]


def test_publisher_display_name_and_urls():
    assert re.fullmatch(r"[a-z][a-z0-9-]*[a-z0-9]", COMFY["PublisherId"])
    assert COMFY["DisplayName"].strip() == COMFY["DisplayName"] and 0 < len(COMFY["DisplayName"]) <= 100
    urls = PROJECT["urls"]
    for key in ("Repository", "Issues"):  # the Registry requires Repository; Issues is what it reads for bugs
        assert urlparse(urls[key]).scheme == "https", key


def test_license_file_exists():
    assert (REPO / PROJECT["license"]["file"]).is_file()


def test_icon_url_points_at_a_square_png_in_this_repository():
    url = urlparse(COMFY["Icon"])
    repo = urlparse(PROJECT["urls"]["Repository"]).path.strip("/")  # comfyui-chai/ComfyUI-CHAI
    assert url.scheme == "https" and url.netloc == "raw.githubusercontent.com"
    prefix = f"/{repo}/main/"
    assert url.path.startswith(prefix), f"the icon must be served from {repo}'s main branch"
    path = REPO / url.path[len(prefix):]
    assert path.is_file(), f"{path.relative_to(REPO)} is missing"
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size[0] == img.size[1] <= 400, (img.format, img.size)


def test_requires_comfyui_is_a_range_the_registry_accepts_with_no_upper_bound():
    spec = COMFY["requires-comfyui"]
    parts = [p.strip() for p in spec.split(",")]
    assert all(RANGE_PART.match(p) for p in parts), spec
    assert not any(p.startswith(("<", "==", "~=")) for p in parts), "never refuse a ComfyUI we have not seen"


def test_changelog_has_an_entry_for_the_current_version():
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = re.findall(r"^## \[?(\d+\.\d+\.\d+)\]?", text, re.M)
    assert versions and versions[0] == PROJECT["version"], "CHANGELOG.md's newest entry must be the pyproject version"


# ------------------------------------------------------------------------------ scripts/version_changed.py

def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(repo), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, pyproject: str) -> str:
    (repo / "pyproject.toml").write_text(pyproject)
    _git(repo, "add", "pyproject.toml")
    _git(repo, "commit", "-q", "-m", "c")
    return _git(repo, "rev-parse", "HEAD")


def _run(repo: Path, base: str, tmp_path: Path) -> tuple[dict, str]:
    out_file = tmp_path / "github_output"
    out_file.write_text("")
    res = subprocess.run([sys.executable, str(VERSION_CHANGED), "--base", base, "--repo", str(repo)],
                         capture_output=True, text=True, env={"GITHUB_OUTPUT": str(out_file), "PATH": "/usr/bin:/bin"},
                         check=True)
    values = dict(line.split("=", 1) for line in out_file.read_text().splitlines())
    assert values == dict(line.split("=", 1) for line in res.stdout.splitlines())
    return values, res.stderr.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    _git(path, "init", "-q")
    return path


def test_version_changed_says_false_when_only_other_fields_change(repo, tmp_path):
    base = _commit(repo, '[project]\nname = "x"\nversion = "0.1.0"\n')
    _commit(repo, '[project]\nname = "x"\nversion = "0.1.0"\ndescription = "new"\n')
    values, reason = _run(repo, base, tmp_path)
    assert values == {"version": "0.1.0", "previous": "0.1.0", "changed": "false"}, reason


def test_version_changed_says_true_on_a_bump(repo, tmp_path):
    base = _commit(repo, '[project]\nversion = "0.1.0"\n')
    _commit(repo, '[project]\nversion = "0.2.0"\n')
    values, reason = _run(repo, base, tmp_path)
    assert values == {"version": "0.2.0", "previous": "0.1.0", "changed": "true"}
    assert reason == "version 0.1.0 -> 0.2.0"


@pytest.mark.parametrize("base", ["", "0" * 40, "deadbeef" * 5])
def test_version_changed_publishes_when_there_is_no_usable_base(repo, tmp_path, base):
    _commit(repo, '[project]\nversion = "0.1.0"\n')
    values, _ = _run(repo, base, tmp_path)
    assert values["changed"] == "true" and values["previous"] == ""


def test_the_comfyui_benches_run_chai_samplers_default_cache_steps():
    from bench.bench_chai_comfy import DEFAULT_CACHE_STEPS
    from comfyui_chai.chai_attention.config import ChaiConfig

    assert DEFAULT_CACHE_STEPS == ",".join(map(str, ChaiConfig().cache_steps))


def test_requires_comfyui_and_the_readme_table_say_what_ran_and_what_was_only_read():
    readme = (REPO / "README.md").read_text(encoding="utf-8").split("### ComfyUI versions tested", 1)[1]
    ran = re.findall(r"^\| v(\d+\.\d+\.\d+) \(\*\*ran\*\*\) \|", readme, re.M)
    assert ran, "the tested-versions table marks the releases tier 2 ran on"
    oldest = min(ran, key=lambda v: tuple(map(int, v.split("."))))
    assert COMFY["requires-comfyui"] == f">={oldest}", "the lower bound is the oldest release that ran"
    read = re.findall(r"^\| newer, up to (\d+\.\d+\.\d+) \(\*\*read only\*\*\) \| .*\*\*not run\*\*", readme, re.M)
    compat = (REPO / "docs" / "comfyui-compat.md").read_text(encoding="utf-8")
    newest_read = re.search(r"newest stored release\s+marker is (\d+\.\d+\.\d+)", compat)
    assert newest_read and read == [newest_read.group(1)], (read, newest_read)
