"""Reading reward-model weight files without executing anything in them.

Three formats arrive from the reward models' download pages: ``.safetensors``, torch pickles (read with
``weights_only=True``) and TorchScript archives (OpenAI's CLIP ``ViT-L-14.pt``). ``torch.jit.load`` would compile
and run the archive's ``code/`` and unpickle its objects without ``weights_only``'s restrictions, so a TorchScript
archive is read here with a restricted unpickler instead: it allows only tensor rebuilding and plain containers,
maps every TorchScript class to an inert record of its attributes, and reads the tensors' bytes from the zip.

A file cut short (an interrupted download) is reported as *incomplete*, with its size against what its own header
promises, before any parser error.
"""
from __future__ import annotations

import json
import os
import pickle
import zipfile
from typing import Any

import torch

#: element type of each legacy storage class a TorchScript pickle names
STORAGE_DTYPES = {
    "FloatStorage": torch.float32, "HalfStorage": torch.float16, "BFloat16Storage": torch.bfloat16,
    "DoubleStorage": torch.float64, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8, "BoolStorage": torch.bool,
}


class WeightFileError(ValueError):
    """A weight file that cannot be read safely (incomplete, corrupt, or holding code or objects)."""


def incomplete(name: str, path: str, have: int, want: int | None = None) -> WeightFileError:
    size = f"{have} bytes" + (f", its header promises at least {want}" if want else "")
    return WeightFileError(f"{name}: {path} is incomplete ({size}): the download or copy was cut short; download "
                           "the file again")


def not_weights(path: str, head: bytes) -> str | None:
    """What a file that starts with ``head`` is instead of weights, with what to do: a web page saved in place of
    the download, or a Git LFS pointer left by a clone without ``git lfs``; None when it looks like neither."""
    text = head.lstrip().lower()
    if text.startswith((b"<!doctype html", b"<html", b"<head", b"<?xml", b"<!--")):
        return (f"{path} is a web page (HTML), not the weights: the browser or wget saved the page the link led to. "
                "Download the file itself (on Hugging Face: the file's download button, a …/resolve/main/<file> URL)")
    if text.startswith(b"version https://git-lfs"):
        return (f"{path} is a Git LFS pointer, not the weights: the repository was cloned without Git LFS. Run "
                "`git lfs install && git lfs pull` in its folder, or download the file itself")
    return None


