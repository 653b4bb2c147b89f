"""The real-ComfyUI harness itself: boot in-process with the pack, UI workflow -> API conversion + validation,
execution through PromptExecutor, progress/interrupt/inference-mode behaviour, pack-failure reporting, and a
real main.py server driven over HTTP.  No mocks: everything goes through ComfyUI 0.3.75's own code."""
from __future__ import annotations

import copy
import os
import textwrap
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import comfy_harness as ch  # noqa: E402

pytest_plugins = ["conftest_comfy"]  # no-op when tests/conftest.py already registers it

REPO = ch.REPO_ROOT
PACK_WRITTEN = (REPO / "nodes" / "__init__.py").is_file()


# --------------------------------------------------------------------------------------------------------------
# ComfyUI setup
# --------------------------------------------------------------------------------------------------------------

def test_ensure_comfyui_is_complete_and_idempotent(comfyui_dir):
    version = ch.tree_version(comfyui_dir)
    assert version == (ch.FLOOR_VERSION if ch.lane() == "floor" else
                       ch.newest_tarball().name.removeprefix("ComfyUI-").removesuffix(".tar.gz"))
    assert ch._looks_complete(comfyui_dir, version)
    marker = comfyui_dir / ch.MARKER_NAME
    assert marker.is_file()
    assert not (comfyui_dir / "extra_model_paths.yaml").exists()
    stamp = (marker.stat().st_mtime_ns, (comfyui_dir / "main.py").stat().st_mtime_ns)
    assert ch.ensure_comfyui(comfyui_dir) == comfyui_dir  # second call: marker + metadata check only
    assert (marker.stat().st_mtime_ns, (comfyui_dir / "main.py").stat().st_mtime_ns) == stamp   # nothing re-extracted
    reqs = ch._requirements(comfyui_dir)
    names = {ch._canon(r.split(">")[0].split("=")[0].split("~")[0]) for r in reqs}
    assert not names & {"torch", "torchvision", "torchaudio", "comfyui-frontend-package",
                        "comfyui-workflow-templates", "comfyui-embedded-docs"}
    assert {"aiohttp", "safetensors", "einops"} <= names
    assert ch._missing_requirements(reqs) == []
    assert ch._missing_requirements(["surely-not-installed-pkg-xyz>=1"]) == ["surely-not-installed-pkg-xyz>=1"]


def test_boot_in_process(comfyui):
    import comfy.cli_args
    import folder_paths
    import nodes

    assert comfyui.comfy_dir == Path(nodes.__file__).resolve().parent  # ComfyUI's nodes.py, not the pack's nodes/
    assert comfyui.server.__class__.__name__ == "PromptServer"
    args = comfy.cli_args.args
    assert args.cpu and args.disable_api_nodes
    assert Path(folder_paths.get_output_directory()) == comfyui.base_dir / "output"
    assert str(comfyui.base_dir / "models" / "loras") in folder_paths.get_folder_paths("loras")
    classes = comfyui.node_classes()
    assert classes is nodes.NODE_CLASS_MAPPINGS
    assert {"KSampler", "SaveImage", "LoraLoaderModelOnly", "SaveLoRA", "TrainLoraNode"} <= set(classes)
    assert comfyui is ch.boot_comfy(REPO, require_pack=False)  # singleton
    assert comfyui.boot_seconds > 0   # how long is the machine's business, not a test's


def test_pack_imported(comfyui):
    import nodes

    assert comfyui.pack is not None, "boot_comfy did not try to load the pack"
    if not PACK_WRITTEN:
        pytest.skip("nodes/__init__.py not written yet (pack load result: %s)" % comfyui.pack.log)
    comfyui.pack.raise_if_failed()  # raises with ComfyUI's logged traceback
    assert nodes.LOADED_MODULE_DIRS.get(ch.PACK_NAME) == str(comfyui.base_dir / "custom_nodes" / ch.PACK_NAME)
    for node_id in comfyui.pack.nodes:
        assert nodes.NODE_CLASS_MAPPINGS[node_id].RELATIVE_PYTHON_MODULE == f"custom_nodes.{ch.PACK_NAME}"


