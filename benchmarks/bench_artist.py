"""The artist's time: how many answers each way of asking needs before the samples show a hidden taste.

The artist demo's settings (workflows/treegrpo_artist_demo_cpu.json: 'a red circle', 2 trees of 4 leaves per
iteration, window 2, branch 2, noise level 0.9, LoRA rank 8, lr 1e-3; ``--kl`` the KL weight, 0 before issue 50) on
the core trainer. The simulated artist has a hidden taste the trainer never sees (``--taste``, one of
treegrpo/demo/tastes.py: ``big`` — the browser test's scripted artist —, ``small``, ``left``, ``right``, ``up``,
``warm``, ``cool``; each worth 0 for an empty picture and less for a fading one). It answers in favourites mode with the leaf
the taste values most, and with probability ``--error`` (15 %) with another leaf drawn at random.

Strategies, each for ``--iterations`` iterations, paired per seed (same seeds, same evaluation noises):

* ``oracle``: trained on the hidden taste itself (every leaf's value as its reward; no answers);
* ``every``: the artist asked about every tree (issue 33);
* ``unsure``: the taste model (treegrpo/artist/taste.py on the demo's built-in features), the artist asked where it may be
  wrong (``ask_reason``; ``--old-rule``: the heads' disagreement alone, as before issue 50); the other trees are
  scored by the model, or not trained on when they lie beyond the answers and no question is left;
* ``random``: the same model, the artist asked about trees drawn at random at the rate ``unsure`` ended with;
* ``d3po``: D3PO-style pairs: two trajectories from one shared initial noise without a shared denoising prefix (SDE
  from the first step), one pick per pair, every pair asked (the same GRPO update on them).

After every iteration the taste's mean value over 64 ODE samples from fixed noises is measured; the target is 70 % of
the gain ``oracle`` reaches in the same iterations (per seed; a seed where the oracle gains nothing has no target).
Reported: the answers each strategy has given when it first reaches the target (first passage), their ratios
(unsure / every, every / d3po) paired per seed, every strategy's final value per seed and how many seeds end below the
base model, and the taste model's refit time, reasons to ask, warnings and agreement with the artist's next answers.

    python benchmarks/bench_artist.py [--taste big] [--kl 0.1] [--seeds 8] [--first-seed 0] [--iterations 40]
                                      [--error 0.15] [--only every --only unsure ...] [--out results/artist.json]
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

import torch  # noqa: E402

from treegrpo import cli  # noqa: E402
from treegrpo.artist.answers import Answer, pairwise_wins, win_rates  # noqa: E402
from treegrpo.backends import load_policy  # noqa: E402
from treegrpo.config import TrainConfig  # noqa: E402
from treegrpo.demo.tastes import TASTES, taste as taste_fn  # noqa: E402
from treegrpo.io import atomic_write_json  # noqa: E402
from treegrpo.scores import LeafScores  # noqa: E402
from treegrpo.artist.start_check import CheckConfig, StartCheck  # noqa: E402
from treegrpo.artist.taste import OnlineTaste, TasteConfig, TasteModel  # noqa: E402
from treegrpo.artist.features import DemoEncoder  # noqa: E402
from treegrpo.trainer import Trainer  # noqa: E402
from treegrpo.tree import sample_ode  # noqa: E402

PROMPT = "a red circle"
EVAL_N, EVAL_SEED = 64, 123
# the end of a run against the base model, paired on noises of its own: 64 pictures place a run's end within about
# ±0.1 of the base on a taste whose pictures score 0 or 0.6 (an empty shape or a clear one), 256 within ±0.05
END_N, END_SEED = 256, 321
STRATEGIES = ("oracle", "every", "unsure", "random", "d3po")
TARGET_FRACTION = 0.7


def artist_demo_config(seed: int, iterations: int, output_dir: str, strategy: str = "every",
                       kl_beta: float = 0.1) -> TrainConfig:
    """The artist demo workflow's settings on the core trainer (``d3po``: independent SDE pairs instead of trees)."""
    d = cli.demo_config_dict()
    d.update(prompts=[PROMPT], prompts_per_iter=2, trees_per_prompt=1, iterations=iterations, eval_every=0,
             seed=seed, output_dir=output_dir, run_name=f"bench_artist_{strategy}_{seed}", checkpoint_every=0)
    d["tree"].update(window_start=1, window_width=2, branch=2, noise_level=0.9)
    if strategy == "d3po":
        steps = d["tree"]["steps"]
        d["tree"].update(method="trajectory", group_size=2, window_start=0, window_width=steps, tail_steps=0)
    d["optim"].update(lr=1e-3, clip_range=1e-4, kl_beta=kl_beta)
    d["advantage"].update(backup="softmax", flat_floor=0.0)
    return TrainConfig.from_dict(d)


