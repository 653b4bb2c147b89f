"""A preference model of the artist's taste: Bradley–Terry heads on frozen image features, a bootstrap ensemble for
its uncertainty, and the rule that asks the artist only where the model may be wrong (docs/design.md, "Ask only when
unsure").

* **Model**: a leaf with features x (D,) gets the score s(x) = θ·z(x), where z standardises the features with the mean
  and spread of every leaf answered so far, each times its group's weight where the encoder names feature groups
  (:func:`group_weights`: every group the same share of the ridge's prior). Bradley–Terry: the artist prefers leaf i
  over leaf j with probability σ(s_i − s_j).
* **Fit**: the pairs an answer implies (:func:`treegrpo.artist.answers.pairwise_wins`) by penalised maximum likelihood,
  ``min_θ Σ −log σ(θ·(z_w − z_l)) + λ/2 ‖θ‖²`` (convex; Newton's method in float64).
* **Uncertainty**: ``heads`` fits, each on a bootstrap resample of the answered *trees* (a tree's pairs come from one
  look at it, so they are resampled together); the reward is the mean of the heads' scores.
* **When to ask** (:func:`ask_reason`): always for the first ``warmup_trees`` trees; then, at least ``min_ask_rate``
  of the trees for the whole run; and, within ``max_ask_rate`` of the trees seen, when the heads are unsure
  (their mean probability that the top leaf beats the runner-up, ``mean_k σ(s_k[top] − s_k[second])``, is below
  ``confident``), when the samples have **moved** away from what was answered (a leaf's distance to the nearest
  answered leaf, in standardised features, is more than ``novelty`` times the answered leaves' own spacing: heads
  fit on the answers can agree confidently far from them), or when the model **disagreed** with the artist's recent
  answers (its agreement with the last ``recent`` answers, each measured before it learnt from it, is below
  ``agreement_floor``). A tree that has moved beyond the answers when the rate allows no question is **not trained
  on**: the model would be extrapolating there, and the samples would follow it away from the artist.
* **Being fooled** (:func:`taste_warnings`): the model's score of the samples rising while its agreement with the
  artist's recent answers is low, or the samples' diversity (mean pairwise feature distance of a round's leaves)
  falling under ``diversity_floor`` of the warm-up's, is a warning in the run's log and on the node, and the next
  tree is asked about whatever the rate.
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
    novelty: float = 1.5            # ask when a leaf is farther than this many answered-leaf spacings from the
    #                                 answered leaves (0: never for this reason)
    min_ask_rate: float = 0.05      # ask about at least this fraction of the trees seen, all run long
    agreement_floor: float = 0.6    # ask while the model agreed with less than this share of the recent answers
    recent: int = 5                 # how many answers (and rounds) "recent" means
    diversity_floor: float = 0.5    # warn and ask when a round's leaves are less diverse than this share of the
    #                                 warm-up rounds' (0: off)

    @classmethod
    def one_in(cls, every: int, **kw) -> "TasteConfig":
        """The settings that ask about at most one tree in ``every`` (the Train node's ``artist_every``), the floor
        rate lowered to that where it is higher."""
        rate = 1.0 / every
        return cls(max_ask_rate=rate, min_ask_rate=min(cls.min_ask_rate, rate), **kw)

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
        need(_finite(self.novelty) and 0 <= self.novelty <= 100,
             f"novelty must be a number in [0, 100] (0: off), got {self.novelty!r}")
        need(_finite(self.min_ask_rate) and 0 <= self.min_ask_rate <= self.max_ask_rate,
             f"min_ask_rate must be in [0, max_ask_rate = {self.max_ask_rate}], got {self.min_ask_rate!r}")
        need(_finite(self.agreement_floor) and 0 <= self.agreement_floor <= 1,
             f"agreement_floor must be a share in [0, 1] (0: off), got {self.agreement_floor!r}")
        need(isinstance(self.recent, int) and 1 <= self.recent <= 1000,
             f"recent must be an integer 1..1000, got {self.recent!r}")
        need(_finite(self.diversity_floor) and 0 <= self.diversity_floor < 1,
             f"diversity_floor must be a share in [0, 1) (0: off), got {self.diversity_floor!r}")


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
    """Ask the artist about this tree (:func:`ask_reason` gives a reason: no model yet, the heads disagree, or the
    least rate of questions is due)? ``scores`` (K, n): the heads' scores of its leaves (None: no model yet);
    ``trees_seen``: trees before this one; ``answers``: questions asked so far."""
    return ask_reason(scores, trees_seen, answers, cfg) is not None


REASONS = ("warm-up", "warning", "floor", "unsure", "moved", "disagrees")


def ask_reason(scores: Optional[torch.Tensor], trees_seen: int, answers: int, cfg: TasteConfig, *,
               novelty: Optional[float] = None, agreement: Optional[float] = None,
               warned: bool = False) -> Optional[str]:
    """Why to ask the artist about this tree (one of :data:`REASONS`), or None to let the model score it.

    ``scores`` (K, n): the heads' scores of its leaves (None: no model yet); ``trees_seen``: trees before this one;
    ``answers``: questions asked so far; ``novelty``: :meth:`TasteModel.novelty` of its leaves; ``agreement``: the
    model's mean agreement with the artist's recent answers; ``warned``: a :func:`taste_warnings` warning asks for
    this tree. Order: warm-up, warning, the floor rate; then, within ``max_ask_rate``: unsure, moved, disagrees.
    After the first ``warmup_trees`` trees a model not made yet (no answer with a preference) asks within
    ``max_ask_rate`` too ("warm-up")."""
    if trees_seen < cfg.warmup_trees:
        return "warm-up"
    if scores is None:
        return "warm-up" if answers + 1 <= cfg.max_ask_rate * (trees_seen + 1) else None
    if warned:
        return "warning"
    if answers < cfg.min_ask_rate * (trees_seen + 1):
        return "floor"
    if answers + 1 > cfg.max_ask_rate * (trees_seen + 1):
        return None
    if win_probability(scores)[1] < cfg.confident:
        return "unsure"
    if cfg.novelty > 0 and novelty is not None and novelty > cfg.novelty:
        return "moved"
    if agreement is not None and agreement < cfg.agreement_floor:
        return "disagrees"
    return None


def feature_spread(features: torch.Tensor) -> float:
    """The mean pairwise Euclidean distance between the rows of ``features`` (n, D), divided by √D (0 for n < 2):
    how diverse a round's leaves are, in the encoder's units."""
    n, dim = features.shape
    if n < 2:
        return 0.0
    d = torch.cdist(features.double(), features.double())
    return float(d.sum() / (n * (n - 1)) / math.sqrt(dim))


def taste_warnings(score_rise: Optional[float], agreement: Optional[float], diversity: Optional[float],
                   warmup_diversity: Optional[float], cfg: TasteConfig) -> dict[str, str]:
    """The signs that the taste model is being fooled, ``{"fooled" | "collapse": a sentence for the log and node}``.

    ``score_rise``: the current model's mean score of this round's leaves minus its score of the leaves ``recent``
    rounds ago (standardised units; > 0: the samples move where the model says the artist is happier);
    ``agreement``: its mean agreement with the artist's last ``recent`` answers; ``diversity`` /
    ``warmup_diversity``: :func:`feature_spread` of this round's leaves and the warm-up rounds' mean."""
    out = {}
    if score_rise is not None and agreement is not None and score_rise > 0 and agreement < cfg.agreement_floor:
        out["fooled"] = (f"the taste model rates the samples higher (+{score_rise:.2f}) while it agreed with only "
                   f"{agreement:.0%} of your last {cfg.recent} answers: it may be learning something you do not want; "
                   f"asking you about the next tree")
    if (cfg.diversity_floor > 0 and diversity is not None and warmup_diversity
            and diversity < cfg.diversity_floor * warmup_diversity):
        out["collapse"] = (f"the samples are {diversity / warmup_diversity:.0%} as diverse as at the start: they may "
                           f"be collapsing onto what the taste model likes; asking you about the next tree")
    return out


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
    groups: tuple = ()                           # sizes of the encoder's feature groups (summing to D; () = one)
    answered_z: Optional[torch.Tensor] = None    # (N, D) the answered leaves, standardised (after fit)
    spacing: Optional[float] = None              # their median distance to the nearest leaf of another tree

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
        self.std = allf.std(0, unbiased=False).clamp_min(1e-6) / group_weights(self.groups, allf.shape[1])
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
        self.answered_z = (allf - self.mean) / self.std
        self.spacing = _spacing(self.answered_z, [len(t.features) for t in self.trees])
        self.fit_seconds = time.perf_counter() - t0

    def novelty(self, features: torch.Tensor) -> Optional[float]:
        """How far leaves ``features`` (n, D) lie from the answered ones: the largest distance of a leaf to its
        nearest answered leaf (standardised features) in units of :attr:`spacing`. About 1 where the answers are;
        None without answers from two trees (or a model read from a file, which keeps no leaves)."""
        if self.answered_z is None or not self.spacing:
            return None
        z = (features.detach().double().cpu() - self.mean) / self.std
        return float(torch.cdist(z, self.answered_z).amin(1).max()) / self.spacing

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

        from ..io import atomic_write

        if self.thetas is None:
            raise ValueError("the taste model has not learned anything yet (no answered tree with a preference)")
        meta = {"format": FORMAT, "version": VERSION, "features": self.features,
                "feature_dim": str(self.feature_dim), "answers": str(self.answers), "groups": json.dumps(list(self.groups)),
                "config": json.dumps(asdict(self.config)), "info": json.dumps({**self.info, **(extra or {})})}
        tensors = {"thetas": self.thetas.float().contiguous(), "mean": self.mean.float().contiguous(),
                   "std": self.std.float().contiguous()}
        atomic_write(os.fspath(path), lambda tmp: save_file(tensors, tmp, metadata=meta))

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
        try:
            groups = tuple(int(g) for g in json.loads(meta.get("groups", "[]")))
            group_weights(groups, dim)
        except (TypeError, ValueError):
            groups = ()       # informational only: the saved ``std`` already carries the groups' weights
        m = cls(config=cfg, features=meta.get("features", "demo"), feature_dim=dim, thetas=th, mean=mean, std=std,
                info=json.loads(meta.get("info", "{}")), groups=groups)
        m.info["answers"] = int(meta.get("answers", 0))
        return m


def group_weights(groups: Sequence[int], dim: int) -> torch.Tensor:
    """(D,) float64 the scale of each standardised feature so that every group of ``groups`` (sizes summing to
    ``dim``) carries the same share of the prior: ``c_g = √(D / (G · D_g))``, so ``Σ_g D_g c_g² = D`` (the ridge's
    total prior variance unchanged) and a group of 3 features weighs as much as one of 128. ``()``: all ones."""
    if not groups:
        return torch.ones(dim, dtype=torch.float64)
    if sum(groups) != dim or any(int(g) < 1 for g in groups):
        raise ValueError(f"feature groups {tuple(groups)} must be sizes >= 1 summing to the features' {dim}")
    return torch.cat([torch.full((int(g),), math.sqrt(dim / (len(groups) * g)), dtype=torch.float64) for g in groups])


def _spacing(z: torch.Tensor, sizes: list[int]) -> Optional[float]:
    """The median over answered leaves ``z`` (N, D) of the distance to the nearest leaf of another answered tree
    (``sizes``: leaves per tree, in order); None with fewer than two trees or all distances 0."""
    if len(sizes) < 2:
        return None
    tree = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    d = torch.cdist(z, z)
    d[tree[:, None] == tree[None, :]] = float("inf")
    s = float(d.amin(1).median())
    return s if s > 0 and math.isfinite(s) else None


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
    """Drives the taste model over a run: for each tree, ask the artist (``ask``) when :func:`ask_reason` gives a
    reason, learn from the answer, and otherwise score the leaves with the model. Counts, the reasons, the agreement
    of the model with each answer before it learnt from it (the signal "does the model know the taste yet") and the
    :func:`taste_warnings` are kept in ``log``."""

    model: TasteModel
    encoder: Optional[object] = None
    decide: Optional[object] = None          # (scores, trees_seen, asked, config) -> bool; default: ask_reason
    trees_seen: int = 0
    asked: int = 0
    log: list = field(default_factory=list)
    agreements: list = field(default_factory=list)     # per answer, before the model learnt from it
    round_means: list = field(default_factory=list)    # per round, the leaves' mean features (D,)
    warmup_spread: list = field(default_factory=list)  # feature_spread of the warm-up rounds
    warned: bool = False                               # a warning asks about the next tree
    unanswered: int = 0                                # questions in a row nobody answered (timed out)
    _novelty: list = field(default_factory=list)       # this round's trees' novelty
    active: set = field(default_factory=set)           # warnings raised and not yet cleared (raised once each)

    @property
    def idle(self) -> bool:
        """Nothing can be trained until the artist answers: no model yet (no answer with a preference) and the
        last ``warmup_trees`` questions (at least one) timed out."""
        return self.model.thetas is None and self.unanswered >= max(1, self.model.config.warmup_trees)

    def state_dict(self) -> dict:
        """What a resumed run's taste model cannot learn again from the answers (its model is refit from
        ``artist_labels.jsonl``): the agreements with each answer, the rounds' mean features and the warm-up's
        spread (what its warnings compare with), the warnings raised, and the questions in a row left unanswered."""
        rounds = torch.stack(self.round_means) if self.round_means else torch.zeros(0, dtype=torch.float64)
        return {"online": json.dumps({"agreements": [float(a) for a in self.agreements],
                                      "warmup_spread": [float(x) for x in self.warmup_spread],
                                      "warned": bool(self.warned), "active": sorted(self.active),
                                      "unanswered": int(self.unanswered)}),
                "round_means": rounds.double().cpu()}

    def load_state_dict(self, state: dict) -> None:
        """The state :meth:`state_dict` kept (a checkpoint of the same run)."""
        kept = json.loads(state["online"])
        self.agreements = list(kept["agreements"])
        self.warmup_spread = list(kept["warmup_spread"])
        self.warned, self.active, self.unanswered = kept["warned"], set(kept["active"]), kept["unanswered"]
        self.round_means = list(state["round_means"].double())

    def recent_agreement(self) -> Optional[float]:
        a = self.agreements[-self.model.config.recent:]
        return sum(a) / len(a) if len(a) >= min(3, self.model.config.recent) else None

    def _reason(self, f: torch.Tensor) -> tuple[Optional[str], bool]:
        """(why to ask about the tree with leaf features ``f``, or None; whether it lies beyond the answers)."""
        scores = self.model.head_scores(f)
        if self.decide is not None:
            return ("custom" if self.decide(scores, self.trees_seen, self.asked, self.model.config) else None), False
        cfg = self.model.config
        novelty = self.model.novelty(f) if scores is not None else None
        if novelty is not None:
            self._novelty.append(novelty)
        far = cfg.novelty > 0 and novelty is not None and novelty > cfg.novelty
        return ask_reason(scores, self.trees_seen, self.asked, cfg, novelty=novelty,
                          agreement=self.recent_agreement(), warned=self.warned), far

    def _watch(self, features: torch.Tensor, warmup: bool) -> list[str]:
        """This round's :func:`taste_warnings` (each said once until its cause clears)."""
        cfg = self.model.config
        spread = feature_spread(features.double())
        if warmup:
            self.warmup_spread.append(spread)
        self.round_means.append(features.double().mean(0))
        rise = None
        if self.model.thetas is not None and len(self.round_means) > cfg.recent:
            then, now = self.round_means[-1 - cfg.recent], self.round_means[-1]
            s = self.model.scores(torch.stack([then, now]))
            rise = float(s[1] - s[0])
        ref = sum(self.warmup_spread) / len(self.warmup_spread) if self.warmup_spread and not warmup else None
        found = taste_warnings(rise, self.recent_agreement(), spread, ref, cfg)
        new = [w for k, w in found.items() if k not in self.active]
        self.active = set(found)
        return new

    def round(self, images: torch.Tensor, leaf_tree: torch.Tensor, ask, features: Optional[torch.Tensor] = None):
        """One batch: ``images`` (n, 3, H, W) leaves in [0, 1], ``leaf_tree`` (n,) their tree, ``ask(tree) ->``
        the (winner, loser) pairs of the answer (``[]``: no preference or skip), or None when nobody answered.

        Returns ``(rewards (n,) float32, exclude (n_trees,) bool, stats)``: asked trees get their win rates, the
        others the model's scores; a tree without preference is excluded, an unanswered one keeps the model's
        scores (excluded, as a tree not asked, while there is no model). ``stats["taste_warnings"]``: the warnings raised this round."""
        from .answers import win_rates

        if features is None:
            features = self.encoder(images)
        leaf_tree = leaf_tree.cpu()
        n_trees = int(leaf_tree.max()) + 1 if leaf_tree.numel() else 0
        rewards = torch.zeros(leaf_tree.numel())
        exclude = torch.zeros(n_trees, dtype=torch.bool)
        agreements, asked_trees, reasons = [], [], {}
        warmup = self.trees_seen < self.model.config.warmup_trees
        beyond, self._novelty = 0, []
        for t in range(n_trees):
            idx = (leaf_tree == t).nonzero().flatten()
            f = features[idx]
            reason, far = self._reason(f)
            if reason is None and far:
                # beyond what the answers cover and no question left in the rate: the model would be extrapolating,
                # so the tree is not trained on (a run whose samples outrun the answers slows down, never runs away)
                exclude[t] = True
                beyond += 1
            elif reason is not None:
                self.warned = False
                self.asked += 1
                asked_trees.append(t)
                reasons[reason] = reasons.get(reason, 0) + 1
                pairs = ask(t)
                self.unanswered = self.unanswered + 1 if pairs is None else 0
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
                        self.agreements.append(a)
                    self.model.add(f, pairs)
                    rewards[idx] = win_rates(pairs, len(idx))
            else:
                if self.model.thetas is None:           # no model to score it yet: not trained on
                    exclude[t] = True
                rewards[idx] = self.model.scores(f)
            self.trees_seen += 1
        warnings = self._watch(features.detach().double().cpu(), warmup)
        if warnings:
            self.warned = True
        stats = {"taste_asked": len(asked_trees), "taste_trees": n_trees, "taste_answers": self.model.answers,
                 "taste_agreement": (sum(agreements) / len(agreements)) if agreements else None,
                 "taste_recent_agreement": self.recent_agreement(), "taste_reasons": reasons,
                 "taste_warnings": warnings, "taste_beyond": beyond,
                 "taste_novelty": max(self._novelty) if self._novelty else None, "taste_fit_s": self.model.fit_seconds}
        self.log.append(stats)
        return rewards, exclude, stats


    def learn_check(self, first: torch.Tensor, second: torch.Tensor, pick: Optional[int]) -> Optional[float]:
        """Learn from a check against the start (treegrpo/artist/start_check.py): the artist preferred side
        ``pick`` (0 / 1; None: no preference, nothing learnt) of two picture sets (B, 3, H, W). What a tree's answers
        cannot say — where the run stands against where it started — as one comparison of the sides' mean features
        (with a linear score: the picked side's mean score is the higher). Returns the model's agreement with it
        before learning (counted among the recent agreements, so a model that disagrees asks more), or None."""
        if pick is None:
            return None
        if pick not in (0, 1):
            raise ValueError(f"a check's pick is 0, 1 or None, got {pick!r}")
        f = check_features(self.encoder, first, second)
        pairs = [(pick, 1 - pick)]
        a = self.model.agreement(f, pairs)
        if a is not None:
            self.agreements.append(a)
        self.model.add(f, pairs)
        return a


