"""Issue 50: checks against where the run started (treegrpo/artist/start_check.py) — the guard's rule on hand-worked
sequences, the pictures (the model now and the base model from the same noises), and a run rolled back to the exact
LoRA and optimiser state the artist approved."""
import copy
import os

import pytest
import torch

from treegrpo.artist.start_check import (NO_ANSWER, NOW, START, CheckConfig, Snapshot, StartCheck, StartGuard,
                                  check_pictures)


def _guard():
    return StartGuard(Snapshot(0, "w0"), keep=2)


def test_the_guard_keeps_approved_states_and_goes_back_to_them():
    g = _guard()
    assert g.record(None, lambda: Snapshot(5, "w5")) is None and g.approved == []      # no answer: nothing
    assert g.record(NOW, lambda: Snapshot(5, "w5")) is None                             # approved: kept
    assert g.record(START, lambda: pytest.fail("a lost state is not kept")).weights == "w5"   # back to 5
    assert g.record(START, lambda: pytest.fail()).weights == "w0"       # 5 lost again right after: the one before
    assert g.approved == [] and g.restores == 2
    assert g.record(START, lambda: pytest.fail()).weights == "w0"       # the start is never dropped
    assert g.record(NOW, lambda: Snapshot(20, "w20")) is None
    assert g.record(NOW, lambda: Snapshot(25, "w25")) is None
    assert g.record(NOW, lambda: Snapshot(30, "w30")) is None
    assert [s.iteration for s in g.approved] == [25, 30]                # keep = 2
    assert g.record(START, lambda: pytest.fail()).iteration == 30
    assert g.record(NOW, lambda: Snapshot(40, "w40")) is None           # won again: a loss later starts afresh
    assert g.record(START, lambda: pytest.fail()).iteration == 40
    with pytest.raises(ValueError, match="verdict"):
        g.record("better", lambda: None)


def test_check_config_refuses_nonsense():
    for bad in ({"every": -1}, {"pictures": 0}, {"pictures": 65}, {"every": 2.5}):
        with pytest.raises(ValueError):
            CheckConfig(**bad)
    c = StartCheck(lambda *a: 0, CheckConfig(every=5))
    assert [i for i in range(21) if c.due(i)] == [5, 10, 15, 20]
    assert not any(StartCheck(lambda *a: 0, CheckConfig(every=0)).due(i) for i in range(21))


def _trainer(tmp_path, check=None, lr=5e-2):
    from treegrpo import cli
    from treegrpo.backends import load_policy
    from treegrpo.config import TrainConfig
    from treegrpo.trainer import Trainer

    d = cli.demo_config_dict()
    d.update(prompts=["a red circle"], prompts_per_iter=1, trees_per_prompt=1, iterations=6, eval_every=0, seed=3,
             output_dir=str(tmp_path), run_name="check", checkpoint_every=0)
    d["tree"].update(window_start=1, window_width=2, branch=2)
    d["optim"].update(lr=lr)
    cfg = TrainConfig.from_dict(d)
    policy, _ = load_policy(cfg)
    from treegrpo.demo.tastes import taste
    big = taste("big")
    return Trainer(cfg, policy, {"demo_adherence": lambda im, p: big(im)}, progress=False,
                   callbacks=[check] if check is not None else [])


def _flat(w):
    return torch.cat([t.flatten() for t in list(w.down.values()) + list(w.up.values())])


def test_the_start_side_is_the_base_model_and_both_sides_share_the_noise(tmp_path):
    t = _trainer(tmp_path)
    noise = torch.randn((3, *t.policy.latent_shape()), generator=torch.Generator().manual_seed(1))
    prompts = ["a red circle"] * 3
    now, start = check_pictures(t.policy, prompts, noise, t.cfg.tree.steps)
    assert torch.equal(now, start)          # LoRA B = 0 at the start: the same pictures
    for _ in range(2):
        t.train_step()
    now2, start2 = check_pictures(t.policy, prompts, noise, t.cfg.tree.steps)
    assert torch.equal(start2, start)       # the base model's pictures do not move with training
    assert not torch.equal(now2, start2)    # the model's do
    assert now2.shape == start2.shape == (3, 3, *now2.shape[2:])


