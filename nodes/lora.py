"""Save LoRA node: ComfyUI key format into models/loras (LoraLoader lists it), atomic, with metadata."""
from __future__ import annotations

import os

import folder_paths
from comfy_api.latest import io, ui

from treegrpo.config import windows_reserved
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
    """Why ``prefix`` cannot name a file inside models/loras, on any system the workflow may run on, or None (checked
    when the prompt is queued: the LoRA is saved after the training)."""
    p = prefix.strip().replace("\\", "/").lstrip("/")
    parts = p.split("/")
    if not p or ".." in parts or ":" in p:      # ':' a drive (C:/...) or a stream on Windows: outside models/loras
        return f"filename_prefix {prefix!r} must be a relative name inside models/loras, e.g. treegrpo/my_lora"
    if not parts[-1] or parts[-1].startswith("."):
        return (f"filename_prefix {prefix!r} ends in a folder or a hidden name: end it with the file's name, e.g. "
                f"{'/'.join(parts[:-1] + ['my_lora'])}")
    bad = next((c for c in parts if windows_reserved(c) or any(ch in c for ch in '<>"|?*')), None)
    if bad is not None:
        return f"filename_prefix {prefix!r}: {bad!r} cannot be a file or folder name on Windows; choose another"
    long = next((c for c in parts if len(c.encode("utf-8")) > 200), None)
    if long is not None:
        return (f"filename_prefix {prefix!r}: the name {long[:30]!r}... is {len(long.encode('utf-8'))} bytes; file "
                "systems allow 255 with the counter and extension: use at most 200")
    return None


def save_to_loras(lora: dict, prefix: str) -> str:
    if not lora:
        raise ValueError("empty LoRA: nothing to save")
    root = folder_paths.get_folder_paths("loras")[0]
    if prefix_error(prefix):
        raise ValueError(prefix_error(prefix))
    prefix = prefix.strip().replace("\\", "/").lstrip("/")
    folder = os.path.join(root, os.path.dirname(prefix))
    try:
        os.makedirs(folder, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"filename_prefix {prefix!r}: a file stands where its folder {folder!r} should be; rename "
                         "that file or choose another prefix (the trained LoRA is also kept in the run's folder)") from None
    base = os.path.basename(prefix)
    n = 1
    while os.path.exists(os.path.join(folder, f"{base}_{n:05d}.safetensors")):
        n += 1
    path = os.path.join(folder, f"{base}_{n:05d}.safetensors")
    save_lora_file(path, dict(lora), getattr(lora, "metadata", {}))
    return path


NODES = [SaveLoRA]
