"""Save LoRA node: ComfyUI key format into models/loras (LoraLoader lists it), atomic, with metadata."""
from __future__ import annotations

from comfy_api.latest import io, ui

from treegrpo.comfyui.lora_files import loras_write_error, prefix_error, save_to_loras

from .sockets import CATEGORY, PackNode


class SaveLoRA(PackNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="TreeGRPOSaveLoRA", display_name="TreeGRPO Save LoRA", category=f"{CATEGORY}/lora",
            description="Writes the LoRA (ComfyUI keys, with TreeGRPO metadata) into models/loras, atomically.",
            inputs=[
                io.LoraModel.Input("lora", tooltip="LoRA from the Train or Trainer Step node"),
                io.String.Input("filename_prefix", default="treegrpo/treegrpo_lora",
                                tooltip="file name under models/loras (a counter is appended)"),
            ],
            outputs=[io.String.Output(display_name="path", tooltip="the file written")],
            is_output_node=True,
        )

    @classmethod
    def validate_inputs(cls, filename_prefix=None):
        deps = cls.check_dependencies()
        if deps is not True or filename_prefix is None:
            return deps
        return prefix_error(filename_prefix) or loras_write_error(filename_prefix) or True

    @classmethod
    def execute(cls, lora, filename_prefix):
        path = save_to_loras(lora, filename_prefix)
        return io.NodeOutput(path, ui=ui.PreviewText(f"saved {path}"))


NODES = [SaveLoRA]
