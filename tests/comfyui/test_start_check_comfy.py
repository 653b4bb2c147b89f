"""The check against the start in ComfyUI (issue 50): one question in the artist's dialog with the two sides as one
picture each; the side picked (or marked bad) comes back, no preference / skip / no answer change nothing, and every
check is kept in the run's artist_checks.jsonl with its pictures. In-process on its own board, answered from a second
thread as the web page would."""
import json
import threading
import time

import pytest
import torch

pytestmark = pytest.mark.slow   # waits for a person: seconds a test


def _answering(board, client, answers):
    """Answer the next questions of ``client`` with ``answers`` in order (None: leave it unanswered). A question is
    told from another by its nonce, as the web page does: a check asked again keeps its id (run, iteration, tree)."""
    seen = []

    def run():
        deadline = time.monotonic() + 60
        todo = list(answers)
        while todo and time.monotonic() < deadline:
            for q in board.pending(client)["questions"]:
                if q["nonce"] in seen:
                    continue
                seen.append(q["nonce"])
                a = todo.pop(0)
                if a is not None:
                    board.answer(q["id"], q["nonce"], a)
            time.sleep(0.01)

    th = threading.Thread(target=run)
    th.start()
    return th, seen


def test_a_check_question_returns_the_side_picked_and_keeps_every_answer(comfyui_pack, tmp_path):
    from treegrpo.comfyui.artist.questions import CHECK_AGAIN_TEXT, CHECK_TEXT, CHECKS_FILE, ArtistBoard, ask_check

    board, client = ArtistBoard(), "tab-1"
    first, second = torch.rand(4, 3, 8, 8), torch.rand(4, 3, 8, 8)
    answers = [{"mode": "favourites", "good": [1]}, {"mode": "favourites", "bad": [1]}, {"mode": "none"},
               {"mode": "skip"}, {"mode": "favourites", "good": [0, 1]}]
    th, _ = _answering(board, client, answers)
    got = [ask_check(first, second, ["a red circle"] * 4, it, folder=str(tmp_path), run_name="r", timeout_s=30,
                     board=board, client_id=client) for it in range(5)]
    th.join()
    assert got == [1, 0, None, None, None]        # the side; bad marks the other; none, skip, both: no preference
    recs = [json.loads(ln) for ln in (tmp_path / CHECKS_FILE).read_text().splitlines()]
    assert [r["pick"] for r in recs] == got and [r["iteration"] for r in recs] == list(range(5))
    assert all(r["outcome"] == "answered" and len(r["sides"]) == 2 for r in recs)
    import numpy as np
    from PIL import Image
    side = Image.open(tmp_path / recs[0]["sides"][1]).convert("RGB")
    assert side.size == (4 * 8 + 3 * 2, 8)                                   # four pictures in a row, 2-pixel gaps
    px = torch.from_numpy(np.asarray(side, dtype=np.float32))[:, 10:18] / 255
    assert torch.allclose(px, second[1].movedim(0, -1), atol=1 / 255)       # the second picture of the second side
    assert not (tmp_path / "artist_labels.jsonl").exists()                   # the taste model's labels: untouched
    assert board.pending(client)["questions"] == []
    assert CHECK_TEXT.startswith("Is the run still going your way?")
    # the second look after the start was picked: its own question (tree -2, its own text), kept as such
    seen = []

    def look():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for q in board.pending(client)["questions"]:
                seen.append(q)
                board.answer(q["id"], q["nonce"], {"mode": "favourites", "good": [0]})
                return
            time.sleep(0.01)

    th = threading.Thread(target=look)
    th.start()
    assert ask_check(first, second, ["p"] * 4, 7, folder=str(tmp_path), run_name="r", timeout_s=30, board=board,
                     client_id=client, again=True) == 0
    th.join()
    assert seen[0]["tree"] == -2 and seen[0]["prompt"] == CHECK_AGAIN_TEXT and seen[0]["kind"] == "check"
    last = json.loads((tmp_path / CHECKS_FILE).read_text().splitlines()[-1])
    assert last["again"] is True and last["iteration"] == 7 and "check_again" in last["sides"][0]
    # one run (one prompt id) asked twice at one iteration — the end's re-check of an approved state: the second
    # answer's pictures go beside the first's, never over them
    th, _ = _answering(board, client, [{"mode": "favourites", "good": [0]}] * 2)
    sides = [torch.zeros(4, 3, 8, 8), torch.ones(4, 3, 8, 8)]
    picks = [ask_check(sides[k], sides[1 - k], ["p"] * 4, 9, folder=str(tmp_path), run_name="r", timeout_s=30,
                       board=board, client_id=client, prompt_id="samerun0") for k in range(2)]
    th.join()
    assert picks == [0, 0], picks                                    # both showings answered, each its own
    recs = [json.loads(ln) for ln in (tmp_path / CHECKS_FILE).read_text().splitlines()[-2:]]
    assert recs[0]["sides"][0] != recs[1]["sides"][0] and recs[1]["sides"][0].endswith("samerun0_9_check_2/side_0.png")
    for k, r in enumerate(recs):
        kept = np.asarray(Image.open(tmp_path / r["sides"][0]).convert("RGB"), dtype=np.float32)
        assert kept[:, :8].max() == (0 if k == 0 else 255)           # each answer keeps the pictures it was shown