class SimulatedArtist:
    """Favourites with one pick: the leaf the hidden taste values most, or with probability ``error`` another leaf
    at random. Checks against the start: :meth:`check` (no preference below a difference of ``margin``)."""

    def __init__(self, error: float, seed: int, taste: str = "big", margin: float = 0.05):
        self.error, self.margin = error, margin
        self.value = taste_fn(taste)
        self.g = torch.Generator().manual_seed(10_000 + seed)
        self.answers = 0

    def pairs(self, images: torch.Tensor) -> list[tuple[int, int]]:
        area = self.value(images)
        pick = int(area.argmax())
        if len(area) > 1 and float(torch.rand((), generator=self.g)) < self.error:
            others = [i for i in range(len(area)) if i != pick]
            pick = others[int(torch.randint(len(others), (), generator=self.g))]
        self.answers += 1
        return pairwise_wins(Answer("favourites", good=(pick,)), len(area))

    def check(self, first: torch.Tensor, second: torch.Tensor, prompts, iteration) -> int | None:
        """A check against the start (treegrpo/artist/start_check.py): the side whose pictures the hidden taste values
        more on average by at least ``margin``, else no preference (None); with probability ``error`` one of the
        other two answers instead, at random."""
        diff = float(self.value(second).mean()) - float(self.value(first).mean())
        answer = 1 if diff >= self.margin else 0 if diff <= -self.margin else None
        if float(torch.rand((), generator=self.g)) < self.error:
            others = [a for a in (0, 1, None) if a != answer]
            answer = others[int(torch.randint(2, (), generator=self.g))]
        self.answers += 1
        return answer


def make_hook(strategy: str, artist: SimulatedArtist, taste: OnlineTaste | None):
    """The leaf scorer (treegrpo.scores) of a strategy: leaf rewards for the batch."""

    def hook(ctx, batch, images, raw):
        images = images.float()
        leaf_tree = batch.leaf_tree.cpu()
        if strategy == "oracle":
            return LeafScores({"artist": artist.value(images)}, {"artist": 1.0})
        if strategy in ("every", "d3po"):
            rewards = torch.zeros(len(leaf_tree))
            for t in range(batch.n_trees):
                idx = (leaf_tree == t).nonzero().flatten()
                rewards[idx] = win_rates(artist.pairs(images[idx]), len(idx))
            return LeafScores({"artist": rewards}, {"artist": 1.0})

        def ask(t):
            return artist.pairs(images[(leaf_tree == t).nonzero().flatten()])

        rewards, exclude, stats = taste.round(images, leaf_tree, ask)
        return LeafScores({"artist": rewards}, {"artist": 1.0}, exclude, stats=stats)

    return hook


def eval_values(policy, noise: torch.Tensor, steps: int, value=None) -> torch.Tensor:
    """The hidden taste's value (default ``big``: the shape's area) of each ODE sample from ``noise`` (N,)."""
    with torch.no_grad():
        imgs = policy.decode(sample_ode(policy, [PROMPT] * len(noise), noise, steps, 1.0))
    return (value or taste_fn("big"))(imgs).float()


def paired_se(end: torch.Tensor, start: torch.Tensor) -> float:
    """The standard error of the mean of the per-noise differences ``end − start`` (N,): how precisely the
    evaluation pictures place the run's end above or below the base model."""
    d = (end - start).double()
    return float(d.std(unbiased=True) / math.sqrt(len(d))) if len(d) > 1 else float("nan")


