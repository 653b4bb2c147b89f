"""Thumbnails of the shipped workflows for ComfyUI's template browser, rendered by the real web UI.

    python workflows/make_thumbnails.py          # writes workflows/<name>.jpg next to every <name>.json

The template browser shows, for a custom node pack's template ``<name>``, the image
``/api/workflow_templates/<pack>/<name>.jpg`` -- ComfyUI serves the pack's ``workflows/`` folder there -- so
the thumbnail is ``workflows/<name>.jpg``.  Each one is a screenshot of the workflow as the frontend draws it:
ComfyUI's server with the pinned frontend package, this pack, headless system Chromium (tests/browser_harness.py;
needs `chromium`), the file dropped on the canvas, focus mode (no menus), zoom to fit, cropped to the nodes and padded square;
then scaled to ``SIZE``x``SIZE`` JPEG (well under 100 KB).  Run it again after ``workflows/generate.py`` changes a layout.
"""
from __future__ import annotations

import io
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import browser_harness as bh  # noqa: E402
import comfy_harness as ch  # noqa: E402

SIZE = 480
VIEW = {"width": 1600, "height": 1000}   # the graph is fitted into this, cropped to its nodes, padded square
MARGIN = 16
QUALITY = 85
# no minimap, no canvas info text, no zoom controls over the graph; text drawn at any zoom
SETTINGS = {"Comfy.Minimap.Visible": False, "LiteGraph.Canvas.MinFontSizeForLOD": 0, "Comfy.Graph.CanvasInfo": False,
            "Comfy.Graph.CanvasMenu": False, "Comfy.TutorialCompleted": True}
# the nodes' bounding box in page pixels (title bars included)
JS_BOUNDS = """() => {
  const c = window.app.canvas, r = c.canvas.getBoundingClientRect(), T = window.LiteGraph.NODE_TITLE_HEIGHT;
  const xs = [], ys = [];
  for (const n of window.app.graph.nodes) {
    const a = c.ds.convertOffsetToCanvas([n.pos[0], n.pos[1] - T]);
    const b = c.ds.convertOffsetToCanvas([n.pos[0] + n.size[0], n.pos[1] + n.size[1]]);
    xs.push(a[0], b[0]); ys.push(a[1], b[1]);
  }
  return [r.left + Math.min(...xs), r.top + Math.min(...ys), r.left + Math.max(...xs), r.top + Math.max(...ys)];
}"""


def render(paths: list[Path], out_dir: Path = HERE) -> list[Path]:
    from PIL import Image
    from playwright.sync_api import sync_playwright

    exe = bh.find_chromium()
    if exe is None:
        raise SystemExit(f"no Chromium: {bh.INSTALL_HINT}")
    comfy = ch.ensure_comfyui()
    bh.ensure_frontend(comfy)
    srv = bh.start_ui_server(Path(tempfile.mkdtemp(prefix="treegrpo_thumbs_")), comfy)
    written = []
    try:
        ch._http(srv.port, "/settings", SETTINGS)
        with sync_playwright() as p:
            browser = bh.launch_chromium(p, exe)
            ctx = browser.new_context(viewport=VIEW, device_scale_factor=1)
            ctx.route("**/*", lambda r: r.continue_() if r.request.url.startswith(srv.url) else r.abort())
            ctx.add_init_script("localStorage.setItem('vueNodesBannerDismissed', 'true')")
            cp = bh.ComfyPage(ctx.new_page(), srv.url)
            cp.open()
            cp.page.wait_for_timeout(1000)
            cp.close_dialogs()
            cp.evaluate("() => window.app.extensionManager.command.execute('Workspace.ToggleFocusMode')")
            for path in paths:
                cp.drop_workflow(path)
                cp.evaluate("() => window.app.canvas.deselectAll && window.app.canvas.deselectAll()")
                cp.fit_view()
                png = cp.page.screenshot()
                img = Image.open(io.BytesIO(png)).convert("RGB")
                x0, y0, x1, y1 = cp.evaluate(JS_BOUNDS)
                box = (max(0, int(x0) - MARGIN), max(0, int(y0) - MARGIN),
                       min(img.width, int(x1) + MARGIN), min(img.height, int(y1) + MARGIN))
                bg = img.getpixel((box[0], box[1]))
                img = img.crop(box)
                side = max(img.size)
                square = Image.new("RGB", (side, side), bg)
                square.paste(img, ((side - img.width) // 2, (side - img.height) // 2))
                img = square.resize((SIZE, SIZE), Image.LANCZOS)
                out = out_dir / f"{path.stem}.jpg"
                tmp = out.with_suffix(".jpg.tmp")
                img.save(tmp, "JPEG", quality=QUALITY, optimize=True, progressive=True)
                os.replace(tmp, out)
                written.append(out)
                print(f"wrote {out.name} ({out.stat().st_size // 1024} KB)")
            browser.close()
    finally:
        srv.stop()
    return written


def main() -> None:
    names = set(sys.argv[1:])
    paths = [p for p in sorted(HERE.glob("*.json")) if not names or p.stem in names]
    render(paths)


if __name__ == "__main__":
    main()