def check_features(encoder, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """A check's two sides (B, 3, H, W) each as its pictures' mean feature: (2, D) float64."""
    return torch.stack([encoder(first).double().mean(0), encoder(second).double().mean(0)])


def read_labels(path: str | os.PathLike) -> list[tuple[dict, "object"]]:
    """The answered records of an ``artist_labels.jsonl`` with their :class:`treegrpo.artist.answers.Answer`, in order.

    Written by any version: fields of a record or of its answer that this version does not know are left out with
    one warning naming the file, the record format (``version``) and the fields; a record whose answer this version
    cannot use (an unknown mode, a leaf outside the tree) is left out with one warning naming the file and its line;
    a last line cut off by a crash is ignored. A line that is not JSON in the middle of the file is refused, naming
    the file and the line (the file was edited or damaged there)."""
    import logging

    from .answers import LABELS_VERSION, MODES, Answer

    p = os.fspath(path)
    with open(p, encoding="utf-8") as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    out, unknown, versions, unusable = [], set(), set(), []
    fields = {"mode", "good", "bad", "ranking", "best", "worst", "seconds"}
    for n, ln in enumerate(lines):
        try:
            rec = json.loads(ln)
        except json.JSONDecodeError:
            if n == len(lines) - 1:      # a last line cut off by a crash: the answers before it count
                break
            raise ValueError(f"{p}: line {n + 1} is not JSON; the labels file is damaged there") from None
        if not isinstance(rec, dict):
            unusable.append(n + 1)
            continue
        versions.add(rec.get("version", 1))
        if rec.get("outcome") != "answered" or not rec.get("answer"):
            continue
        raw = rec["answer"]
        extra = set(raw) - fields if isinstance(raw, dict) else set()
        try:
            answer = Answer.from_dict({k: v for k, v in raw.items() if k in fields})
            if answer.mode not in MODES:
                raise ValueError(answer.mode)
        except (ValueError, TypeError, AttributeError):
            unusable.append(n + 1)
            continue
        unknown |= extra
        out.append((rec, answer))
    newer = sorted(v for v in versions if not isinstance(v, int) or v > LABELS_VERSION)
    if unknown:
        logging.warning("TreeGRPO: %s holds answers written by record format %s (this TreeGRPO writes %d); their "
                        "fields %s are unknown here and left out", p, newer or sorted(versions, key=str),
                        LABELS_VERSION, sorted(unknown))
    if unusable:
        logging.warning("TreeGRPO: %s: the answers on lines %s cannot be used by this version%s and are left out "
                        "(the file is kept as it is)", p, unusable[:10] + (["..."] if len(unusable) > 10 else []),
                        f" (record format {newer}, this TreeGRPO reads {LABELS_VERSION})" if newer else "")
    return out


def from_labels(folder: str | os.PathLike, encoder, config: Optional[TasteConfig] = None,
                features: str = "demo", iteration: Optional[int] = None) -> TasteModel:
    """A taste model learnt from a run's ``artist_labels.jsonl`` (the answered trees whose leaf images are kept
    beside it, in ``artist/``; :func:`read_labels`) and its ``artist_checks.jsonl`` (each check a side was picked
    in, its two pictures kept there too): what a resumed run starts from. ``iteration``: the one the run resumes at
    (its checkpoint's); answers about that iteration or later, and checks after it, came after the checkpoint (a crash
    cut the iteration) and are left out: the resumed run takes them again when it draws those trees
    (:mod:`treegrpo.artist.replay`)."""
    from ..report import read_picture
    from .answers import pairwise_wins
    from .start_check import side_pictures

    path = os.path.join(os.fspath(folder), "artist_labels.jsonl")
    model = TasteModel(config=config or TasteConfig(), features=features, groups=tuple(getattr(encoder, "groups", ())))

    def later(rec, first_after):    # a record the checkpoint does not include
        it = rec.get("iteration")
        return iteration is not None and isinstance(it, int) and it >= first_after

    for rec, answer in (read_labels(path) if os.path.isfile(path) else []):
        if later(rec, iteration or 0):
            continue
        leaves = [os.path.join(os.fspath(folder), p) for p in rec.get("leaves", [])]
        if len(leaves) < 2 or not all(os.path.isfile(p) for p in leaves):
            continue
        try:
            pairs = pairwise_wins(answer, len(leaves))
        except ValueError:
            continue
        imgs = torch.stack([read_picture(p) for p in leaves]).movedim(-1, 1)
        model.add(encoder(imgs), pairs, refit=False)
    for rec in _read_jsonl(os.path.join(os.fspath(folder), "artist_checks.jsonl")):
        if later(rec, (iteration or 0) + 1):
            continue
        sides = [os.path.join(os.fspath(folder), p) for p in rec.get("sides") or []]
        pick, n = rec.get("pick"), len(rec.get("prompts") or [])
        if pick not in (0, 1) or n < 1 or len(sides) != 2 or not all(os.path.isfile(p) for p in sides):
            continue
        try:
            first, second = (side_pictures(read_picture(p), n) for p in sides)
        except ValueError:
            continue
        model.add(check_features(encoder, first, second), [(pick, 1 - pick)], refit=False)
    model.fit()
    return model


def _read_jsonl(path: str) -> list[dict]:
    """The records of a JSON-lines file (none when it is missing; a damaged line is skipped)."""
    if not os.path.isfile(path):
        return []
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out
