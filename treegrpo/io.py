"""Atomic file writes: temp file in the same folder, fsync, rename. A crash or a full disk during a
write leaves the previous file intact."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Callable


def atomic_write(path: str, write: Callable[[str], None]) -> str:
    """Call ``write(tmp_path)`` then move ``tmp_path`` over ``path`` atomically; returns ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(path) + "-", dir=folder)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; give the usual permissions
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:  # pragma: no cover - some filesystems do not fsync folders
        pass
    return path


def atomic_write_text(path: str, text: str) -> str:
    def w(tmp):
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
    return atomic_write(path, w)


def atomic_write_json(path: str, obj) -> str:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