def test_broken_pack_is_reported_with_traceback(comfyui, tmp_path):
    pack = tmp_path / "harness_broken_pack"
    pack.mkdir()
    (pack / "__init__.py").write_text(textwrap.dedent("""
        def _helper():
            raise ValueError("boom-entrypoint-123")

        async def comfy_entrypoint():
            _helper()
    """))
    res = comfyui.load_pack(pack, require=False, link=False)
    assert not res.ok and res.nodes == []
    assert "boom-entrypoint-123" in res.error and "_helper" in res.error  # the full traceback, not just str(e)
    with pytest.raises(ch.PackLoadError, match="boom-entrypoint-123"):
        res.raise_if_failed()

    pack2 = tmp_path / "harness_syntax_pack"
    pack2.mkdir()
    (pack2 / "__init__.py").write_text("def broken(:\n")
    with pytest.raises(ch.PackLoadError, match="SyntaxError"):
        comfyui.load_pack(pack2, link=False)


# --------------------------------------------------------------------------------------------------------------
# UI workflow -> API
# --------------------------------------------------------------------------------------------------------------

# The web UI's classic default graph, as its "Save" writes it (workflow format 0.4).
DEFAULT_GRAPH = {
    "last_node_id": 9, "last_link_id": 9,
    "nodes": [
        {"id": 7, "type": "CLIPTextEncode", "pos": [413, 389], "size": [425, 180], "flags": {}, "order": 3, "mode": 0,
         "inputs": [{"name": "clip", "type": "CLIP", "link": 5}],
         "outputs": [{"name": "CONDITIONING", "type": "CONDITIONING", "links": [6], "slot_index": 0}],
         "properties": {"Node name for S&R": "CLIPTextEncode"}, "widgets_values": ["text, watermark"]},
        {"id": 6, "type": "CLIPTextEncode", "pos": [415, 186], "size": [422, 164], "flags": {}, "order": 2, "mode": 0,
         "inputs": [{"name": "clip", "type": "CLIP", "link": 3}],
         "outputs": [{"name": "CONDITIONING", "type": "CONDITIONING", "links": [4], "slot_index": 0}],
         "properties": {"Node name for S&R": "CLIPTextEncode"},
         "widgets_values": ["beautiful scenery nature glass bottle landscape, , purple galaxy bottle,"]},
        {"id": 5, "type": "EmptyLatentImage", "pos": [473, 609], "size": [315, 106], "flags": {}, "order": 0,
         "mode": 0, "outputs": [{"name": "LATENT", "type": "LATENT", "links": [2], "slot_index": 0}],
         "properties": {"Node name for S&R": "EmptyLatentImage"}, "widgets_values": [512, 512, 1]},
        {"id": 3, "type": "KSampler", "pos": [863, 186], "size": [315, 262], "flags": {}, "order": 4, "mode": 0,
         "inputs": [{"name": "model", "type": "MODEL", "link": 1},
                    {"name": "positive", "type": "CONDITIONING", "link": 4},
                    {"name": "negative", "type": "CONDITIONING", "link": 6},
                    {"name": "latent_image", "type": "LATENT", "link": 2}],
         "outputs": [{"name": "LATENT", "type": "LATENT", "links": [7], "slot_index": 0}],
         "properties": {"Node name for S&R": "KSampler"},
         "widgets_values": [156680208700286, "randomize", 20, 8, "euler", "normal", 1]},
        {"id": 8, "type": "VAEDecode", "pos": [1209, 188], "size": [210, 46], "flags": {}, "order": 5, "mode": 0,
         "inputs": [{"name": "samples", "type": "LATENT", "link": 7}, {"name": "vae", "type": "VAE", "link": 8}],
         "outputs": [{"name": "IMAGE", "type": "IMAGE", "links": [9], "slot_index": 0}],
         "properties": {"Node name for S&R": "VAEDecode"}},
        {"id": 9, "type": "SaveImage", "pos": [1451, 189], "size": [210, 58], "flags": {}, "order": 6, "mode": 0,
         "inputs": [{"name": "images", "type": "IMAGE", "link": 9}], "properties": {}, "widgets_values": ["ComfyUI"]},
        {"id": 4, "type": "CheckpointLoaderSimple", "pos": [26, 474], "size": [315, 98], "flags": {}, "order": 1,
         "mode": 0,
         "outputs": [{"name": "MODEL", "type": "MODEL", "links": [1], "slot_index": 0},
                     {"name": "CLIP", "type": "CLIP", "links": [3, 5], "slot_index": 1},
                     {"name": "VAE", "type": "VAE", "links": [8], "slot_index": 2}],
         "properties": {"Node name for S&R": "CheckpointLoaderSimple"},
         "widgets_values": ["v1-5-pruned-emaonly.safetensors"]},
    ],
    "links": [[1, 4, 0, 3, 0, "MODEL"], [2, 5, 0, 3, 3, "LATENT"], [3, 4, 1, 6, 0, "CLIP"],
              [4, 6, 0, 3, 1, "CONDITIONING"], [5, 4, 1, 7, 0, "CLIP"], [6, 7, 0, 3, 2, "CONDITIONING"],
              [7, 3, 0, 8, 0, "LATENT"], [8, 4, 2, 8, 1, "VAE"], [9, 8, 0, 9, 0, "IMAGE"]],
    "groups": [], "config": {}, "extra": {}, "version": 0.4,
}


