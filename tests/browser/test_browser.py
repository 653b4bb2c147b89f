"""The pack in the real ComfyUI web UI, in a real browser: the lane's ComfyUI main.py (0.3.75 with frontend 1.32.9,
or 0.33.0 with 1.48.7: $TREEGRPO_COMFYUI_LANE) serving the frontend package it pins, this repo as a custom node
pack, headless system Chromium driven by Playwright.  For every shipped workflow: drop the file onto the canvas
like a user, check that every node is known and none is shown as an error, screenshot it.  For the CPU demo:
type a short iteration count into the widgets, press Run, watch the progress reach 100 %, see the previews appear
and the LoRA land in models/loras.

Screenshots: tests/artifacts/browser/ (gitignored).  Needs `chromium` (Debian package); without it the tests
skip on a developer machine and fail in CI ($CI set).  See the README, "Browser tests".
"""
from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from pathlib import Path

import pytest

import browser_harness as bh
from artist_eval import samples_area
import comfy_harness as ch

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / "workflows").glob("*.json"))
DEMO = REPO / "workflows" / "treegrpo_demo_cpu.json"
VIEWPORT = {"width": 1600, "height": 1400}
# screenshot-friendly user settings: no minimap over the graph, text drawn at any zoom (LOD off)
SETTINGS = {"Comfy.Minimap.Visible": False, "LiteGraph.Canvas.MinFontSizeForLOD": 0}
DEMO_RUN: dict = {}   # widget values typed into the Train node before Run (none: the shipped defaults are tested)
DEMO_MIN_GAIN = 0.12  # queued from the page, the evaluation reward rises at least as much as `treegrpo demo`'s
# a guard against a hang, not a speed bound (how long the run takes is benchmarks/bench_comfy.py's figure: a
# slower or busier machine takes longer and still passes)
DEMO_TIMEOUT_S = 1800
TEMPLATE_BROWSER = "global-workflow-template-selector"   # the template browser's dialog key (aria-labelledby)


def test_readme_test_command_installs_chromium_and_ci_runs_it_verbatim():
    """A fresh machine gets the browser through the README's test command; .ci/run runs that command."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("Run the tests", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [ln for ln in block.splitlines() if ln.strip()]
    assert any("apt-get install -y chromium" in ln and ln.startswith("command -v chromium") for ln in lines), lines
    assert any('pip install -e ".[test]"' in ln and "pytest" in ln for ln in lines), lines
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    for ln in lines:
        assert ln in ci, f".ci/run does not run this README line verbatim: {ln}"
    assert any(ln.startswith("export ") and 'CI="${CI:-1}"' in ln for ln in ci)


# ----------------------------------------------------------------------------------------------------------------
# fixtures: one server, one browser, one page for the module
# ----------------------------------------------------------------------------------------------------------------

def browser_unavailable(msg: str):
    """No browser here: skip on a developer machine, fail in CI ($CI set) -- never pass silently."""
    if os.environ.get("CI"):
        pytest.fail(f"{msg} ($CI is set: the browser tests must run in CI)", pytrace=False)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def chromium_exe():
    exe = bh.find_chromium()
    if exe is None:
        browser_unavailable(f"no Chromium found for the browser tests: {bh.INSTALL_HINT}")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as e:
        browser_unavailable(f"the Python package `playwright` is missing ({e}); `pip install -e '.[test]'` installs it")
    return exe


def test_a_missing_browser_fails_in_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setenv("TREEGRPO_CHROMIUM", "/nonexistent/chromium")
    assert bh.find_chromium() is None
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="must run in CI"):
        browser_unavailable("no Chromium")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        browser_unavailable("no Chromium")


@pytest.fixture(scope="module")
def ui_server(chromium_exe, comfyui_dir, tmp_path_factory):
    frontend = bh.ensure_frontend(comfyui_dir)
    srv = bh.start_ui_server(tmp_path_factory.mktemp("comfyui_browser"), comfyui_dir)
    srv.frontend_version = frontend
    try:
        ch._http(srv.port, "/settings", SETTINGS)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def browser(chromium_exe):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = bh.launch_chromium(p, chromium_exe)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def page(browser, ui_server):
    ctx = browser.new_context(viewport=VIEWPORT, device_scale_factor=1, service_workers="block")
    # a closed network: the page only ever talks to this ComfyUI (the frontend also tries api.comfy.org)
    ctx.route(re.compile(r"^(?!https?://127\.0\.0\.1[:/]|data:|blob:)"), lambda route: route.abort())
    ctx.add_init_script("localStorage.setItem('vueNodesBannerDismissed', 'true')")
    pg = ctx.new_page()
    cp = bh.ComfyPage(pg, ui_server.url, frontend_version=ui_server.frontend_version)
    t0 = time.perf_counter()
    cp.open()
    cp.open_seconds = time.perf_counter() - t0
    # a new user's first visit opens the template browser: wait for it (or a moment), remember, close
    # (the assertions about it live in the template test: nothing here fails)
    selector = pg.locator(f'[aria-labelledby="{TEMPLATE_BROWSER}"]')
    try:
        selector.wait_for(state="visible", timeout=30_000)
    except Exception:  # noqa: BLE001
        pass
    try:
        show_all_templates(cp)
    except Exception:  # noqa: BLE001
        pass
    try:
        pg.locator('[data-testid^="template-workflow-"] img').first.wait_for(state="attached", timeout=15_000)
    except Exception:  # noqa: BLE001
        pass
    pg.wait_for_timeout(500)
    cp.first_dialogs = cp.dialogs()
    cp.first_templates = template_cards(cp)
    cp.screenshot("00_first_visit_template_browser")
    cp.close_dialogs()
    yield cp
    ctx.close()


def show_all_templates(cp: bh.ComfyPage) -> None:
    """Frontend 1.48 opens the template browser of a new user's session on "Getting started" (the category
    basics-getting-started: ComfyUI's own basics, from the comfyui-workflow-templates package, which is not
    installed here, so that view is empty) -- on the first visit and every time it is opened again in that page;
    1.32 opens it on "All Templates".  On 1.48 pick "All Templates" in the browser's side panel, like a user."""
    if cp.frontend_at_least(1, 48):
        cp.page.locator(f'[aria-labelledby="{TEMPLATE_BROWSER}"]').get_by_role(
            "button", name="All Templates", exact=True).click(timeout=15_000)


