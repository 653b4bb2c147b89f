"""What scoring a batch gives the advantage backup, and what a leaf scorer is told about the run.

A **leaf scorer** replaces or adjusts the reward models' scores of a batch's leaves: the artist asked about every N-th
tree (treegrpo/comfyui/artist/questions.py), the taste model that asks when unsure (treegrpo/comfyui/artist/taste.py), a
simulated artist (benchmarks/bench_artist.py). It is called as ``scorer(ctx, batch, images, raw) -> LeafScores`` with a
:class:`ScoringContext` — never the Trainer — the batch (a ``TreeBatch``: ``leaf_tree``, ``n_trees``, ``prompts``,
``parents``), the decoded leaves (n, 3, H, W) or (n, F, 3, H, W) in [0, 1], and the reward models' raw scores.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch


@dataclass(frozen=True)
class ScoringContext:
    """The run as a leaf scorer sees it. ``iteration``: this batch's (0-based); ``trees_before``: trees the run
    trained on before this batch; ``output_dir`` / ``run_name`` / ``seed``: the run's (where answers are kept);
    ``weights``: the reward models' weights by name; ``score_images(images, prompts) -> {name: (B,)}``: the reward
    models on other pictures (a fallback for an unanswered question)."""

    iteration: int
    trees_before: int
    output_dir: str
    run_name: str
    seed: int
    weights: dict
    score_images: Callable


@dataclass
class LeafScores:
    """Raw rewards by name, each (n_leaves,); their ``weights`` (None: the config's); ``exclude_trees`` (n_trees,)
    bool, trees not trained on (an artist's "no preference"; None: none); ``stats``: the scorer's statistics, kept in
    the iteration's record (e.g. the taste model's ``taste_*``; ``taste_warnings`` are also logged as warnings)."""

    raw: dict
    weights: Optional[dict] = None
    exclude_trees: Optional[torch.Tensor] = None
    stats: dict = field(default_factory=dict)