def test_default_graph_converts_and_validates(comfyui):
    api = ch.workflow_to_api(DEFAULT_GRAPH, comfyui.node_classes())
    assert set(api) == {"3", "4", "5", "6", "7", "8", "9"}
    assert api["3"] == {"class_type": "KSampler", "_meta": {"title": "KSampler"}, "inputs": {
        "seed": 156680208700286, "steps": 20, "cfg": 8, "sampler_name": "euler", "scheduler": "normal",
        "denoise": 1, "model": ["4", 0], "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["5", 0]}}
    assert api["4"]["inputs"] == {"ckpt_name": "v1-5-pruned-emaonly.safetensors"}
    assert api["8"]["inputs"] == {"samples": ["3", 0], "vae": ["4", 2]}
    assert api["7"]["inputs"] == {"text": "text, watermark", "clip": ["4", 1]}
    assert api["5"]["inputs"] == {"width": 512, "height": 512, "batch_size": 1}

    # validation checks the checkpoint combo against models/checkpoints: without the file it must fail there
    ok, error, node_errors = comfyui.validate(api)
    assert not ok and error["type"] == "prompt_outputs_failed_validation"
    assert node_errors["4"]["errors"][0]["type"] == "value_not_in_list"
    ckpt = comfyui.base_dir / "models" / "checkpoints" / "v1-5-pruned-emaonly.safetensors"
    ckpt.write_bytes(b"")  # validation only lists files; nothing loads it
    try:
        v = comfyui.validate(api)
        assert v.ok, v
        assert v.outputs == ["9"] and v.node_errors == {}
    finally:
        ckpt.unlink()


def _n(id, type, order, inputs=(), outputs=(), widgets=None, mode=0, **kw):
    d = {"id": id, "type": type, "pos": [0, 0], "size": [200, 100], "flags": {}, "order": order, "mode": mode,
         "inputs": list(inputs), "outputs": list(outputs), "properties": {"Node name for S&R": type}}
    if widgets is not None:
        d["widgets_values"] = widgets
    d.update(kw)
    return d


# Built-in, model-free nodes exercising every conversion rule (new-frontend style: widget sockets are listed in
# `inputs` with a `widget` field).  1 EmptyImage(width <- PrimitiveNode 10) -> 2 ImageAddNoise(seed+control)
# -> 3 ImageInvert [bypassed] -> 4 Reroute -> 5 ImageScale -> 6 SaveImage;  9 EmptyLatentImage -> 12 LatentUpscale
# -> 13 SaveLatent;  1 -> 14 ImageInvert [muted] -> 15 SaveImage [muted];  7 Note, 8 MarkdownNote, a group.
UI_WORKFLOW = {
    "id": "0d9c3c1e-0000-4000-8000-000000000001", "revision": 0, "last_node_id": 15, "last_link_id": 14,
    "nodes": [
        _n(10, "PrimitiveNode", 0, outputs=[{"name": "INT", "type": "INT", "links": [11],
                                             "widget": {"name": "width"}}],
           widgets=[24, "fixed"], properties={"Run widget replace on values": False}),
        _n(1, "EmptyImage", 1,
           inputs=[{"name": "width", "type": "INT", "widget": {"name": "width"}, "link": 11},
                   {"name": "height", "type": "INT", "widget": {"name": "height"}, "link": None},
                   {"name": "batch_size", "type": "INT", "widget": {"name": "batch_size"}, "link": None},
                   {"name": "color", "type": "INT", "widget": {"name": "color"}, "link": None}],
           outputs=[{"name": "IMAGE", "type": "IMAGE", "links": [1, 12]}], widgets=[16, 16, 1, 0]),
        _n(2, "ImageAddNoise", 2,
           inputs=[{"name": "image", "type": "IMAGE", "link": 1},
                   {"name": "seed", "type": "INT", "widget": {"name": "seed"}, "link": None}],
           outputs=[{"name": "IMAGE", "type": "IMAGE", "links": [2]}], widgets=[42, "randomize", 0.25]),
        _n(3, "ImageInvert", 3, mode=4, inputs=[{"name": "image", "type": "IMAGE", "link": 2}],
           outputs=[{"name": "IMAGE", "type": "IMAGE", "links": [3]}]),
        _n(4, "Reroute", 4, inputs=[{"name": "", "type": "*", "link": 3}],
           outputs=[{"name": "", "type": "IMAGE", "links": [4]}], properties={"showOutputText": False}),
        _n(5, "ImageScale", 5,
           inputs=[{"name": "image", "type": "IMAGE", "link": 4}],
           outputs=[{"name": "IMAGE", "type": "IMAGE", "links": [5]}],
           widgets=["nearest-exact", 32, 20, "disabled"], title="Scale it"),
        _n(6, "SaveImage", 6, inputs=[{"name": "images", "type": "IMAGE", "link": 5}], widgets=["harness/ui"]),
        _n(7, "Note", 7, widgets=["a note"]),
        _n(8, "MarkdownNote", 8, widgets=["# markdown"]),
        _n(9, "EmptyLatentImage", 9, outputs=[{"name": "LATENT", "type": "LATENT", "links": [6]}], widgets=[16, 16, 1]),
        _n(12, "LatentUpscale", 10, inputs=[{"name": "samples", "type": "LATENT", "link": 6}],
           outputs=[{"name": "LATENT", "type": "LATENT", "links": [7]}], widgets=["bilinear", 32, 48, "center"]),
        _n(13, "SaveLatent", 11, inputs=[{"name": "samples", "type": "LATENT", "link": 7}],
           widgets=["harness/latent"]),
        _n(14, "ImageInvert", 12, mode=2, inputs=[{"name": "image", "type": "IMAGE", "link": 12}],
           outputs=[{"name": "IMAGE", "type": "IMAGE", "links": [13]}]),
        _n(15, "SaveImage", 13, mode=2, inputs=[{"name": "images", "type": "IMAGE", "link": 13}], widgets=["muted"]),
    ],
    "links": [[1, 1, 0, 2, 0, "IMAGE"], [2, 2, 0, 3, 0, "IMAGE"], [3, 3, 0, 4, 0, "*"], [4, 4, 0, 5, 0, "IMAGE"],
              [5, 5, 0, 6, 0, "IMAGE"], [6, 9, 0, 12, 0, "LATENT"], [7, 12, 0, 13, 0, "LATENT"],
              [11, 10, 0, 1, 0, "INT"], [12, 1, 0, 14, 0, "IMAGE"], [13, 14, 0, 15, 0, "IMAGE"]],
    "groups": [{"id": 1, "title": "latents", "bounding": [0, 0, 400, 300], "color": "#3f789e", "flags": {}}],
    "config": {}, "extra": {"ds": {"scale": 1, "offset": [0, 0]}}, "version": 0.4,
}


def test_ui_workflow_converts_validates_and_runs(comfyui):
    api = ch.workflow_to_api(UI_WORKFLOW, comfyui.node_classes())
    assert set(api) == {"1", "2", "5", "6", "9", "12", "13"}  # notes, reroute, primitive, muted, bypassed gone
    assert api["1"]["inputs"] == {"width": 24, "height": 16, "batch_size": 1, "color": 0}  # primitive inlined
    assert api["2"]["inputs"] == {"image": ["1", 0], "seed": 42, "strength": 0.25}  # "randomize" skipped
    assert api["5"]["inputs"] == {"upscale_method": "nearest-exact", "width": 32, "height": 20, "crop": "disabled",
                                  "image": ["2", 0]}  # through the reroute and the bypassed ImageInvert
    assert api["5"]["_meta"] == {"title": "Scale it"}
    assert api["12"]["inputs"] == {"upscale_method": "bilinear", "width": 32, "height": 48, "crop": "center",
                                   "samples": ["9", 0]}
    v = comfyui.validate(api)
    assert v.ok, v
    assert sorted(v.outputs) == ["13", "6"]

    # same graph in the workflow-1.0 link format (links as objects) converts identically
    wf = copy.deepcopy(UI_WORKFLOW)
    wf["links"] = [dict(zip(["id", "origin_id", "origin_slot", "target_id", "target_slot", "type"], ln))
                   for ln in wf["links"]]
    assert ch.workflow_to_api(wf, comfyui.node_classes()) == api

    res = comfyui.execute(api)
    assert res.success and not res.interrupted
    img = res.outputs["6"]["images"][0]
    png = comfyui.base_dir / "output" / img["subfolder"] / img["filename"]
    assert png.is_file() and png.suffix == ".png"
    from PIL import Image

    assert Image.open(png).size == (32, 20)
    lat = res.outputs["13"]["latents"][0]
    assert (comfyui.base_dir / "output" / lat["subfolder"] / lat["filename"]).is_file()


def test_workflow_to_api_rejects_unknown_nodes(comfyui):
    wf = copy.deepcopy(UI_WORKFLOW)
    wf["nodes"].append(_n(99, "NoSuchNodeXYZ", 20))
    with pytest.raises(KeyError, match="NoSuchNodeXYZ"):
        ch.workflow_to_api(wf, comfyui.node_classes())


# --------------------------------------------------------------------------------------------------------------
# execution
# --------------------------------------------------------------------------------------------------------------

TINY = {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 6, "batch_size": 2, "color": 0xFF0000}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "harness_tiny"}}}


