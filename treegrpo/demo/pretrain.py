"""Regenerate the demo's shipped weights, deterministically, on CPU.

    python -m treegrpo.demo.pretrain --out treegrpo/demo/assets

1. the classifier (colour + shape heads) on generator images with noise / blur / colour augmentation;
2. the flow model with the rectified-flow loss (logit-normal σ, 10 % condition dropout for CFG);
3. the held-out judge (:mod:`.judge`: another architecture and seed), never trained on by the RL demo.

The flow model is deliberately *under*-trained: at cfg 1 with 10 Euler steps its samples look like
coloured shapes but often miss the prompt (mean adherence reward ≈ 0.5), which leaves the RL demo
headroom to show learning. Everything is seeded; ``torch.set_num_threads(2)`` keeps the float
arithmetic the same from run to run on one machine.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .classifier import ClassifierConfig, DemoClassifier, save_classifier
from .judge import DemoJudge, JudgeConfig, save_judge
from .model import DemoConfig, DemoDiT, euler_sample, save_demo_model, tokenize
from .shapes import COLOURS, all_prompts, sample_batch

CLASSIFIER_FILE = "demo_classifier.safetensors"
FLOW_FILE = "demo_flow.safetensors"
JUDGE_FILE = "demo_judge.safetensors"
JUDGE_SEED = 101   # the judge shares nothing with the training reward: not its seed, not its data draw


def _gaussian_blur(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Per-image 5×5 Gaussian blur with std ``sigma`` (B,) (σ = 0 → identity)."""
    b, c, h, w = x.shape
    r = torch.arange(-2, 3, dtype=torch.float32)
    s = sigma.clamp_min(1e-3).view(b, 1)
    k1 = torch.exp(-(r.view(1, -1) ** 2) / (2 * s**2))
    k1 = k1 / k1.sum(1, keepdim=True)  # (B, 5)
    k2 = (k1[:, :, None] * k1[:, None, :]).repeat_interleave(c, 0).unsqueeze(1)  # (B*C, 1, 5, 5)
    out = F.conv2d(F.pad(x.reshape(1, b * c, h, w), (2, 2, 2, 2), mode="replicate"), k2, groups=b * c)
    return out.view(b, c, h, w)


