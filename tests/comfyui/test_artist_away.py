"""An artist who walks away (issue 51): after a question goes unanswered, the next ones wait only the grace period
until the artist answers again; then full waits resume. The dialog's question says how many trees fell back, the
labels record who scored each tree, and the Train node's console line says the artist is away. Runs ask_trees
in-process on its own board (ComfyUI's folder_paths for the leaf images), answering from a second thread as the
web page would; only the recorded waits are compared, never a clock."""
import json
import threading
import time
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.slow   # a ComfyUI server and waits for a person: seconds a test


def _batch(n_trees=4):
    leaf_tree = torch.arange(n_trees).repeat_interleave(2)
    return SimpleNamespace(leaf_tree=leaf_tree, n_trees=n_trees, prompts=[f"p{t}" for t in range(n_trees)],
                           parents=[torch.zeros(n_trees, dtype=torch.long), leaf_tree.clone()])


def test_after_a_timeout_the_next_questions_wait_the_grace_period_until_the_artist_answers(comfyui_pack, tmp_path):
    from treegrpo.comfyui.artist.questions import ON_TIMEOUT, ArtistBoard, ask_trees

    board, client = ArtistBoard(), "tab-1"
    seen = []

    def artist():                      # away for trees 0 and 1, back for tree 2, away again for tree 3
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for q in board.pending(client)["questions"]:
                if q["id"] not in [s["id"] for s in seen]:
                    seen.append(q)
                if q["tree"] == 2:
                    board.answer(q["id"], q["nonce"], {"mode": "favourites", "good": [0]})
                    return
            time.sleep(0.01)

    th = threading.Thread(target=artist)
    th.start()
    rewards, exclude = ask_trees(_batch(), torch.rand(8, 8, 8, 3), folder=str(tmp_path), iteration=0, seed=0,
                                 run_name="away", mode="favourites", timeout_s=3.0, away_grace_s=1.0,
                                 on_timeout=ON_TIMEOUT[1], fallback=lambda imgs, prompts: torch.zeros(len(imgs)),
                                 board=board, client_id=client)
    th.join()
    labels = [json.loads(ln) for ln in (tmp_path / "artist_labels.jsonl").read_text().splitlines()]
    assert [r["answered_by"] for r in labels] == ["reward model", "reward model", "artist", "reward model"]
    assert [r["waited_s"] for r in labels] == [3.0, 1.0, 1.0, 3.0]       # full, grace, grace (answered), full again
    assert [q["away"] for q in sorted(seen, key=lambda q: q["tree"])][:3] == [0, 1, 2]
    assert board.away(client) == 1 and board.away_summary() == "artist away: 1 tree fell back"
    assert rewards[4:6].tolist() == [1.0, 0.0] and not exclude.any()
    # a new Train-node run queued from that tab: the person is at the page, full waits again
    from treegrpo.comfyui.artist.questions import train_node_artist
    train_node_artist(2, "favourites", 600, board=board, client_id=client)
    assert board.away(client) == 0 and board.away_summary() is None


def test_the_console_line_says_the_artist_is_away(comfyui_pack):
    from treegrpo.comfyui import watch
    from treegrpo.comfyui.artist import questions as artist

    board = artist.ArtistBoard()
    old, artist.BOARD = artist.BOARD, board
    try:
        assert watch._artist_away() is None
        board.fell_back("tab")
        board.fell_back("tab")
        assert watch._artist_away() == "artist away: 2 trees fell back"
    finally:
        artist.BOARD = old


def test_the_last_console_line_gives_the_whole_runs_time(comfyui_pack, tmp_path, monkeypatch):
    """``done, iteration N/N after T``: T is the run from the watcher's start to its end, not the last iterations
    the time-left estimate averages over (a 15-iteration run of 2 s each said "after 20s" at 30 s)."""
    from treegrpo.comfyui import watch

    now = [100.0]
    lines = []
    trainer = SimpleNamespace(cfg=SimpleNamespace(run_name="clock", eval_seeds=1), keep_eval_images=False, rank=0,
                              warnings=[], iteration=0, evals=[], out=str(tmp_path), best_lora_path=str(tmp_path / "none"),
                              save_lora=lambda path: path)
    monkeypatch.setattr(watch, "loras_folder", lambda name: str(tmp_path / "loras"))
    w = watch.RunWatcher(trainer, 15, lambda: None, log=lines.append, clock=lambda: now[0])
    for it in range(15):
        now[0] += 2.0
        trainer.iteration = it + 1
        w.on_iteration({"iteration": it, "reward": 0.5, "kl": 0.0})
    now[0] += 1.0                                      # saving the LoRA and the figures
    w.finish()
    assert "it 15/15" in lines[-2] and "0s left" in lines[-2]
    assert lines[-1].startswith("TreeGRPO clock: done, iteration 15/15 after 31s;"), lines[-1]


