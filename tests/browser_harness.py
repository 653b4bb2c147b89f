"""The pack in the real ComfyUI web UI, driven in a real (headless) Chromium -- helpers for tests/browser/test_browser.py.

* :func:`ensure_frontend` -- the ``comfyui-frontend-package`` version that the tested ComfyUI's requirements.txt
  pins (1.32.9 for 0.3.75, the floor lane; 1.48.7 for 0.33.0, the newest lane; ``comfy_harness.ensure_comfyui``
  leaves the web UI packages out; this installs exactly the pinned one).
* :func:`start_ui_server` -- ComfyUI's ``main.py`` on 127.0.0.1 with its *default* web root (the installed frontend
  package, the way a user's ComfyUI serves it; ``comfy_harness.start_server`` serves an empty web root instead).
* :func:`find_chromium` / :func:`launch_chromium` -- the system Chromium (Debian ``chromium``), driven by
  Playwright over CDP; no browser is ever downloaded (``playwright install`` is never run).
* :class:`ComfyPage` -- what a user does on the page: drop a workflow file onto the canvas or open it with
  Ctrl+O, read what the frontend made of it (``window.app`` / ``window.LiteGraph``, the frontend's own objects),
  press Run, record progress/executed events, take screenshots.

Nothing here imports ComfyUI; the frontend code this relies on (comfyui-frontend-package 1.32.9):
``app.handleFile`` (drop and the hidden ``#comfy-file-input`` both end there), ``app.loadGraphData`` which
collects node types missing from ``LiteGraph.registered_node_types`` and shows the ``global-missing-nodes``
dialog, ``LGraph.configure`` which marks unknown nodes ``has_errors``, and ``app.api`` events
(``progress``, ``progress_state``, ``executing``, ``executed``, ``execution_success``, ``execution_error``).

What frontend 1.48.7 does differently (the tests branch on :meth:`ComfyPage.frontend_at_least` where it matters):
node ids are strings; some dialogs (the template browser) are its own component with ``role="dialog"`` and the key
in ``aria-labelledby`` but no ``.p-dialog`` class, closed by a button labelled "Close dialog"; there is no
``global-missing-nodes`` dialog and an unknown node is not marked ``has_errors`` -- missing node types, model files
the server does not offer ("missing models", which it does mark ``has_errors``) and missing media go to its stores,
the error overlay (``data-testid="error-overlay"``) and the Errors tab of the properties panel
(:data:`JS_LOAD_PROBLEMS`); ``data-testid="queue-button"`` is the Run button itself.
"""
from __future__ import annotations

import atexit
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import comfy_harness as ch

FRONTEND_PACKAGE = "comfyui-frontend-package"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts" / "browser"
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Without these Chromium phones home (component updates, sync, QUIC probes...) and floods a closed network.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-default-apps", "--disable-extensions", "--no-default-browser-check",
                 "--metrics-recording-only", "--disable-features=Translate,MediaRouter,OptimizationHints",
                 "--disable-dev-shm-usage"]
INSTALL_HINT = ("install it with `apt-get install -y chromium` (Debian/Ubuntu; the README's test command does it), "
                "or point $TREEGRPO_CHROMIUM at a Chromium/Chrome binary")


class BrowserSetupError(RuntimeError):
    """The browser test cannot run on this machine (no Chromium, no Playwright, wrong frontend)."""


# ----------------------------------------------------------------------------------------------------------------
# frontend package and server
# ----------------------------------------------------------------------------------------------------------------

def required_frontend_version(comfy_dir: Path) -> str:
    """The ``comfyui-frontend-package==X`` pin of ComfyUI's requirements.txt."""
    for line in (Path(comfy_dir) / "requirements.txt").read_text().splitlines():
        m = re.match(r"\s*comfyui[-_]frontend[-_]package\s*==\s*([0-9][^\s#;]*)", line, re.I)
        if m:
            return m.group(1)
    raise BrowserSetupError(f"{comfy_dir}/requirements.txt pins no {FRONTEND_PACKAGE}")