def augment(images: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Noise, blur, brightness/contrast and small colour shifts, so the judge is robust to model samples."""
    b = images.shape[0]
    u = torch.rand(b, 6, generator=g)
    blur = torch.where(u[:, 0] < 0.5, 1.2 * u[:, 1], torch.zeros(b))
    x = _gaussian_blur(images, blur)
    contrast = (0.8 + 0.4 * u[:, 2]).view(b, 1, 1, 1)
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    x = (x - mean) * contrast + mean + (0.2 * u[:, 3] - 0.1).view(b, 1, 1, 1)
    x = x + 0.06 * (2 * torch.rand(b, 3, 1, 1, generator=g) - 1)  # colour shift
    x = x + (0.12 * u[:, 4]).view(b, 1, 1, 1) * torch.randn(x.shape, generator=g)  # pixel noise
    return x.clamp(0, 1)


def _lr(step: int, total: int, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def classifier_accuracy(model, n: int = 2048, seed: int = 1234, augmented: bool = False) -> dict:
    """Colour / shape / joint accuracy on ``n`` fresh generator images."""
    g = torch.Generator().manual_seed(seed)
    x, c, s = sample_batch(n, g)
    if augmented:
        x = augment(x, g)
    model.eval()
    pc, ps = model(x)
    ok_c, ok_s = pc.argmax(-1) == c, ps.argmax(-1) == s
    return {
        "colour": ok_c.float().mean().item(),
        "shape": ok_s.float().mean().item(),
        "joint": (ok_c & ok_s).float().mean().item(),
    }


def train_classifier(steps: int = 600, batch: int = 128, lr: float = 2e-3, seed: int = 0, log=print,
                     build=lambda: DemoClassifier(ClassifierConfig()), what: str = "classifier"):
    """A colour + shape classifier (``build()``: the training reward's by default, or the judge) on augmented
    generator images, AdamW with warm-up and cosine decay, seeded."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    model.train()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, lr, 50)
        x, c, s = sample_batch(batch, g)
        x = augment(x, g)
        lc, ls = model(x)
        loss = F.cross_entropy(lc, c) + F.cross_entropy(ls, s)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % 100 == 0 or step == steps - 1:
            log(f"{what} step {step + 1}/{steps} loss {loss.item():.4f}")
    return model.eval()


@torch.no_grad()
def mean_adherence(
    flow: DemoDiT, classifier: DemoClassifier, cfg: float, steps: int = 10, per_prompt: int = 8, seed: int = 0
) -> float:
    """Mean p(colour)·p(shape) of Euler samples over all prompts (``per_prompt`` samples each)."""
    prompts = [p for p in all_prompts() for _ in range(per_prompt)]
    tokens = tokenize(prompts)
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(len(prompts), 3, flow.config.resolution, flow.config.resolution, generator=g)
    x0 = euler_sample(flow, noise, tokens, steps=steps, cfg=cfg)
    images = ((x0 + 1) / 2).clamp(0, 1)
    pc, ps = classifier.probabilities(images)
    idx = torch.arange(len(prompts))
    ci = (tokens[:, 0] - 1).clamp_min(0)
    si = (tokens[:, 1] - 1 - len(COLOURS)).clamp_min(0)
    return (pc[idx, ci] * ps[idx, si]).mean().item()


def train_flow(
    steps: int = 800,
    batch: int = 128,
    lr: float = 3e-3,
    seed: int = 0,
    cond_dropout: float = 0.1,
    config: DemoConfig | None = None,
    log=print,
    eval_every: int = 0,
    classifier: DemoClassifier | None = None,
) -> DemoDiT:
    """Rectified-flow training: x_σ = (1−σ)·x0 + σ·ε, target v = ε − x0, σ ~ logit-normal(0, 1)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    model = DemoDiT(config or DemoConfig())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for step in range(steps):
        model.train()
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, lr, 50)
        images, c, s = sample_batch(batch, g)
        x0 = images * 2 - 1
        tokens = torch.stack([1 + c, 1 + len(COLOURS) + s], dim=1)
        drop = torch.rand(batch, generator=g) < cond_dropout
        tokens = torch.where(drop[:, None], torch.zeros_like(tokens), tokens)
        sigma = torch.sigmoid(torch.randn(batch, generator=g))
        eps = torch.randn(x0.shape, generator=g)
        xs = (1 - sigma.view(-1, 1, 1, 1)) * x0 + sigma.view(-1, 1, 1, 1) * eps
        loss = F.mse_loss(model(xs, sigma, tokens), eps - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % 100 == 0 or step == steps - 1:
            log(f"flow step {step + 1}/{steps} loss {loss.item():.4f}")
        if eval_every and classifier is not None and (step + 1) % eval_every == 0:
            model.eval()
            r1 = mean_adherence(model, classifier, cfg=1.0)
            r3 = mean_adherence(model, classifier, cfg=3.0)
            log(f"  eval step {step + 1}: adherence cfg1 {r1:.3f} cfg3 {r3:.3f}")
    return model.eval()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "assets"), help="output folder")
    ap.add_argument("--classifier-steps", type=int, default=600)
    ap.add_argument("--flow-steps", type=int, default=800)
    ap.add_argument("--flow-lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=0, help="log the adherence every N flow steps (slow)")
    ap.add_argument("--eval-images", type=int, default=2048, help="fresh images for the classifier accuracy check")
    ap.add_argument("--eval-per-prompt", type=int, default=8, help="samples per prompt for the final adherence report")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-accuracy", type=float, default=0.98, help="fail if the classifier is less accurate")
    ap.add_argument("--judge-steps", type=int, default=800)
    ap.add_argument("--only", choices=("all", "judge"), default="all",
                    help="judge: regenerate only the held-out judge (the other files are unchanged)")
    args = ap.parse_args(argv)

    threads_before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _regenerate(args)
    finally:
        torch.set_num_threads(threads_before)


def _judge(args: argparse.Namespace, out: Path) -> dict:
    """Train and write the held-out judge (seed ``JUDGE_SEED``; its own architecture, :mod:`.judge`)."""
    t0 = time.perf_counter()
    judge = train_classifier(steps=args.judge_steps, batch=args.batch, seed=JUDGE_SEED, lr=3e-3,
                             build=lambda: DemoJudge(JudgeConfig()), what="judge")
    acc = classifier_accuracy(judge, n=args.eval_images, seed=4321)
    print(f"judge accuracy {acc}  ({time.perf_counter() - t0:.0f} s)")
    if acc["joint"] < args.min_accuracy:
        raise SystemExit(f"judge accuracy {acc['joint']:.3f} < {args.min_accuracy}; train longer (--judge-steps)")
    save_judge(judge, out / JUDGE_FILE, {"steps": str(args.judge_steps), "seed": str(JUDGE_SEED),
                                         "accuracy": json.dumps(acc)})
    return {"judge": acc}


def _regenerate(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    out = Path(args.out)
    if args.only == "judge":
        return _judge(args, out)
    t0 = time.perf_counter()

    classifier = train_classifier(steps=args.classifier_steps, batch=args.batch, seed=args.seed)
    acc_clean = classifier_accuracy(classifier, n=args.eval_images)
    acc_aug = classifier_accuracy(classifier, n=args.eval_images, augmented=True)
    print(f"classifier accuracy clean {acc_clean} augmented {acc_aug}  ({time.perf_counter() - t0:.0f} s)")
    if acc_clean["joint"] < args.min_accuracy:
        raise SystemExit(
            f"classifier accuracy {acc_clean['joint']:.3f} < {args.min_accuracy}; train longer (--classifier-steps)"
        )
    save_classifier(
        classifier,
        out / CLASSIFIER_FILE,
        {"steps": str(args.classifier_steps), "seed": str(args.seed), "accuracy": json.dumps(acc_clean)},
    )

    t1 = time.perf_counter()
    flow = train_flow(
        steps=args.flow_steps, batch=args.batch, lr=args.flow_lr, seed=args.seed,
        eval_every=args.eval_every, classifier=classifier,
    )
    r1 = mean_adherence(flow, classifier, cfg=1.0, per_prompt=args.eval_per_prompt)
    r3 = mean_adherence(flow, classifier, cfg=3.0, per_prompt=args.eval_per_prompt)
    print(f"flow model adherence (10 Euler steps): cfg 1 {r1:.3f}, cfg 3 {r3:.3f}  ({time.perf_counter() - t1:.0f} s)")
    save_demo_model(
        flow,
        out / FLOW_FILE,
        {
            "steps": str(args.flow_steps), "seed": str(args.seed), "batch": str(args.batch),
            "adherence_cfg1": f"{r1:.4f}", "adherence_cfg3": f"{r3:.4f}",
        },
    )
    judged = _judge(args, out)
    total = time.perf_counter() - t0
    print(f"wrote {out / CLASSIFIER_FILE}, {out / FLOW_FILE} and {out / JUDGE_FILE} in {total:.0f} s")
    return {"classifier": acc_clean, **judged, "adherence_cfg1": r1, "adherence_cfg3": r3, "seconds": total}


if __name__ == "__main__":
    main()