def _scripted(verdicts, t_box, asked):
    """An ``ask`` that answers each look with the next of ``verdicts`` ("now", "start", None), telling the sides
    apart by the base model's pictures of the looks' noises (the start side equals them: the checks' two fixed
    noises, and the end's re-checks' own, ``fresh`` = 1, 2, ...). ``asked`` gets (iteration, again, verdict, fresh)."""
    verdicts = iter(verdicts)
    base = {}

    def start_of(t, prompts, again, fresh):
        if (again, fresh) not in base:
            seed = 424_242 + (7919 if again else 0) + 104_729 * fresh
            noise = torch.randn((len(prompts), *t.policy.latent_shape()), generator=torch.Generator().manual_seed(seed))
            base[(again, fresh)] = check_pictures(t.policy, prompts, noise, t.cfg.tree.steps)[1]
        return base[(again, fresh)]

    def ask(first, second, prompts, iteration, again=False):
        t = t_box[0]
        fresh = next(f for f in range(6) if torch.equal(first, start_of(t, prompts, again, f))
                     or torch.equal(second, start_of(t, prompts, again, f)))
        start = start_of(t, prompts, again, fresh)
        assert torch.equal(first, start) != torch.equal(second, start)   # one side is the start
        want = next(verdicts)
        asked.append((iteration, again, want, fresh))
        if want is None:
            return None
        start_first = torch.equal(first, start)
        return (1 if start_first else 0) if want == "now" else (0 if start_first else 1)

    return ask


def test_a_lost_check_restores_the_approved_lora_and_optimiser_exactly(tmp_path):
    box, asked = [], []
    check = StartCheck(_scripted(["now", "now", "start", "start", "start", "start"], box, asked),
                       CheckConfig(every=2, pictures=2, seed=0))
    t = _trainer(tmp_path, check)
    box.append(t)
    w0 = copy.deepcopy(t.lora.weights())
    for _ in range(2):
        t.after_iteration(t.train_step())
    assert check.records[-1] == {"iteration": 2, "verdict": NOW, "restored": None, "looks": [NOW, NOW]}
    w2 = copy.deepcopy(t.lora.weights())
    opt2 = copy.deepcopy(t.optimizer.state_dict())
    for _ in range(2):
        t.after_iteration(t.train_step())
    rec = check.records[-1]
    assert rec == {"iteration": 4, "verdict": START, "restored": 2, "looks": [START, START]}   # confirmed
    assert torch.equal(_flat(t.lora.weights()), _flat(w2))
    st = t.optimizer.state_dict()["state"]
    for k, v in opt2["state"].items():
        assert torch.equal(st[k]["exp_avg"], v["exp_avg"]) and torch.equal(st[k]["exp_avg_sq"], v["exp_avg_sq"])
    assert t.history[-1]["check"] == START and t.history[-1]["check_restored"] == 2
    assert any("goes back to iteration 2's" in w for w in t.warnings)
    for _ in range(2):
        t.after_iteration(t.train_step())
    assert check.records[-1]["restored"] == 0            # lost again right after going back: the start
    assert torch.equal(_flat(t.lora.weights()), _flat(w0))
    assert any("where this run started" in w for w in t.warnings)
    assert [a for _, a, _, _ in asked] == [False, True, False, True, False, True]   # every pick is looked at twice


def test_a_side_picked_once_but_not_on_the_second_look_changes_nothing(tmp_path):
    box, asked = [], []
    check = StartCheck(_scripted(["start", "now", "start", None, "now", "start", None], box, asked),
                       CheckConfig(every=1, pictures=2))
    t = _trainer(tmp_path, check)
    box.append(t)
    t.after_iteration(t.train_step())
    w1 = copy.deepcopy(t.lora.weights())
    assert check.records[-1] == {"iteration": 1, "verdict": None, "restored": None, "looks": [START, NOW]}
    assert torch.equal(_flat(t.lora.weights()), _flat(w1)) and check.guard.approved == []
    t.after_iteration(t.train_step())
    assert check.records[-1]["looks"] == [START, None] and check.records[-1]["restored"] is None
    assert t.history[-1]["check"] == "none"
    t.after_iteration(t.train_step())            # the model now picked once: not approved without the second look
    assert check.records[-1]["looks"] == [NOW, START] and check.guard.approved == []
    t.after_iteration(t.train_step())            # no preference: no second look
    assert check.records[-1]["looks"] == [None] and check.records[-1]["verdict"] is None
    # without confirm one pick of the start goes back at once
    box2, asked2 = [], []
    once = StartCheck(_scripted(["start"], box2, asked2), CheckConfig(every=1, pictures=2, confirm=False))
    t2 = _trainer(tmp_path / "once", once)
    box2.append(t2)
    t2.after_iteration(t2.train_step())
    assert once.records[-1] == {"iteration": 1, "verdict": START, "restored": 0, "looks": [START]}


