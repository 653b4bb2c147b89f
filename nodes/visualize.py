"""Tree Preview node: leaves laid out by tree and branch, annotated with reward and advantage."""
from __future__ import annotations

from comfy_api.latest import io, ui

from treegrpo.report import tree_preview

from .sockets import CATEGORY, PackNode, Rewards, Tree


class TreePreview(PackNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="TreeGRPOTreePreview", display_name="TreeGRPO Tree Preview", category=f"{CATEGORY}/visualize",
            description="Shows every leaf of every tree in branch order, with its reward and advantage.",
            inputs=[
                Tree.Input("tree", tooltip="tree (with advantages, from Advantage Backup, to show them)"),
                io.Image.Input("images", tooltip="decoded leaves of the tree"),
                Rewards.Input("rewards", optional=True, tooltip="annotate each leaf with its reward"),
            ],
            outputs=[io.Image.Output(display_name="preview", tooltip="one image: the leaves of each tree in branch order")],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, tree, images, rewards=None):
        img = tree_preview(tree.batch, images.movedim(-1, 1), rewards)
        return io.NodeOutput(img, ui=ui.PreviewImage(img, cls=cls))


NODES = [TreePreview]