def template_cards(cp: bh.ComfyPage) -> dict[str, dict]:
    """Cards shown by the template browser: name -> thumbnail image state."""
    return cp.evaluate("""() => Object.fromEntries(Array.from(document.querySelectorAll('[data-testid^="template-workflow-"]'))
      .map(c => [c.dataset.testid.replace('template-workflow-', ''),
                 Array.from(c.querySelectorAll('img')).map(i => ({src: i.currentSrc || i.src, w: i.naturalWidth,
                                                                  h: i.naturalHeight, complete: i.complete}))]))""")


def overlapping(graph: list[dict]) -> list[tuple]:
    """Pairs of nodes whose boxes (title bar included) intersect."""
    boxes = [(n["id"], n["pos"][0], n["pos"][1] - 30, n["size"][0], n["size"][1] + 30) for n in graph]
    return [(a[0], b[0]) for a in boxes for b in boxes
            if a[0] < b[0] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3] and a[2] < b[2] + b[4] and b[2] < a[2] + a[4]]


def assert_clean_graph(cp: bh.ComfyPage, path: Path) -> list[dict]:
    """Every node of the file is in the page, of a registered type, not marked as an error; no dialog
    (the missing-nodes dialog is one) and no error toast is open."""
    graph = cp.graph()
    wf = json.loads(path.read_text())
    # node ids: numbers in the file; frontend 1.32 keeps them numbers, 1.48 makes them strings -- compare as text
    assert sorted(str(n["id"]) for n in graph) == sorted(str(n["id"]) for n in wf["nodes"]), path.stem
    assert {str(n["id"]): n["type"] for n in graph} == {str(n["id"]): n["type"] for n in wf["nodes"]}
    missing_model_nodes: set[str] = set()
    if cp.frontend_at_least(1, 48):
        # Frontend 1.48 checks every model-file widget against the files the server offers: a node whose file is not
        # here (the shipped workflows name checkpoints a user downloads; compare_base_vs_lora names the LoRA the demo
        # writes) is outlined as an error and counted in the error overlay ("missing models").  1.32 has no such
        # check.  Allow exactly that -- a file this server really does not list -- and nothing else: no missing node
        # type, no missing input media, and an overlay that counts nothing but those files.
        problems = cp.load_problems()
        assert not problems["missing_nodes"], f"{path.stem}: missing node types: {problems['missing_nodes']}"
        assert not problems["missing_media"], f"{path.stem}: missing input media: {problems['missing_media']}"
        models = problems["missing_models"]
        for m in models:
            assert m["value"] == m["name"] and m["offered"] is False, (path.stem, m)
        missing_model_nodes = {str(m["node"]) for m in models}
        overlay = problems["overlay"]
        if not models:
            assert overlay is None, (path.stem, overlay)
        elif len(models) == 1:
            assert overlay and f"{models[0]['name']} is missing" in overlay, (path.stem, problems)
        else:
            assert overlay and f"{len(models)} errors found" in overlay, (path.stem, problems)
    bad = [(n["id"], n["type"]) for n in graph
           if not n["registered"] or (n["has_errors"] and str(n["id"]) not in missing_model_nodes)]
    assert not bad, f"{path.stem}: nodes missing or shown as errors: {bad}"
    for n in graph:
        if n["type"] not in ("Note", "MarkdownNote"):  # frontend-only nodes have no server definition
            assert n["node_def"] == n["type"], n
    d = cp.dialogs()
    assert not d["dialogs"], f"{path.stem}: dialog open after loading: {d['dialogs']}"
    assert not d["errors"], f"{path.stem}: error toasts: {d['errors']}"
    assert not cp.evaluate("() => window.app.lastNodeErrors"), path.stem
    return graph


# ----------------------------------------------------------------------------------------------------------------
# the page, the frontend version, the template browser
# ----------------------------------------------------------------------------------------------------------------

def test_server_serves_the_frontend_version_comfyui_pins(page, ui_server, comfyui_dir, chromium_exe):
    print(f"browser: {bh.chromium_version(chromium_exe)}; page up in {page.open_seconds:.1f}s")
    pinned = bh.required_frontend_version(comfyui_dir)
    assert ui_server.frontend_version == pinned
    assert page.evaluate("() => window.__COMFYUI_FRONTEND_VERSION__") == pinned
    log = ui_server.log_text()
    stats = ch._http(ui_server.port, "/system_stats")["system"]
    if bh.version_tuple(ch.comfyui_version()) <= bh.version_tuple(ch.FLOOR_VERSION):
        # ComfyUI 0.3.75 checks the frontend package alone and logs its version on a line of its own
        assert f"ComfyUI frontend version: {pinned}" in log
    else:
        # newer ComfyUI (0.33.0) checks every comfy* package of requirements.txt, logs "<package> version: X" for
        # each one that is not outdated, and lists them (installed and required) in /system_stats
        assert f"comfyui-frontend-package version: {pinned}" in log
        packages = {p["name"]: p for p in stats["comfy_package_versions"]}
        assert packages[bh.FRONTEND_PACKAGE] == {"name": bh.FRONTEND_PACKAGE, "installed": pinned,
                                                 "required": pinned}, packages
    # the page is the installed package's own index.html
    with urllib.request.urlopen(ui_server.url + "/", timeout=30) as r:
        assert r.read() == (bh.frontend_static_dir() / "index.html").read_bytes()
    assert stats["comfyui_version"] == ch.comfyui_version()
    assert stats["required_frontend_version"] == pinned
    assert not ui_server.pack_import_failed()
    # the page came up with the pack's node definitions registered and no uncaught script error
    assert page.evaluate("() => Object.keys(window.LiteGraph.registered_node_types)"
                         ".filter(t => t.startsWith('TreeGRPO')).length") >= 10
    assert not page.page_errors, page.page_errors


