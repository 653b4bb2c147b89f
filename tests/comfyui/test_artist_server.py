"""The Artist Picks node through a real ComfyUI server, with a websocket client playing the artist (as the web
dialog does): the question reaches only the tab that queued the prompt, answers are posted to the pack's route,
stale or duplicate answers are refused, a reload gets the question again, Cancel stops the wait, an unanswered tree
falls back after its timeout, and every answer is in the run's artist_labels.jsonl."""
import contextlib
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import comfy_harness as ch
from test_comfy_nodes import demo_step_graph

pytestmark = pytest.mark.slow   # a ComfyUI server and waits for a person: seconds a test


def artist_graph(run, seed, timeout_s=120, on_timeout="skip the tree"):
    g = demo_step_graph(run, seed)
    g["score"] = {"class_type": "TreeGRPOArtistPicks", "inputs": {
        "images": ["img", 0], "tree": ["tree", 0], "mode": "favourites", "timeout_s": timeout_s,
        "on_timeout": on_timeout}}
    return g


def post_answer(port, qid, nonce, answer):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/treegrpo/artist/answer",
                                 data=json.dumps({"id": qid, "nonce": nonce, "answer": answer}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def questions(ws, pid):
    return [e["data"] for e in ws.events if e["type"] == "treegrpo.artist.question" and e["data"]["prompt_id"] == pid]


def labels(srv, run):
    path = Path(srv.base_dir) / "output" / "treegrpo" / run / "artist_labels.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def test_the_artist_answers_each_tree_and_the_picks_train(comfyui_server):
    srv, run = comfyui_server, "artist_server"
    with ch.EventClient(srv.port) as ws, ch.EventClient(srv.port) as other:
        pid = ch.post_prompt(srv.port, artist_graph(run, 0), client_id=ws.client_id)
        for tree in (0, 1):
            ws.wait_for(lambda e: e["type"] == "treegrpo.artist.question" and e["data"]["prompt_id"] == pid
                        and e["data"]["tree"] == tree, timeout=600, what=f"the question about tree {tree}")
            q = questions(ws, pid)[-1]
            assert len(q["images"]) == 4 and sorted(i for g in q["groups"] for i in g) == [0, 1, 2, 3]
            assert all(len(g) == 2 for g in q["groups"])                      # siblings side by side
            # a page reload: the open question is served again to this tab, only a count to the other
            mine = ch._http(srv.port, f"/treegrpo/artist/pending?client_id={ws.client_id}")
            theirs = ch._http(srv.port, f"/treegrpo/artist/pending?client_id={other.client_id}")
            assert [x["nonce"] for x in mine["questions"]] == [q["nonce"]]
            assert theirs == {"questions": [], "waiting_elsewhere": 1, "away": 0}
            assert post_answer(srv.port, q["id"], "0" * 32, {"mode": "favourites", "good": [0]})[0] == 409
            assert post_answer(srv.port, q["id"], q["nonce"], {"mode": "favourites", "good": [7]})[0] == 400
            assert post_answer(srv.port, q["id"], q["nonce"], {"mode": "favourites", "good": [tree],
                                                               "seconds": 1.5})[0] == 200
            assert post_answer(srv.port, q["id"], q["nonce"], {"mode": "favourites", "good": [0]})[0] == 409
        entry = ch.wait_history(srv.port, pid, timeout=600, check=True)
    assert post_answer(srv.port, "nope:0", "x", {"mode": "none"})[0] == 404
    assert not [e for e in other.events if e["type"] == "treegrpo.artist.question"]   # the other tab saw none
    stats = json.loads(entry["outputs"]["step"]["text"][0])
    assert stats["edges"] > 0
    rec = labels(srv, run)
    assert [(r["tree"], r["outcome"], r["answer"]["good"]) for r in rec] == [(0, "answered", [0]), (1, "answered", [1])]
    assert rec[0]["rewards"] == [1.0, 0.0, 0.0, 0.0] and rec[0]["seconds"] == 1.5
    folder = Path(srv.base_dir) / "output" / "treegrpo" / run
    assert all((folder / leaf).is_file() for r in rec for leaf in r["leaves"])


def test_cancel_stops_the_wait_and_an_unanswered_tree_times_out(comfyui_server):
    srv, run = comfyui_server, "artist_cancel"
    with ch.EventClient(srv.port) as ws:
        pid = ch.post_prompt(srv.port, artist_graph(run, 0), client_id=ws.client_id)
        ws.wait_for(lambda e: e["type"] == "treegrpo.artist.question" and e["data"]["prompt_id"] == pid,
                    timeout=600, what="a question")
        q = questions(ws, pid)[0]
        ch.server_interrupt(srv.port)
        entry = ch.wait_history(srv.port, pid, timeout=120)
        assert "execution_interrupted" in [m[0] for m in entry["status"]["messages"]]
        assert post_answer(srv.port, q["id"], q["nonce"], {"mode": "none"})[0] == 409     # too late
        ws.wait_for(lambda e: e["type"] == "treegrpo.artist.closed" and e["data"]["id"] == q["id"], timeout=60,
                    what="the dialog told to close")
        # nobody answers: after timeout_s each tree is skipped (not trained on) and the run goes on; after the first
        # went unanswered the next waits only away_s
        g = artist_graph(run, 1, timeout_s=5)
        g["score"]["inputs"]["away_s"] = 2
        pid = ch.post_prompt(srv.port, g, client_id=ws.client_id)
        entry = ch.wait_history(srv.port, pid, timeout=600, check=True)
        stats = json.loads(entry["outputs"]["step"]["text"][0])
        assert stats["edges"] == 0 and stats["scored_trees"] == 0
        # queued again (Auto Queue does so with nobody there): still away, short waits
        g = artist_graph(run, 2, timeout_s=6)
        g["score"]["inputs"]["away_s"] = 2
        ch.wait_history(srv.port, ch.post_prompt(srv.port, g, client_id=ws.client_id), timeout=600, check=True)
        # the page saw its person (a click: the dialog's script posts /here): full waits again
        assert ch._http(srv.port, f"/treegrpo/artist/pending?client_id={ws.client_id}")["away"] == 4
        req = urllib.request.Request(f"http://127.0.0.1:{srv.port}/treegrpo/artist/here", method="POST",
                                     data=json.dumps({"client_id": ws.client_id}).encode(),
                                     headers={"Content-Type": "application/json"})
        assert urllib.request.urlopen(req, timeout=30).status == 200
        g["tree"]["inputs"]["seed"] = 3
        ch.wait_history(srv.port, ch.post_prompt(srv.port, g, client_id=ws.client_id), timeout=600, check=True)
    assert [(r["outcome"], r["waited_s"]) for r in labels(srv, run)][-6:] == [
        ("timeout", 5.0), ("timeout", 2.0), ("timeout", 2.0), ("timeout", 2.0), ("timeout", 6.0), ("timeout", 2.0)]


@contextlib.contextmanager
def scripted_artist(ws, answer):
    """While inside: a thread that calls ``answer(question)`` for each artist question ``ws`` (an EventClient)
    receives, in order, as a person at the web dialog would."""
    stop = threading.Event()

    def artist():
        seen = 0
        while not stop.is_set():
            qs = [e["data"] for e in ws.events if e["type"] == "treegrpo.artist.question"]
            for q in qs[seen:]:
                answer(q)
            seen = len(qs)
            stop.wait(0.1)

    t = threading.Thread(target=artist, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(10)


def run_with_scripted_artist(srv, graph, score, timeout=900, checks=None):
    """Queue ``graph`` from a websocket client that answers every question it gets with the leaf ``score(srv, image
    ref)`` rates highest (favourites), as the web dialog would. Returns (the history entry, [(iteration, tree,
    pick)]). A check against the start (kind ``check``) is answered the same way and goes to ``checks`` as
    (iteration, pick, question) instead."""
    answered = []

    def answer(q):
        best = max(range(len(q["images"])), key=lambda i: score(srv, q["images"][i]))
        if q.get("kind") == "check":
            assert checks is not None, f"a check against the start nobody expected: {q}"
            checks.append((q["iteration"], best, q))
        else:
            answered.append((q["iteration"], q["tree"], best))
        post_answer(srv.port, q["id"], q["nonce"], {"mode": "favourites", "good": [best]})

    with ch.EventClient(srv.port) as ws, scripted_artist(ws, answer):
        pid = ch.post_prompt(srv.port, graph, client_id=ws.client_id)
        entry = ch.wait_history(srv.port, pid, timeout=timeout, check=True)
    return entry, answered


def redness(srv, ref):
    """Mean red minus the other channels of a leaf image the dialog would show (fetched through ComfyUI's /view)."""
    import io
    import urllib.parse

    import numpy as np
    from PIL import Image

    q = urllib.parse.urlencode({"filename": ref["filename"], "subfolder": ref["subfolder"], "type": ref["type"]})
    with urllib.request.urlopen(f"{srv.url}/view?{q}", timeout=30) as r:
        a = np.asarray(Image.open(io.BytesIO(r.read())).convert("RGB")).astype(float)
    return float((a[..., 0] - (a[..., 1] + a[..., 2]) / 2).mean())


def test_the_train_node_asks_about_every_nth_tree_and_scores_the_others(comfyui_server):
    """artist_every=2 over 2 iterations of 2 trees: trees 0 and 2 of the run are asked (the redder leaf is the
    favourite, as a scripted artist who likes red), trees 1 and 3 come from the reward model; the run trains."""
    from test_comfy_nodes import train_graph

    srv, run = comfyui_server, "artist_train_node"
    g = train_graph(run, 2)
    g["train"]["inputs"].update(artist_every=2, artist_mode="favourites", artist_timeout_s=300)
    checks = []
    _, answered = run_with_scripted_artist(srv, g, redness, checks=checks)
    assert [(i, tr) for i, tr, _ in answered] == [(0, 0), (1, 0)]      # run trees 0 and 2: 2 questions, 4 trees
    # no check was due in 2 iterations (every 5), but the run's end is one: the model now against the start
    assert [(i, q["tree"]) for i, _, q in checks][:1] == [(2, -1)] and all(i == 2 for i, _, _ in checks)
    rec = labels(srv, run)
    assert [(r["iteration"], r["tree"], r["outcome"]) for r in rec] == [(0, 0, "answered"), (1, 0, "answered")]
    log = json.loads((Path(srv.base_dir) / "output" / "treegrpo" / run / "log.json").read_text())
    assert len(log["train"]) == 2 and all(h["edges"] > 0 for h in log["train"])


def test_a_cancelled_artist_run_queued_again_goes_back_to_the_state_approved_before(comfyui_server):
    """The guard of the checks against the start survives Cancel and queue again: the artist approves iteration 2,
    cancels while the check at 4 waits and queues the run again: it resumes after iteration 4 and asks that check at
    once; the artist prefers the start and the LoRA goes back to iteration 2's (before, the state the run resumed with
    became the start, 4's, and the cut check was skipped); at 6 they approve. The scripted artist knows which side is
    the model now from the checks' side-order generator (seeded by the node's seed, one draw a look, kept in the
    checkpoint)."""
    import torch
    from test_comfy_nodes import train_graph

    srv, run = comfyui_server, "artist_guard_resumed"
    g = train_graph(run, 6)
    g["train"]["inputs"].update(artist_every=1000, artist_mode="favourites", artist_timeout_s=300,
                                artist_check_every=2)
    order = torch.Generator().manual_seed(7_000_003 + 0)
    script = iter(["now", "now", "cancel", "start", "start", "now", "now"])
    looks, cancelled = [], threading.Event()

    def answer(q):
        if q.get("kind") != "check":
            post_answer(srv.port, q["id"], q["nonce"], {"mode": "favourites", "good": [0]})
            return
        now = 0 if bool(torch.rand((), generator=order) < 0.5) else 1
        want = next(script)
        looks.append((q["iteration"], want))
        if want == "cancel":
            ch.server_interrupt(srv.port)
            cancelled.set()
        else:
            pick = now if want == "now" else 1 - now
            post_answer(srv.port, q["id"], q["nonce"], {"mode": "favourites", "good": [pick]})

    with ch.EventClient(srv.port) as ws, scripted_artist(ws, answer):
        pid = ch.post_prompt(srv.port, g, client_id=ws.client_id)
        entry = ch.wait_history(srv.port, pid, timeout=900)
        assert cancelled.is_set() and "execution_interrupted" in [m[0] for m in entry["status"]["messages"]]
        pid = ch.post_prompt(srv.port, g, client_id=ws.client_id)
        ch.wait_history(srv.port, pid, timeout=900, check=True)
    assert looks == [(2, "now"), (2, "now"), (4, "cancel"), (4, "start"), (4, "start"), (6, "now"), (6, "now")], looks
    folder = Path(srv.base_dir) / "output" / "treegrpo" / run
    log = json.loads((folder / "log.json").read_text())["train"]
    checked = {h["iteration"] + 1: (h.get("check"), h.get("check_restored")) for h in log if "check" in h}  # after
    assert checked == {2: ("now", None), 4: ("start", 2), 6: ("now", None)}, checked
    assert (folder / "artist" / "states" / f"{run}-0000002.pt").is_file()


def test_a_page_opened_again_after_its_tab_closed_answers_the_waiting_questions(comfyui_server):
    """The tab that queued the prompt is closed while a question waits; ComfyUI opened again (a new tab: a new
    client id) is served that question and the next ones (sent to the closed tab), not just "waiting in another
    tab" while the run waits out every timeout."""
    srv, run = comfyui_server, "artist_tab_closed"
    with ch.EventClient(srv.port) as first:
        pid = ch.post_prompt(srv.port, artist_graph(run, 0, timeout_s=600), client_id=first.client_id)
        first.wait_for(lambda e: e["type"] == "treegrpo.artist.question" and e["data"]["prompt_id"] == pid,
                       timeout=600, what="the question about tree 0")
    with ch.EventClient(srv.port) as again:
        for tree in (0, 1):
            deadline = time.monotonic() + 120
            while True:
                got = ch._http(srv.port, f"/treegrpo/artist/pending?client_id={again.client_id}")["questions"]
                if got and got[0]["tree"] == tree:
                    break
                assert time.monotonic() < deadline, f"the reopened page was never served tree {tree}"
                time.sleep(0.2)
            assert post_answer(srv.port, got[0]["id"], got[0]["nonce"], {"mode": "favourites", "good": [tree]})[0] == 200
            again.wait_for(lambda e: e["type"] == "treegrpo.artist.closed" and e["data"]["nonce"] == got[0]["nonce"],
                           timeout=60, what="the end of the question, told to the page that took it over")
            q = urllib.parse.urlencode({"id": got[0]["id"], "nonce": got[0]["nonce"]})
            assert ch._http(srv.port, f"/treegrpo/artist/state?{q}") == {"state": "answered"}
        ch.wait_history(srv.port, pid, timeout=600, check=True)
    assert [(r["tree"], r["answered_by"]) for r in labels(srv, run)] == [(0, "artist"), (1, "artist")]
