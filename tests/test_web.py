"""The pack's frontend extension (web/js): declared by the entry point and valid JavaScript."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "web" / "chai_reports.js"


def test_entry_point_names_the_web_directory_with_the_report_extension():
    spec = importlib.util.spec_from_file_location("chai_entry_for_web_test", REPO / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (REPO / module.WEB_DIRECTORY).resolve() == SCRIPT.parent
    text = SCRIPT.read_text()
    # The report box is never serialized: saved workflows keep their widgets_values (input names never change),
    # and the queued prompt does not carry it (tests/tier2/test_browser.py checks both in the real frontend).
    assert "widget.serialize = false" in text and "widget.options.serialize = false" in text
    assert "CHAI.Reports" in text


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node.js to parse the script")
def test_the_extension_parses_as_an_es_module(tmp_path):
    copy = tmp_path / "chai_reports.mjs"
    copy.write_text(SCRIPT.read_text())
    done = subprocess.run(["node", "--check", str(copy)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
