"""``POST /interrupt`` through a real ComfyUI server (main.py, the pack in custom_nodes), as a user's Cancel button
does, on whichever ComfyUI this process's lane tests (0.3.75, and the newest tree in the second lane): while the Train
node trains, the interrupt writes a checkpoint and the next queued run resumes from it; while a step node runs, the
iteration in flight is dropped and the next queue continues the run from its last finished step. ComfyUI 0.33 made
``InterruptProcessingException`` a ``BaseException`` and throttles the progress hook; both paths are exercised here."""
import json
from pathlib import Path

import comfy_harness as ch
from test_comfy_nodes import demo_step_graph, train_graph


def _status(entry):
    return entry["status"]["status_str"], [m[0] for m in entry["status"].get("messages", [])]


def test_interrupting_the_train_node_checkpoints_and_the_next_queue_resumes(comfyui_server):
    srv, run = comfyui_server, "server_interrupted"
    folder = Path(srv.base_dir) / "output" / "treegrpo" / run
    with ch.EventClient(srv.port) as ws:
        pid = ch.post_prompt(srv.port, train_graph(run, 200), client_id=ws.client_id)
        # the Train node's ProgressBar counts iterations (max = iterations): wait for two finished ones
        ws.wait_for(lambda e: e["type"] == "progress" and e["data"].get("prompt_id") == pid
                    and e["data"].get("max") == 200 and e["data"].get("value", 0) >= 2, timeout=600,
                    what="progress past iteration 2")
        ch.server_interrupt(srv.port)
        entry = ch.wait_history(srv.port, pid, timeout=600)
    status, messages = _status(entry)
    assert status == "error" and "execution_interrupted" in messages, (status, messages)
    ckpts = sorted((folder / "checkpoints").glob(f"{run}-*.pt"))
    assert ckpts, "no checkpoint written on interrupt"
    done = int(ckpts[-1].stem.rsplit("-", 1)[1])
    assert 2 <= done < 200
    pid = ch.post_prompt(srv.port, train_graph(run, done + 1))
    entry = ch.wait_history(srv.port, pid, timeout=600, check=True)
    log = json.loads((folder / "log.json").read_text())
    assert [h["iteration"] for h in log["train"]] == list(range(done + 1))   # resumed: one more iteration ran
    assert entry["outputs"]["save"]["text"][0].startswith("saved ")
    console = srv.log_text()                 # the console says where the run stopped and where it went on from
    assert f"TreeGRPO {run}: stopped after iteration {done}, saved in " in console, console[-3000:]
    assert f"TreeGRPO {run}: resumed from " in console and f"after iteration {done}" in console
    # the before/after picture's left grid is the base model's evaluation (iteration 0, before the interrupt), not
    # the resumed session's first one: found whole, unchanged, in its left half (under the titles, right of the labels)
    import numpy as np
    before = _pixels(folder / "evals" / "eval_000000.png")
    both = _pixels(folder / "samples_before_after.png")
    h, w = before.shape[:2]
    at = [(y, x) for y in range(both.shape[0] - h + 1) for x in range(both.shape[1] // 2 - w // 2)
          if np.array_equal(both[y:y + h, x:x + w], before)]
    assert at, "the base model's evaluation grid is not the left one"      # (no list diff: pytest would take ages)


def _pixels(path):
    import numpy as np
    from PIL import Image
    return np.asarray(Image.open(path).convert("RGB"))


def test_interrupting_a_step_node_drops_that_iteration_and_the_run_continues(comfyui_server):
    from treegrpo.lora import read_lora_file

    srv, run = comfyui_server, "server_step_interrupted"
    lora = Path(srv.base_dir) / "output" / "treegrpo" / run / f"{run}.safetensors"
    for seed in (0, 1):
        ch.wait_history(srv.port, ch.post_prompt(srv.port, demo_step_graph(run, seed)), timeout=600, check=True)
    assert read_lora_file(str(lora))[1]["treegrpo.step"] == "2"
    with ch.EventClient(srv.port) as ws:
        pid = ch.post_prompt(srv.port, demo_step_graph(run, 2), client_id=ws.client_id)
        ws.wait_for(lambda e: e["type"] == "executing" and (e.get("data") or {}).get("prompt_id") == pid
                    and (e.get("data") or {}).get("node") in ("tree", "step"), timeout=600,
                    what="a step node executing")
        ch.server_interrupt(srv.port)
        entry = ch.wait_history(srv.port, pid, timeout=600)
    status, messages = _status(entry)
    print("step graph after the interrupt:", status)
    if status == "success":   # the whole graph finished before the interrupt arrived: nothing to test this time
        assert read_lora_file(str(lora))[1]["treegrpo.step"] == "3"
        return
    assert "execution_interrupted" in messages, (status, messages)
    assert read_lora_file(str(lora))[1]["treegrpo.step"] == "2"        # the interrupted iteration left no trace
    ch.wait_history(srv.port, ch.post_prompt(srv.port, demo_step_graph(run, 2)), timeout=600, check=True)
    assert read_lora_file(str(lora))[1]["treegrpo.step"] == "3"        # and the run continues from step 2