def test_the_nodes_last_text_says_how_the_run_ended(comfyui_pack, tmp_path, monkeypatch):
    """The text under the Train node once the run ends: what it delivered and what its end said (the check that took
    the LoRA back), or where a stopped run goes on from — not the last iteration's line with its time left (an
    artist's walk: the node said "it 1/8 | 1m58s left" after Stop, and nothing of the end's roll-back)."""
    from comfy.model_management import InterruptProcessingException

    from treegrpo.comfyui import watch

    shown = []
    trainer = SimpleNamespace(cfg=SimpleNamespace(run_name="walk", eval_seeds=1), keep_eval_images=False, rank=0,
                              warnings=["an earlier warning"], iteration=0, evals=[], out=str(tmp_path),
                              best_lora_path=str(tmp_path / "none"), save_lora=lambda path: path,
                              checkpointed_iteration=None)
    monkeypatch.setattr(watch, "loras_folder", lambda name: str(tmp_path / "loras"))
    w = watch.RunWatcher(trainer, 8, lambda: None, log=lambda line: None, node_id="7")
    monkeypatch.setattr(w, "show_text", shown.append)
    trainer.iteration = 1
    w.on_iteration({"iteration": 0, "reward": 0.5})
    assert "left" in shown[-1]
    w.stopped(InterruptProcessingException())
    assert shown[-1] == "cancelled after iteration 1/8\nnothing saved: queued again it starts afresh"
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "walk-0000001.pt").write_bytes(b"x")    # stopped before it read its checkpoint
    w.stopped(RuntimeError("boom"))
    assert shown[-1] == ("stopped (RuntimeError) after iteration 1/8\nits checkpoints are kept: queued again it "
                         "resumes from the newest")
    trainer.checkpointed_iteration = 1
    w.stopped(RuntimeError("boom"))
    assert shown[-1] == "stopped (RuntimeError) after iteration 1/8\nsaved: queue again to resume from iteration 1"
    for it in range(1, 8):
        trainer.iteration = it + 1
        w.on_iteration({"iteration": it, "reward": 0.5})
    trainer.warnings.append("the artist did not prefer iteration 8's pictures: the run ends on iteration 4's LoRA")
    w.finish()
    assert shown[-1] == ("done: iteration 8/8\nLoRA treegrpo/walk/walk.safetensors\nthe artist did not prefer "
                         "iteration 8's pictures: the run ends on iteration 4's LoRA")


@pytest.mark.parametrize("best", [0, 4])
def test_the_end_says_when_the_best_lora_is_the_untrained_one(comfyui_pack, tmp_path, monkeypatch, best):
    """A run whose judge never scored a trained state above the base model keeps iteration 0's LoRA as its best:
    a file named _best that changes nothing. The last console line and the node say so (a walk found every short
    SD1.5 run's _best file all zeros, without a word)."""
    import torch

    from treegrpo.comfyui import watch
    from treegrpo.lora import save_lora_file

    lines, shown = [], []
    best_path = str(tmp_path / "b_best.safetensors")
    save_lora_file(best_path, {"m.lora_up.weight": torch.zeros(2, 1)}, {"treegrpo.best_iteration": str(best)})
    trainer = SimpleNamespace(cfg=SimpleNamespace(run_name="b", eval_seeds=1), keep_eval_images=False, rank=0,
                              warnings=[], iteration=4, evals=[], out=str(tmp_path), best_lora_path=best_path,
                              save_lora=lambda path: path, best_set_aside=[])
    monkeypatch.setattr(watch, "loras_folder", lambda name: str(tmp_path / "loras"))
    w = watch.RunWatcher(trainer, 4, lambda: None, log=lines.append, node_id="7")
    monkeypatch.setattr(w, "show_text", shown.append)
    w.finish()
    said = "b_best.safetensors is the untrained LoRA (no change)"
    assert (said in lines[-1]) == (best == 0) and (said in shown[-1]) == (best == 0)


