"""Advantage Backup node."""
from __future__ import annotations

import json

from comfy_api.latest import io

from treegrpo.comfyui.steps import backup_tree
from treegrpo.config import AdvantageConfig

from .sockets import CATEGORY, PackNode, Rewards, Tree
from .widgets import config_default, widget


class AdvantageBackup(PackNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="TreeGRPOAdvantageBackup", display_name="TreeGRPO Advantage Backup", category=f"{CATEGORY}/training",
            description="Leaf rewards -> z-scored leaf advantages -> advantages of every window edge, backed up "
                        "deepest level first (softmax over sibling log-probs, or mean), optionally relative to "
                        "the mean of their siblings.",
            inputs=[
                Tree.Input("tree", tooltip="tree from the TreeGRPO Tree Sampler"),
                Rewards.Input("rewards", tooltip="rewards of the tree's leaves, in leaf order"),
                widget(io.Combo, "backup", "how child-edge advantages combine into their parent's"),
                widget(io.Float, "temperature", "softmax temperature on the behaviour log-probs", min=0.01,
                       max=100.0, step=0.01),
                widget(io.Float, "adv_clip", "clip edge advantages to +-this (0 = off)", min=0.0, max=100.0, step=0.1),
                widget(io.Float, "flat_floor", "trees whose reward spread is below this are not trained", min=0.0,
                       max=10.0, step=0.0001),
                widget(io.Combo, "edge_baseline", optional=True, tooltip="siblings: each edge's advantage minus the mean of the "
                               "edges out of the same node (siblings compete); none: the paper's edge advantages"),
            ],
            outputs=[Tree.Output(display_name="tree", tooltip="the tree with per-edge advantages, for the Trainer Step"),
                     io.String.Output(display_name="stats", tooltip="advantage statistics (JSON)")],
        )

    @classmethod
    def validate_inputs(cls, backup=None, edge_baseline=None):
        ok = cls.check_choice("backup", backup, ("softmax", "mean"))
        return ok if ok is not True else cls.check_combos(edge_baseline=edge_baseline)

    @classmethod
    def execute(cls, tree, rewards, backup, temperature, adv_clip, flat_floor, edge_baseline=None):
        cfg = AdvantageConfig(backup=backup, temperature=temperature, adv_clip=adv_clip, flat_floor=flat_floor,
                              edge_baseline=edge_baseline or config_default("edge_baseline"))
        out = backup_tree(tree, rewards, cfg)
        return io.NodeOutput(out, json.dumps(out.adv_stats, indent=1))


NODES = [AdvantageBackup]