def installed_frontend_version() -> str | None:
    try:
        return importlib.metadata.version(FRONTEND_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def ensure_frontend(comfy_dir: Path) -> str:
    """Install the frontend package at exactly the version ComfyUI pins (no-op when it already is); returns it."""
    want = required_frontend_version(comfy_dir)
    if installed_frontend_version() != want:
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", f"{FRONTEND_PACKAGE}=={want}"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise BrowserSetupError(f"{' '.join(cmd)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        importlib.invalidate_caches()
    have = installed_frontend_version()
    if have != want:
        raise BrowserSetupError(f"{FRONTEND_PACKAGE} {have} is installed, ComfyUI pins {want}")
    return want


def version_tuple(version: str) -> tuple[int, ...]:
    """``"1.48.7"`` -> ``(1, 48, 7)`` (the numeric release part; what the frontend-version branches compare)."""
    m = re.match(r"\d+(?:\.\d+)*", version.strip())
    if not m:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(x) for x in m.group(0).split("."))


def frontend_static_dir() -> Path:
    import comfyui_frontend_package

    return Path(comfyui_frontend_package.__file__).resolve().parent / "static"


def start_ui_server(base_dir: Path, comfy_dir: Path, timeout: float = 180.0) -> ch.ComfyServer:
    """ComfyUI's main.py with the real web UI: ``comfy_harness.start_server`` without ``--front-end-root``, so
    ComfyUI picks its frontend itself (the installed package, after checking its version against
    requirements.txt).  The pack is symlinked as custom_nodes/comfyui-treegrpo."""
    return ch.start_server(base_dir, comfy_dir=comfy_dir, timeout=timeout, web_ui=True)


# ----------------------------------------------------------------------------------------------------------------
# the browser
# ----------------------------------------------------------------------------------------------------------------

def find_chromium() -> str | None:
    exe = os.environ.get("TREEGRPO_CHROMIUM")
    if exe:
        return exe if os.access(exe, os.X_OK) else None
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium_version(exe: str) -> str:
    try:
        p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
        return p.stdout.strip() or p.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"? ({e})"


def launch_chromium(playwright, exe: str):
    """Headless system Chromium (Playwright adds --headless) with a fresh profile (a new temporary
    --user-data-dir per launch)."""
    return playwright.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS,
                                      chromium_sandbox=False, timeout=60_000)


# ----------------------------------------------------------------------------------------------------------------
# the page
# ----------------------------------------------------------------------------------------------------------------

# Everything the page knows about its graph, read from the frontend's own objects.
JS_GRAPH = """() => {
  const reg = window.LiteGraph.registered_node_types;
  return window.app.graph.nodes.map(n => ({
    id: n.id, type: n.type, title: n.title, registered: n.type in reg, has_errors: !!n.has_errors,
    comfy_class: n.comfyClass ?? null, node_def: n.constructor?.nodeData?.name ?? null,
    python_module: n.constructor?.nodeData?.python_module ?? null,
    category: n.constructor?.nodeData?.category ?? null,
    color: n.color ?? null, bgcolor: n.bgcolor ?? null, mode: n.mode,
    pos: Array.from(n.pos), size: Array.from(n.size),
    widgets: (n.widgets || []).map(w => ({name: w.name, type: w.type, value: w.value})),
    inputs: (n.inputs || []).map(i => ({name: i.name, type: i.type, link: i.link})),
    imgs: (n.imgs || []).map(i => ({src: i.src, w: i.naturalWidth, h: i.naturalHeight, complete: i.complete})),
  }));
}"""

# Dialogs shown right now (the frontend's global dialogs carry their key in aria-labelledby) and error toasts.
# Frontend 1.32 draws its dialogs with PrimeVue (.p-dialog, role="dialog"); 1.48 draws some of them (the template
# browser among them) with its own component, which has role="dialog" and the key in aria-labelledby but no
# .p-dialog class: ask for the ARIA role, and keep .p-dialog for anything PrimeVue shows without it.
DIALOG_SELECTOR = '[role="dialog"], [role="alertdialog"], .p-dialog'
JS_DIALOGS = """(sel) => ({
  dialogs: Array.from(document.querySelectorAll(sel)).filter(d => d.offsetParent !== null || d.getClientRects().length)
    .filter((d, i, all) => !all.some(o => o !== d && o.contains(d)))   // a dialog inside a dialog: the outer one
    .map(d => ({key: d.getAttribute('aria-labelledby'), text: d.innerText.slice(0, 400)})),
  errors: Array.from(document.querySelectorAll('.p-toast-message-error, .p-toast-message-warn'))
    .map(t => t.innerText.slice(0, 400)),
})"""

