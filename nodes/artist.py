"""The Artist Picks node: the person at the page that queued the prompt picks among each tree's leaves; the picks
become the leaf rewards Advantage Backup takes (treegrpo/artist/answers.py states the rule)."""
from __future__ import annotations

from comfy_api.latest import io

from treegrpo.config import ArtistConfig
from treegrpo.comfyui.artist.questions import ask_artist
from treegrpo.comfyui.runtime import asking_context

from .sockets import CATEGORY, PackNode, RewardModel, Rewards, Tree
from .widgets import widget


class ArtistPicks(PackNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="TreeGRPOArtistPicks", display_name="TreeGRPO Artist Picks", category=f"{CATEGORY}/rewards",
            description="Shows each tree's leaves (siblings side by side) in the tab that queued the prompt and waits "
                        "for your picks: favourites (click; shift-click marks bad), a ranking, or best and worst. "
                        "Picks become win-rate rewards; 'no preference' and 'skip' leave the tree untrained. Every "
                        "answer is kept in the run folder's artist_labels.jsonl.",
            inputs=[
                io.Image.Input("images", tooltip="decoded leaves (VAEDecode of the Tree Sampler's leaves)"),
                Tree.Input("tree", tooltip="the Tree Sampler's trees (which leaves are siblings)"),
                widget(io.Combo, "mode",
                       tooltip="favourites: click the good ones (shift-click: bad); ranking: click in order best "
                               "first; best_worst: click the best, then the worst"),
                widget(io.Int, "timeout_s", min=5, max=86400),
                widget(io.Combo, "on_timeout",
                       tooltip="what an unanswered tree becomes: not trained on, or scored by the reward model "
                               "connected below"),
                RewardModel.Input("reward_model", optional=True,
                                  tooltip="the fallback for unanswered trees (on_timeout: use the reward model)"),
                widget(io.Int, "away_s", optional=True, min=1, max=86400),
            ],
            outputs=[Rewards.Output(display_name="rewards", tooltip="per-leaf rewards for Advantage Backup")],
        )

    @classmethod
    def validate_inputs(cls, mode=None, on_timeout=None, timeout_s=None, away_s=None):
        ok = cls.check_combos(mode=mode, on_timeout=on_timeout)
        if ok is not True:
            return ok
        if timeout_s is not None and not 5 <= timeout_s <= 86400:
            return f"timeout_s: {timeout_s!r} is outside 5..86400 seconds"
        if away_s is not None and not 1 <= away_s <= 86400:
            return f"away_s: {away_s!r} is outside 1..86400 seconds"
        return cls.check_dependencies()

    @classmethod
    def execute(cls, images, tree, mode, timeout_s, on_timeout, reward_model=None, away_s=None):
        cfg = ArtistConfig(mode=mode, timeout_s=timeout_s, on_timeout=on_timeout,
                           away_s=ArtistConfig().away_s if away_s is None else away_s)   # refuses bad values first
        out = ask_artist(tree, images, mode=cfg.mode, timeout_s=cfg.timeout_s, on_timeout=cfg.on_timeout,
                         reward_model=reward_model, away_s=cfg.away_s, **asking_context())
        return io.NodeOutput(out)


NODES = [ArtistPicks]
