"""A preference model of the artist's taste: Bradley–Terry heads on frozen image features, a bootstrap ensemble for
its uncertainty, and the rule that asks the artist only where the ensemble is unsure (docs/design.md, "Ask only when
unsure").

* **Model**: a leaf with features x (D,) gets the score s(x) = θ·z(x), where z standardises the features with the mean and spread of every leaf answered so far. Bradley–Terry: the artist
  prefers leaf i over leaf j with probability σ(s_i − s_j).
* **Fit**: the pairs an answer implies (:func:`treegrpo.artist.pairwise_wins`) by penalised maximum likelihood,
  ``min_θ Σ −log σ(θ·(z_w − z_l)) + λ/2 ‖θ‖²`` (convex; Newton's method in float64).
* **Uncertainty**: ``heads`` fits, each on a bootstrap resample of the answered *trees* (a tree's pairs come from one
  look at it, so they are resampled together); the reward is the mean of the heads' scores.
* **When to ask**: always for the first ``warmup_trees`` trees; afterwards when the ensemble's mean probability that
  its top leaf beats the runner-up, ``mean_k σ(s_k[top] − s_k[second])``, is below ``confident`` (heads that
  disagree pull it towards ½ or below), and at most ``max_ask_rate`` of the trees seen.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import torch

FORMAT = "treegrpo-taste"
VERSION = "1"


@dataclass
class TasteConfig:
    """Settings of the preference model and of when it asks."""

    heads: int = 5                  # bootstrap ensemble size (1: no uncertainty; then ask every tree)
    l2: float = 1.0                 # λ, ridge on θ in standardised feature units
    # the defaults are benchmarks/bench_artist.py's measurement (the artist demo, a 15 %-error artist, 8 seeds)
    warmup_trees: int = 12          # always ask about the first N trees
    confident: float = 0.9          # ask when P(top leaf beats the runner-up) is below this (0.5..1)
    max_ask_rate: float = 0.25      # ask about at most this fraction of the trees seen (0..1], warm-up included
    seed: int = 0                   # the bootstrap's seed

    def __post_init__(self):
        def need(ok, what):
            if not ok:
                raise ValueError(f"TasteConfig.{what}")
        need(isinstance(self.heads, int) and 1 <= self.heads <= 64, f"heads must be an integer 1..64, got {self.heads!r}")
        need(_finite(self.l2) and self.l2 > 0, f"l2 must be a finite number > 0, got {self.l2!r}")
        need(isinstance(self.warmup_trees, int) and self.warmup_trees >= 0,
             f"warmup_trees must be an integer >= 0, got {self.warmup_trees!r}")
        need(_finite(self.confident) and 0.5 <= self.confident <= 1,
             f"confident must be a probability in [0.5, 1] (0.5: never ask after the warm-up, 1: always), "
             f"got {self.confident!r}")
        need(_finite(self.max_ask_rate) and 0 < self.max_ask_rate <= 1,
             f"max_ask_rate must be in (0, 1], got {self.max_ask_rate!r}")


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# ---------------------------------------------------------------------------------------------------------------
# the maths: pure functions
# ---------------------------------------------------------------------------------------------------------------

def fit_bradley_terry(diffs: torch.Tensor, l2: float, offset: Optional[torch.Tensor] = None,
                      weights: Optional[torch.Tensor] = None, iters: int = 50, tol: float = 1e-10) -> torch.Tensor:
    """θ (D,) float64 maximising ``Σ_p w_p log σ(θ·d_p + o_p) − λ/2‖θ‖²`` by Newton's method.

    ``diffs`` (P, D): winner's minus loser's features per pair; ``offset`` (P,): a fixed logit per pair (the base
    reward's); ``weights`` (P,): pair multiplicities (a bootstrap resample); ``l2`` = λ ≥ 0 (0 only for data that is
    not separable)."""
    d = diffs.double()
    p_n, dim = d.shape
    o = torch.zeros(p_n, dtype=torch.float64) if offset is None else offset.double().reshape(p_n)
    w = torch.ones(p_n, dtype=torch.float64) if weights is None else weights.double().reshape(p_n)
    theta = torch.zeros(dim, dtype=torch.float64)
    eye = torch.eye(dim, dtype=torch.float64)
    for _ in range(iters):
        m = d @ theta + o
        p = torch.sigmoid(m)
        grad = d.T @ (w * (1 - p)) - l2 * theta
        hess = (d * (w * p * (1 - p)).unsqueeze(1)).T @ d + l2 * eye
        step = torch.linalg.solve(hess, grad)
        theta = theta + step
        if float(step.abs().max()) < tol:
            break
    return theta


def win_probability(scores: torch.Tensor) -> tuple[int, float]:
    """For one tree's leaves scored by every head, ``scores`` (K, n): the ensemble's top leaf (by mean score) and
    the heads' mean probability that it beats the runner-up, ``mean_k σ(s_k[top] − s_k[second])``."""
    if scores.ndim != 2 or scores.shape[1] < 2:
        raise ValueError(f"scores must be (heads, leaves >= 2), got {tuple(scores.shape)}")
    order = scores.double().mean(0).argsort(descending=True)
    top, second = int(order[0]), int(order[1])
    return top, float(torch.sigmoid(scores[:, top].double() - scores[:, second].double()).mean())