def test_tiny_graph_executes(comfyui):
    res = comfyui.execute(TINY)
    assert res.success
    imgs = res.outputs["2"]["images"]
    assert len(imgs) == 2 and all(i["type"] == "output" for i in imgs)
    for i in imgs:
        assert (comfyui.base_dir / "output" / i["subfolder"] / i["filename"]).is_file()
    events = [m[0] for m in res.messages]
    assert events[0] == "execution_start" and events[-1] == "execution_success"
    assert res.history["status"]["status_str"] == "success"

    # classic cache (the server default): an identical prompt re-runs nothing, its outputs come from the cache
    again = comfyui.execute(TINY)
    assert again.outputs == res.outputs
    cached = next(d for e, d in again.messages if e == "execution_cached")
    assert sorted(cached["nodes"]) == ["1", "2"]
    # ComfyUI 0.3.75 copies cached outputs into the history only for prompts with a client_id (the web UI sends
    # one); later versions copy them for every prompt
    expect = {} if ch.comfyui_version() == ch.FLOOR_VERSION else res.outputs
    assert comfyui.execute(TINY, client_id=None).outputs == expect


def test_invalid_prompt_and_node_error(comfyui):
    bad = copy.deepcopy(TINY)
    bad["1"]["inputs"]["width"] = 0
    ok, error, node_errors = comfyui.validate(bad)
    assert not ok and node_errors["1"]["errors"][0]["type"] == "value_smaller_than_min"
    with pytest.raises(ch.ComfyValidationError) as ei:
        comfyui.execute(bad)
    assert "1" in ei.value.node_errors

    mismatch = {"1": {"class_type": "EmptyLatentImage", "inputs": {"width": 8, "height": 8, "batch_size": 1}},
                "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "x"}}}
    ok, error, node_errors = comfyui.validate(mismatch)  # LATENT into an IMAGE input
    assert not ok and node_errors["2"]["errors"][0]["type"] == "return_type_mismatch"

    # ComfyUI accepts a prompt if one output validates (it drops the rest); the harness is strict by default
    mixed = {**copy.deepcopy(TINY), **{"3": mismatch["1"], "4": {**mismatch["2"], "inputs": {"images": ["3", 0],
                                                                                            "filename_prefix": "x"}}}}
    v = comfyui.validate(mixed)
    assert v.ok and v.outputs == ["2"] and "4" in v.node_errors
    with pytest.raises(ch.ComfyValidationError):
        comfyui.execute(mixed)
    assert comfyui.execute(mixed, strict=False).outputs.keys() == {"2"}


@pytest.fixture(scope="module")
def probe_pack(comfyui, tmp_path_factory):
    """A throwaway V3 pack with a node that loops over a ProgressBar (for progress / interrupt / inference-mode)."""
    pack = tmp_path_factory.mktemp("packs") / "harness_probe_pack"
    pack.mkdir()
    (pack / "__init__.py").write_text(textwrap.dedent('''
        import time
        import torch
        import comfy.utils
        import comfy.model_management
        from comfy_api.latest import ComfyExtension, io

        class HarnessProbeLoop(io.ComfyNode):
            @classmethod
            def define_schema(cls):
                return io.Schema(node_id="HarnessProbeLoop", category="testing", is_output_node=True,
                                 inputs=[io.Int.Input("steps", default=3, min=1, max=100000),
                                         io.Float.Input("sleep", default=0.0, min=0.0, max=1.0),
                                         io.Int.Input("seed", default=0, min=0, max=2**31),
                                         io.Boolean.Input("fail", default=False, optional=True)],
                                 outputs=[io.Int.Output()])

            @classmethod
            def execute(cls, steps, sleep, seed, fail=False):
                if fail:
                    raise RuntimeError("probe-failure-456")
                pbar = comfy.utils.ProgressBar(steps)
                for _ in range(steps):
                    if sleep:
                        time.sleep(sleep)
                    pbar.update(1)
                t = torch.ones(1)
                with torch.inference_mode(False):
                    t2 = torch.ones(1, requires_grad=True)
                info = {"inference_mode": torch.is_inference_mode_enabled(), "is_inference": t.is_inference(),
                        "grad_enabled": torch.is_grad_enabled(), "escaped_is_inference": t2.is_inference()}
                return io.NodeOutput(steps, ui={"probe": [info]})

        class _Ext(ComfyExtension):
            async def get_node_list(self):
                return [HarnessProbeLoop]

        async def comfy_entrypoint():
            return _Ext()
    '''))
    res = comfyui.load_pack(pack, link=False)
    assert res.nodes == ["HarnessProbeLoop"]
    return res


def test_progress_and_inference_mode(comfyui, probe_pack):
    n0 = len(comfyui.progress)
    res = comfyui.execute({"1": {"class_type": "HarnessProbeLoop", "inputs": {"steps": 4, "sleep": 0.0, "seed": 1}}})
    info = res.outputs["1"]["probe"][0]
    # PromptExecutor runs every node under torch.inference_mode(); inference_mode(False) gives normal tensors
    assert info == {"inference_mode": True, "is_inference": True, "grad_enabled": False,
                    "escaped_is_inference": False}
    prog = comfyui.progress[n0:]
    # ComfyUI 0.3.75 calls the hook at every update; 0.33+ throttles it (first and last always, others >= 0.1 s apart)
    values = [p["value"] for p in prog]
    assert values[0] == 1 and values[-1] == 4 and values == sorted(set(values)) and all(p["max"] == 4 for p in prog)
    assert values == [1, 2, 3, 4] or ch.comfyui_version() != ch.FLOOR_VERSION
    assert all(p["node"] == "1" and p["prompt_id"] == res.prompt_id for p in prog)
    assert any(e[0] == "progress" for e in comfyui.events)


def test_node_exception_is_raised_with_details(comfyui, probe_pack):
    with pytest.raises(ch.ComfyExecutionError) as ei:
        comfyui.execute({"1": {"class_type": "HarnessProbeLoop", "inputs": {"steps": 1, "sleep": 0.0, "seed": 4,
                                                                        "fail": True}}})
    msg = str(ei.value)
    assert "probe-failure-456" in msg and "RuntimeError" in msg and "HarnessProbeLoop" in msg
    assert "def execute" in msg or "execute" in msg  # ComfyUI's traceback of the node is included
    res = ei.value.result
    assert not res.success and not res.interrupted and res.error["node_id"] == "1"


def test_interrupt(comfyui, probe_pack):
    n0 = len(comfyui.progress)
    fut = comfyui.submit({"1": {"class_type": "HarnessProbeLoop", "inputs": {"steps": 100000, "sleep": 0.001,
                                                                         "seed": 2}}})
    deadline = time.monotonic() + 20
    while len(comfyui.progress) < n0 + 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    comfyui.interrupt()
    with pytest.raises(ch.ComfyInterrupted) as ei:
        fut.result(timeout=20)
    res = ei.value.result
    assert res.interrupted and not res.success and res.error["node_id"] == "1"
    assert len(comfyui.progress) - n0 < 100000
    # the flag was consumed: the next prompt runs normally
    assert comfyui.execute({"1": {"class_type": "HarnessProbeLoop", "inputs": {"steps": 2, "sleep": 0.0,
                                                                            "seed": 3}}}).success
    comfyui.drain_events()


# --------------------------------------------------------------------------------------------------------------
# real server
# --------------------------------------------------------------------------------------------------------------

def test_real_server_runs_prompt(comfyui_server):
    port = comfyui_server.port
    stats = ch._http(port, "/system_stats")
    assert stats["system"]["comfyui_version"] == ch.comfyui_version()
    assert stats["devices"][0]["type"] == "cpu"
    prompt = copy.deepcopy(TINY)
    prompt["2"]["inputs"]["filename_prefix"] = "harness_server"
    pid = ch.post_prompt(port, prompt)
    entry = ch.wait_history(port, pid, timeout=60, check=True)
    assert entry["status"]["completed"] is True
    imgs = entry["outputs"]["2"]["images"]
    assert len(imgs) == 2
    for i in imgs:
        assert (comfyui_server.base_dir / "output" / i["subfolder"] / i["filename"]).is_file()

    bad = copy.deepcopy(TINY)
    bad["1"]["inputs"]["height"] = -1
    with pytest.raises(ch.ComfyValidationError) as ei:
        ch.post_prompt(port, bad)
    assert "1" in ei.value.node_errors

    assert (comfyui_server.base_dir / "custom_nodes" / ch.PACK_NAME).resolve() == REPO
    if PACK_WRITTEN:
        assert not comfyui_server.pack_import_failed(), comfyui_server.log_text()[-6000:]
        info = ch.object_info(port)
        pack_nodes = [k for k, v in info.items() if v.get("python_module") == f"custom_nodes.{ch.PACK_NAME}"]
        assert pack_nodes, "the pack registered no nodes in the real server"
