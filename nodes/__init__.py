"""ComfyUI nodes of the TreeGRPO pack (V3 API). Thin adapters over ``treegrpo``: they convert ComfyUI
types to core types, report progress and call one core function each."""
from __future__ import annotations

from comfy_api.latest import ComfyExtension, io

from . import advantages, lora, rewards, sampling, training, visualize


class TreeGRPOExtension(ComfyExtension):
    async def on_load(self) -> None:
        rewards.register_model_folder()

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return [*sampling.NODES, *rewards.NODES, *advantages.NODES, *training.NODES, *lora.NODES, *visualize.NODES]