def test_the_end_of_a_run_keeps_only_a_state_the_artist_preferred_to_the_start(tmp_path):
    """StartCheck.finish: the state reached is kept on two looks that prefer it (a check made at the last iteration
    counts as the first); otherwise the run goes back to the newest approved state if the artist prefers it to the
    start again on two looks at noises of their own, else to the base model, and the state it leaves is handed to
    ``on_unapproved`` first."""
    # approved at iteration 2, trained on to 3: the end asks twice; the second look says no preference -> iteration 2
    # is shown again beside the start on fresh noises, preferred twice -> the run ends on it
    box, asked, left = [], [], []
    check = StartCheck(_scripted(["now", "now", "now", None, "now", "now"], box, asked),
                       CheckConfig(every=2, pictures=2),
                       on_unapproved=lambda tr: left.append(copy.deepcopy(tr.lora.weights())))
    t = _trainer(tmp_path / "a", check)
    box.append(t)
    for _ in range(2):
        t.after_iteration(t.train_step())
    w2 = copy.deepcopy(t.lora.weights())
    t.after_iteration(t.train_step())
    w3 = copy.deepcopy(t.lora.weights())
    rec = check.finish(t)
    assert rec == {"iteration": 3, "verdict": None, "restored": 2, "looks": [NOW, None], "final": True,
                   "rechecks": [[2, [NOW, NOW]]]}
    assert [(a, f) for _, a, _, f in asked] == [(False, 0), (True, 0), (False, 0), (True, 0), (False, 1), (True, 1)]
    assert torch.equal(_flat(t.lora.weights()), _flat(w2)) and torch.equal(_flat(left[0]), _flat(w3))
    assert any("ends on iteration 2's LoRA" in w for w in t.warnings)

    # the same run, but iteration 2 is not preferred to the start on the fresh noises: it is dropped -> the base model
    box, asked = [], []
    check = StartCheck(_scripted(["now", "now", "now", None, "now", None], box, asked),
                       CheckConfig(every=2, pictures=2))
    t = _trainer(tmp_path / "a2", check)
    box.append(t)
    w0 = copy.deepcopy(t.lora.weights())
    for _ in range(3):
        t.after_iteration(t.train_step())
    rec = check.finish(t)
    assert rec["restored"] == 0 and rec["rechecks"] == [[2, [NOW, None]]] and check.guard.approved == []
    assert torch.equal(_flat(t.lora.weights()), _flat(w0))
    assert any("ends on the base model" in w for w in t.warnings)

    # preferred on both looks of a check at the last iteration: that verdict stands, nothing more is asked
    box, asked = [], []
    check = StartCheck(_scripted(["now", "now"], box, asked), CheckConfig(every=2, pictures=2))
    t = _trainer(tmp_path / "b", check)
    box.append(t)
    for _ in range(2):
        t.after_iteration(t.train_step())
    w2 = copy.deepcopy(t.lora.weights())
    assert check.finish(t) == {"iteration": 2, "verdict": NOW, "restored": None, "looks": [], "final": True}
    assert [a for _, a, _, _ in asked] == [False, True] and torch.equal(_flat(t.lora.weights()), _flat(w2))

    # no state ever approved and no preference at the end: the base model (LoRA as at the start)
    box, asked = [], []
    check = StartCheck(_scripted([None, None], box, asked), CheckConfig(every=2, pictures=2))
    t = _trainer(tmp_path / "c", check)
    box.append(t)
    w0 = copy.deepcopy(t.lora.weights())
    for _ in range(3):
        t.after_iteration(t.train_step())
    assert check.finish(t)["restored"] == 0 and torch.equal(_flat(t.lora.weights()), _flat(w0))
    assert any("ends on the base model" in w for w in t.warnings)

    # Trainer.train runs it at the end (on_train_end), before the caller saves the LoRA; final=False: no end check
    box, asked = [], []
    check = StartCheck(_scripted(["start", "start", None, "now", "now"], box, asked), CheckConfig(every=2, pictures=2))
    t = _trainer(tmp_path / "d", check)
    box.append(t)
    t.train(iterations=5)
    assert [r.get("final", False) for r in check.records] == [False, False, True]
    assert check.records[0]["restored"] == 0 and check.records[1]["verdict"] is None
    assert check.records[-1] == {"iteration": 5, "verdict": NOW, "restored": None, "looks": [NOW, NOW], "final": True}
    off = StartCheck(_scripted([], [], []), CheckConfig(every=2, final=False))
    assert off.finish(t) is None


