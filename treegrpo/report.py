"""Figures written next to a trained LoRA: reward curves and before/after sample grids (PNG)."""
from __future__ import annotations

import io
from typing import Optional

import torch

from .io import atomic_write


def image_grid(images: torch.Tensor, nrow: int, scale: int = 4, pad: int = 2) -> torch.Tensor:
    """(B, 3, H, W) in [0, 1] → one (3, H', W') grid, upscaled ``scale``× (nearest) so small images are visible."""
    from torchvision.utils import make_grid

    if scale > 1:
        images = torch.nn.functional.interpolate(images.float(), scale_factor=scale, mode="nearest")
    return make_grid(images, nrow=nrow, padding=pad, pad_value=1.0)


def sample_grid(images: torch.Tensor, per_prompt: int, size: int = 128) -> torch.Tensor:
    """(B, 3, H, W) samples, ``per_prompt`` consecutive per prompt → a (3, H', W') grid, one row per prompt, each
    image scaled to about ``size`` pixels on its longer side (a 16-pixel demo image enlarged, a 1024-pixel one
    reduced); a strip of video frames (wider than twice its height) by twice its height."""
    def side(t):
        h, w = t.shape[-2:]
        return max(h, min(w, 2 * h))

    if side(images) > size:
        images = torch.nn.functional.interpolate(images.float(), scale_factor=size / side(images), mode="area")
    return image_grid(images, nrow=max(1, per_prompt), scale=max(1, size // side(images)))


def labelled_grids(grids: list[torch.Tensor], titles: list[str], row_labels: Optional[list[str]] = None,
                   pad: int = 8, band: int = 18) -> torch.Tensor:
    """(3, H, W) grids in [0, 1] side by side under their ``titles`` (each after the first scaled to its height),
    with ``row_labels`` (one per row of the grids, cut to 32 characters) in a margin on the left: a (3, H', W')
    picture that says what each side and row is. The grids are copied in unchanged (at their place)."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont

    h = grids[0].shape[1]
    scaled = [grids[0]]
    for g in grids[1:]:
        w = max(1, round(g.shape[2] * h / g.shape[1]))
        if g.shape[1:] != (h, w):
            g = torch.nn.functional.interpolate(g[None].float(), size=(h, w), mode="bilinear",
                                                align_corners=False)[0].clamp(0, 1)
        scaled.append(g)
    font = ImageFont.load_default()
    labels = [(r if len(r) <= 32 else r[:31] + "…") for r in (row_labels or [])]
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    margin = max((int(measure.textlength(r, font=font)) for r in labels), default=-pad) + pad
    xs = [margin]
    for g in scaled[:-1]:
        xs.append(xs[-1] + g.shape[2] + pad)
    width = max(xs[-1] + scaled[-1].shape[2],            # a title wider than its grid is not cut off
                *(x + int(measure.textlength(t, font=font)) + 2 for x, t in zip(xs, titles)))
    canvas = Image.new("RGB", (width, band + h), "white")
    draw = ImageDraw.Draw(canvas)
    for x, title in zip(xs, titles):
        draw.text((x, 3), title, fill="black", font=font)
    for i, r in enumerate(labels):
        draw.text((0, band + (i + 0.5) * h / len(labels) - 6), r, fill="black", font=font)
    out = torch.from_numpy(np.asarray(canvas).copy()).permute(2, 0, 1).float() / 255
    for x, g in zip(xs, scaled):
        out[:, band:, x:x + g.shape[2]] = g.float()
    return out


def labelled_pair(left: torch.Tensor, right: torch.Tensor, titles: tuple[str, str],
                  row_labels: Optional[list[str]] = None, pad: int = 8, band: int = 18) -> torch.Tensor:
    """Two (3, H, W) grids side by side (:func:`labelled_grids`): which side is which, and a label per row."""
    return labelled_grids([left, right], list(titles), row_labels, pad=pad, band=band)


def to_pil(grid: torch.Tensor):
    from PIL import Image

    arr = (grid.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    return Image.fromarray(arr)


def read_picture(path: str) -> torch.Tensor:
    """A picture file as (H, W, 3) float32 in [0, 1] (what :func:`to_pil` and the artist's kept leaves wrote);
    OSError or ValueError when it cannot be read."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as im:
        return torch.from_numpy(np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0)


def before_after_grid(before: torch.Tensor, after: torch.Tensor, prompts: list[str], per_prompt: int, path: str,
                      scale: int = 4) -> str:
    """Rows: prompts; left block: base model, right block: with the LoRA. Labels drawn with matplotlib."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(prompts)
    fig, axes = plt.subplots(n, 2, figsize=(2 + 1.0 * per_prompt * 2, 0.9 * n + 0.8), squeeze=False)
    for i, p in enumerate(prompts):
        for j, (imgs, title) in enumerate(((before, "base"), (after, "TreeGRPO LoRA"))):
            g = image_grid(imgs[i * per_prompt:(i + 1) * per_prompt], nrow=per_prompt, scale=scale)
            ax = axes[i][j]
            ax.imshow(g.permute(1, 2, 0).numpy())
            ax.set_xticks([]), ax.set_yticks([])
            if i == 0:
                ax.set_title(title, fontsize=10)
            if j == 0:
                ax.set_ylabel(p, rotation=0, ha="right", va="center", fontsize=8)
    fig.tight_layout()
    return _fig_to_png(fig, path)


def _fig_to_png(fig, path: str) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return atomic_write(path, lambda tmp: open(tmp, "wb").write(buf.getvalue()))


def reward_curves(runs: dict[str, list[dict]], path: str, title: str = "evaluation reward") -> str:
    """``runs``: method → list of eval records with ``eval_reward`` and the training clock
    (``train_time``) / ``total_nfe``; plots reward vs wall-clock and vs NFE."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, ev in runs.items():
        t = [e.get("train_time", 0.0) for e in ev]
        nfe = [e.get("total_nfe", 0) for e in ev]
        r = [e["eval_reward"] for e in ev]
        line = axes[0].plot(t, r, marker="o", ms=3, label=name)[0]
        axes[1].plot(nfe, r, marker="o", ms=3, label=name, color=line.get_color())
        if any(e.get("eval_judge") is not None for e in ev):   # the held-out judge, dashed, same colour
            j = [e.get("eval_judge", float("nan")) for e in ev]
            axes[0].plot(t, j, ls="--", marker="x", ms=3, color=line.get_color(), label=f"{name}: held-out judge")
            axes[1].plot(nfe, j, ls="--", marker="x", ms=3, color=line.get_color(), label=f"{name}: held-out judge")
    axes[0].set_xlabel("training wall-clock (s)")
    axes[1].set_xlabel("denoiser evaluations (NFE)")
    for ax in axes:
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return _fig_to_png(fig, path)


def curve_image(values: list[float], width: int = 512, height: int = 256) -> torch.Tensor:
    """A reward curve rendered to an image tensor (1, H, W, 3) in [0, 1] (for ComfyUI IMAGE outputs)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width / 100, height / 100), dpi=100)
    ax.plot(range(len(values)), values, marker="o", ms=2)
    ax.set_xlabel("iteration"), ax.set_ylabel("reward"), ax.grid(alpha=0.3)
    fig.tight_layout()
    return _fig_to_image(fig)


#: the signals drawn relative to the base model's value (the first evaluation), with their labels
RELATIVE_SIGNALS = (("eval_diversity", "diversity"), ("eval_hf_energy", "high-freq. energy"),
                    ("eval_saturation", "saturation"))


def signals_title(evals: list[dict], width: int = 110) -> Optional[tuple[str, str]]:
    """The title of `signals_image`: (text, colour), or None for a run that never warned. What the newest evaluation
    fails (its first warning, cut to `width` characters, and how many more) in red; where it passes after earlier
    warnings, the iteration of the last one in grey, so a check that has recovered no longer reads as failing."""
    if not evals:
        return None
    now = evals[-1].get("warnings", [])
    if now:
        text = now[0] if len(now[0]) <= width else now[0][:width] + "..."
        more = f" (+{len(now) - 1} more)" if len(now) > 1 else ""
        return "warning: " + text + more, "firebrick"
    last = next((e for e in reversed(evals) if e.get("warnings")), None)
    if last is None:
        return None
    return f"the hacking checks pass now (last warning at iteration {last['iteration']})", "dimgrey"


def signals_image(evals: list[dict], width: int = 768, height: int = 320) -> torch.Tensor:
    """A run's evaluations as a ComfyUI IMAGE (1, H, W, 3): left, the training reward and the held-out judge per
    iteration; right, the hacking signals relative to the base model (1 = unchanged), the near-black + near-white
    share and the window KL; `signals_title` as the title."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    it = [e["iteration"] for e in evals]
    fig, (a, b) = plt.subplots(1, 2, figsize=(width / 100, height / 100), dpi=100)
    a.plot(it, [e["eval_reward"] for e in evals], marker="o", ms=3, label="the reward trained on")
    if any(e.get("eval_judge") is not None for e in evals):
        a.plot(it, [e.get("eval_judge", float("nan")) for e in evals], marker="x", ms=3, ls="--",
               label="held-out judge")
    a.set_xlabel("iteration"), a.set_ylabel("score of the evaluation samples"), a.grid(alpha=0.3), a.legend(fontsize=7)
    base = evals[0] if evals else {}
    for key, label in RELATIVE_SIGNALS:
        if base.get(key):
            b.plot(it, [e.get(key, float("nan")) / base[key] for e in evals], marker=".", label=label)
    b.plot(it, [e.get("eval_near_black", 0.0) + e.get("eval_near_white", 0.0) for e in evals], marker=".",
           label="near-black+white share")
    if any("eval_kl" in e for e in evals):
        b.plot(it, [e.get("eval_kl", float("nan")) for e in evals], marker=".", ls=":", label="KL to base")
    b.axhline(1.0, color="grey", lw=0.5)
    b.set_xlabel("iteration"), b.set_ylabel("vs. base model"), b.grid(alpha=0.3), b.legend(fontsize=7)
    title = signals_title(evals)
    if title is not None:
        fig.suptitle(title[0], fontsize=8, color=title[1])
    fig.tight_layout()
    return _fig_to_image(fig)


def _fig_to_image(fig) -> torch.Tensor:
    """A matplotlib figure as a ComfyUI IMAGE (1, H, W, 3) float in [0, 1]; closes the figure."""
    import matplotlib.pyplot as plt
    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    img = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    return torch.from_numpy(np.asarray(img).astype("float32") / 255.0)[None]


def tree_preview(batch, images: torch.Tensor, rewards: dict | None = None, cell: float = 1.1) -> torch.Tensor:
    """Leaves (n, 3, H, W) laid out one tree per row in branch order, titled with the weighted reward and
    the leaf advantage when known; video leaves (every frame of each, in order) by their first frame. Returns a
    ComfyUI IMAGE (1, H', W', 3)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .video import leaf_frames

    n_trees = batch.n_trees
    images = leaf_frames(images, batch.leaves, "the Tree Preview")
    n = images.shape[0]
    per = n // n_trees
    total = None
    if rewards:
        total = sum(float(rewards["weights"][k]) * v.float() for k, v in rewards["rewards"].items())
    adv = batch.advantages[-1] if batch.advantages is not None else None
    fig, axes = plt.subplots(n_trees, per, figsize=(cell * per + 0.4, cell * n_trees + 0.5), squeeze=False)
    for t in range(n_trees):
        for j in range(per):
            i = t * per + j
            ax = axes[t][j]
            ax.imshow(images[i].permute(1, 2, 0).clamp(0, 1).cpu().numpy(), interpolation="nearest")
            ax.set_xticks([]), ax.set_yticks([])
            label = []
            if total is not None:
                label.append(f"r={float(total[i]):.2f}")
            if adv is not None:
                label.append(f"A={float(adv[i]):+.2f}")
            ax.set_title(" ".join(label), fontsize=6)
            if j == 0:
                ax.set_ylabel(f"tree {t}", fontsize=7)
    fig.suptitle(f"{n_trees} tree(s) x {per} leaves, branching {batch.branching}", fontsize=8)
    fig.tight_layout()
    return _fig_to_image(fig)
