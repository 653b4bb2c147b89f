"""The artist as the reward: a person's picks among the leaves of one tree become leaf rewards.

Leaves of one tree share their start and differ only by the branches taken in the window, so a pick among them says
which branches were better. The rule (docs/design.md §9, tested on hand-worked cases in tests/unit/test_artist.py):

* every answer implies pairwise wins between leaves of the same tree:
  - **favourites**: each favourite beats every other leaf; if bad leaves are marked, every unmarked leaf beats each
    bad one (a favourite beats a bad one once);
  - **ranking**: tiers, best first; every leaf beats every leaf of a later tier; leaves of one tier tie (no pair);
  - **best and worst**: the best beats every other leaf, every other leaf beats the worst (once each);
  - **no preference** and **skip** give no pair;
* a leaf's reward is its within-tree win rate: wins / comparisons it took part in (a leaf in no comparison gets ½);
* a tree with no pair carries no preference: it is not trained on (its edges get weight 0).
Then the usual z-score inside the tree and the advantage backup.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

MODES = ("favourites", "ranking", "best_worst", "none", "skip")
LABELS_VERSION = 1   # the record format of artist_labels.jsonl (written by treegrpo/comfyui/artist/questions.py,
#                      read by treegrpo.artist.taste.read_labels)


@dataclass(frozen=True)
class Answer:
    """One answer about one tree; leaf indices are 0-based positions in the tree's leaves.

    ``good``/``bad``: favourites mode. ``ranking``: tiers best first (a tier of several leaves is a tie).
    ``best``/``worst``: best-and-worst mode. ``seconds``: how long the person took (kept in the labels)."""

    mode: str
    good: tuple = ()
    bad: tuple = ()
    ranking: tuple = ()
    best: Optional[int] = None
    worst: Optional[int] = None
    seconds: float = 0.0
    extra: dict = field(default_factory=dict, compare=False)

    def validate(self, n_leaves: int) -> "Answer":
        """Itself, or ValueError naming what is wrong (an index outside the tree, a leaf both good and bad, …)."""
        if self.mode not in MODES:
            raise ValueError(f"answer mode {self.mode!r} is not one of {', '.join(MODES)}")
        if n_leaves < 2:
            raise ValueError(f"a tree needs at least 2 leaves to compare, this one has {n_leaves}")

        def check(ix, what):
            for i in ix:
                if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n_leaves:
                    raise ValueError(f"{what}: leaf {i!r} is not in this tree (leaves 0..{n_leaves - 1})")

        check(self.good, "good")
        check(self.bad, "bad")
        if set(self.good) & set(self.bad):
            raise ValueError(f"leaves {sorted(set(self.good) & set(self.bad))} are marked both good and bad")
        flat = [i for tier in self.ranking for i in tier]
        check(flat, "ranking")
        if len(flat) != len(set(flat)):
            raise ValueError("ranking: a leaf appears twice")
        for name in ("best", "worst"):
            v = getattr(self, name)
            if v is not None:
                check([v], name)
        if self.mode == "best_worst":
            if self.best is None or self.worst is None:
                raise ValueError("best_worst: give both the best and the worst leaf")
            if self.best == self.worst:
                raise ValueError("best_worst: the best and the worst leaf are the same")
        if self.mode == "favourites" and not self.good and not self.bad:
            raise ValueError("favourites: pick at least one leaf (or answer 'no preference')")
        if self.mode == "ranking" and len(self.ranking) < 2:
            raise ValueError("ranking: give at least two tiers (one tier is a tie of everything)")
        return self

    @classmethod
    def from_dict(cls, d: dict) -> "Answer":
        """From the JSON the web dialog posts: ``{"mode", "good", "bad", "ranking", "best", "worst", "seconds"}``."""
        if not isinstance(d, dict):
            raise ValueError(f"an answer is a JSON object, got {type(d).__name__}")
        unknown = set(d) - {"mode", "good", "bad", "ranking", "best", "worst", "seconds"}
        if unknown:
            raise ValueError(f"answer: unknown fields {sorted(unknown)}")
        ints = lambda v: tuple(int(i) if isinstance(i, (int, float)) and float(i).is_integer() else i  # noqa: E731
                               for i in (v or ()))
        seconds = d.get("seconds", 0.0)
        if not isinstance(seconds, (int, float)) or not (0 <= float(seconds) < 1e7):
            raise ValueError(f"answer: seconds {seconds!r} is not a duration")
        return cls(mode=d.get("mode", ""), good=ints(d.get("good")), bad=ints(d.get("bad")),
                   ranking=tuple(ints(t) if isinstance(t, (list, tuple)) else ints([t]) for t in d.get("ranking") or ()),
                   best=d.get("best"), worst=d.get("worst"), seconds=float(seconds))

    def to_dict(self) -> dict:
        return {"mode": self.mode, "good": list(self.good), "bad": list(self.bad),
                "ranking": [list(t) for t in self.ranking], "best": self.best, "worst": self.worst,
                "seconds": round(self.seconds, 3)}


def pairwise_wins(answer: Answer, n_leaves: int) -> list[tuple[int, int]]:
    """``(winner, loser)`` pairs the answer implies among ``n_leaves`` leaves (each unordered pair at most once)."""
    a = answer.validate(n_leaves)
    pairs: dict[frozenset, tuple[int, int]] = {}

    def win(w, l):
        if w != l:
            pairs.setdefault(frozenset((w, l)), (w, l))

    leaves = range(n_leaves)
    if a.mode == "favourites":
        good, bad = set(a.good), set(a.bad)
        for g in a.good:
            for o in leaves:
                if o not in good:
                    win(g, o)
        for o in leaves:
            if o not in bad:
                for b in a.bad:
                    win(o, b)
    elif a.mode == "ranking":
        for i, tier in enumerate(a.ranking):
            for later in a.ranking[i + 1:]:
                for w in tier:
                    for l in later:
                        win(w, l)
    elif a.mode == "best_worst":
        for o in leaves:
            win(a.best, o)
        for o in leaves:
            win(o, a.worst)
    return list(pairs.values())


def win_rates(pairs: list[tuple[int, int]], n_leaves: int) -> Optional[torch.Tensor]:
    """Each leaf's within-tree win rate (n_leaves,) in [0, 1]: wins / comparisons (½ without any); None without pairs
    (the tree carries no preference)."""
    if not pairs:
        return None
    wins = torch.zeros(n_leaves, dtype=torch.float64)
    games = torch.zeros(n_leaves, dtype=torch.float64)
    for w, l in pairs:
        wins[w] += 1
        games[w] += 1
        games[l] += 1
    return torch.where(games > 0, wins / games.clamp_min(1), torch.full_like(wins, 0.5)).float()


def answer_rewards(answer: Answer, n_leaves: int) -> Optional[torch.Tensor]:
    """The leaf rewards (n_leaves,) of one answered tree, or None when it carries no preference."""
    return win_rates(pairwise_wins(answer, n_leaves), n_leaves)


def sibling_groups(parents: list[torch.Tensor], leaf_ids: list[int]) -> list[list[int]]:
    """The leaves ``leaf_ids`` (global leaf indices of one tree) grouped by their ancestor at the last level where
    the tree branched, as positions 0.. in ``leaf_ids``: siblings side by side in the dialog. ``parents[j]`` maps
    the nodes of level j to their parents at level j − 1 (a TreeBatch's ``parents``)."""
    ids = torch.as_tensor(leaf_ids, dtype=torch.long)
    for j in range(len(parents) - 1, 0, -1):
        up = parents[j].cpu()[ids]
        if up.unique().numel() < ids.unique().numel():   # this level branched: its parents are the groups
            groups: dict[int, list[int]] = {}
            for pos, p in enumerate(up.tolist()):
                groups.setdefault(p, []).append(pos)
            return list(groups.values())
        ids = up
    return [list(range(len(leaf_ids)))]