def test_a_check_at_the_last_iteration_that_goes_back_is_confirmed_on_fresh_noises_at_the_end(tmp_path):
    """A run whose last iteration is a check that prefers the start: the check goes back to the approved state, and
    the end (found by an artist's walk: it asked nothing more and kept nothing) shows that state beside the start on
    noises of its own before delivering it, and hands the state the check took back to ``on_unapproved``."""
    for fresh, restored in ((["now", "now"], 2), (["start"], 0)):
        box, asked, left = [], [], []
        check = StartCheck(_scripted(["now", "now", "start", "start", *fresh], box, asked),
                           CheckConfig(every=2, pictures=2),
                           on_unapproved=lambda tr: left.append((tr.iteration, copy.deepcopy(tr.lora.weights()))))
        t = _trainer(tmp_path / str(restored), check)
        box.append(t)
        w0 = copy.deepcopy(t.lora.weights())
        for _ in range(2):
            t.after_iteration(t.train_step())
        w2 = copy.deepcopy(t.lora.weights())
        for _ in range(2):
            t.after_iteration(t.train_step())
        assert check.records[-1]["restored"] == 2          # the check at the last iteration went back
        reached = check.reached[1]
        rec = check.finish(t)
        assert rec == {"iteration": 4, "verdict": START, "restored": restored, "looks": [], "final": True,
                       "rechecks": [[2, [NOW if v == "now" else START for v in fresh]]]}
        assert [f for _, _, _, f in asked][4:] == [1] * len(fresh)            # the end's looks: fresh noises
        assert torch.equal(_flat(t.lora.weights()), _flat(w2 if restored == 2 else w0))
        assert len(left) == 1 and left[0][0] == 4 and torch.equal(_flat(left[0][1]), _flat(reached))
        assert not torch.equal(_flat(reached), _flat(w2))
        assert check.finish(t) is None and len(asked) == 4 + len(fresh)      # settled: asked nothing again


def test_a_stop_during_the_ends_recheck_keeps_the_state_the_run_reached(tmp_path):
    """Cancel while the end shows an approved state beside the start again: the stop's checkpoint must hold the state
    the run reached, not the one on show (a review found the resumed run then asked about, and kept as
    ``not-preferred``, the approved state under the reached iteration's name)."""
    box, asked, left = [], [], []
    ask = _scripted(["now", "now", "start"], box, asked)

    def stopping(first, second, prompts, iteration, again=False):
        if len(asked) == 3:               # approved at 2 (two looks), the start preferred at the end (one look)
            raise KeyboardInterrupt       # the re-check's first look: Cancel
        return ask(first, second, prompts, iteration, again)

    check = StartCheck(stopping, CheckConfig(every=2, pictures=2), on_unapproved=lambda tr: left.append(tr.iteration))
    t = _trainer(tmp_path, check)
    box.append(t)
    for _ in range(3):
        t.after_iteration(t.train_step())
    w3, opt3 = copy.deepcopy(t.lora.weights()), copy.deepcopy(t.optimizer.state_dict())
    with pytest.raises(KeyboardInterrupt):
        check.finish(t)
    assert left == [3] and torch.equal(_flat(t.lora.weights()), _flat(w3))
    now = t.optimizer.state_dict()["state"]
    assert all(torch.equal(now[i]["exp_avg"], opt3["state"][i]["exp_avg"]) for i in opt3["state"])
    assert not any(r.get("final") for r in check.records)      # the end is checked again when queued again