def test_template_browser_lists_every_workflow_with_its_thumbnail(page):
    """A new user's first visit opens the template browser: the pack's workflows are there, each with the
    thumbnail shipped next to it (workflows/<name>.jpg); clicking one loads it."""
    first = page.first_dialogs["dialogs"]
    assert [d["key"] for d in first] == [TEMPLATE_BROWSER], first
    cards = page.first_templates
    names = {p.stem for p in WORKFLOWS}
    assert set(cards) == names, cards
    for name in names:  # fetched from the pack's workflows/ folder (the frontend then shows it as a blob: URL)
        status = page.responses.get(f"/api/workflow_templates/{ch.PACK_NAME}/{name}.jpg")
        assert status and status[0] == 200 and status[1] == "image/jpeg", (name, status)
        assert not any(i["src"].endswith("default-template.png") for i in cards[name]), (name, cards[name])
    # open it again from the side bar (Templates) and wait for every thumbnail to be decoded
    page.page.locator(".templates-tab-button").first.click()
    show_all_templates(page)
    page.page.wait_for_function("""() => { const i = Array.from(document.querySelectorAll('[data-testid^="template-workflow-"] img'));
        return i.length >= %d && i.every(x => x.complete && x.naturalWidth > 0); }""" % len(names), timeout=20_000)
    loaded = template_cards(page)
    assert all(imgs[0]["w"] == imgs[0]["h"] == 480 for imgs in loaded.values()), loaded  # ours, not the default
    page.screenshot("01_template_browser")
    page.page.locator('[data-testid="template-workflow-treegrpo_step_by_step"]').click()
    page.page.wait_for_function("() => document.title.includes('treegrpo_step_by_step')"
                                " && window.app.graph.nodes.some(n => n.type === 'TreeGRPOTrainerStep')",
                                timeout=20_000)
    page.page.wait_for_timeout(300)
    assert_clean_graph(page, REPO / "workflows" / "treegrpo_step_by_step.json")


# ----------------------------------------------------------------------------------------------------------------
# every shipped workflow, loaded the user's way
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.stem for p in WORKFLOWS])
def test_workflow_dropped_on_the_canvas_shows_no_missing_or_broken_node(page, path):
    page.drop_workflow(path)
    graph = assert_clean_graph(page, path)
    assert not overlapping(graph), f"{path.stem}: overlapping nodes {overlapping(graph)}"
    page.fit_view()
    shot = page.screenshot(f"workflow_{path.stem}")
    assert shot.stat().st_size > 20_000


def test_a_missing_node_is_caught_by_these_checks(page, tmp_path):
    """The negative control: a workflow naming a node type nobody registered shows the frontend's missing-nodes
    dialog and a node drawn as an error -- exactly what the checks above look for."""
    wf = json.loads((REPO / "workflows" / "compare_base_vs_lora.json").read_text())
    victim = next(n for n in wf["nodes"] if n["type"] == "TreeGRPOLoadDemoModel")
    victim["type"] = "TreeGRPONoSuchNode"
    path = tmp_path / "with_a_missing_node.json"
    path.write_text(json.dumps(wf))
    page.drop_workflow(path)
    page.page.wait_for_timeout(500)
    broken = [n for n in page.graph() if str(n["id"]) == str(victim["id"])][0]   # 1.48: ids are strings
    assert not broken["registered"], broken
    with pytest.raises(AssertionError, match="TreeGRPONoSuchNode"):
        assert_clean_graph(page, path)
    if not page.frontend_at_least(1, 48):
        # 1.32: the node is drawn as an error and the missing-nodes dialog names its type
        assert broken["has_errors"], broken
        dialogs = page.dialogs()["dialogs"]
        assert [d["key"] for d in dialogs] == ["global-missing-nodes"], dialogs
        assert "TreeGRPONoSuchNode" in dialogs[0]["text"], dialogs
        page.screenshot("04_missing_node_control")
        page.close_dialogs()
    else:
        # 1.48 has no missing-nodes dialog (and does not mark the node has_errors): the error overlay counts it and
        # the properties panel's Errors tab names its type under "Missing Node Packs"
        assert not page.dialogs()["dialogs"], page.dialogs()
        problems = page.load_problems()
        assert [(m["type"], str(m["node"])) for m in problems["missing_nodes"]] == \
            [("TreeGRPONoSuchNode", str(victim["id"]))], problems
        assert problems["overlay"], problems
        page.open_errors_panel()
        group = page.page.locator('[data-testid="error-group-missing-node"]')
        assert "TreeGRPONoSuchNode" in group.inner_text(timeout=15_000)
        page.screenshot("04_missing_node_control")
        page.close_properties_panel()


def test_workflow_opened_with_ctrl_o_file_chooser(page):
    """Workflow > Open (Ctrl+O) goes through the browser's file chooser."""
    path = REPO / "workflows" / "compare_base_vs_lora.json"
    page.open_workflow_with_ctrl_o(path)
    assert_clean_graph(page, path)


# ----------------------------------------------------------------------------------------------------------------
# node appearance as the frontend shows it
# ----------------------------------------------------------------------------------------------------------------

JS_NODE_DEFS = """() => Object.values(window.LiteGraph.registered_node_types)
  .filter(c => c.nodeData && c.nodeData.name.startsWith('TreeGRPO'))
  .map(c => ({name: c.nodeData.name, display_name: c.nodeData.display_name, category: c.nodeData.category,
              description: c.nodeData.description, python_module: c.nodeData.python_module,
              input: c.nodeData.input, output_tooltips: c.nodeData.output_tooltips}))"""

JS_FRESH_NODE = """(type) => {
  const n = window.LiteGraph.createNode(type);
  return {size: Array.from(n.size), color: n.color ?? null,
          widgets: (n.widgets || []).map(w => ({name: w.name, type: w.type, value: w.value,
             min: w.options?.min ?? null, max: w.options?.max ?? null,
             values: Array.isArray(w.options?.values) ? w.options.values : null}))};
}"""

JS_BADGES = """() => window.app.graph.nodes.filter(n => n.type.startsWith('TreeGRPO'))
  .map(n => ({type: n.type, badges: (n.badges || []).map(b => typeof b === 'function' ? b() : b)
                                        .map(b => b && b.text).filter(Boolean)}))"""