def test_a_best_lora_set_aside_follows_into_the_lora_folder(comfyui_pack, tmp_path, monkeypatch):
    """The best LoRA of a state the artist rejected moves aside in the run folder; its copy where LoraLoader lists
    it follows at the next line, and after a stop (the list of moves gone with the process) at the next copy."""
    from safetensors.torch import save_file

    from treegrpo.comfyui import watch

    run, loras = tmp_path / "run", tmp_path / "loras"
    run.mkdir()
    loras.mkdir()
    best = run / "walk_best.safetensors"
    trainer = SimpleNamespace(cfg=SimpleNamespace(run_name="walk", eval_seeds=1), keep_eval_images=False, rank=0,
                              warnings=[], iteration=0, evals=[], out=str(run), best_lora_path=str(best),
                              best_set_aside=[])
    monkeypatch.setattr(watch, "loras_folder", lambda name: str(loras))
    w = watch.RunWatcher(trainer, 8, lambda: None, log=lambda line: None)
    for it in (3, 7):
        save_file({"x": torch.zeros(1)}, str(best), metadata={"treegrpo.best_iteration": str(it)})
        w.copy_best()
        assert (loras / "walk_best.safetensors").is_file()
        trainer.best_set_aside.append((2, str(best)))      # a check went back to iteration 2's state
        best.rename(run / f"walk_best-not-preferred-{it}.safetensors")
        if it == 7:
            trainer.best_set_aside.clear()                  # ... and the process stopped before the copy followed
        w.copy_best()
        assert not (loras / "walk_best.safetensors").exists()
        assert (loras / f"walk_best-not-preferred-{it}.safetensors").is_file()


def test_a_tree_answered_before_a_crash_is_not_asked_again(comfyui_pack, tmp_path):
    """The iteration a crash cut, drawn again by the resumed run (the same run, iteration, seed and pictures): the
    trees the artist answered take those answers without a question and no second record; a tree whose pictures
    differ (another noise) and one nobody answered are asked again."""
    from treegrpo.comfyui.artist.questions import ArtistBoard, ask_trees

    board, client = ArtistBoard(), "tab-1"
    g = torch.Generator().manual_seed(0)
    images = torch.rand(8, 8, 8, 3, generator=g)
    asked = []

    def artist(stop_after):            # answers trees 0 and 1 (leaf 1 and leaf 0 the favourite), not tree 2 or 3
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(asked) < stop_after:
            for q in board.pending(client)["questions"]:
                if q["id"] in [a["id"] for a in asked]:
                    continue
                asked.append(q)
                if q["tree"] in (0, 1):
                    board.answer(q["id"], q["nonce"], {"mode": "favourites", "good": [1 - q["tree"]]})
            time.sleep(0.01)

    kw = dict(folder=str(tmp_path), iteration=3, seed=0, run_name="crash", mode="favourites", timeout_s=1.0,
              away_grace_s=1.0, board=board, client_id=client)
    th = threading.Thread(target=artist, args=(4,))
    th.start()
    first, first_exclude = ask_trees(_batch(), images, **kw)
    th.join()
    assert sorted(q["tree"] for q in asked) == [0, 1, 2, 3]
    # the resumed run: the same pictures, except tree 1's second leaf (another noise)
    again_images = images.clone()
    again_images[3] = torch.rand(8, 8, 3, generator=g)
    asked.clear()
    th = threading.Thread(target=artist, args=(3,))
    th.start()
    got = {}
    again, again_exclude = ask_trees(_batch(), again_images, answers=got, **kw)
    th.join()
    assert sorted(q["tree"] for q in asked) == [1, 2, 3]    # tree 0 was not asked again
    assert again[0:2].tolist() == first[0:2].tolist() == [0.0, 1.0] and got[0].good == (1,)
    labels = [json.loads(ln) for ln in (tmp_path / "artist_labels.jsonl").read_text().splitlines()]
    assert [(r["tree"], r["answered_by"]) for r in labels] == [(0, "artist"), (1, "artist"), (2, "skipped"),
                                                               (3, "skipped"), (1, "artist"), (2, "skipped"),
                                                               (3, "skipped")]
    assert first_exclude.tolist() == again_exclude.tolist() == [False, False, True, True]