def test_the_best_lora_is_never_a_state_the_artist_rejected(tmp_path):
    """Evaluations of the states a check took back are passed over for the best LoRA: a best LoRA written from one
    moves aside as ``<run>_best-not-preferred-<iteration>.safetensors`` (kept, named for what it is), and when the
    best evaluation left is of the state gone back to, the best LoRA is that state (found by an artist's walk: the
    judge's best was a state the artist had rejected, beside a run that ended on the base model)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from treegrpo.checkpoint import run_files
    from treegrpo.hacking import best_index

    box, asked = [], []
    check = StartCheck(_scripted(["now", "now", "start", "start"], box, asked), CheckConfig(every=2, pictures=2))
    t = _trainer(tmp_path, check)
    box.append(t)
    scores = iter([0.1, 0.2, 0.3, 0.9, 0.25])     # iterations 0 .. 4: the best at 3, after the state approved at 2
    t.evaluate = lambda **kw: {"iteration": t.iteration, "eval_reward": next(scores)}
    t.cfg.eval_every = 1

    def meta(path):
        with safe_open(str(path), framework="pt") as f:
            return f.metadata()

    t.start_evaluations()
    for _ in range(3):
        t.after_iteration(t.train_step())
    best = t.best_lora_path
    assert meta(best)["treegrpo.best_iteration"] == "3"
    w3 = load_file(best)
    t.after_iteration(t.train_step())             # iteration 4: the check prefers the start -> back to iteration 2
    assert check.records[-1]["restored"] == 2
    # iteration 4's evaluation comes after its check: of the state gone back to, not rejected
    assert [e.get("rejected", False) for e in t.evals] == [False, False, False, True, False]
    aside = tmp_path / "check_best-not-preferred-3.safetensors"
    assert meta(aside)["treegrpo.best_iteration"] == "3" and all(torch.equal(v, w3[k]) for k, v in load_file(aside).items())
    assert best_index(t.evals) == 2 and meta(best)["treegrpo.best_iteration"] == "2"
    now = t.lora_tensors("comfy")                 # the state gone back to, which iteration 2's evaluation scored
    assert all(torch.equal(v, now[k]) for k, v in load_file(best).items())
    assert t.best_set_aside == [(2, str(aside))] and str(aside) in run_files(str(tmp_path), "check")

    # gone back to the start, whose evaluation is the best left: the best LoRA is the start's
    box, asked = [], []
    check = StartCheck(_scripted(["start", "start"], box, asked), CheckConfig(every=2, pictures=2))
    t = _trainer(tmp_path / "b", check)
    box.append(t)
    scores = iter([0.5, 0.6, 0.4])
    t.evaluate = lambda **kw: {"iteration": t.iteration, "eval_reward": next(scores)}
    t.cfg.eval_every = 1
    t.start_evaluations()
    for _ in range(2):
        t.after_iteration(t.train_step())
    assert meta(t.best_lora_path)["treegrpo.best_iteration"] == "0"
    assert os.path.exists(tmp_path / "b" / "check_best-not-preferred-1.safetensors")


def test_the_base_models_pictures_are_sampled_once_per_look(tmp_path, monkeypatch):
    """The base model's side of a look never changes during a run: it is sampled at the first check and reused (the
    second look's noises: once too), the same pictures as sampling it again."""
    import treegrpo.artist.start_check as sc

    box, asked, seen, sampled = [], [], [], []
    ask = _scripted(["now"] * 6, box, asked)

    def spy(first, second, prompts, iteration, again=False):
        seen.append((first, second))
        return ask(first, second, prompts, iteration, again)

    real = sc.check_pictures

    def counting(*a, start=None, **kw):
        sampled.append(start is None)
        return real(*a, start=start, **kw)

    monkeypatch.setattr(sc, "check_pictures", counting)
    check = StartCheck(spy, CheckConfig(every=1, pictures=2))
    t = _trainer(tmp_path, check)
    box.append(t)
    for _ in range(3):
        t.after_iteration(t.train_step())
    assert len(asked) == 6 and sampled == [True, True, False, False, False, False]   # each look's base: once
    for k, again in enumerate([False, True] * 3):
        noise = torch.randn((2, *t.policy.latent_shape()),
                            generator=torch.Generator().manual_seed(424_242 + (7919 if again else 0)))
        base = real(t.policy, ["a red circle"] * 2, noise, t.cfg.tree.steps)[1]
        assert any(torch.equal(side, base) for side in seen[k])