def test_pack_nodes_look_right_in_the_node_library(page):
    """Categories under TreeGRPO/, a display name and description per node, a tooltip on every input,
    numbers with min/max, defaults inside their ranges, one source badge for all."""
    defs = page.evaluate(JS_NODE_DEFS)
    assert len(defs) >= 10
    problems = []
    for d in defs:
        if not d["category"].startswith("TreeGRPO/"):
            problems.append((d["name"], "category", d["category"]))
        if not d["display_name"].startswith("TreeGRPO "):
            problems.append((d["name"], "display_name", d["display_name"]))
        if not d["description"]:
            problems.append((d["name"], "description"))
        if d["python_module"] != f"custom_nodes.{ch.PACK_NAME}":
            problems.append((d["name"], "python_module", d["python_module"]))
        for section in ("required", "optional"):
            for name, spec in (d["input"].get(section) or {}).items():
                opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
                if not opts.get("tooltip"):
                    problems.append((d["name"], name, "no tooltip"))
                if spec[0] in ("INT", "FLOAT"):
                    lo, hi, default = opts.get("min"), opts.get("max"), opts.get("default")
                    if lo is None or hi is None or not lo < hi:
                        problems.append((d["name"], name, "range", lo, hi))
                    elif default is None or not lo <= default <= hi:
                        problems.append((d["name"], name, "default outside range", default))
        fresh = page.evaluate(JS_FRESH_NODE, d["name"])
        for w in fresh["widgets"]:
            if w["type"] == "number" and not (w["min"] <= w["value"] <= w["max"]):
                problems.append((d["name"], w["name"], "widget default", w))
            if w["values"] is not None and w["value"] not in w["values"]:
                problems.append((d["name"], w["name"], "combo default", w))
    assert not problems, "\n".join(map(str, problems))
    # the tree widgets' defaults make a valid tree (what a node fresh from the menu would queue)
    from treegrpo.config import TreeConfig

    for d in defs:
        req = d["input"].get("required") or {}
        if {"steps", "window_start", "window_width", "branch"} <= set(req):
            TreeConfig(**{k: req[k][1]["default"] for k in ("steps", "window_start", "window_width", "branch")})
    # every TreeGRPO node on the canvas carries the same source badge (the pack), nothing else
    page.drop_workflow(REPO / "workflows" / "treegrpo_step_by_step.json")
    badges = page.evaluate(JS_BADGES)
    assert badges and {tuple(b["badges"]) for b in badges} == {(next(iter(badges))["badges"][0],)}, badges
    assert ch.PACK_NAME in badges[0]["badges"][0], badges


def test_node_colours_are_consistent_across_workflows(page):
    """A pack node has its category's colour in every shipped workflow; ComfyUI's own nodes keep theirs."""
    seen: dict[str, set] = {}
    for path in WORKFLOWS:
        page.drop_workflow(path)
        for n in page.graph():
            if n["type"].startswith("TreeGRPO"):
                assert n["color"] and n["bgcolor"], (path.stem, n["type"])
                seen.setdefault(n["category"], set()).add((n["color"], n["bgcolor"]))
            elif n["type"] == "Note":
                assert n["bgcolor"], path.stem
            else:
                assert n["color"] is None and n["bgcolor"] is None, (path.stem, n["type"], n["color"])
    assert all(len(c) == 1 for c in seen.values()), seen
    assert len({next(iter(c)) for c in seen.values()}) == len(seen), seen  # one colour per category


def test_widgets_refuse_nonsense_typed_by_a_user(page, ui_server):
    """Typed values outside a widget's range are clamped by the widget; a tree that does not fit the steps is
    refused when queued, with one clear message, and the page shows the error on the node.  The server refuses
    out-of-range values that bypass the widgets (API prompts) as well."""
    page.drop_workflow(DEMO)
    train = next(n for n in page.graph() if n["type"] == "TreeGRPOTrain")["id"]
    assert page.type_into_widget(train, "iterations", "-5") == 1
    assert page.type_into_widget(train, "branch", "1000") == 16
    assert page.type_into_widget(train, "branch", "2") == 2
    assert page.type_into_widget(train, "noise_level", "0") == pytest.approx(0.01)
    assert page.type_into_widget(train, "window_start", "9") == 9    # in range, but 9 + 3 > 10 steps
    page.reset_events()
    page.press_run()
    page.page.wait_for_function("() => !!window.app.lastNodeErrors", timeout=30_000)
    errors = page.evaluate("() => window.app.lastNodeErrors")
    assert list(errors) == [str(train)], errors
    details = {e["details"].split(" - ", 1)[1] for e in errors[str(train)]["errors"]}
    assert len(details) == 1 and "window_start + window_width must be <= steps (10)" in details.pop(), errors
    # ComfyUI repeats it once per input validate_inputs names (steps, window_start, window_width, branch,
    # gradient_checkpointing)
    assert len(errors[str(train)]["errors"]) <= 5, errors
    page.page.wait_for_timeout(300)
    page.screenshot("02_validation_error")
    assert not [e for e in page.events() if e["type"] == "execution_start"]
    page.close_dialogs()
    page.screenshot("03_validation_error_on_the_node")   # the Train node outlined in red

    # the same graph as an API prompt with values no widget would let through
    api = ch.workflow_to_api(json.loads(DEMO.read_text()), ch.node_classes_from_server(ui_server.port))
    tid = next(k for k, v in api.items() if v["class_type"] == "TreeGRPOTrain")
    for bad, kind in (({"iterations": -5}, "value_smaller_than_min"), ({"noise_level": 5.0}, "value_bigger_than_max"),
                      ({"branch": 1000}, "custom_validation_failed")):
        g = json.loads(json.dumps(api))
        g[tid]["inputs"].update(bad)
        with pytest.raises(ch.ComfyValidationError) as ei:
            ch.post_prompt(ui_server.port, g)
        kinds = {e["type"] for e in ei.value.node_errors[tid]["errors"]}
        assert kinds == {kind}, (bad, ei.value.node_errors)


def test_the_reward_loader_lists_only_the_files_of_the_chosen_reward(page, ui_server):
    """The user puts reward files in models/reward_models and refreshes (R): a loaded workflow's HPS loader lists
    only the HPS file; choosing ImageReward lists (and picks) its folder's ImageReward.pt; a reward that needs no
    file lists only "none"."""
    folder = ui_server.base_dir / "models" / "reward_models"
    (folder / "ImageReward").mkdir(parents=True, exist_ok=True)
    for name in ("HPS_v2.1_compressed.pt", "ViT-L-14.pt", "ImageReward/ImageReward.pt", "ImageReward/med_config.json"):
        (folder / name).write_bytes(b"not read by the list")
    page.drop_workflow(REPO / "workflows" / "treegrpo_sd15_lora.json")
    page.evaluate("() => window.app.refreshComboInNodes()")
    loader = next(n for n in page.graph() if n["type"] == "TreeGRPORewardModelLoader")["id"]
    files = """(id) => { const n = window.app.graph.getNodeById(id);
                 const f = n.widgets.find(w => w.name === 'file'); return [f.value, [...f.options.values]]; }"""
    page.page.wait_for_function(f"(id) => ({files})(id)[1].length === 1", arg=loader, timeout=20_000)
    assert page.evaluate(files, loader) == ["HPS_v2.1_compressed.pt", ["HPS_v2.1_compressed.pt"]]
    choose = """([id, value]) => { const n = window.app.graph.getNodeById(id);
                  const w = n.widgets.find(w => w.name === 'reward'); w.value = value; w.callback(value); }"""
    page.evaluate(choose, [loader, "image_reward"])
    page.page.wait_for_function(f"(id) => ({files})(id)[0] !== 'HPS_v2.1_compressed.pt'", arg=loader, timeout=20_000)
    assert page.evaluate(files, loader) == ["ImageReward/ImageReward.pt", ["ImageReward/ImageReward.pt"]]
    page.evaluate(choose, [loader, "demo_adherence"])
    page.page.wait_for_function(f"(id) => ({files})(id)[0].startsWith('(none')", arg=loader, timeout=20_000)
    assert page.evaluate(files, loader)[1] == ["(none: built-in weights or none needed)"]
    page.screenshot("reward_loader_file_list")