def run(strategy: str, seed: int, iterations: int, error: float, output_dir: str, taste_cfg: TasteConfig,
        ask_rate: float = 1.0, encoder=None, taste: str = "big", kl_beta: float = 0.1, check_every: int = 0,
        learn_checks: bool = True, final_check: bool = True, check_pictures: int = CheckConfig.pictures,
        eval_n: int = EVAL_N) -> dict:
    """One simulated run: after each iteration (answers so far, the hidden taste's mean value on ``eval_n``
    evaluation pictures); taste statistics.
    ``check_every``: a check against the start every that many iterations (0: none; not for ``oracle``), each one
    answer of the artist; ``learn_checks``: the taste model also learns from them (``OnlineTaste.learn_check``)."""
    cfg = artist_demo_config(seed, iterations, output_dir, strategy, kl_beta)
    policy, _ = load_policy(cfg)
    artist = SimulatedArtist(error, seed, taste)
    online = None
    if strategy in ("unsure", "random"):
        encoder = encoder or DemoEncoder()
        online = OnlineTaste(TasteModel(config=taste_cfg, features="demo", groups=tuple(getattr(encoder, "groups", ()))),
                             encoder=encoder)
    check = None
    if check_every and strategy != "oracle":
        def ask_check(first, second, prompts, iteration, again=False):
            pick = artist.check(first, second, prompts, iteration)
            if online is not None and learn_checks:
                online.learn_check(first.float(), second.float(), pick)
            return pick

        check = StartCheck(ask_check, CheckConfig(every=check_every, seed=seed, final=final_check,
                                                  pictures=check_pictures))
    trainer = Trainer(cfg, policy, {"demo_adherence": lambda im, p: torch.zeros(len(p))}, progress=False,
                      callbacks=[check] if check is not None else [])
    if strategy == "random":
        g = torch.Generator().manual_seed(20_000 + seed)
        online.decide = lambda scores, seen, asked, c: (seen < c.warmup_trees or scores is None
                                                       or float(torch.rand((), generator=g)) < ask_rate)
    trainer.leaf_scorer = make_hook(strategy, artist, online)
    noise = torch.randn((eval_n, *policy.latent_shape()), generator=torch.Generator().manual_seed(EVAL_SEED))
    base_values = values = eval_values(policy, noise, cfg.tree.steps, artist.value)   # (eval_n,) now
    curve = [(0, float(values.mean()))]
    fits, agree, reasons, warnings, novelty = [], [], {}, [], []
    t0 = time.perf_counter()
    for _ in range(iterations):
        stats = trainer.train_step()
        trainer.after_iteration(stats)
        values = eval_values(policy, noise, cfg.tree.steps, artist.value)
        curve.append((artist.answers, float(values.mean())))
        st = stats if "taste_asked" in stats else None
        if st:
            if st["taste_asked"]:
                fits.append(st["taste_fit_s"])
            if st["taste_agreement"] is not None:
                agree.append((artist.answers, st["taste_agreement"]))
            for k, v in st.get("taste_reasons", {}).items():
                reasons[k] = reasons.get(k, 0) + v
            warnings += [(len(curve) - 1, w) for w in st.get("taste_warnings", [])]
            novelty.append(st.get("taste_novelty"))
            reasons["beyond"] = reasons.get("beyond", 0) + st.get("taste_beyond", 0)
    if check is not None and check.finish(trainer) is not None:   # the end of the run (StartCheck.finish)
        values = eval_values(policy, noise, cfg.tree.steps, artist.value)
        curve.append((artist.answers, float(values.mean())))
    end_se = paired_se(values, base_values)
    end_noise = torch.randn((END_N, *policy.latent_shape()), generator=torch.Generator().manual_seed(END_SEED))
    end_values = eval_values(policy, end_noise, cfg.tree.steps, artist.value)
    with policy.lora_disabled():
        end_base = eval_values(policy, end_noise, cfg.tree.steps, artist.value)
    end_eval = {"n": END_N, "base": float(end_base.mean()), "end": float(end_values.mean()),
                "se": paired_se(end_values, end_base)}
    trees = iterations * cfg.prompts_per_iter
    return {"strategy": strategy, "seed": seed, "taste": taste, "kl_beta": kl_beta, "curve": curve, "answers": artist.answers, "trees": trees,
            "ask_rate": artist.answers / trees if strategy != "oracle" else 0.0,
            "fit_s": statistics.fmean(fits) if fits else None, "agreement": agree, "reasons": reasons,
            "warnings": warnings, "novelty": novelty, "check_every": check_every,
            "checks": check.records if check is not None else [], "end_se": end_se, "end_eval": end_eval,
            "seconds": time.perf_counter() - t0}