# What frontend 1.48 found wrong with the loaded workflow, from its own stores (pinia, on the Vue app of #vue-app):
# node types nobody registered (missingNodesError; 1.48 shows no missing-nodes dialog for them), model files a
# widget names that the server does not offer (missingModel: the widget's value is not among its combo values),
# missing input media (missingMedia), and the error overlay that counts them.  1.32 has none of these stores.
JS_LOAD_PROBLEMS = """() => {
  const pinia = document.querySelector('#vue-app')?.__vue_app__?.config?.globalProperties?.$pinia;
  const state = (id) => pinia?.state?.value?.[id] ?? null;
  const mm = state('missingModel'), mn = state('missingNodesError'), md = state('missingMedia');
  const overlay = document.querySelector('[data-testid="error-overlay"]');
  return {
    stores: !!(mm && mn),
    refreshing: !!mm?.isRefreshingMissingModels,
    missing_nodes: (mn?.missingNodesError?.nodeTypes || [])
      .map(t => typeof t === 'string' ? {type: t, node: null} : {type: t.type, node: t.nodeId ?? null}),
    missing_models: (mm?.missingModelCandidates || []).filter(c => c.isMissing === true).map(c => {
      const n = window.app.graph.getNodeById(c.nodeId);
      const w = (n?.widgets || []).find(w => w.name === c.widgetName);
      const values = Array.isArray(w?.options?.values) ? w.options.values : null;
      return {node: c.nodeId, type: c.nodeType, widget: c.widgetName, name: c.name, value: w ? w.value : null,
              offered: values ? values.includes(c.name) : null};
    }),
    missing_media: (md?.missingMediaCandidates || []).map(c => ({node: c.nodeId, widget: c.widgetName, name: c.name})),
    overlay: overlay && overlay.getClientRects().length ? overlay.innerText : null,
  };
}"""

# A user dropping a file from the desktop: a DataTransfer carrying a File, dragenter/dragover/drop on the canvas.
JS_DROP = """async ({name, text}) => {
  const file = new File([text], name, {type: 'application/json'});
  const dt = new DataTransfer();
  dt.items.add(file);
  const target = document.querySelector('#graph-canvas') || document.body;
  const r = target.getBoundingClientRect();
  const at = {bubbles: true, cancelable: true, dataTransfer: dt,
              clientX: r.left + r.width / 2, clientY: r.top + r.height / 2};
  for (const type of ['dragenter', 'dragover', 'drop']) target.dispatchEvent(new DragEvent(type, at));
}"""

# Record what the server tells the page while a prompt runs, through the frontend's own api object.
JS_HOOK_EVENTS = """() => {
  if (window.__tg) return;
  window.__tg = {events: [], titles: []};
  for (const type of ['status', 'execution_start', 'execution_cached', 'executing', 'progress', 'progress_state',
                      'executed', 'execution_success', 'execution_error', 'execution_interrupted',
                      'b_preview', 'b_preview_with_metadata']) {
    window.app.api.addEventListener(type, e => window.__tg.events.push({type, t: Date.now(),
                                                                        detail: JSON.parse(JSON.stringify(e.detail ?? null))}));
  }
  const seen = () => { const t = document.title; const a = window.__tg.titles; if (a[a.length - 1] !== t) a.push(t); };
  new MutationObserver(seen).observe(document.querySelector('title') || document.head,
                                     {subtree: true, characterData: true, childList: true});
  seen();
}"""


# Centre a node at zoom 1 and return the page coordinates of the middle of one of its widgets.
JS_WIDGET_CENTER = """([id, name]) => {
  const c = window.app.canvas, n = window.app.graph.getNodeById(id);
  const w = n.widgets.find(w => w.name === name);
  c.ds.scale = 1;
  c.centerOnNode(n);
  c.setDirty(true, true);
  const h = w.computedHeight || window.LiteGraph.NODE_WIDGET_HEIGHT;
  const p = c.ds.convertOffsetToCanvas([n.pos[0] + n.size[0] / 2, n.pos[1] + w.y + h / 2]);
  const r = c.canvas.getBoundingClientRect();
  return [r.left + p[0], r.top + p[1]];
}"""


