"""scripts/check_wheels.py: the wheels-only resolution of requirements.txt per platform and Python version.

The parsing, the drop-and-retry loop and the table run on a fake pip; one test asks the real index (PyPI) about a
pure-Python wheel and an sdist-only release, and skips when the index cannot be reached.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
try:
    import check_wheels as cw
finally:
    sys.path.remove(str(REPO / "scripts"))

NO_HNSWLIB = ("ERROR: Could not find a version that satisfies the requirement hnswlib>=0.8.0 (from versions: none)\n"
              "ERROR: No matching distribution found for hnswlib>=0.8.0\n")
NO_DEP = ("ERROR: Could not find a version that satisfies the requirement Blis_Lib<1.4,>=1.3 (from thinc) "
          "(from versions: none)\nERROR: No matching distribution found for Blis_Lib<1.4,>=1.3\n")
CONFLICT = ("ERROR: Cannot install numpy>=3 and spacy==3.8 because these package versions have conflicting "
            "dependencies.\nERROR: ResolutionImpossible: for help visit https://pip.pypa.io/\n")
REQS = "# comment\nspacy>=3.8,<3.9\nhnswlib>=0.8.0  # the ANN index\n\n-r other.txt\nnumpy>=1.25\n"


def wheel(name: str, url_tail: str = "-1.0-py3-none-any.whl") -> dict:
    return {"metadata": {"name": name, "version": "1.0"},
            "download_info": {"url": f"https://files.example/{name}{url_tail}"}}


class FakePip:
    """Answers each resolution from the requirement names in the file pip was handed."""

    def __init__(self, no_wheel: set[str], stderr_for: dict[str, str], report_items: list[dict] | None = None):
        self.no_wheel, self.stderr_for, self.items = no_wheel, stderr_for, report_items
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str], report: Path) -> cw.PipRun:
        names = [n for n, _ in cw.requirement_lines(Path(cmd[cmd.index("-r") + 1]).read_text())]
        self.calls.append(cmd)
        for name in names:
            if name in self.no_wheel:
                return cw.PipRun(1, self.stderr_for[name], None)
        return cw.PipRun(0, "", {"install": self.items if self.items is not None else [wheel(n) for n in names]})


def test_requirement_lines_skip_comments_options_and_blank_lines():
    assert cw.requirement_lines(REQS) == [("spacy", "spacy>=3.8,<3.9"), ("hnswlib", "hnswlib>=0.8.0"),
                                          ("numpy", "numpy>=1.25")]


@pytest.mark.parametrize("stderr, name", [(NO_HNSWLIB, "hnswlib"), (NO_DEP, "blis-lib"), (CONFLICT, None),
                                          ("", None)])
def test_failed_requirement_names_the_package_pip_found_nothing_for(stderr, name):
    assert cw.failed_requirement(stderr) == name


def test_first_error_is_the_first_error_line_shortened():
    assert cw.first_error(CONFLICT).startswith("Cannot install numpy>=3 and spacy==3.8")
    assert len(cw.first_error("ERROR: " + "x" * 300)) == 100
    assert cw.first_error("") == "pip failed without a message"


def test_pip_command_is_wheels_only_isolated_and_names_every_platform_tag(tmp_path):
    cmd = cw.pip_command(tmp_path / "r.txt", cw.PLATFORMS["manylinux_x86_64"], "3.13", tmp_path / "t",
                         tmp_path / "rep.json", cw.INDEX_URL)
    assert {"--isolated", "--dry-run", "--only-binary=:all:"} <= set(cmd)
    assert cmd[cmd.index("--python-version") + 1] == "3.13" and cmd[cmd.index("--index-url") + 1] == cw.INDEX_URL
    tags = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--platform"]
    assert tags == cw.PLATFORMS["manylinux_x86_64"]
    assert {"manylinux_2_28_x86_64", "manylinux2014_x86_64", "manylinux_2_17_x86_64"} <= set(tags)


def test_a_top_level_requirement_without_a_wheel_is_named_dropped_and_the_rest_resolved():
    lines = cw.requirement_lines(REQS)
    pip = FakePip({"hnswlib"}, {"hnswlib": NO_HNSWLIB})
    cell = cw.check_cell("win_amd64", "3.13", lines, runner=pip)
    assert not cell.ok and cell.missing == ["hnswlib"] and cell.wheels == 2
    assert len(pip.calls) == 2 and cell.text() == "no wheel: hnswlib; the other 2 wheels ok"
    assert "win_amd64" in pip.calls[0] and "3.13" in pip.calls[0]


def test_two_top_level_gaps_are_both_named():
    pip = FakePip({"hnswlib", "numpy"}, {"hnswlib": NO_HNSWLIB, "numpy": NO_HNSWLIB.replace("hnswlib", "numpy")})
    cell = cw.check_cell("macos_arm64", "3.10", cw.requirement_lines(REQS), runner=pip)
    assert cell.missing == ["hnswlib", "numpy"] and cell.wheels == 1 and len(pip.calls) == 3


def test_a_dependency_without_a_wheel_is_named_and_stops_the_cell():
    pip = FakePip({"spacy"}, {"spacy": NO_DEP})
    cell = cw.check_cell("win_amd64", "3.12", cw.requirement_lines(REQS), runner=pip)
    assert cell.missing == ["blis-lib"] and len(pip.calls) == 1 and not cell.ok


def test_a_conflict_is_an_error_not_a_missing_wheel():
    pip = FakePip({"spacy"}, {"spacy": CONFLICT})
    cell = cw.check_cell("win_amd64", "3.12", cw.requirement_lines(REQS), runner=pip)
    assert cell.missing == [] and cell.error.startswith("Cannot install") and not cell.ok


def test_an_sdist_in_the_report_counts_as_missing():
    items = [wheel("spacy"), wheel("numpy", "-1.0.tar.gz")]
    cell = cw.check_cell("win_amd64", "3.12", [("spacy", "spacy"), ("numpy", "numpy")],
                         runner=FakePip(set(), {}, items))
    assert cell.missing == ["numpy"] and cell.wheels == 2


def test_table_has_a_row_per_platform_and_a_column_per_python():
    cells = [cw.Cell("win_amd64", "3.12", wheels=55), cw.Cell("win_amd64", "3.13", missing=["hnswlib"])]  # no rest
    table = cw.format_table(cells, ["win_amd64", "macos_arm64"], ["3.12", "3.13"]).splitlines()
    assert table[0] == "| platform | 3.12 | 3.13 |"
    assert table[2] == "| win_amd64 | ok (55 wheels) | no wheel: hnswlib |"
    assert table[3] == "| macos_arm64 | - | - |"


def test_main_exits_1_and_names_the_gap(tmp_path, capsys):
    req = tmp_path / "requirements.txt"
    req.write_text(REQS)
    code = cw.main(["--requirements", str(req), "--jobs", "2"], runner=FakePip({"hnswlib"}, {"hnswlib": NO_HNSWLIB}))
    out = capsys.readouterr()
    assert code == 1 and "without a wheel: hnswlib" in out.err
    assert out.out.count("no wheel: hnswlib") == len(cw.PLATFORMS) * len(cw.PYTHONS)  # every cell of the table
    assert "| manylinux_x86_64 |" in out.out and "| 3.10 | 3.11 | 3.12 | 3.13 |" in out.out


def test_main_exits_0_when_every_cell_has_wheels(tmp_path, capsys):
    req = tmp_path / "requirements.txt"
    req.write_text("numpy>=1.25\n")
    assert cw.main(["--requirements", str(req), "--platform", "win_amd64", "--python", "3.13"],
                   runner=FakePip(set(), {})) == 0
    assert "ok: all 1 cells" in capsys.readouterr().out


def test_bad_python_version_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as exc:
        cw.main(["--python", "3"], runner=FakePip(set(), {}))
    assert exc.value.code == 2


def test_an_unreachable_index_skips_or_fails_as_asked(tmp_path, capsys):
    req = tmp_path / "requirements.txt"
    req.write_text("numpy\n")
    args = ["--requirements", str(req), "--index-url", "http://127.0.0.1:9/simple"]
    assert cw.main(args) == 0 and "skipped" in capsys.readouterr().err
    assert cw.main(args + ["--require-network"]) == 1


@pytest.mark.skipif(cw.index_reachable(cw.INDEX_URL, timeout=5) is not None, reason="PyPI unreachable (offline)")
def test_real_pypi_finds_a_pure_wheel_and_refuses_an_sdist_only_release():
    # hnswlib 0.8.0 was published as an sdist only; einops 0.8.0 as a pure-Python wheel.
    lines = [("einops", "einops==0.8.0"), ("hnswlib", "hnswlib==0.8.0")]
    cell = cw.check_cell("win_amd64", "3.13", lines)
    assert cell.missing == ["hnswlib"] and cell.wheels == 1, cell