def first_passage(curve: list[tuple[int, float]], target: float) -> float:
    """Answers at which the mean area first rose by ``target`` over the start (nan if never)."""
    base = curve[0][1]
    return next((float(n) for n, a in curve if a - base >= target), float("nan"))


def gain_at(curve: list[tuple[int, float]], answers: int) -> float:
    """The gain of the first point with at least ``answers`` answers (the last point if none)."""
    return next((a for n, a in curve if n >= answers), curve[-1][1]) - curve[0][1]


def summary(values: list[float]) -> dict:
    ok = [v for v in values if not math.isnan(v)]
    return {"mean": statistics.fmean(ok) if ok else float("nan"),
            "sd": statistics.stdev(ok) if len(ok) > 1 else 0.0,
            "min": min(ok) if ok else float("nan"), "max": max(ok) if ok else float("nan"),
            "reached": f"{len(ok)}/{len(values)}", "values": values}


def report(runs: list[dict], fraction: float = TARGET_FRACTION) -> dict:
    """Per strategy: answers to the target (70 % of the oracle's gain, per seed) and the paired ratios."""
    by = {(r["strategy"], r["seed"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    strategies = [s for s in STRATEGIES if any(r["strategy"] == s for r in runs)]
    out = {"target_fraction": fraction, "strategies": {}, "ratios": {}}
    targets = {}
    for s in seeds:
        o = by.get(("oracle", s))
        if o is not None and o["curve"][-1][1] > o["curve"][0][1]:    # no gain to reach where the oracle has none
            targets[s] = fraction * (o["curve"][-1][1] - o["curve"][0][1])
    for name in strategies:
        if name == "oracle":
            gains = [by[("oracle", s)]["curve"][-1][1] - by[("oracle", s)]["curve"][0][1] for s in seeds
                     if ("oracle", s) in by]
            out["strategies"][name] = {"gain": summary(gains)}
            continue
        vals = [first_passage(by[(name, s)]["curve"], targets[s]) if (name, s) in by and s in targets
                else float("nan") for s in seeds]
        rs = [by[(name, s)] for s in seeds if (name, s) in by]
        entry = {"answers_to_target": summary(vals), "ask_rate": statistics.fmean(r["ask_rate"] for r in rs),
                 "final_gain": summary([r["curve"][-1][1] - r["curve"][0][1] for r in rs]),
                 "final_value": [r["curve"][-1][1] for r in rs],
                 "below_base": sum(r["curve"][-1][1] < r["curve"][0][1] for r in rs),
                 "worst_vs_base": min(r["curve"][-1][1] - r["curve"][0][1] for r in rs),
                 # below the base by more than two standard errors of the paired evaluation (runs that record it)
                 "below_base_2se": sum(r["curve"][-1][1] - r["curve"][0][1] < -2 * r["end_se"] for r in rs
                                       if r.get("end_se") is not None)}
        ends = [r["end_eval"] for r in rs if r.get("end_eval")]
        if ends:     # the paired end evaluation on END_N noises of its own: end − base, below it, beyond 2 SE
            diffs = [e["end"] - e["base"] for e in ends]
            entry["end_eval"] = {"n": ends[0]["n"], "diff": summary(diffs), "se": [e["se"] for e in ends],
                                 "below_base": sum(d < 0 for d in diffs),
                                 "below_base_2se": sum(d < -2 * e["se"] for d, e in zip(diffs, ends)),
                                 "worst": min(diffs)}
        fits = [r["fit_s"] for r in rs if r.get("fit_s")]
        if fits:
            entry["fit_s"] = statistics.fmean(fits)
            ag = [a for r in rs for _, a in r["agreement"][len(r["agreement"]) // 2:]]
            entry["agreement_late"] = statistics.fmean(ag) if ag else None
        out["strategies"][name] = entry

    def ratio(a, b):
        """Paired per seed. A seed where ``a`` never reached the target: nan (it fails any ratio target). Where only
        ``b`` never did, it would need more than all its answers: ``x / (b's answers)`` is an upper bound, counted
        (``bounded``)."""
        va = out["strategies"].get(a, {}).get("answers_to_target", {}).get("values")
        vb = out["strategies"].get(b, {}).get("answers_to_target", {}).get("values")
        if not va or not vb:
            return None
        vals, bounded = [], 0
        for s, x, y in zip(seeds, va, vb):
            if math.isnan(x):
                vals.append(float("nan"))
            elif math.isnan(y):
                vals.append(x / by[(b, s)]["answers"])
                bounded += 1
            else:
                vals.append(x / y if y > 0 else float("nan"))
        return dict(summary(vals), bounded=bounded)

    out["ratios"] = {"unsure/every": ratio("unsure", "every"), "random/every": ratio("random", "every"),
                     "every/d3po": ratio("every", "d3po")}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--error", type=float, default=0.15, help="probability that an answer is wrong")
    ap.add_argument("--taste", default="big", choices=sorted(TASTES), help="the simulated artist's hidden taste "
                    "(treegrpo/demo/tastes.py)")
    ap.add_argument("--kl", type=float, default=0.1, help="optim.kl_beta of every strategy (the artist workflows' "
                    "0.1; the results before issue 50 used 0)")
    ap.add_argument("--only", action="append", choices=STRATEGIES, help="strategies to run (default: all)")
    ap.add_argument("--confident", type=float, default=TasteConfig.confident)
    ap.add_argument("--warmup", type=int, default=TasteConfig.warmup_trees)
    ap.add_argument("--heads", type=int, default=TasteConfig.heads)
    ap.add_argument("--l2", type=float, default=TasteConfig.l2)
    ap.add_argument("--max-ask-rate", type=float, default=TasteConfig.max_ask_rate)
    ap.add_argument("--novelty", type=float, default=TasteConfig.novelty)
    ap.add_argument("--min-ask-rate", type=float, default=TasteConfig.min_ask_rate)
    ap.add_argument("--agreement-floor", type=float, default=TasteConfig.agreement_floor)
    ap.add_argument("--diversity-floor", type=float, default=TasteConfig.diversity_floor)
    ap.add_argument("--old-rule", action="store_true", help="the rule before issue 50: the heads' disagreement only "
                    "(novelty, floor rate, agreement and diversity off)")
    ap.add_argument("--check-every", type=int, default=0, help="a check against the start (treegrpo/artist/start_check.py) "
                    "every that many iterations, each one answer (0: none)")
    ap.add_argument("--no-learn-checks", action="store_true", help="the taste model does not learn from the checks")
    ap.add_argument("--check-pictures", type=int, default=CheckConfig.pictures, help="pictures per side of a check")
    ap.add_argument("--no-final-check", action="store_true", help="the run ends on the state it reached (no final "
                    "check keeping only a state the artist preferred to the start)")
    ap.add_argument("--eval-n", type=int, default=EVAL_N, help="evaluation pictures behind each point of a run's "
                    "curve")
    ap.add_argument("--report", default=None, help="only recompute the report of this results file")
    ap.add_argument("--merge", nargs="+", metavar="ARTIST_JSON", help="pool the runs of these results files into "
                    "--out (a later file's run replaces an earlier one of the same strategy and seed: e.g. d3po again "
                    "for more iterations; the target stays 70 %% of the pooled oracle's gain); runs nothing")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "artist.json"))
    a = ap.parse_args(argv)
    strategies = a.only or list(STRATEGIES)
    if "random" in strategies and "unsure" not in strategies:
        ap.error("--only random needs --only unsure too (it asks at the rate unsure ended with)")
    if a.merge:
        import json
        parts = []
        for path in a.merge:
            with open(path) as f:
                parts.append(json.load(f))
        pooled = {}
        for part in parts:
            for r in part["runs"]:
                pooled[(r["strategy"], r["seed"])] = r
        out = {**{k: v for k, v in parts[0].items() if k not in ("runs", "report")},
               "merged_from": [os.path.abspath(p) for p in a.merge],
               "iterations_by_strategy": {s: sorted({len(r["curve"]) - 1 for r in pooled.values() if r["strategy"] == s})
                                          for s in STRATEGIES if any(r["strategy"] == s for r in pooled.values())},
               "runs": sorted(pooled.values(), key=lambda r: (r["seed"], STRATEGIES.index(r["strategy"])))}
        out["report"] = report(out["runs"])
        atomic_write_json(a.out, out)
        print_report(out["report"])
        return out
    if a.report:
        import json
        with open(a.report) as f:
            saved = json.load(f)
        saved["report"] = report(saved["runs"])
        atomic_write_json(a.report, saved)
        print(json.dumps(saved["report"], indent=1, default=str)[:4000])
        return saved
    if a.old_rule:
        a.novelty = a.min_ask_rate = a.agreement_floor = a.diversity_floor = 0.0
    taste_cfg = TasteConfig(heads=a.heads, l2=a.l2, warmup_trees=a.warmup, confident=a.confident,
                            max_ask_rate=a.max_ask_rate, novelty=a.novelty, min_ask_rate=a.min_ask_rate,
                            agreement_floor=a.agreement_floor, diversity_floor=a.diversity_floor)
    encoder = DemoEncoder()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(a.first_seed, a.first_seed + a.seeds):
            rate = 1.0
            for name in [s for s in STRATEGIES if s in strategies]:
                r = run(name, seed, a.iterations, a.error, tmp, taste_cfg, ask_rate=rate, encoder=encoder,
                        taste=a.taste, kl_beta=a.kl, check_every=a.check_every,
                        learn_checks=not a.no_learn_checks, final_check=not a.no_final_check,
                        check_pictures=a.check_pictures, eval_n=a.eval_n)
                if name == "unsure":
                    rate = max(0.0, (r["answers"] - taste_cfg.warmup_trees) / max(1, r["trees"] - taste_cfg.warmup_trees))
                runs.append(r)
                print(f"seed {seed} {name:>6}: {r['answers']:3d} answers of {r['trees']} trees, area "
                      f"{r['curve'][0][1]:.3f} -> {r['curve'][-1][1]:.3f} ({r['seconds']:.0f} s)", flush=True)
    out = {"iterations": a.iterations, "error": a.error, "hidden_taste": a.taste, "kl_beta": a.kl,
           "eval_n": a.eval_n, "check_every": a.check_every, "learn_checks": bool(a.check_every) and not a.no_learn_checks,
           "final_check": bool(a.check_every) and not a.no_final_check, "check_pictures": a.check_pictures,
           "taste": vars(taste_cfg), "report": report(runs),
           "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    atomic_write_json(a.out, out)
    print_report(out["report"])
    return out


def print_report(rep: dict) -> None:
    for name, e in rep["strategies"].items():
        if name == "oracle":
            print(f"{name:>6}: gain {e['gain']['mean']:+.3f} ± {e['gain']['sd']:.3f}; target "
                  f"{TARGET_FRACTION:.0%} of it")
        else:
            s = e["answers_to_target"]
            print(f"{name:>6}: {s['mean']:.1f} ± {s['sd']:.1f} answers to the target (reached {s['reached']}), "
                  f"asked {e['ask_rate']:.0%} of trees" + (f", refit {1000 * e['fit_s']:.1f} ms" if e.get("fit_s") else "")
                  + (f"; final {', '.join(f'{v:.2f}' for v in e['final_value'])}, {e['below_base']} below the base"
                     f" (worst {e['worst_vs_base']:+.3f}; {e.get('below_base_2se', 0)} by more than 2 SE of the paired "
                     "evaluation)" if "final_value" in e else "")
                  + (f"; on {e['end_eval']['n']} fresh pictures end − base {e['end_eval']['diff']['mean']:+.3f} "
                     f"(worst {e['end_eval']['worst']:+.3f}), {e['end_eval']['below_base']} below the base, "
                     f"{e['end_eval']['below_base_2se']} by more than 2 SE" if "end_eval" in e else ""))
    for k, v in rep["ratios"].items():
        if v:
            print(f"{k}: {v['mean']:.2f} ± {v['sd']:.2f} (seeds {v['reached']}, min {v['min']:.2f}, max {v['max']:.2f}"
                  + (f"; {v['bounded']} upper bounds: the second never reached the target" if v["bounded"] else "") + ")")


if __name__ == "__main__":
    main()
