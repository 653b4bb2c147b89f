"""Reward-hacking signals on constructed images with known values; the warnings on constructed runs; the best
checkpoint chosen by the held-out judge."""
import math

import pytest
import torch

from treegrpo import hacking


def test_high_frequency_energy_of_known_patterns():
    h = w = 16
    flat = torch.full((1, 3, h, w), 0.4)
    assert hacking.high_frequency_energy(flat).item() == 0.0
    y, x = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    checker = ((x + y) % 2).float().expand(1, 3, h, w)                 # ±0.5 around its mean, at Nyquist
    assert hacking.high_frequency_energy(checker).item() == pytest.approx(3 * 0.25)
    slow = (0.5 + 0.4 * torch.cos(2 * math.pi * x / 16)).expand(1, 3, h, w)  # 1/16 cycles/pixel: outside
    assert hacking.high_frequency_energy(slow).item() == pytest.approx(0.0, abs=1e-9)
    fast = (0.5 + 0.4 * torch.cos(2 * math.pi * 6 * x / 16)).expand(1, 3, h, w)  # 3/8 cycles/pixel: inside
    assert hacking.high_frequency_energy(fast).item() == pytest.approx(3 * 0.4 ** 2 / 2, rel=1e-5)
    stripes = (0.5 + 0.1 * torch.cos(math.pi * y)).expand(1, 3, h, w)   # horizontal lines, period 2 px
    assert hacking.high_frequency_energy(stripes).item() == pytest.approx(3 * 0.1 ** 2, rel=1e-5)
    both = (0.5 + 0.4 * torch.cos(2 * math.pi * x / 16) + 0.1 * torch.cos(math.pi * y)).expand(1, 3, h, w)
    assert hacking.high_frequency_energy(both).item() == pytest.approx(3 * 0.1 ** 2, rel=1e-5)  # the shape adds 0


def test_saturation_and_extremes_of_known_images():
    img = torch.zeros(1, 3, 2, 2)
    img[0, :, 0, 0] = torch.tensor([1.0, 0.0, 0.0])       # pure red: 1
    img[0, :, 0, 1] = torch.tensor([0.5, 0.25, 0.25])     # 0.5
    img[0, :, 1, 0] = torch.tensor([0.6, 0.6, 0.6])       # grey: 0
    img[0, :, 1, 1] = 0.0                                 # black: 0 (and near-black)
    assert hacking.saturation(img).item() == pytest.approx(1.5 / 4)
    assert hacking.near_black(img).item() == pytest.approx(0.25)
    assert hacking.near_white(img).item() == 0.0
    assert hacking.near_white(torch.ones(2, 3, 4, 4)).tolist() == [1.0, 1.0]


def test_diversity_is_the_mean_pairwise_rms_distance_within_a_prompt():
    a = torch.zeros(1, 3, 4, 4)
    same = torch.cat([a, a, a + 0.2, a + 0.2])             # two prompts, two identical images each
    assert hacking.diversity(same, 2) == 0.0
    apart = torch.cat([a, a + 0.3, a, a + 0.1])            # distances 0.3 and 0.1
    assert hacking.diversity(apart, 2) == pytest.approx(0.2)
    assert hacking.diversity(apart, 1) == 0.0


def _run(rewards, judges=None, diversity=None, hf=None):
    out = []
    for i, r in enumerate(rewards):
        e = {"iteration": 10 * i, "eval_reward": r, "eval_diversity": (diversity or [0.2] * len(rewards))[i],
             "eval_hf_energy": (hf or [0.1] * len(rewards))[i]}
        if judges is not None:
            e["eval_judge"] = judges[i]
        out.append(e)
    return out


def warn(evals):
    return hacking.hacking_warnings(evals, judge_drop=0.03, diversity_floor=0.5, hf_ceiling=1.5)


def test_the_warning_fires_when_the_judge_falls_while_the_reward_rises():
    hacked = _run([0.5, 0.6, 0.7, 0.8], judges=[0.5, 0.6, 0.58, 0.52])
    found = warn(hacked)
    assert len(found) == 1 and "held-out judge fell from 0.600 (iteration 10) to 0.520" in found[0]
    assert warn(hacked[:3]) == []                                   # 0.02 below the best: within the noise
    assert warn(_run([0.5, 0.6, 0.7, 0.8], judges=[0.5, 0.55, 0.62, 0.66])) == []   # healthy: both rise
    assert warn(_run([0.5, 0.6, 0.5, 0.45], judges=[0.5, 0.6, 0.5, 0.45])) == []     # both fall: no hacking
    assert warn(_run([0.5, 0.6, 0.7])) == []                                        # no judge