def should_ask(scores: Optional[torch.Tensor], trees_seen: int, answers: int, cfg: TasteConfig) -> bool:
    """Ask the artist about this tree? ``scores`` (K, n): the heads' scores of its leaves (None: no model yet);
    ``trees_seen``: trees before this one; ``answers``: questions asked so far."""
    if trees_seen < cfg.warmup_trees or scores is None:
        return True
    if answers + 1 > cfg.max_ask_rate * (trees_seen + 1):
        return False
    return win_probability(scores)[1] < cfg.confident


# ---------------------------------------------------------------------------------------------------------------
# the online model
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class AnsweredTree:
    """One answered tree: its leaves' features (n, D) and the (winner, loser) pairs of the answer."""

    features: torch.Tensor
    pairs: list


@dataclass
class TasteModel:
    """The online preference model. ``features``: the name of the feature encoder (stored with the file);
    ``trees``: what it learned from; after :meth:`fit`, ``thetas`` (K, D) and the standardisation."""

    config: TasteConfig = field(default_factory=TasteConfig)
    features: str = "demo"
    feature_dim: int = 0
    trees: list = field(default_factory=list)
    thetas: Optional[torch.Tensor] = None
    mean: Optional[torch.Tensor] = None
    std: Optional[torch.Tensor] = None
    fit_seconds: float = 0.0
    info: dict = field(default_factory=dict)

    @property
    def answers(self) -> int:
        return len(self.trees)

    def add(self, features: torch.Tensor, pairs: Sequence[tuple[int, int]], refit: bool = True) -> None:
        """Learn from one answered tree (no pairs: nothing to learn); refit unless told not to."""
        f = features.detach().double().cpu()
        if f.ndim != 2:
            raise ValueError(f"features must be (leaves, D), got {tuple(f.shape)}")
        if self.feature_dim and f.shape[1] != self.feature_dim:
            raise ValueError(f"features have {f.shape[1]} dimensions, this taste model {self.feature_dim} "
                             f"({self.features})")
        self.feature_dim = f.shape[1]
        if not pairs:
            return
        self.trees.append(AnsweredTree(f, [tuple(p) for p in pairs]))
        if refit:
            self.fit()

    def fit(self) -> None:
        """Refit every head on a bootstrap resample of the answered trees (head 0 on all of them when K = 1)."""
        if not self.trees:
            return
        t0 = time.perf_counter()
        allf = torch.cat([t.features for t in self.trees])
        self.mean = allf.mean(0)
        self.std = allf.std(0, unbiased=False).clamp_min(1e-6)
        diffs, tree_of = [], []
        for i, t in enumerate(self.trees):
            z = (t.features - self.mean) / self.std
            for w, l in t.pairs:
                diffs.append(z[w] - z[l])
                tree_of.append(i)
        d = torch.stack(diffs)
        tree_of = torch.tensor(tree_of)
        g = torch.Generator().manual_seed(self.config.seed * 1_000_003 + len(self.trees))
        thetas = []
        n = len(self.trees)
        for k in range(self.config.heads):
            if self.config.heads == 1:
                counts = torch.ones(n)
            else:
                counts = torch.bincount(torch.randint(n, (n,), generator=g), minlength=n).double()
            thetas.append(fit_bradley_terry(d, self.config.l2, weights=counts[tree_of]))
        self.thetas = torch.stack(thetas)
        self.fit_seconds = time.perf_counter() - t0

    def head_scores(self, features: torch.Tensor) -> Optional[torch.Tensor]:
        """(K, n) every head's score of leaves with ``features`` (n, D); None before the first answer."""
        if self.thetas is None:
            return None
        if features.ndim != 2 or features.shape[1] != self.thetas.shape[1]:
            raise ValueError(f"features must be (leaves, {self.thetas.shape[1]}) for this taste model "
                             f"({self.features}), got {tuple(features.shape)}")
        z = (features.detach().double().cpu() - self.mean) / self.std
        return self.thetas @ z.T

    def scores(self, features: torch.Tensor) -> torch.Tensor:
        """(n,) float32 the reward: the heads' mean score (0 before any answer)."""
        s = self.head_scores(features)
        return torch.zeros(features.shape[0]) if s is None else s.mean(0).float()

    def agreement(self, features: torch.Tensor, pairs: Sequence[tuple[int, int]]) -> Optional[float]:
        """The fraction of the artist's pairs the model orders the same way (ties count ½); None without a model."""
        if self.thetas is None or not pairs:
            return None
        s = self.scores(features)
        agree = [1.0 if s[w] > s[l] else 0.5 if s[w] == s[l] else 0.0 for w, l in pairs]
        return sum(agree) / len(agree)

    # -- the file ---------------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, extra: Optional[dict] = None) -> None:
        """``path`` (.safetensors): the heads, the standardisation and the config (in the metadata), atomically."""
        from safetensors.torch import save_file

        if self.thetas is None:
            raise ValueError("the taste model has not learned anything yet (no answered tree with a preference)")
        meta = {"format": FORMAT, "version": VERSION, "features": self.features,
                "feature_dim": str(self.feature_dim), "answers": str(self.answers),
                "config": json.dumps(asdict(self.config)), "info": json.dumps({**self.info, **(extra or {})})}
        tmp = f"{os.fspath(path)}.tmp-{os.getpid()}"
        save_file({"thetas": self.thetas.float().contiguous(), "mean": self.mean.float().contiguous(),
                   "std": self.std.float().contiguous()}, tmp, metadata=meta)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TasteModel":
        """A saved taste model (for scoring: its answers stay in artist_labels.jsonl); clear errors for a file that
        is not one, is truncated or does not fit together."""
        from safetensors import safe_open

        p = os.fspath(path)
        if not os.path.isfile(p):
            raise FileNotFoundError(f"taste model {p!r} does not exist: a Train node or `treegrpo train` with the "
                                    f"artist writes <run_name>_taste.safetensors into models/reward_models/")
        try:
            with safe_open(p, "pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:  # noqa: BLE001 - safetensors raises several types for a damaged file
            raise ValueError(f"taste model {p!r} is not a readable safetensors file ({e}); it may be truncated: "
                             f"save it again from its run") from None
        if meta.get("format") != FORMAT:
            raise ValueError(f"{p!r} is not a TreeGRPO taste model (format {meta.get('format')!r}, expected "
                             f"{FORMAT!r}); pick a file written as <run_name>_taste.safetensors")
        missing = sorted({"thetas", "mean", "std"} - set(tensors))
        if missing:
            raise ValueError(f"taste model {p!r} lacks the tensors {missing}; save it again from its run")
        th, mean, std = tensors["thetas"].double(), tensors["mean"].double(), tensors["std"].double()
        dim = int(meta.get("feature_dim", th.shape[-1]))
        if th.ndim != 2 or th.shape[1] != dim or mean.shape != (dim,) or std.shape != (dim,):
            raise ValueError(f"taste model {p!r}: tensors of shapes {tuple(th.shape)}, {tuple(mean.shape)}, "
                             f"{tuple(std.shape)} do not fit feature_dim {dim}; save it again from its run")
        if not (torch.isfinite(th).all() and torch.isfinite(mean).all() and torch.isfinite(std).all()):
            raise ValueError(f"taste model {p!r} holds NaN or infinite values; save it again from its run")
        cfg = _config_from_file(p, meta)
        m = cls(config=cfg, features=meta.get("features", "demo"), feature_dim=dim, thetas=th, mean=mean, std=std,
                info=json.loads(meta.get("info", "{}")))
        m.info["answers"] = int(meta.get("answers", 0))
        return m


def _config_from_file(path: str, meta: dict) -> "TasteConfig":
    """The TasteConfig a taste model file was written with. A file of another version is read where it can be:
    fields this version does not know are left out with one warning naming the file, its version and the fields;
    one it cannot use (a config that is not a JSON object, a value this version refuses) is refused with one line
    naming the file and both versions."""
    import logging

    version = meta.get("version", "?")
    try:
        raw = json.loads(meta.get("config", "{}"))
    except ValueError:
        raw = None
    if not isinstance(raw, dict):
        raise ValueError(f"taste model {path!r} (format version {version}; this TreeGRPO reads version {VERSION}) has "
                         "a config this version cannot read; save it again from its run with this version")
    known = {f.name for f in dataclasses.fields(TasteConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        logging.warning("TreeGRPO: taste model %s was written by format version %s (this TreeGRPO writes %s); its "
                        "settings %s are unknown here and left out", path, version, VERSION, unknown)
    try:
        return TasteConfig(**{k: v for k, v in raw.items() if k in known})
    except (TypeError, ValueError) as e:
        raise ValueError(f"taste model {path!r} (format version {version}; this TreeGRPO reads version {VERSION}): "
                         f"its settings are not valid here ({e}); update TreeGRPO, or save it again from its run") from None


# ---------------------------------------------------------------------------------------------------------------
# asking only when unsure, one batch of trees at a time
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class OnlineTaste:
    """Drives the taste model over a run: for each tree, ask the artist (``ask``) when :func:`should_ask` says so,
    learn from the answer, and otherwise score the leaves with the model. Counts and the agreement of the model with
    each answer before it learnt from it (the signal "does the model know the taste yet") are kept in ``log``."""

    model: TasteModel
    encoder: Optional[object] = None
    decide: Optional[object] = None          # (scores, trees_seen, asked, config) -> bool; default should_ask
    trees_seen: int = 0
    asked: int = 0
    log: list = field(default_factory=list)

    def round(self, images: torch.Tensor, leaf_tree: torch.Tensor, ask, features: Optional[torch.Tensor] = None):
        """One batch: ``images`` (n, 3, H, W) leaves in [0, 1], ``leaf_tree`` (n,) their tree, ``ask(tree) ->``
        the (winner, loser) pairs of the answer (``[]``: no preference or skip), or None when nobody answered.

        Returns ``(rewards (n,) float32, exclude (n_trees,) bool, stats)``: asked trees get their win rates, the
        others the model's scores; a tree without preference is excluded, an unanswered one keeps the model's
        scores (excluded while there is no model)."""
        from .artist import win_rates

        if features is None:
            features = self.encoder(images)
        leaf_tree = leaf_tree.cpu()
        n_trees = int(leaf_tree.max()) + 1 if leaf_tree.numel() else 0
        rewards = torch.zeros(leaf_tree.numel())
        exclude = torch.zeros(n_trees, dtype=torch.bool)
        agreements, asked_trees = [], []
        for t in range(n_trees):
            idx = (leaf_tree == t).nonzero().flatten()
            f = features[idx]
            decide = self.decide or should_ask
            if decide(self.model.head_scores(f), self.trees_seen, self.asked, self.model.config):
                self.asked += 1
                asked_trees.append(t)
                pairs = ask(t)
                if pairs is None:                       # nobody answered: the model's guess, if it has one
                    if self.model.thetas is None:
                        exclude[t] = True
                    rewards[idx] = self.model.scores(f)
                elif not pairs:
                    exclude[t] = True
                else:
                    a = self.model.agreement(f, pairs)
                    if a is not None:
                        agreements.append(a)
                    self.model.add(f, pairs)
                    rewards[idx] = win_rates(pairs, len(idx))
            else:
                rewards[idx] = self.model.scores(f)
            self.trees_seen += 1
        stats = {"taste_asked": len(asked_trees), "taste_trees": n_trees, "taste_answers": self.model.answers,
                 "taste_agreement": (sum(agreements) / len(agreements)) if agreements else None,
                 "taste_fit_s": self.model.fit_seconds}
        self.log.append(stats)
        return rewards, exclude, stats


def from_labels(folder: str | os.PathLike, encoder, config: Optional[TasteConfig] = None,
                features: str = "demo") -> TasteModel:
    """A taste model learnt from a run's ``artist_labels.jsonl`` (the answered trees whose leaf images are kept
    beside it, in ``artist/``): what a resumed run starts from, and what ``treegrpo taste`` fits offline."""
    import numpy as np
    from PIL import Image

    from .artist import Answer, pairwise_wins

    path = os.path.join(os.fspath(folder), "artist_labels.jsonl")
    model = TasteModel(config=config or TasteConfig(), features=features)
    if not os.path.isfile(path):
        return model
    with open(path, encoding="utf-8") as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    for n, ln in enumerate(lines):
        try:
            rec = json.loads(ln)
        except json.JSONDecodeError:
            if n == len(lines) - 1:      # a last line cut off by a crash: the answers before it count
                break
            raise ValueError(f"{path}: line {n + 1} is not JSON; the labels file is damaged there") from None
        if rec.get("outcome") != "answered" or not rec.get("answer"):
            continue
        leaves = [os.path.join(os.fspath(folder), p) for p in rec.get("leaves", [])]
        if len(leaves) < 2 or not all(os.path.isfile(p) for p in leaves):
            continue
        pairs = pairwise_wins(Answer.from_dict(rec["answer"]), len(leaves))
        imgs = torch.stack([torch.from_numpy(np.asarray(Image.open(p).convert("RGB"), dtype=np.float32) / 255.0)
                            for p in leaves]).movedim(-1, 1)
        model.add(encoder(imgs), pairs, refit=False)
    model.fit()
    return model