def test_an_unanswered_check_changes_nothing_and_an_away_artist_waits_the_grace_period(comfyui_pack, tmp_path):
    from treegrpo.comfyui.artist.questions import CHECKS_FILE, ArtistBoard, ask_check

    board, client = ArtistBoard(), "tab-1"
    board.fell_back(client)                         # a tree fell back: the artist is away
    pick = ask_check(torch.rand(2, 3, 8, 8), torch.rand(2, 3, 8, 8), ["p", "p"], 5, folder=str(tmp_path),
                     run_name="r", timeout_s=600, away_grace_s=1.0, board=board, client_id=client)
    from treegrpo.artist.start_check import NO_ANSWER

    assert pick == NO_ANSWER                        # not "no preference": nobody answered
    rec = json.loads((tmp_path / CHECKS_FILE).read_text())
    assert rec["outcome"] == "timeout" and rec["waited_s"] == 1.0 and rec["answer"] is None


def test_a_check_answered_before_the_run_stopped_is_not_asked_again(comfyui_pack, tmp_path):
    """ComfyUI killed while the artist looked at a check: the resumed run (another prompt) repeats the iteration and
    draws the same pictures, the sides maybe in the other order; the answer given is used, in that order, without a
    question or a second record, and the taste model learns it only when the checkpoint it resumed from did not
    include it (a check after the checkpoint's iteration)."""
    from types import SimpleNamespace

    from treegrpo.artist.start_check import NO_ANSWER
    from treegrpo.comfyui.artist.questions import CHECKS_FILE, ArtistBoard, ask_check
    from treegrpo.comfyui.train_node import start_check
    from treegrpo.config import ArtistConfig

    board, client = ArtistBoard(), "tab-1"
    first, second = torch.rand(4, 3, 8, 8), torch.rand(4, 3, 8, 8)
    th, _ = _answering(board, client, [{"mode": "favourites", "good": [0]}])
    assert ask_check(first, second, ["p"] * 4, 6, folder=str(tmp_path), run_name="r", timeout_s=30, board=board,
                     client_id=client, prompt_id="killed00") == 0
    th.join()
    kw = dict(folder=str(tmp_path), run_name="r", timeout_s=5, away_grace_s=1, board=board, client_id=client,
              prompt_id="resumed0")
    replayed = []
    assert ask_check(second, first, ["p"] * 4, 6, replayed=replayed, **kw) == 1    # the other order: the other side
    assert replayed[0]["prompt_id"] == "killed00" and board.pending(client)["questions"] == []
    assert len((tmp_path / CHECKS_FILE).read_text().splitlines()) == 1              # no second record
    assert ask_check(first, second, ["p"] * 4, 6, again=True, **kw) == NO_ANSWER     # the second look: never given
    assert ask_check(first, second, ["p"] * 4, 7, **kw) == NO_ANSWER                 # another iteration
    # through the Train node's check: learnt again only when the resumed taste model did not read it back
    learnt = []
    check = start_check(ArtistConfig(every=1, timeout_s=5, away_s=1, check_every=2), 0,
                        learn=lambda a, b, pick: learnt.append(pick), board=board, client_id=client,
                        prompt_id="resumed1")
    for began_at, want in ((5, [0]), (6, [])):      # resumed after iteration 5 (a crash cut 6), after 6 (the end)
        learnt.clear()
        check.begin(SimpleNamespace(cfg=SimpleNamespace(output_dir=str(tmp_path), run_name="r"), iteration=began_at,
                                    lora=SimpleNamespace(weights=lambda: {}),
                                    optimizer=SimpleNamespace(state_dict=lambda: {})))
        assert check.ask(first, second, ["p"] * 4, 6) == 0 and learnt == want