# ----------------------------------------------------------------------------------------------------------------
# the CPU demo, queued from the page
# ----------------------------------------------------------------------------------------------------------------

def test_demo_workflow_runs_from_the_page(page, ui_server):
    page.drop_workflow(DEMO)
    graph = assert_clean_graph(page, DEMO)
    by_type: dict[str, list[int]] = {}
    for n in graph:
        by_type.setdefault(n["type"], []).append(n["id"])
    train = by_type["TreeGRPOTrain"][0]
    for name, value in DEMO_RUN.items():
        assert page.type_into_widget(train, name, str(value)) == value
    page.fit_view()
    page.screenshot("demo_1_before_run")

    page.reset_events()
    t0 = time.perf_counter()
    page.press_run()
    done = page.wait_for_event(("execution_success", "execution_error", "execution_interrupted"), DEMO_TIMEOUT_S)
    run_s = time.perf_counter() - t0
    assert done["type"] == "execution_success", (done, ui_server.log_text()[-4000:])
    page.page.wait_for_timeout(1000)  # the previews load
    events = page.events()
    titles = page.titles()

    # progress: the Train node's bar went to its end (one step per iteration), the tab title showed 100 %
    prog = [e["detail"] for e in events if e["type"] == "progress" and str(e["detail"]["node"]) == str(train)]
    assert prog, [e["type"] for e in events]
    assert prog[-1]["value"] == prog[-1]["max"] > 1, prog
    assert any(t.endswith("[100%] TreeGRPOTrain") for t in titles), titles
    states = [e["detail"] for e in events if e["type"] == "progress_state"]
    last = states[-1]["nodes"]
    assert last and all(s["state"] == "finished" for s in last.values()), last
    executed = {str(e["detail"]["node"]) for e in events if e["type"] == "executed"}

    # the live preview: while the Train node ran, the server sent it images (its curves after every evaluation)
    end_t = next(e["t"] for e in events if e["type"] == "execution_success")
    train_done_t = next(e["t"] for e in events if e["type"] == "executed" and str(e["detail"]["node"]) == str(train))
    live = [e for e in events if e["type"] in ("b_preview", "b_preview_with_metadata") and e["t"] < train_done_t
            and str((e["detail"] or {}).get("displayNodeId", (e["detail"] or {}).get("nodeId", train))) == str(train)]
    assert len(live) >= 2 and live[0]["t"] < end_t, [(e["type"], e["detail"]) for e in events
                                                     if e["type"].startswith("b_preview")]

    # the previews: sample grid (Train node + its PreviewImage), reward curve, tree preview
    preview_nodes = [train, *by_type["PreviewImage"], *by_type["TreeGRPOTreePreview"]]
    assert {str(i) for i in preview_nodes} <= executed, executed
    page.page.wait_for_function(
        """(ids) => ids.every(id => { const n = window.app.graph.getNodeById(id);
             return n.imgs && n.imgs.length && n.imgs.every(i => i.complete && i.naturalWidth > 0); })""",
        arg=preview_nodes, timeout=20_000)
    after = page.graph()
    imgs = {n["id"]: n["imgs"] for n in after if n["id"] in preview_nodes}
    assert all(v and v[0]["w"] >= 64 for v in imgs.values()), imgs
    assert not overlapping(after), f"nodes grown by their previews cover others: {overlapping(after)}"

    # it learned: the run's log (output/treegrpo/<run_name>/log.json) has every iteration and the
    # evaluation reward rose by at least DEMO_MIN_GAIN
    log = json.loads((ui_server.base_dir / "output" / "treegrpo" / "treegrpo_demo" / "log.json").read_text())
    assert len(log["train"]) == prog[-1]["max"]
    gain = log["eval"][-1]["eval_reward"] - log["eval"][0]["eval_reward"]
    assert gain >= DEMO_MIN_GAIN, [round(e["eval_reward"], 3) for e in log["eval"]]

    # the LoRA is in models/loras (the Save LoRA node's text says where)
    # (and the Train node's own copies in models/loras/treegrpo/<run_name>/, where LoraLoader lists them)
    all_loras = sorted((ui_server.base_dir / "models" / "loras").rglob("*.safetensors"))
    loras = [p for p in all_loras if p.name.startswith("treegrpo_demo_")]
    assert loras, all_loras
    assert loras[0].stat().st_size > 1000
    assert (ui_server.base_dir / "models" / "loras" / "treegrpo" / "treegrpo_demo" / "treegrpo_demo.safetensors") \
        in all_loras, all_loras
    page.fit_view()
    page.screenshot("demo_2_after_run")
    page.evaluate("(ids) => window.app.canvas.selectNodes(ids.map(id => window.app.graph.getNodeById(id)))",
                  preview_nodes)
    page.fit_view()
    page.evaluate("() => window.app.canvas.deselectAll()")
    page.page.wait_for_timeout(200)
    page.screenshot("demo_3_previews")
    print(f"demo run from the page: {run_s:.1f}s, eval reward {log['eval'][0]['eval_reward']:.3f} -> "
          f"{log['eval'][-1]['eval_reward']:.3f}, {len(events)} events, LoRA {loras[0]}")


# ----------------------------------------------------------------------------------------------------------------
# the artist's dialog (Artist Picks), answered with a click and Enter
# ----------------------------------------------------------------------------------------------------------------

