"""Save LoRA node: ComfyUI key format into models/loras (LoraLoader lists it), atomic, with metadata."""
from __future__ import annotations

import os

import folder_paths
from comfy_api.latest import io, ui

from treegrpo.lora import save_lora_file

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
        return prefix_error(filename_prefix) or True

    @classmethod
    def execute(cls, lora, filename_prefix):
        path = save_to_loras(lora, filename_prefix)
        return io.NodeOutput(path, ui=ui.PreviewText(f"saved {path}"))


def prefix_error(prefix: str):
    """Why ``prefix`` cannot name a file inside models/loras, or None."""
    p = prefix.strip().replace("\\", "/").lstrip("/")
    if not p or ".." in p.split("/"):
        return f"filename_prefix {prefix!r} must be a relative name inside models/loras"
    return None


def save_to_loras(lora: dict, prefix: str) -> str:
    if not lora:
        raise ValueError("empty LoRA: nothing to save")
    root = folder_paths.get_folder_paths("loras")[0]
    if prefix_error(prefix):
        raise ValueError(prefix_error(prefix))
    prefix = prefix.strip().replace("\\", "/").lstrip("/")
    folder = os.path.join(root, os.path.dirname(prefix))
    os.makedirs(folder, exist_ok=True)
    base = os.path.basename(prefix)
    n = 1
    while os.path.exists(os.path.join(folder, f"{base}_{n:05d}.safetensors")):
        n += 1
    path = os.path.join(folder, f"{base}_{n:05d}.safetensors")
    save_lora_file(path, dict(lora), getattr(lora, "metadata", {}))
    return path


NODES = [SaveLoRA]