def test_an_artist_who_is_away_at_the_end_keeps_the_state_the_run_reached(tmp_path):
    """Nobody answering (NO_ANSWER) is not a verdict: during the run it changes nothing and asks no second look; at
    the end the run keeps the state it reached and says it was not compared with the start."""
    box, asked = [], []
    scripted = _scripted(["now", "now"], box, asked)
    answers = iter(["scripted", "scripted", NO_ANSWER, NO_ANSWER])

    def ask(first, second, prompts, iteration, again=False):
        a = next(answers)
        return scripted(first, second, prompts, iteration, again) if a == "scripted" else a

    check = StartCheck(ask, CheckConfig(every=2, pictures=2))
    t = _trainer(tmp_path, check)
    box.append(t)
    for _ in range(4):
        t.after_iteration(t.train_step())
    assert check.records[-1] == {"iteration": 4, "verdict": None, "restored": None, "looks": [NO_ANSWER]}
    assert t.history[-1]["check"] == "none"
    t.after_iteration(t.train_step())
    w5 = copy.deepcopy(t.lora.weights())
    rec = check.finish(t)
    assert rec["looks"] == [NO_ANSWER] and rec["restored"] is None and rec["verdict"] is None
    assert torch.equal(_flat(t.lora.weights()), _flat(w5))
    assert any("nobody answered the check at the end" in w and "iteration 2's" in w for w in t.warnings)


def test_a_check_answer_outside_its_choices_is_refused(tmp_path):
    t = _trainer(tmp_path, StartCheck(lambda *a: "left", CheckConfig(every=1, pictures=1)))
    with pytest.raises(ValueError, match="0, 1, None or NO_ANSWER"):
        t.after_iteration(t.train_step())


def test_the_taste_model_learns_a_check_as_one_comparison_of_the_sides_mean_features():
    from treegrpo.artist.taste import OnlineTaste, TasteConfig, TasteModel

    enc = lambda x: x.flatten(1)[:, :3]                       # noqa: E731 -- features: the first 3 values
    online = OnlineTaste(TasteModel(config=TasteConfig(heads=1)), encoder=enc)
    first, second = torch.zeros(4, 3, 2, 2), torch.zeros(4, 3, 2, 2)
    first[:, 0, 0, 0] = torch.tensor([1.0, 2.0, 3.0, 6.0])   # feature 0: mean 3 on the first side, 0 on the second
    assert online.learn_check(first, second, None) is None and online.model.answers == 0
    assert online.learn_check(first, second, 1) is None       # no model yet: no agreement to measure
    t = online.model.trees[-1]
    assert t.pairs == [(1, 0)] and torch.equal(t.features[:, 0], torch.tensor([3.0, 0.0], dtype=torch.float64))
    assert online.model.scores(enc(second)).mean() > online.model.scores(enc(first)).mean()   # it learnt the side
    assert online.learn_check(first, second, 1) == 1.0        # agrees now, counted among the recent agreements
    assert online.agreements == [1.0]
    with pytest.raises(ValueError, match="0, 1 or None"):
        online.learn_check(first, second, 2)


def test_a_side_picture_reads_back_into_its_pictures():
    from treegrpo.artist.start_check import side_picture, side_pictures

    for n in (1, 3, 4, 6):
        pics = torch.rand(n, 3, 5, 7)
        grid = side_picture(pics)
        assert torch.equal(side_pictures(grid, n), pics)
    assert side_picture(torch.rand(6, 3, 5, 7)).shape == (2 * 5 + 2, 4 * 7 + 3 * 2, 3)   # rows of at most 4
    with pytest.raises(ValueError, match="not a side of 3 pictures"):
        side_pictures(torch.rand(5, 30, 3), 3)