# The scripted artist: likes big shapes. It measures each leaf the dialog shows (the drawn <img>, in the page: the
# fraction of pixels more than 0.15 away from the demo's grey background, treegrpo.demo.shapes.shape_area's rule)
# and clicks the biggest.
LEAF_AREAS_JS = """() => [...document.querySelectorAll('#treegrpo-artist .leaf')].map(le => {
  const img = le.querySelector('img'), c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const x = c.getContext('2d'); x.drawImage(img, 0, 0);
  const d = x.getImageData(0, 0, c.width, c.height).data, bg = 0.2 * 255, thr = 0.15 * 255;
  let n = 0;
  for (let i = 0; i < d.length; i += 4)
    if (Math.max(Math.abs(d[i] - bg), Math.abs(d[i + 1] - bg), Math.abs(d[i + 2] - bg)) > thr) n++;
  return {leaf: Number(le.dataset.leaf), area: n / (d.length / 4)};
})"""
ARTIST_QUEUES = 12        # queued prompts of the artist demo: 2 trees each, 24 answers ("a few dozen")
# The taste shows: the mean shape area of the trained LoRA's samples (64 fixed noises, ODE) exceeds the base model's
# by at least this much. Base: 0.279 (spread 0.10 over the 64). benchmarks/bench_artist.py's simulation of these 24
# answers on the core trainer with the workflow's KL 0.1: +0.19 (lowest +0.13 over seeds 100-107; +0.21 without KL on
# seeds 0-7); this test measured +0.20 on both lanes without KL. A paired difference over 64 noises has a standard error of about 0.01: 0.08 is far outside chance and half
# of the weakest seed's gain.
ARTIST_MIN_AREA_GAIN = 0.08


def test_an_artist_who_likes_big_circles_clicks_through_the_trees_and_the_lora_learns_it(page, ui_server):
    """The artist demo workflow queued from the page ARTIST_QUEUES times (the Run button's batch count): for each
    tree the pack's dialog opens in this tab with the tree's four leaves (siblings in groups of two); the scripted
    artist clicks the biggest shape and presses Enter. Every answer is in the run's labels, and the LoRA the
    workflow saved draws bigger circles than the base model by ARTIST_MIN_AREA_GAIN."""
    page.drop_workflow(REPO / "workflows" / "treegrpo_artist_demo_cpu.json")
    page.reset_events()
    t0 = time.perf_counter()
    page.evaluate(f"() => window.app.queuePrompt(0, {ARTIST_QUEUES})")   # Run with batch count ARTIST_QUEUES
    pg = page.page
    seconds, picks, seen = [], [], set()
    for k in range(2 * ARTIST_QUEUES):
        dlg = pg.locator("#treegrpo-artist[data-question]")
        dlg.wait_for(state="visible", timeout=300_000)
        qid = dlg.get_attribute("data-question")
        assert qid not in seen, qid
        pg.wait_for_function("() => { const i = [...document.querySelectorAll('#treegrpo-artist .leaf img')];"
                             " return i.length === 4 && i.every(x => x.complete && x.naturalWidth > 0); }",
                             timeout=60_000)
        assert dlg.locator(".group").count() == 2
        shown = time.perf_counter()
        areas = page.evaluate(LEAF_AREAS_JS)
        best = max(areas, key=lambda a: a["area"])["leaf"]
        dlg.locator(f'.leaf[data-leaf="{best}"]').click()
        assert "good" in (dlg.locator(f'.leaf[data-leaf="{best}"]').get_attribute("class") or "")
        pg.keyboard.press("Enter")
        pg.locator(f'#treegrpo-artist[data-question="{qid}"]').wait_for(state="detached", timeout=60_000)
        seconds.append(time.perf_counter() - shown)
        seen.add(qid)
        picks.append((qid, best))
        if k == 0:
            page.screenshot("artist_dialog_answered")
    deadline = time.time() + DEMO_TIMEOUT_S
    while True:   # the last queued prompt's end
        queue = ch._http(ui_server.port, "/queue")
        if not queue["queue_running"] and not queue["queue_pending"]:
            break
        assert time.time() < deadline, "the queued artist prompts did not finish"
        time.sleep(0.5)
    # the server's queue can be empty a moment before the last prompt's end reaches the page over the websocket
    done = "() => window.__tg.events.filter(e => ['execution_success', 'execution_error', " \
           "'execution_interrupted'].includes(e.type)).length"
    pg.wait_for_function(f"() => ({done})() >= {ARTIST_QUEUES}", timeout=30_000)
    ends = [e["type"] for e in page.events() if e["type"] in ("execution_success", "execution_error",
                                                              "execution_interrupted")]
    assert ends == ["execution_success"] * ARTIST_QUEUES, (ends, ui_server.log_text()[-4000:])
    total = time.perf_counter() - t0
    path = ui_server.base_dir / "output" / "treegrpo" / "treegrpo_artist" / "artist_labels.jsonl"
    recs = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert [(r["outcome"], r["answer"]["good"]) for r in recs] == [("answered", [b]) for _, b in picks]
    assert [r["iteration"] for r in recs] == [i for i in range(ARTIST_QUEUES) for _ in (0, 1)]
    loras = sorted((ui_server.base_dir / "models" / "loras" / "treegrpo").glob("treegrpo_artist_*.safetensors"))
    assert len(loras) == ARTIST_QUEUES, loras
    base, trained = samples_area(None), samples_area(loras[-1])
    print(f"artist dialog: 1 click + Enter per tree, {sum(seconds) / len(seconds):.2f} s per answer "
          f"(max {max(seconds):.2f} s) from shown to answered; {len(picks)} answers, {ARTIST_QUEUES} queued prompts "
          f"in {total:.1f} s; shape area of the samples {base:.3f} -> {trained:.3f}")
    assert trained - base >= ARTIST_MIN_AREA_GAIN, (base, trained)


def artist_labels(ui_server) -> list[dict]:
    path = ui_server.base_dir / "output" / "treegrpo" / "treegrpo_artist" / "artist_labels.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def wait_queue_empty(ui_server, timeout_s: float = DEMO_TIMEOUT_S) -> None:
    deadline = time.time() + timeout_s
    while True:
        queue = ch._http(ui_server.port, "/queue")
        if not queue["queue_running"] and not queue["queue_pending"]:
            return
        assert time.time() < deadline, "the queued prompts did not finish"
        time.sleep(0.5)