def test_the_warning_fires_on_collapsed_diversity_and_a_new_texture():
    assert "diversity fell to 0.0900" in warn(_run([0.5, 0.7], diversity=[0.2, 0.09]))[0]
    assert warn(_run([0.5, 0.7], diversity=[0.2, 0.11])) == []
    assert "high-frequency energy rose to 0.1600" in warn(_run([0.5, 0.7], hf=[0.1, 0.16]))[0]
    assert warn(_run([0.5, 0.7], hf=[0.1, 0.14])) == []
    assert hacking.hacking_warnings(_run([0.5, 0.7], hf=[0.1, 0.9]), judge_drop=0, diversity_floor=0,
                                    hf_ceiling=0) == []


def test_a_check_that_keeps_failing_is_said_once_and_its_end_after_the_quiet_evaluations():
    """Diversity (base 0.2, floor 0.1) fails at evaluations 2-4, passes at 5, fails at 6 (within the quiet
    stretch: not said again), then passes from 7 on: the warning at 2, its end at 6 + 5 = 11; it fails again at 12
    and is said again. High-frequency energy fails at 3 only. Each evaluation is read as a resumed run reads it:
    from the records alone."""
    div = [0.2, 0.15, 0.05, 0.06, 0.07, 0.12, 0.08] + [0.15] * 5 + [0.05]
    hf = [0.1] * 3 + [0.2] + [0.1] * 9
    evals = _run([0.5] * len(div), diversity=div, hf=hf)
    limits = dict(judge_drop=0.03, diversity_floor=0.5, hf_ceiling=1.5)
    said = {i: hacking.warning_changes(evals[:i + 1], quiet=5, **limits) for i in range(len(evals))}
    started = {i: s for i, (s, _) in said.items() if s}
    ended = {i: e for i, (_, e) in said.items() if e}
    assert sorted(started) == [2, 3, 12]
    assert [w[:26] for w in started[2]] == ["diversity fell to 0.0500, "] and started[12][0].startswith("diversity")
    assert started[3] == [hacking.hacking_warnings(evals[:4], **limits)[1]]      # texture, on top of diversity
    assert ended == {8: ["high-frequency energy has passed its check at the last 5 evaluations"],
                     11: ["diversity has passed its check at the last 5 evaluations"]}
    # every failing evaluation still carries its warnings (the record is the state; the log says the changes)
    assert [i for i in range(len(evals)) if hacking.hacking_checks(evals[:i + 1], **limits)] == [2, 3, 4, 6, 12]
    assert hacking.warning_changes(evals[:1], **limits) == ([], [])


def test_best_index_prefers_the_held_out_judge():
    evals = _run([0.5, 0.6, 0.9], judges=[0.5, 0.7, 0.6])
    assert hacking.best_index(evals) == 1
    assert hacking.best_index(_run([0.5, 0.9, 0.6])) == 1
    assert hacking.best_index([]) is None


