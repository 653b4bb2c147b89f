"""Where the Prompt List node finds prompt files: ComfyUI's input/ folder (and its subfolders) and the sets the pack
ships (``treegrpo/prompt_sets/``, listed as ``treegrpo/<file>``)."""
from __future__ import annotations

import os

from ..prompts import PROMPT_FILE_TYPES, SHIPPED_DIR as SHIPPED, SHIPPED_PREFIX, PromptFileError, shipped_prompt_file


#: folder levels below input/ the list looks into
MAX_DEPTH = 6


def _input_dir() -> str:
    import folder_paths
    return folder_paths.get_input_directory()


def prompt_file_choices() -> list[str]:
    """Prompt files under input/ (paths relative to it, sorted), then the shipped sets."""
    found, seen = [], set()
    root = _input_dir()
    for folder, dirs, files in os.walk(root, followlinks=True):    # a linked folder too, each folder once
        seen.add(os.path.realpath(folder))
        deep = os.path.relpath(folder, root).count(os.sep) >= MAX_DEPTH - 1    # (a link to / or ~ is not walked whole)
        dirs[:] = [] if deep else sorted(d for d in dirs if not d.startswith(".")
                                         and os.path.realpath(os.path.join(folder, d)) not in seen)
        for f in files:
            if os.path.splitext(f)[1].lower() in PROMPT_FILE_TYPES:
                found.append(os.path.relpath(os.path.join(folder, f), root).replace(os.sep, "/"))
    shipped = sorted(SHIPPED_PREFIX + f for f in os.listdir(SHIPPED) if f.endswith(PROMPT_FILE_TYPES))
    return sorted(found) + shipped


def resolve_prompt_file(name: str) -> str:
    """The full path of a choice of :func:`prompt_file_choices`; a name that escapes input/ or does not exist is
    refused with what to do."""
    if not isinstance(name, str) or not name:
        raise PromptFileError("file: choose a prompt file (put a .txt, .csv or .jsonl file in ComfyUI's input/ folder)")
    shipped = shipped_prompt_file(name)
    if shipped:
        return shipped
    # the name is checked as written (no '..' out of input/); a link the user put in input/ is followed, as the
    # list follows it
    root = os.path.abspath(_input_dir())
    path = os.path.normpath(os.path.join(root, name))
    if os.path.commonpath([root, path]) != root:
        raise PromptFileError(f"file: {name!r} is outside ComfyUI's input/ folder; put the prompt file there")
    if not os.path.isfile(path):
        raise PromptFileError(f"file: {name!r} is not in ComfyUI's input/ folder ({root}); put it there and refresh "
                              "the page (R)")
    if os.path.splitext(path)[1].lower() not in PROMPT_FILE_TYPES:
        raise PromptFileError(f"file: {name!r} is not a .txt, .csv or .jsonl prompt file")
    return path
