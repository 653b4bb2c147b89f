"""ComfyUI nodes of the TreeGRPO pack (V3 API). Thin adapters over ``treegrpo``: they convert ComfyUI
types to core types, report progress and call one core function each."""
from __future__ import annotations

import logging

from comfy_api.latest import ComfyExtension, io

from . import advantages, artist, lora, prompts, rewards, sampling, training, visualize
from .sockets import dependency_error


class TreeGRPOExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        """Called once when ComfyUI loads the pack (0.3.75 does not call ``on_load``)."""
        rewards.register_model_folder()
        from treegrpo.comfyui import reward_files
        from treegrpo.comfyui.artist.questions import register_routes
        register_routes()
        reward_files.register_routes()
        from treegrpo.comfyui.versions import outside_tested, running_version
        if outside_tested(running_version()):
            logging.warning(outside_tested(running_version()))
        if dependency_error():  # the nodes load anyway, and refuse to run with this same message
            logging.warning(dependency_error())
        return [*sampling.NODES, *rewards.NODES, *artist.NODES, *advantages.NODES, *prompts.NODES, *training.NODES, *lora.NODES, *visualize.NODES]