def test_the_artist_dialog_keys_zoom_countdown_and_a_page_reload(page, ui_server):
    """One queued artist prompt answered with the keyboard: the prompt and a countdown are shown, digits toggle
    favourites and Shift+digit marks a bad one, Z zooms the leaf under the mouse and any key closes the zoom; after a
    page reload the same question is shown again (fresh); digits and Enter answer it, Esc skips the next tree."""
    page.drop_workflow(REPO / "workflows" / "treegrpo_artist_demo_cpu.json")
    before = len(artist_labels(ui_server))
    page.evaluate("() => window.app.queuePrompt(0, 1)")
    pg = page.page
    imgs_loaded = ("() => { const i = [...document.querySelectorAll('#treegrpo-artist .leaf img')];"
                   " return i.length === 4 && i.every(x => x.complete && x.naturalWidth > 0); }")
    dlg = pg.locator('#treegrpo-artist[data-question$=":0"]')
    dlg.wait_for(state="visible", timeout=300_000)
    pg.wait_for_function(imgs_loaded, timeout=60_000)
    qid = dlg.get_attribute("data-question")
    assert dlg.locator(".prompt").inner_text() == "Tree 1: \u201ca red circle\u201d"
    left = int(re.fullmatch(r"(\d+) s left", dlg.locator(".countdown").inner_text()).group(1))
    assert 0 < left <= 600                                    # the workflow's timeout_s
    leaf = lambda i: dlg.locator(f'.leaf[data-leaf="{i}"]')  # noqa: E731
    pg.keyboard.press("Digit2")
    pg.keyboard.press("Shift+Digit3")
    assert "good" in leaf(1).get_attribute("class") and "bad" in leaf(2).get_attribute("class")
    assert not any(c in leaf(0).get_attribute("class") for c in ("good", "bad"))
    leaf(3).hover()
    pg.keyboard.press("z")
    zoomed = dlg.locator(".zoom img")
    zoomed.wait_for(state="visible", timeout=10_000)
    assert zoomed.evaluate("e => e.src") == leaf(3).locator("img").evaluate("e => e.src")   # absolute URLs
    page.screenshot("artist_dialog_zoom")
    pg.keyboard.press("x")                                     # any key closes the zoom, the dialog stays
    assert dlg.locator(".zoom").count() == 0 and dlg.is_visible()
    page.open()                                                # reload: the pending question comes back
    dlg = pg.locator(f'#treegrpo-artist[data-question="{qid}"]')
    dlg.wait_for(state="visible", timeout=60_000)
    pg.wait_for_function(imgs_loaded, timeout=60_000)
    assert dlg.locator(".leaf.good, .leaf.bad").count() == 0    # a fresh showing
    pg.keyboard.press("Digit2")
    pg.keyboard.press("Digit4")
    pg.keyboard.press("Enter")
    dlg.wait_for(state="detached", timeout=60_000)
    nxt = pg.locator('#treegrpo-artist[data-question$=":1"]')
    nxt.wait_for(state="visible", timeout=300_000)
    pg.keyboard.press("Escape")
    nxt.wait_for(state="detached", timeout=60_000)
    wait_queue_empty(ui_server)
    page.close_dialogs()                                       # whatever the reload opened (the template browser)
    recs = artist_labels(ui_server)[before:]
    assert [(r["tree"], r["outcome"], r["answer"]["mode"], r["answer"]["good"]) for r in recs] == [
        (0, "answered", "favourites", [1, 3]), (1, "skip", "skip", [])]
    assert recs[0]["rewards"] == [0.0, 1.0, 0.0, 1.0] and recs[1]["rewards"] is None


def test_the_artist_dialog_takes_clicks_over_the_template_browser(page, ui_server):
    """A question that arrives while the front end's own modal is open (the template browser) is answered with the
    mouse: the dialog is a modal <dialog> in the browser's top layer, above the front end's modals."""
    page.drop_workflow(REPO / "workflows" / "treegrpo_artist_demo_cpu.json")
    before = len(artist_labels(ui_server))
    pg = page.page
    pg.locator(".templates-tab-button").first.click()
    pg.locator(f'[aria-labelledby="{TEMPLATE_BROWSER}"]').wait_for(state="visible", timeout=30_000)
    page.evaluate("() => window.app.queuePrompt(0, 1)")
    dlg = pg.locator('#treegrpo-artist[data-question$=":0"]')
    dlg.wait_for(state="visible", timeout=300_000)
    assert pg.locator(f'[aria-labelledby="{TEMPLATE_BROWSER}"]').is_visible()     # still open underneath
    leaf = dlg.locator('.leaf[data-leaf="2"]')
    leaf.click(timeout=10_000)                      # Playwright refuses when another element takes the pointer
    assert "good" in leaf.get_attribute("class")
    page.screenshot("artist_dialog_over_the_template_browser")
    dlg.locator('[data-act="send"]').click(timeout=10_000)
    dlg.wait_for(state="detached", timeout=60_000)
    nxt = pg.locator('#treegrpo-artist[data-question$=":1"]')
    nxt.wait_for(state="visible", timeout=300_000)
    nxt.locator('[data-act="skip"]').click(timeout=10_000)
    nxt.wait_for(state="detached", timeout=60_000)
    wait_queue_empty(ui_server)
    page.close_dialogs()
    recs = artist_labels(ui_server)[before:]
    assert [(r["tree"], r["answered_by"], r["outcome"], r["answer"]["good"]) for r in recs] == [
        (0, "artist", "answered", [2]), (1, "artist", "skip", [])]


# the page's fetch, slowed for the pack's routes only: a request reaches the server at once, its response comes back
# late (a busy server or network): an answer's LATE_MS late, a /pending one twice that. The websocket events are not
# slowed, so they overtake the responses.
SLOW_ARTIST_FETCH_JS = """(ms) => { if (window.__fastFetch) return; window.__fastFetch = window.fetch;
  window.fetch = async (...a) => { const r = await window.__fastFetch(...a), url = String(a[0].url || a[0]);
    if (url.includes('/treegrpo/artist/')) await new Promise(ok => setTimeout(ok, url.includes('/pending') ? 2 * ms : ms));
    return r; }; }"""
LATE_MS = 1500


