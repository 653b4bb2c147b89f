"""How many answers the artist demo needs to show a taste: a simulated artist who likes big shapes is asked about
every tree of the artist demo's run (workflows/treegrpo_artist_demo_cpu.json: 'a red circle', 2 trees of 4 leaves
per iteration, window 2, branch 2, noise level 0.9, LoRA rank 8, lr 1e-3), on the core trainer.

The artist picks the leaf with the biggest shape (treegrpo.demo.shapes.shape_area, the rule of the browser test's
scripted artist); with ``--temperature T > 0`` it picks leaf i with probability softmax(area / T) instead, an artist
who is not always sure. After every iteration the mean shape area of 64 ODE samples from fixed noises is measured;
the taste "shows" once that mean has risen by ``--target`` over the base model's (default 0.10: one spread of the
base model's areas). Work is counted in answers (one per tree asked), not seconds. Per seed: the answers to reach the
target (first passage) and the gain after 24 answers (the browser test's 12 queued prompts).

    python benchmarks/bench_artist.py [--seeds 8] [--max-answers 60] [--target 0.10] [--temperature 0]
                                      [--out benchmarks/results/artist.json]
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import torch  # noqa: E402

from treegrpo import cli  # noqa: E402
from treegrpo.artist import Answer, answer_rewards  # noqa: E402
from treegrpo.backends import load_policy  # noqa: E402
from treegrpo.config import TrainConfig  # noqa: E402
from treegrpo.demo.shapes import shape_area  # noqa: E402
from treegrpo.io import atomic_write_json  # noqa: E402
from treegrpo.trainer import Trainer  # noqa: E402
from treegrpo.tree import sample_ode  # noqa: E402

PROMPT = "a red circle"
EVAL_N, EVAL_SEED = 64, 123
AT_ANSWERS = 24


def artist_demo_config(seed: int, iterations: int, output_dir: str) -> TrainConfig:
    """The artist demo workflow's settings on the core trainer."""
    d = cli.demo_config_dict()
    d.update(prompts=[PROMPT], prompts_per_iter=2, trees_per_prompt=1, iterations=iterations, eval_every=0,
             seed=seed, output_dir=output_dir, run_name=f"bench_artist_{seed}", checkpoint_every=0)
    d["tree"].update(window_start=1, window_width=2, branch=2, noise_level=0.9)
    d["optim"].update(lr=1e-3, clip_range=1e-4, kl_beta=0.0)
    d["advantage"].update(backup="softmax", flat_floor=0.0)
    return TrainConfig.from_dict(d)


def simulated_artist(temperature: float, generator: torch.Generator):
    """A ``Trainer.artist`` that answers every tree in favourites mode: the biggest shape (or, with a temperature,
    a leaf drawn with probability softmax(area / temperature))."""
    asked = {"answers": 0}

    def ask(trainer, batch, images, raw):
        area = shape_area(images.float())
        per = len(area) // batch.n_trees
        rewards = torch.zeros(len(area))
        for t in range(batch.n_trees):
            a = area[t * per:(t + 1) * per]
            if temperature > 0:
                pick = int(torch.multinomial(torch.softmax(a / temperature, 0), 1, generator=generator))
            else:
                pick = int(a.argmax())
            rewards[t * per:(t + 1) * per] = answer_rewards(Answer("favourites", good=(pick,)), per)
            asked["answers"] += 1
        return {"artist": rewards}, {"artist": 1.0}, None

    ask.asked = asked
    return ask


def eval_area(policy, noise: torch.Tensor, steps: int) -> float:
    with torch.no_grad():
        imgs = policy.decode(sample_ode(policy, [PROMPT] * len(noise), noise, steps, 1.0))
    return float(shape_area(imgs).mean())


def run_seed(seed: int, max_answers: int, temperature: float, output_dir: str) -> dict:
    """One simulated run: the curve of (answers, mean sample area) after each iteration."""
    cfg = artist_demo_config(seed, math.ceil(max_answers / 2), output_dir)
    policy, _ = load_policy(cfg)
    trainer = Trainer(cfg, policy, {"demo_adherence": lambda im, p: torch.zeros(len(p))}, progress=False)
    trainer.artist = simulated_artist(temperature, torch.Generator().manual_seed(10_000 + seed))
    noise = torch.randn((EVAL_N, *policy.latent_shape()), generator=torch.Generator().manual_seed(EVAL_SEED))
    curve = [(0, eval_area(policy, noise, cfg.tree.steps))]
    t0 = time.perf_counter()
    while trainer.artist.asked["answers"] < max_answers:
        trainer.train_step()
        curve.append((trainer.artist.asked["answers"], eval_area(policy, noise, cfg.tree.steps)))
    return {"seed": seed, "curve": curve, "seconds": time.perf_counter() - t0}


def first_passage(curve: list[tuple[int, float]], target: float) -> float:
    """Answers at which the mean area first rose by ``target`` over the start (nan if never)."""
    base = curve[0][1]
    return next((float(n) for n, a in curve if a - base >= target), float("nan"))


def gain_at(curve: list[tuple[int, float]], answers: int) -> float:
    return next((a for n, a in curve if n >= answers), curve[-1][1]) - curve[0][1]


def summary(values: list[float]) -> dict:
    ok = [v for v in values if not math.isnan(v)]
    return {"mean": statistics.fmean(ok) if ok else float("nan"),
            "sd": statistics.stdev(ok) if len(ok) > 1 else 0.0,
            "min": min(ok) if ok else float("nan"), "max": max(ok) if ok else float("nan"),
            "reached": f"{len(ok)}/{len(values)}"}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--max-answers", type=int, default=60)
    ap.add_argument("--target", type=float, default=0.10)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "artist.json"))
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    import tempfile

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(a.first_seed, a.first_seed + a.seeds):
            r = run_seed(seed, a.max_answers, a.temperature, tmp)
            r["answers_to_target"] = first_passage(r["curve"], a.target)
            r[f"gain_at_{AT_ANSWERS}"] = gain_at(r["curve"], AT_ANSWERS)
            print(f"seed {seed}: base area {r['curve'][0][1]:.3f}, +{a.target} after {r['answers_to_target']:.0f} "
                  f"answers, gain at {AT_ANSWERS} answers {r[f'gain_at_{AT_ANSWERS}']:+.3f} ({r['seconds']:.0f} s)",
                  flush=True)
            runs.append(r)
    out = {"arm": "ask every tree", "target": a.target, "temperature": a.temperature, "max_answers": a.max_answers,
           "answers_to_target": summary([r["answers_to_target"] for r in runs]),
           f"gain_at_{AT_ANSWERS}": summary([r[f"gain_at_{AT_ANSWERS}"] for r in runs]), "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    atomic_write_json(a.out, out)
    s = out["answers_to_target"]
    g = out[f"gain_at_{AT_ANSWERS}"]
    print(f"answers to show the taste (+{a.target} mean area): {s['mean']:.1f} ± {s['sd']:.1f} "
          f"(min {s['min']:.0f}, max {s['max']:.0f}, reached {s['reached']}); gain at {AT_ANSWERS} answers "
          f"{g['mean']:+.3f} ± {g['sd']:.3f}")
    return out


if __name__ == "__main__":
    main()