def test_a_fresh_run_that_asks_the_artist_is_checkpointed_before_its_first_question(comfyui_pack, tmp_path):
    """A crash during the first iteration's questions (the most of a run: the taste model starts cold) must find a
    checkpoint to resume, or the run would start afresh and move the answers aside instead of using them again."""
    from treegrpo import cli
    from treegrpo.backends import load_policy
    from treegrpo.comfyui.watch import RunWatcher
    from treegrpo.config import TrainConfig
    from treegrpo.run import build_rewards, build_trainer

    for asks in (True, False):
        d = cli.demo_config_dict()
        d.update(output_dir=str(tmp_path / str(asks)), run_name="artist_fresh", iterations=1, prompts_per_iter=2,
                 eval_every=0, checkpoint_every=1)
        cfg = TrainConfig.from_dict(d)
        policy, name = load_policy(cfg)
        tr = build_trainer(cfg, policy, build_rewards(cfg, torch.device("cpu")), progress=False, base_model_name=name,
                           leaf_scorer=(lambda *a: None) if asks else None)
        tr.begin(resume=True)                         # nothing to resume: a fresh start
        RunWatcher(tr, 1, SimpleNamespace(update=lambda *a: None), log=lambda m: None).on_train_begin(tr)
        found = sorted(p.name for p in (tmp_path / str(asks)).glob("checkpoints/*.pt"))
        assert found == (["artist_fresh-0000000.pt"] if asks else []), (asks, found)


def test_a_taste_run_nobody_answers_stops_saved_instead_of_spending_its_iterations(comfyui_pack, monkeypatch):
    """The Train node with artist_ask 'when unsure' and nobody at the page: once the warm-up's questions (2 here)
    all went unanswered, nothing can be trained (no taste model, no answer), so the run stops before the iteration
    counts, with a checkpoint and what to do, instead of asking on every tree and training nothing to its end."""
    from pathlib import Path

    from test_comfy_nodes import train_graph

    from treegrpo.artist.taste import TasteConfig

    one_in = TasteConfig.one_in.__func__
    monkeypatch.setattr(TasteConfig, "one_in", classmethod(lambda cls, every, **kw: one_in(cls, every,
                                                                                          warmup_trees=2, **kw)))
    run = "taste_away"
    g = train_graph(run, 6, prompts="a red circle\na blue square")
    g["train"]["inputs"].update(artist_every=2, artist_ask="when unsure", artist_timeout_s=5, artist_away_s=1,
                                eval_every=0)
    res = comfyui_pack.execute(g, check=False)
    assert not res.success
    text = json.dumps(res.error, default=str)
    assert "nobody answered the last 2 questions" in text and "Queue the workflow again" in text, text[-2000:]
    folder = Path(comfyui_pack.base_dir) / "output" / "treegrpo" / run
    labels = [json.loads(ln) for ln in (folder / "artist_labels.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["outcome"]) for r in labels] == [(0, "timeout"), (0, "timeout")]
    assert [r["waited_s"] for r in labels] == [5.0, 1.0]
    assert [p.name for p in (folder / "checkpoints").glob("*.pt")] == [f"{run}-0000000.pt"]   # no iteration spent


def test_the_train_nodes_taste_model_keeps_its_running_state_in_the_checkpoint(comfyui_pack, tmp_path):
    """The Train node's *when unsure* scorer has a callback (``keeper``) whose state goes into the run's checkpoint:
    the resumed run's taste model, rebuilt from the answers on disk, takes its agreements, rounds and warnings back
    (an artist's walk: "taste agrees" vanished after a resume)."""
    from treegrpo.artist.features import DemoEncoder
    from treegrpo.artist.taste import TasteConfig
    from treegrpo.comfyui.artist.questions import ArtistBoard
    from treegrpo.comfyui.artist.taste import TasteKeeper, train_node_taste
    from treegrpo.scores import ScoringContext

    hook = train_node_taste(DemoEncoder(), "favourites", 5, TasteConfig(), board=ArtistBoard(), client_id="tab")
    assert isinstance(hook.keeper, TasteKeeper) and hook.keeper.state_dict(None) is None
    kept = {"online": json.dumps({"agreements": [1.0, 0.0, 1.0], "warmup_spread": [0.5], "warned": False,
                                  "active": ["diversity"], "unanswered": 0}),
            "round_means": torch.zeros(2, 4, dtype=torch.float64)}
    hook.keeper.load_state_dict(None, kept)
    assert hook.keeper.state_dict(None) is kept        # not rebuilt yet: the next checkpoint keeps it as it was
    ctx = ScoringContext(iteration=7, trees_before=14, output_dir=str(tmp_path), run_name="walk", seed=0,
                         weights={}, score_images=lambda *a: {})
    taste = hook.online(ctx)
    assert taste.agreements == [1.0, 0.0, 1.0] and taste.active == {"diversity"} and len(taste.round_means) == 2
    assert taste.recent_agreement() == pytest.approx(2 / 3)
    assert json.loads(hook.keeper.state_dict(None)["online"])["agreements"] == [1.0, 0.0, 1.0]