def check_complete(path: str, name: str) -> None:
    """Raise :func:`incomplete` for a safetensors file shorter than its header says, or a zip archive (torch's
    format since 1.6, TorchScript) whose central directory is missing (it is written last); a web page or a Git LFS
    pointer in place of the weights says so (:func:`not_weights`)."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        instead = not_weights(path, fh.read(256))
        if instead:
            raise WeightFileError(f"{name}: {instead}")
        fh.seek(0)
        head = fh.read(8)
        if path.endswith(".safetensors"):
            if size < 8:
                raise incomplete(name, path, size, 8)
            n = int.from_bytes(head, "little")
            if n > 100_000_000:
                raise WeightFileError(f"{name}: {path} is not a safetensors file (its header length is {n})")
            if size < 8 + n:
                raise incomplete(name, path, size, 8 + n)
            try:
                header = json.loads(fh.read(n))
            except ValueError as e:
                raise WeightFileError(f"{name}: {path} has a corrupt safetensors header ({e})") from None
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            if size < 8 + n + end:
                raise incomplete(name, path, size, 8 + n + end)
        elif head[:4] == b"PK\x03\x04" and not zipfile.is_zipfile(path):
            raise incomplete(name, path, size)


def loaded_weight_files(folder: str) -> list[str]:
    """The weight files ``from_pretrained`` reads from a transformers model folder, in its order of preference:
    ``model.safetensors``, else the shards its index names, else ``pytorch_model.bin`` or its shards ([] when
    there are none: transformers then says what it looked for)."""
    for single, index in (("model.safetensors", "model.safetensors.index.json"),
                          ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        if os.path.isfile(os.path.join(folder, single)):
            return [os.path.join(folder, single)]
        if os.path.isfile(os.path.join(folder, index)):
            try:
                with open(os.path.join(folder, index), encoding="utf-8") as fh:
                    shards = sorted(set(json.load(fh)["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return []                      # a damaged index: transformers' own error names it
            return [os.path.join(folder, f) for f in shards if os.path.isfile(os.path.join(folder, f))]
    return []


def check_folder_weights(folder: str, name: str) -> None:
    """:func:`check_complete` on each weight file ``from_pretrained`` will read (:func:`loaded_weight_files`)."""
    for path in loaded_weight_files(folder):
        check_complete(path, name)


def is_torchscript(path: str) -> bool:
    """TorchScript archives (OpenAI's CLIP ``ViT-L-14.pt``) are zip files with ``code/`` and ``constants.pkl``."""
    try:
        with zipfile.ZipFile(path) as z:
            return any(n.endswith("constants.pkl") or "/code/" in n for n in z.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


class _Record:
    """An inert stand-in for a TorchScript class instance: its pickled attributes, nothing else."""

    def __setstate__(self, state):
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.__dict__["_state"] = state


def _identity(value, *_):
    return value


class _TorchScriptUnpickler(pickle.Unpickler):
    """``data.pkl`` of a TorchScript archive with only tensors, containers and attribute records allowed."""

    def __init__(self, fh, archive: zipfile.ZipFile, prefix: str, name: str, path: str):
        super().__init__(fh)
        self.archive, self.prefix, self.name, self.path = archive, prefix, name, path
        self.records: dict[str, type] = {}

    def find_class(self, module: str, qualname: str) -> Any:
        if module == "__torch__" or module.startswith("__torch__."):
            key = f"{module}.{qualname}"
            if key not in self.records:
                self.records[key] = type(qualname.replace(".", "_"), (_Record,), {})
            return self.records[key]
        if module == "torch" and qualname in STORAGE_DTYPES:
            return STORAGE_DTYPES[qualname]
        allowed = {("torch._utils", "_rebuild_tensor_v2"): self._rebuild_tensor,
                   ("collections", "OrderedDict"): dict,
                   ("torch.jit._pickle", "restore_type_tag"): _identity,
                   ("torch.jit._pickle", "build_intlist"): list, ("torch.jit._pickle", "build_doublelist"): list,
                   ("torch.jit._pickle", "build_boollist"): list, ("torch.jit._pickle", "build_tensorlist"): list}
        if (module, qualname) in allowed:
            return allowed[(module, qualname)]
        raise WeightFileError(f"{self.name}: {self.path} holds a {module}.{qualname} object, which is not read: only "
                              "tensors are loaded from weight files, no code. Convert the file to .safetensors")

    def persistent_load(self, pid):
        kind, dtype, key, _location, numel = pid
        if kind != "storage" or not isinstance(dtype, torch.dtype):
            raise WeightFileError(f"{self.name}: {self.path} references an unknown storage {pid!r}")
        try:
            raw = self.archive.read(f"{self.prefix}data/{key}")
        except KeyError:
            raise incomplete(self.name, self.path, os.path.getsize(self.path)) from None
        itemsize = torch.empty((), dtype=dtype).element_size()
        if len(raw) < numel * itemsize:
            raise incomplete(self.name, self.path, os.path.getsize(self.path))
        return torch.frombuffer(bytearray(raw[: numel * itemsize]), dtype=dtype) if numel else \
            torch.empty(0, dtype=dtype)

    @staticmethod
    def _rebuild_tensor(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
        return storage.as_strided(tuple(size), tuple(stride), offset)


def read_torchscript(path: str, name: str) -> dict[str, torch.Tensor]:
    """The state dict of a TorchScript archive (parameters, buffers and tensor attributes, named by their
    attribute path as ``module.state_dict()`` names them), read without running the archive's code."""
    with zipfile.ZipFile(path) as z:
        pkl = [n for n in z.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if not pkl:
            raise WeightFileError(f"{name}: {path} is a zip archive without data.pkl: not a TorchScript model")
        prefix = pkl[0][: -len("data.pkl")]
        order = z.read(prefix + "byteorder").decode().strip() if prefix + "byteorder" in z.namelist() else "little"
        if order != "little":
            raise WeightFileError(f"{name}: {path} was written on a {order}-endian machine; convert it to .safetensors")
        with z.open(pkl[0]) as fh:
            root = _TorchScriptUnpickler(fh, z, prefix, name, path).load()
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()

    def walk(obj, at: str) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        for k, v in vars(obj).items():
            if isinstance(v, torch.Tensor):
                out[at + k] = v
            elif isinstance(v, _Record):
                walk(v, f"{at}{k}.")

    if not isinstance(root, _Record):
        raise WeightFileError(f"{name}: {path} does not hold a TorchScript module")
    walk(root, "")
    return out


def read_weights(path: str, name: str) -> dict:
    """Load a state dict from ``.safetensors``, a torch pickle (``weights_only=True``) or a TorchScript archive
    (:func:`read_torchscript`). Unwraps ``{'state_dict': ...}`` and a ``module.`` prefix (DataParallel). Errors
    name the file and the model; a truncated file is called incomplete."""
    check_complete(path, name)
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file
        try:
            return load_file(path, device="cpu")
        except Exception as e:  # safetensors raises its own error types
            raise WeightFileError(f"{name}: cannot read {path} as safetensors ({e})") from e
    if is_torchscript(path):
        try:
            sd = read_torchscript(path, name)
        except WeightFileError:
            raise
        except Exception as e:  # zip or pickle errors of a damaged archive
            raise WeightFileError(f"{name}: cannot read the TorchScript archive {path} ({type(e).__name__}: {e}); "
                                  "it may be damaged: download it again") from e
        for key in ("input_resolution", "context_length", "vocab_size"):
            sd.pop(key, None)
        return sd
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else ""
        hint = ""
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            hint = ("; the file holds Python objects besides tensors, which are not loaded for safety: convert it to "
                    "a plain state dict or .safetensors")
        elif isinstance(e, (EOFError, pickle.UnpicklingError)) or "truncated" in msg.lower():
            hint = "; the file may be incomplete: download it again"
        raise WeightFileError(f"{name}: cannot read {path} as a torch weight file ({type(e).__name__}: "
                              f"{msg[:300]}){hint}") from e
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise WeightFileError(f"{name}: {path} does not contain a state dict of tensors")
    if all(k.startswith("module.") for k in obj):
        obj = {k[len("module."):]: v for k, v in obj.items()}
    return obj