def test_the_best_checkpoint_is_the_one_with_the_best_held_out_score(tmp_path):
    """A judge with scripted scores (best at the second of five evaluations): the run keeps that evaluation's
    LoRA in <run>_best.safetensors, with its iteration in the metadata, and warns once the judge has fallen."""
    from treegrpo import cli
    from treegrpo.backends import load_policy
    from treegrpo.config import TrainConfig
    from treegrpo.lora import read_lora_file
    from treegrpo.trainer import Trainer

    d = cli.demo_config_dict()
    d.update(iterations=8, eval_every=2, prompts_per_iter=4, eval_seeds=2, eval_prompts=d["prompts"][:2],
             output_dir=str(tmp_path), eval_rewards=[{"name": "scripted"}], checkpoint_every=0)
    d["optim"] = dict(d["optim"], lr=3e-2, kl_beta=0.0)   # hot and unregularised: the reward rises fast
    cfg = TrainConfig.from_dict(d)
    scores = iter([0.5, 0.8, 0.6, 0.55, 0.5])     # evaluations at iterations 0, 2, 4, 6, 8
    snapshots = {}

    class Scripted:
        def __call__(self, images, prompts):
            snapshots[trainer.iteration] = trainer.lora_tensors("comfy")
            return torch.full((len(prompts),), next(scores))

    policy, name = load_policy(cfg)
    from treegrpo.rewards.base import load_reward
    rewards = {"demo_adherence": load_reward("demo_adherence")}
    trainer = Trainer(cfg, policy, rewards, progress=False, base_model_name=name, judges={"scripted": Scripted()})
    logged = []
    trainer.log = logged.append
    summary = trainer.train()
    assert [e["iteration"] for e in trainer.evals] == [0, 2, 4, 6, 8]
    assert summary["best_eval"]["iteration"] == 2 and summary["best_eval"]["eval_judge"] == pytest.approx(0.8)
    tensors, meta = read_lora_file(str(tmp_path / "treegrpo_demo_best.safetensors"))
    assert meta["treegrpo.best_iteration"] == "2" and meta["treegrpo.best_metric"] == "eval_judge"
    assert tensors.keys() == snapshots[2].keys()
    assert all(torch.equal(tensors[k], snapshots[2][k]) for k in tensors)
    assert not all(torch.equal(tensors[k], snapshots[8][k]) for k in tensors)     # not the last LoRA
    # the warning fires at exactly the evaluations whose training reward is above the one at the judge's best
    expected = [e["iteration"] for e in trainer.evals[2:] if e["eval_reward"] > trainer.evals[1]["eval_reward"]]
    warned = [e["iteration"] for e in trainer.evals if any("held-out judge fell" in w for w in e.get("warnings", []))]
    assert warned == expected and expected, [(e["iteration"], e["eval_reward"]) for e in trainer.evals]
    # the log says it when it starts, not again within the quiet evaluations after a failing one
    flags = ["held-out judge fell" in " ".join(e.get("warnings", [])) for e in trainer.evals]
    starts = [i for i, f in enumerate(flags) if f and not any(flags[max(0, i - hacking.QUIET_EVALUATIONS):i])]
    assert sum("held-out judge fell" in w for w in logged) == len(starts) >= 1
    # each warning line names its run (the demo prints its baseline's warnings beside the tree's)
    assert all(w.startswith(f"TreeGRPO {cfg.run_name} warning (iteration ") for w in logged if "held-out judge" in w)
    for e in trainer.evals:   # every signal is logged at every evaluation
        assert {"eval_diversity", "eval_hf_energy", "eval_saturation", "eval_near_black", "eval_near_white",
                "eval_kl", "eval_judge", "judge/scripted"} <= set(e)
    assert trainer.evals[0]["eval_kl"] == pytest.approx(0.0, abs=1e-9)      # LoRA up-weights start at zero
    assert trainer.evals[-1]["eval_kl"] > 0


def test_signals_title_is_the_newest_evaluations_state():
    from treegrpo.report import signals_title
    judge = "the held-out judge fell 0.12 below its best while the training reward rose"
    long = "x" * 150
    ok = {"iteration": 0}
    assert signals_title([]) is None and signals_title([ok, {"iteration": 10}]) is None
    assert signals_title([ok, {"iteration": 10, "warnings": [judge]}]) == ("warning: " + judge, "firebrick")
    text, colour = signals_title([ok, {"iteration": 10, "warnings": [long, judge, judge]}])
    assert text == "warning: " + "x" * 110 + "... (+2 more)" and colour == "firebrick"
    # a check that passes again no longer reads as failing: the title names the last warning's iteration in grey
    evals = [ok, {"iteration": 10, "warnings": [judge]}, {"iteration": 20, "warnings": [judge]}, {"iteration": 30}]
    assert signals_title(evals) == ("the hacking checks pass now (last warning at iteration 20)", "dimgrey")


def test_the_before_after_picture_says_which_side_is_which():
    """The Train node's samples_before_after.png: both grids copied in unchanged, the right one beside the left,
    a title over each and a label beside each row (drawn: dark pixels where the text goes, none elsewhere)."""
    from treegrpo.report import labelled_pair

    gen = torch.Generator().manual_seed(0)
    left, right = torch.rand(3, 40, 60, generator=gen), torch.rand(3, 40, 30, generator=gen)
    out = labelled_pair(left, right, ("base model (iteration 0)", "LoRA at iteration 12"), ["a red circle", "a cat"])
    band, h = 18, 40
    x_left = next(x for x in range(out.shape[2] - 59) if torch.equal(out[:, band:, x:x + 60], left))
    assert out.shape[:2] == (3, band + h) and torch.equal(out[:, band:, x_left + 68:x_left + 98], right)
    # the right title is wider than its 30-pixel grid: the picture widens for it (it was cut off)
    dark_title = (out.mean(0) < 0.5)[:band, x_left + 98:]
    assert out.shape[2] > x_left + 98 and dark_title.any() and not dark_title[:, -2:].any()
    dark = out.mean(0) < 0.5
    assert dark[:band, x_left:x_left + 60].any() and dark[:band, x_left + 68:].any()     # the two titles
    assert dark[band:band + h // 2, :x_left - 8].any() and dark[band + h // 2:, :x_left - 8].any()   # a label a row
    assert not dark[:band, :x_left].any()      # nothing above the labels
    bare = labelled_pair(left, right, ("a", "b"))
    assert torch.equal(bare[:, band:, :60], left)                                        # no labels, no margin