class ComfyPage:
    def __init__(self, page, server_url: str, artifacts: Path = ARTIFACTS, frontend_version: str | None = None):
        self.page, self.url, self.artifacts = page, server_url, artifacts
        self.frontend_version = frontend_version   # the comfyui-frontend-package version the server serves
        self.console: list[str] = []
        self.page_errors: list[str] = []
        self.responses: dict[str, tuple[int, str]] = {}   # path -> (HTTP status, content-type) of the last fetch
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        page.on("response", lambda r: self.responses.__setitem__(
            urllib.parse.urlsplit(r.url).path, (r.status, r.headers.get("content-type", ""))))
        page.on("pageerror", lambda e: self.page_errors.append(str(e)))
        # file choosers the page opens; a listener for the page's whole life keeps Playwright's interception on
        # (one listener per Ctrl+O, added and removed, sometimes missed the next chooser)
        self.file_choosers: list = []
        page.on("filechooser", lambda fc: self.file_choosers.append(fc))

    def open(self, timeout_ms: int = 90_000) -> None:
        self.page.goto(self.url, wait_until="domcontentloaded", timeout=timeout_ms)
        self.page.wait_for_function(
            "window.app && window.app.graph && window.app.canvas && window.LiteGraph"
            " && document.querySelector('#graph-canvas')", timeout=timeout_ms)
        # the node definitions (object_info) are registered once the pack's nodes are known to LiteGraph
        self.page.wait_for_function("'TreeGRPOTrain' in window.LiteGraph.registered_node_types", timeout=timeout_ms)
        self.page.evaluate(JS_HOOK_EVENTS)

    def evaluate(self, js: str, arg: Any = None) -> Any:
        return self.page.evaluate(js, arg)

    # -- loading workflows ------------------------------------------------------------------------------------
    def _wait_loaded(self, path: Path, timeout_ms: int) -> None:
        n = len(json.loads(path.read_text())["nodes"])
        self.page.wait_for_function(
            """([n, name]) => window.app.graph.nodes.length === n && document.title.includes(name)""",
            arg=[n, path.stem], timeout=timeout_ms)
        self.page.wait_for_timeout(300)  # one more frame: the canvas draws the new graph

    def drop_workflow(self, path: Path, timeout_ms: int = 30_000) -> None:
        """Drag-and-drop the JSON file onto the canvas (app.handleFile, open source 'file_drop')."""
        self.page.evaluate(JS_DROP, {"name": path.name, "text": path.read_text()})
        self._wait_loaded(path, timeout_ms)

    def open_workflow_with_ctrl_o(self, path: Path, timeout_ms: int = 30_000) -> None:
        """Workflow > Open (Ctrl+O): the browser's file chooser of the hidden #comfy-file-input."""
        self.page.locator("#graph-canvas").focus()
        self.file_choosers.clear()
        self.page.keyboard.press("Control+o")
        deadline = time.monotonic() + timeout_ms / 1000
        while not self.file_choosers:
            if time.monotonic() > deadline:
                raise TimeoutError("Ctrl+O opened no file chooser")
            self.page.wait_for_timeout(100)
        self.file_choosers.pop().set_files(str(path))
        self._wait_loaded(path, timeout_ms)

    # -- editing and running ----------------------------------------------------------------------------------
    def type_into_widget(self, node_id: int, name: str, text: str, timeout_ms: int = 10_000) -> Any:
        """Click a widget of a node (zoom 1, node centred) and type ``text`` into the value prompt that opens,
        then Enter -- the way a user edits a number.  Returns the widget's value afterwards."""
        x, y = self.page.evaluate(JS_WIDGET_CENTER, [node_id, name])
        self.page.wait_for_timeout(200)  # the canvas redraws at the new offset
        self.page.mouse.click(x, y)
        box = self.page.locator(".graphdialog input.value")
        box.wait_for(state="visible", timeout=timeout_ms)
        box.fill(str(text))
        box.press("Enter")
        box.wait_for(state="detached", timeout=timeout_ms)
        return self.widget_value(node_id, name)

    def widget_value(self, node_id: int, name: str) -> Any:
        return self.page.evaluate("([id, name]) => window.app.graph.getNodeById(id).widgets"
                                  ".find(w => w.name === name).value", [node_id, name])

    def press_run(self) -> None:
        """The Run (queue) button of the action bar (1.32: a button inside the element with data-testid
        queue-button; 1.48: the button itself carries it)."""
        self.page.locator('button[data-testid="queue-button"], [data-testid="queue-button"] button').first.click()

    def wait_for_event(self, types: tuple[str, ...], timeout_s: float, poll_s: float = 0.5) -> dict:
        """Wait until the page received one of ``types`` (api events); returns it."""
        deadline = time.monotonic() + timeout_s
        while True:
            for e in self.events():
                if e["type"] in types:
                    return e
            if time.monotonic() > deadline:
                raise TimeoutError(f"none of {types} within {timeout_s}s; last events: {self.events()[-5:]}")
            self.page.wait_for_timeout(int(poll_s * 1000))

    # -- reading the page ---------------------------------------------------------------------------------------
    def graph(self) -> list[dict]:
        return self.page.evaluate(JS_GRAPH)

    def dialogs(self) -> dict:
        return self.page.evaluate(JS_DIALOGS, DIALOG_SELECTOR)

    def frontend_at_least(self, *release: int) -> bool:
        """The served frontend is at least ``release`` (e.g. ``frontend_at_least(1, 48)``); without a
        ``frontend_version`` given, the installed package (the one ComfyUI serves by default)."""
        have = self.frontend_version or installed_frontend_version()
        if have is None:
            raise BrowserSetupError(f"no {FRONTEND_PACKAGE} installed and no frontend_version given")
        return version_tuple(have) >= release

    def load_problems(self, timeout_ms: int = 30_000) -> dict:
        """Frontend 1.48's own record of what is wrong with the loaded workflow (see JS_LOAD_PROBLEMS), once its
        missing-model check has settled."""
        self.page.wait_for_function("() => { const p = (%s)(); return p.stores && !p.refreshing; }" % JS_LOAD_PROBLEMS,
                                    timeout=timeout_ms)
        return self.page.evaluate(JS_LOAD_PROBLEMS)

    def open_errors_panel(self, timeout_ms: int = 15_000) -> None:
        """Frontend 1.48: the error overlay's "View details" opens the properties panel on its Errors tab."""
        self.page.locator('[data-testid="error-overlay-see-errors"]').click(timeout=timeout_ms)
        self.page.locator('[data-testid="errors-summary-hero"]').wait_for(state="visible", timeout=timeout_ms)

    def close_properties_panel(self, timeout_ms: int = 15_000) -> None:
        """Frontend 1.48: close the right-hand properties panel with its toggle in the action bar."""
        panel = self.page.locator('[data-testid="properties-panel"]')
        if panel.count() and panel.first.is_visible():
            self.page.get_by_role("button", name="Toggle properties panel", exact=True).first.click(timeout=timeout_ms)
            panel.first.wait_for(state="hidden", timeout=timeout_ms)

    def close_dialogs(self) -> None:
        """Close every open dialog with its own close button (x), like a user."""
        for _ in range(5):
            if not self.dialogs()["dialogs"]:
                return
            d = self.page.locator(", ".join(f"{s.strip()}:visible" for s in DIALOG_SELECTOR.split(","))).last
            # 1.32: PrimeVue's close button; 1.48's own dialog: a button labelled "Close dialog"
            btn = d.locator('.p-dialog-close-button, button[aria-label="Close dialog"], button:has(i.pi-times)').first
            if btn.count():
                btn.click()
            else:
                self.page.keyboard.press("Escape")
            self.page.wait_for_timeout(400)
        raise AssertionError(f"dialogs do not close: {self.dialogs()}")

    def events(self) -> list[dict]:
        return self.page.evaluate("() => window.__tg.events")

    def titles(self) -> list[str]:
        return self.page.evaluate("() => window.__tg.titles")

    def reset_events(self) -> None:
        self.page.evaluate("() => { window.__tg.events = []; window.__tg.titles = [document.title]; }")

    def fit_view(self) -> None:
        """Zoom to fit (the '.' key / 'Comfy.Canvas.FitView' command), as a user does after loading."""
        self.page.evaluate("() => window.app.extensionManager.command.execute('Comfy.Canvas.FitView')")
        self.page.wait_for_timeout(400)

    def screenshot(self, name: str, **kw) -> Path:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        path = self.artifacts / f"{name}.png"
        self.page.screenshot(path=str(path), **kw)
        return path


def new_base_dir(prefix: str = "treegrpo_browser_") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
