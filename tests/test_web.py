"""The pack's frontend extension (web/js): declared by the entry point and valid JavaScript."""
from __future__ import annotations

import importlib.util
import json
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


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node.js to run the function")
def test_reports_find_nodes_on_the_root_graph_and_inside_subgraphs(tmp_path):
    import re

    source = (REPO / "web" / "chai_reports.js").read_text(encoding="utf-8")
    fn = re.search(r"^function graphNode\(id\) \{.*?^\}", source, re.S | re.M).group(0)
    script = tmp_path / "probe.mjs"
    script.write_text(
        "class G { constructor(nodes) { this.nodes = nodes; } getNodeById(i) { return this.nodes[i] ?? null; } }\n"
        "const inner = new G({101: {name: 'inner lookup'}});\n"
        "const app = { graph: new G({12: {name: 'root sampler'}, 6: {name: 'CHAI', subgraph: inner}}) };\n"
        + fn + "\n"
        "console.log(JSON.stringify(['12', '6:101', '6:999', '7:101'].map((i) => graphNode(i)?.name ?? null)));\n",
        encoding="utf-8")
    done = subprocess.run(["node", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["root sampler", "inner lookup", None, None]