def test_a_resumed_runs_taste_model_learns_its_checks_again(tmp_path):
    """What a resumed Train node starts from: the checks the artist answered (artist_checks.jsonl, the sides kept as
    PNGs) count as they did live — one comparison of the sides' mean features each; a check without a pick, with a
    missing picture or of another size is passed over."""
    import json

    from PIL import Image

    from treegrpo.artist.start_check import side_picture
    from treegrpo.artist.taste import TasteConfig, check_features, from_labels

    enc = lambda x: x.flatten(1)[:, :3]                       # noqa: E731
    g = torch.Generator().manual_seed(0)
    (tmp_path / "artist" / "c").mkdir(parents=True)
    recs, sides = [], []
    for i, pick in enumerate((1, 0, None, 1)):
        first, second = torch.rand(4, 3, 6, 6, generator=g), torch.rand(4, 3, 6, 6, generator=g)
        names = []
        for k, side in enumerate((first, second)):
            name = f"artist/c/{i}_{k}.png"
            arr = side_picture(side).mul(255).round().to(torch.uint8).numpy()
            Image.fromarray(arr).save(tmp_path / name)
            names.append(name)
        if i == 3:
            names[1] = "artist/c/missing.png"
        sides.append((first, second))
        recs.append({"iteration": 5 * (i + 1), "prompts": ["p"] * 4, "sides": names, "pick": pick})
    (tmp_path / "artist_checks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + "{damaged\n")
    m = from_labels(tmp_path, enc, TasteConfig(heads=1))
    assert m.answers == 2                                      # checks 0 and 1; 2 had no pick, 3 lost a picture
    # resumed at iteration 5 (its checkpoint written after that iteration's check): the check at 10 came later
    assert from_labels(tmp_path, enc, TasteConfig(heads=1), iteration=5).answers == 1
    assert from_labels(tmp_path, enc, TasteConfig(heads=1), iteration=4).answers == 0
    q = lambda x: x.mul(255).round().div(255)                  # noqa: E731 -- the PNG's 8 bits
    for t, (first, second), pick in zip(m.trees, sides[:2], (1, 0)):
        assert t.pairs == [(pick, 1 - pick)]
        assert torch.allclose(t.features, check_features(enc, q(first), q(second)), atol=1e-6)


def test_a_resumed_run_keeps_its_start_and_the_states_the_artist_approved(tmp_path):
    """Cancel and queue again resumes the run: the guard's start stays the base model's LoRA (not the state it
    resumed with) and the states the artist approved stay approved, read back from the files the checkpoint names;
    only the files a kept checkpoint names stay on disk."""
    import os

    box, asked = [], []
    check = StartCheck(_scripted(["now", "now"], box, asked), CheckConfig(every=2, pictures=2, final=False))
    t = _trainer(tmp_path, check)
    box.append(t)
    t.train(iterations=3)
    w0, w2 = check.guard.initial.weights, check.guard.approved[-1].weights
    opt2 = check.guard.approved[-1].optimizer
    assert check.records[-1]["verdict"] == NOW and check.guard.approved[-1].iteration == 2
    box2, asked2 = [], []
    again = StartCheck(_scripted(["start", "start", "start", "start"], box2, asked2),
                       CheckConfig(every=2, pictures=2, final=False))
    t2 = _trainer(tmp_path, again)
    box2.append(t2)
    t2.train(iterations=4, resume=True)
    assert again.records[-1] == {"iteration": 4, "verdict": START, "restored": 2, "looks": [START, START]}
    assert torch.equal(_flat(t2.lora.weights()), _flat(w2))            # the state approved before the stop
    st = t2.optimizer.state_dict()["state"]
    for k, v in opt2["state"].items():
        assert torch.equal(st[k]["exp_avg"], v["exp_avg"])
    assert any("goes back to iteration 2's" in w for w in t2.warnings)
    t3 = _trainer(tmp_path, StartCheck(_scripted(["start", "start"], box2, asked2),
                                       CheckConfig(every=2, pictures=2, final=False)))
    box2[0] = t3
    t3.train(iterations=6, resume=True)
    rec = t3.callbacks[0].records[-1]
    assert rec["restored"] == 0 and rec["verdict"] == START         # lost again right after going back: the start
    assert torch.equal(_flat(t3.lora.weights()), _flat(w0))         # the base model's LoRA, not iteration 4's
    assert any("where this run started" in w for w in t3.warnings)
    states = tmp_path / "artist" / "states"
    assert sorted(os.listdir(states)) == ["check-0000002.pt", "check-start-0000000.pt"]   # checkpoint 4 names 2's
    t4 = _trainer(tmp_path, StartCheck(_scripted([], box2, asked2), CheckConfig(every=2, pictures=2, final=False)))
    t4.train(iterations=7, resume=True)                              # no check due
    assert sorted(os.listdir(states)) == ["check-start-0000000.pt"]  # the kept checkpoints (6, 7) name the start only
    assert asked2 == [(4, False, "start", 0), (4, True, "start", 0), (6, False, "start", 0), (6, True, "start", 0)]


def test_a_resumed_run_whose_kept_states_are_gone_says_so_and_guards_from_where_it_resumed(tmp_path):
    import os
    import shutil

    box = []
    check = StartCheck(_scripted(["now", "now"], box, []), CheckConfig(every=2, pictures=2, final=False))
    t = _trainer(tmp_path, check)
    box.append(t)
    t.train(iterations=3)
    shutil.rmtree(tmp_path / "artist" / "states")
    box2 = []
    again = StartCheck(_scripted(["start", "start"], box2, []), CheckConfig(every=2, pictures=2, final=False))
    t2 = _trainer(tmp_path, again)
    box2.append(t2)
    w3 = None
    from treegrpo.callbacks import TrainerCallback

    class Keep(TrainerCallback):      # the state the run resumed with (iteration 3's), before iteration 4
        def on_train_begin(self, trainer):
            nonlocal w3
            w3 = copy.deepcopy(trainer.lora.weights())

    t2.callbacks.insert(0, Keep())
    t2.train(iterations=4, resume=True)
    assert torch.equal(_flat(t2.lora.weights()), _flat(w3))
    assert any("could not be read" in w and "iteration 3" in w for w in t2.warnings), t2.warnings
    assert os.path.isdir(tmp_path / "artist" / "states")


def test_a_finished_run_queued_again_ends_as_it_ended_and_asks_nothing(tmp_path):
    """The end took the LoRA back to an approved state (the end's check lost, the re-check of iteration 2's won);
    queued again, the run has nothing left to train: its end is not checked again, the LoRA stays iteration 2's and
    the state the end took back (kept by ``on_unapproved``) is not written over."""
    box, asked, kept = [], [], []
    check = StartCheck(_scripted(["now", "now", "start", "now", "now"], box, asked),
                       CheckConfig(every=2, pictures=2), on_unapproved=lambda t: kept.append(t.iteration))
    t = _trainer(tmp_path, check)
    box.append(t)
    t.train(iterations=3)
    assert check.records[-1]["final"] and check.records[-1]["restored"] == 2 and kept == [3], (check.records, asked)
    w2 = copy.deepcopy(t.lora.weights())
    box2 = []
    again = StartCheck(_scripted([], box2, []), CheckConfig(every=2, pictures=2),
                       on_unapproved=lambda t: pytest.fail("the end was settled"))
    t2 = _trainer(tmp_path, again)
    box2.append(t2)
    t2.train(iterations=3, resume=True)
    assert torch.equal(_flat(t2.lora.weights()), _flat(w2))


def test_a_check_cut_by_a_stop_is_made_when_the_run_resumes(tmp_path):
    """Cancel while the check at 2 waits: the checkpoint holds iteration 2 without its check; the resumed run
    checks at once (before iteration 3) and its verdict goes to iteration 2's record."""
    class Stop(Exception):
        pass

    def ask(*a, **k):
        raise Stop()

    t = _trainer(tmp_path, StartCheck(ask, CheckConfig(every=2, pictures=2, final=False)))
    with pytest.raises(Stop):
        t.train(iterations=4)
    box, asked = [], []
    again = StartCheck(_scripted(["start", "start"], box, asked), CheckConfig(every=2, pictures=2, final=False))
    t2 = _trainer(tmp_path, again)
    box.append(t2)
    t2.train(iterations=3, resume=True)
    assert [(i, a) for i, a, _, _ in asked] == [(2, False), (2, True)]
    rec2 = next(h for h in t2.history if h["iteration"] == 1)          # the record of the 2nd iteration
    assert rec2["check"] == START and rec2["check_restored"] == 0 and len(t2.history) == 3


def test_a_run_begun_without_checks_resumed_with_them_says_what_they_go_back_to(tmp_path, caplog):
    """A checkpoint without a guard (a run begun with artist_check_every 0, or by a version before the checks):
    the resumed run says once that its checks begin now and go back no further than where it resumed; a run that
    had them from the start says nothing of the kind."""
    import logging

    t = _trainer(tmp_path)
    t.train(iterations=2)
    check = StartCheck(_scripted(["now", "now"], [], []), CheckConfig(every=5, pictures=2, final=False))
    t2 = _trainer(tmp_path, check)
    with caplog.at_level(logging.WARNING):
        t2.train(iterations=3, resume=True)
    said = [m for m in caplog.messages if "checks against the start begin at iteration 2" in m]
    assert len(said) == 1 and "goes back to the state the run resumed from" in said[0]
    caplog.clear()
    fresh = StartCheck(_scripted(["now", "now"], [], []), CheckConfig(every=5, pictures=2, final=False))
    with caplog.at_level(logging.WARNING):
        _trainer(tmp_path / "b", fresh).train(iterations=1)
    assert not [m for m in caplog.messages if "checks against the start begin" in m]