def test_late_responses_neither_close_the_next_question_nor_show_an_answered_one_again(page, ui_server):
    """With the pack's responses late: the answer to tree 1 comes back after the server's "closed" event has closed its
    dialog and the next tree's question is showing -- that dialog stays (it once closed it unanswered); a /pending
    response fetched before the answer to tree 2 reached the server arrives after it -- the answered question is not
    shown again (it once came back, and the page sat on a question already answered: the keys test's Esc that "did not
    skip" in the full suite)."""
    page.drop_workflow(REPO / "workflows" / "treegrpo_artist_demo_cpu.json")
    before = len(artist_labels(ui_server))
    pg = page.page
    pg.evaluate(SLOW_ARTIST_FETCH_JS, LATE_MS)
    try:
        page.evaluate("() => window.app.queuePrompt(0, 1)")
        first = pg.locator('#treegrpo-artist[data-question$=":0"]')
        first.wait_for(state="visible", timeout=300_000)
        first.locator('.leaf[data-leaf="0"]').click()
        pg.keyboard.press("Enter")
        nxt = pg.locator('#treegrpo-artist[data-question$=":1"]')
        nxt.wait_for(state="visible", timeout=300_000)
        nxt.evaluate("e => e.dataset.mark = 'first-showing'")
        pg.wait_for_timeout(2 * LATE_MS + 1000)          # the late answer to tree 1 and late /pending replies arrive
        assert pg.locator('#treegrpo-artist[data-mark="first-showing"]').count() == 1, \
            "the late answer to tree 1 closed tree 2's dialog"
        # a /pending request now (a reconnect, another prompt's question) reaches the server before the answer below
        # and its reply, still listing tree 2, comes back after it
        pg.evaluate("() => { window.__treegrpoArtist.refresh(); }")
        pg.keyboard.press("Escape")
        nxt.wait_for(state="detached", timeout=60_000)
        pg.wait_for_timeout(2 * LATE_MS + 1000)
        assert pg.locator("#treegrpo-artist").count() == 0, "an answered question was shown again"
        wait_queue_empty(ui_server)
    finally:
        pg.evaluate("() => { if (window.__fastFetch) { window.fetch = window.__fastFetch; delete window.__fastFetch; } }")
    recs = artist_labels(ui_server)[before:]
    assert [(r["tree"], r["outcome"], r["answer"]["mode"]) for r in recs] == [(0, "answered", "favourites"),
                                                                            (1, "skip", "skip")]


def test_the_artist_dialog_says_when_an_answer_cannot_count_and_stops_the_run(page, ui_server):
    """What the dialog does when the server is gone or lost its question, and its own Stop (it is modal, so ComfyUI's
    Cancel button is under it): an answer that cannot reach the server, or that it fails on (5xx), keeps the dialog
    and says so; one the server no longer knows (404: it restarted), and a question /pending no longer lists that the
    server does not know, say so and what to do, and only close; one answered elsewhere just closes; after a reload
    the question is back, and "Stop the run" interrupts the prompt."""
    page.drop_workflow(REPO / "workflows" / "treegrpo_artist_demo_cpu.json")
    before = len(artist_labels(ui_server))
    pg = page.page
    # while this tab's questions fall back (the server says "away"), a click in the page says its person is back
    pg.route("**/treegrpo/artist/pending*", lambda route: route.fulfill(
        status=200, content_type="application/json", body=json.dumps({"questions": [], "waiting_elsewhere": 0,
                                                                      "away": 3})))
    pg.evaluate("() => window.__treegrpoArtist.refresh()")
    with pg.expect_request("**/treegrpo/artist/here", timeout=10_000) as told:
        pg.mouse.click(5, 300)
    assert json.loads(told.value.post_data)["client_id"]
    pg.unroute("**/treegrpo/artist/pending*")
    page.evaluate("() => window.app.queuePrompt(0, 1)")
    dlg = pg.locator('#treegrpo-artist[data-question$=":0"]')
    dlg.wait_for(state="visible", timeout=300_000)
    msg, send, close = dlg.locator(".msg"), dlg.locator('[data-act="send"]'), dlg.locator('[data-act="close"]')
    answers = "**/treegrpo/artist/answer"
    pg.route(answers, lambda route: route.abort())                     # ComfyUI down
    dlg.locator('.leaf[data-leaf="0"]').click()
    pg.keyboard.press("Enter")
    pg.wait_for_function("() => document.querySelector('#treegrpo-artist .msg').textContent.includes('cannot be "
                         "reached')", timeout=10_000)
    assert send.is_visible() and not close.is_visible()                # the answer can be sent again
    pg.unroute(answers)
    pg.route(answers, lambda route: route.fulfill(status=503, body="proxy: ComfyUI restarting"))
    pg.keyboard.press("Enter")
    pg.wait_for_function("() => document.querySelector('#treegrpo-artist .msg').textContent.includes('HTTP 503')",
                         timeout=10_000)
    assert send.is_visible() and not close.is_visible()                # a server error: Send again
    pg.unroute(answers)
    pg.route(answers, lambda route: route.fulfill(status=404, content_type="application/json", body=json.dumps(
        {"ok": False, "message": "no question: it was never asked here or the server restarted", "state": None})))
    pg.keyboard.press("Enter")
    close.wait_for(state="visible", timeout=10_000)
    assert "no longer knows this question" in msg.inner_text() and "Queue the workflow again" in msg.inner_text()
    assert not send.is_visible() and dlg.locator(".countdown").inner_text() == ""
    pg.unroute(answers)
    close.click()
    dlg.wait_for(state="detached", timeout=10_000)
    page.open()                                                        # the question still waits on the server
    dlg.wait_for(state="visible", timeout=60_000)
    pending, state = "**/treegrpo/artist/pending*", "**/treegrpo/artist/state*"
    pg.route(pending, lambda route: route.fulfill(status=200, content_type="application/json",
                                                  body=json.dumps({"questions": [], "waiting_elsewhere": 0})))
    # not listed any more because another tab answered it: the dialog just closes, the run goes on
    pg.route(state, lambda route: route.fulfill(status=200, content_type="application/json",
                                                body=json.dumps({"state": "answered"})))
    pg.evaluate("() => window.__treegrpoArtist.refresh()")
    dlg.wait_for(state="detached", timeout=10_000)
    pg.unroute(state)
    pg.unroute(pending)
    page.open()
    dlg.wait_for(state="visible", timeout=60_000)
    # not listed and not known at all, as after a restart: it did not count, and what to do
    pg.route(pending, lambda route: route.fulfill(status=200, content_type="application/json",
                                                  body=json.dumps({"questions": [], "waiting_elsewhere": 0})))
    pg.route(state, lambda route: route.fulfill(status=200, content_type="application/json",
                                                body=json.dumps({"state": None})))
    pg.evaluate("() => window.__treegrpoArtist.refresh()")
    close.wait_for(state="visible", timeout=10_000)
    assert "no longer knows this question" in msg.inner_text() and "Queue the workflow again" in msg.inner_text()
    pg.unroute(pending)
    pg.unroute(state)
    page.open()
    dlg.wait_for(state="visible", timeout=60_000)
    dlg.locator('[data-act="stop"]').click()
    dlg.wait_for(state="detached", timeout=60_000)                     # the wait ended: the server closed it
    wait_queue_empty(ui_server)
    page.close_dialogs()
    last = next(iter(ch._http(ui_server.port, "/history?max_items=1").values()))
    assert any(m[0] == "execution_interrupted" for m in last["status"]["messages"]), last["status"]
    assert artist_labels(ui_server)[before:] == []                     # no answer counted, none made up
