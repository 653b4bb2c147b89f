"""What a long run tells the person watching it: one line per iteration (reward, judge, KL, seconds per iteration,
time left), as pure functions of the trainer's statistics and a clock."""
from __future__ import annotations

import math
from typing import Optional


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``, ``3d04h`` (seconds, rounded down to the unit shown)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


class IterationClock:
    """Seconds per iteration as the person waiting sees them (wall clock between iterations, evaluations and saving
    included), smoothed over the last ``window`` iterations; and the time left to ``total``."""

    def __init__(self, window: int = 10):
        self.window = window
        self.times: list[float] = []

    def tick(self, now: float) -> None:
        """Call once at the start and after every iteration with a monotonic clock (s)."""
        self.times = (self.times + [now])[-(self.window + 1):]

    @property
    def s_per_it(self) -> Optional[float]:
        if len(self.times) < 2:
            return None
        return (self.times[-1] - self.times[0]) / (len(self.times) - 1)

    def left(self, done: int, total: int) -> Optional[float]:
        """Seconds left for ``total - done`` more iterations (None before the first iteration ends)."""
        rate = self.s_per_it
        return None if rate is None else max(0, total - done) * rate


def iteration_line(stats: dict, total: Optional[int], *, run_name: str = "", last_eval: Optional[dict] = None,
                   s_per_it: Optional[float] = None, left_s: Optional[float] = None) -> str:
    """One console line for an iteration, e.g.
    ``TreeGRPO sd15: it 12/200 | reward 0.431 | judge 0.520 (it 10) | KL 1.2e-03 | 38.2 s/it | 1h59m left``.

    ``total`` None: a run without an end (the step nodes: one iteration per queued prompt), ``it 12``.
    ``stats``: the trainer's record of the iteration (``iteration`` is the index before it, so the count shown is
    ``iteration + 1``; ``reward`` the mean training reward of its leaves, of the trees scored when ``scored_trees``
    says how many were (none: the artist skipped or left them all); a taste model's run (``taste_trees``) shows the
    trees asked, those not trained because they moved beyond the answers (``taste_beyond``) and the model's recent
    agreement with the answers instead; ``kl`` the update's KL estimate when the
    KL term is on). ``last_eval``: the newest evaluation record (its ``eval_judge`` when a judge is set, else its
    ``eval_reward``, with the iteration it was taken at)."""
    done = int(stats.get("iteration", 0)) + 1
    if "taste_trees" in stats:   # a taste model's run: its scores are log-odds beside the answers' win rates, and
        # their scale moves as it learns, so the line says what the artist did and how the model agrees instead
        reward = f"asked {stats.get('taste_asked', 0)}/{stats['taste_trees']} trees"
        if stats.get("taste_beyond"):    # not asked (the asking rate) and not trained: the model would extrapolate
            reward += f" | {stats['taste_beyond']} not trained (beyond your answers)"
        if stats.get("taste_recent_agreement") is not None:
            reward += f" | taste agrees {float(stats['taste_recent_agreement']):.0%}"
    elif stats.get("scored_trees", 1):
        reward = f"reward {stats.get('reward', float('nan')):.3f}"
    else:
        reward = "no tree scored (all skipped or unanswered)"
    parts = [f"it {done}/{total}" if total else f"it {done}", reward]
    if last_eval:
        key, label = ("eval_judge", "judge") if last_eval.get("eval_judge") is not None else ("eval_reward", "eval")
        parts.append(f"{label} {last_eval[key]:.3f} (it {last_eval.get('iteration', 0)})")
    if stats.get("kl") is not None:
        parts.append(f"KL {float(stats['kl']):.1e}")
    if s_per_it is not None:
        parts.append(f"{s_per_it:.1f} s/it" if s_per_it >= 1 else f"{1 / max(s_per_it, 1e-9):.1f} it/s")
    if left_s is not None:
        parts.append(f"{format_duration(left_s)} left")
    return f"TreeGRPO {run_name}: " + " | ".join(parts) if run_name else "TreeGRPO: " + " | ".join(parts)
