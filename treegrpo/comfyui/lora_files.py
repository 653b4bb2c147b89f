"""LoRA files where ComfyUI's LoraLoader lists them (``models/loras``): the Save LoRA node's file name from its
``filename_prefix`` (checked when the prompt is queued, on the rules of every system a workflow may run on) and a
counter, written atomically. Imported only inside ComfyUI (``folder_paths`` lazily)."""
from __future__ import annotations

import os

from ..config import windows_reserved
from ..io import SaveError, cannot_write
from ..lora import save_lora_file

#: where else LoRAs can go, for a message about a LoRA folder this process cannot write
LORAS_ELSEWHERE = ("give ComfyUI a loras folder it can write first (extra_model_paths.yaml: a loras folder with "
                   "is_default: true)")


def _relative(prefix: str) -> str:
    """The prefix as a '/'-separated name relative to the loras folder (spaces around it and leading slashes off)."""
    return prefix.strip().replace("\\", "/").lstrip("/")


def prefix_error(prefix: str):
    """Why ``prefix`` cannot name a file inside models/loras, on any system the workflow may run on, or None (checked
    when the prompt is queued: the LoRA is saved after the training)."""
    p = _relative(prefix)
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


def loras_write_error(prefix: str):
    """Why the Save LoRA node could not write ``prefix`` into the first loras folder (checked when the prompt is
    queued, before the training), or None."""
    import folder_paths

    folder = os.path.join(folder_paths.get_folder_paths("loras")[0],
                          os.path.dirname(_relative(prefix)))
    why = cannot_write(folder)
    return None if why is None else (f"filename_prefix {prefix!r}: cannot write in {folder!r} ({why}); make it "
                                     f"writable for the user ComfyUI runs as, or {LORAS_ELSEWHERE}")


def save_to_loras(lora: dict, prefix: str) -> str:
    """Write ``lora`` (ComfyUI keys; its ``metadata`` when it has one) as
    ``<models/loras>/<prefix>_<counter>.safetensors`` (the first free 5-digit counter), atomically; returns the path.
    ValueError for a prefix :func:`prefix_error` refuses or a file where its folder should be."""
    import folder_paths

    if not lora:
        raise ValueError("empty LoRA: nothing to save")
    root = folder_paths.get_folder_paths("loras")[0]
    if prefix_error(prefix):
        raise ValueError(prefix_error(prefix))
    prefix = _relative(prefix)
    folder = os.path.join(root, os.path.dirname(prefix))
    again = ("; the trained LoRA is still the graph's output: queue the workflow again and ComfyUI runs only this "
             "node")
    try:
        os.makedirs(folder, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"filename_prefix {prefix!r}: a file stands where its folder {folder!r} should be; rename "
                         f"that file or choose another prefix{again}") from None
    except PermissionError:
        raise ValueError((loras_write_error(prefix) or f"filename_prefix {prefix!r}: cannot create {folder!r}")
                         + again) from None
    base = os.path.basename(prefix)
    n = 1
    while os.path.exists(os.path.join(folder, f"{base}_{n:05d}.safetensors")):
        n += 1
    path = os.path.join(folder, f"{base}_{n:05d}.safetensors")
    try:
        save_lora_file(path, dict(lora), getattr(lora, "metadata", {}))
    except OSError as e:       # a full disk (SaveError), or no permission to make the temporary file
        why = str(e) if isinstance(e, SaveError) else (loras_write_error(prefix) or f"could not write {path}: {e}")
        raise ValueError(why + again) from None
    return path
