"""Atomic file writes: temp file in the same folder, fsync, rename. A crash or a full disk during a
write leaves the previous file intact."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Callable, Optional


class SaveError(OSError):
    """A file could not be written (disk full, no permission, ...); the previous file is unchanged."""


def atomic_write(path: str, write: Callable[[str], None]) -> str:
    """Call ``write(tmp_path)`` then move ``tmp_path`` over ``path`` atomically; returns ``path``.

    Any failure of the write (a full disk included, whatever library raised it) removes the temporary
    file and raises :class:`SaveError` naming ``path``; an interrupt is re-raised as it is."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(path) + "-", dir=folder)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        write(tmp)
        # mkstemp makes 0600 files (and some writers replace the file): give the usual permissions
        os.chmod(tmp, 0o666 & ~umask)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, Exception) and not isinstance(e, SaveError):
            err = SaveError(f"could not save {path}: {e} (disk full or not writable?); the previous file, if any, "
                            "is unchanged - free some space or choose another folder and save again")
            err.errno = getattr(e, "errno", None)
            raise err from e
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


def cannot_write(folder: str) -> Optional[str]:
    """Why this process cannot write files in ``folder`` (it, or the nearest folder above it that exists, where it is
    still to be made), or None when it can; creates nothing."""
    path = os.path.abspath(folder)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    if not os.path.isdir(path):
        return f"{path!r} is a file"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"no permission to write in {path!r}"
    return None
