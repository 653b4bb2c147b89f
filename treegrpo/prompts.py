"""Prompts as users keep them: files of one prompt a line (``.txt``), a table (``.csv``) or JSON lines (``.jsonl``); a
held-out split for evaluation; and the text a reward model should see (ComfyUI's weighting syntax and embedding
names removed; the text encoder still gets the prompt whole)."""
from __future__ import annotations

import csv
import io
import json
import os
import random
import re

#: file kinds a prompt list is read from
PROMPT_FILE_TYPES = (".txt", ".csv", ".jsonl")
#: the keys a ``.jsonl`` object or a ``.csv`` header may hold the prompt under (first found wins)
PROMPT_KEYS = ("prompt", "text", "caption")
#: the prompt sets the pack ships, and the prefix that names them (``treegrpo/general_subjects.txt``)
SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompt_sets")
SHIPPED_PREFIX = "treegrpo/"


class PromptFileError(ValueError):
    """A prompt file that cannot be used; the message names the file, the line and what to do."""


def _text(path: str) -> str:
    try:
        with open(path, encoding="utf-8-sig") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise PromptFileError(f"prompt file {path!r} does not exist; put it in ComfyUI's input/ folder (or give its "
                              "full path)") from None
    except UnicodeDecodeError as e:
        raise PromptFileError(f"prompt file {path!r} is not UTF-8 text ({e.reason} at byte {e.start}); save it as "
                              "UTF-8") from None
    except OSError as e:
        raise PromptFileError(f"prompt file {path!r} cannot be read ({e.strerror})") from None
    if "\x00" in text:
        raise PromptFileError(f"prompt file {path!r} is a binary file, not text")
    return text


def _one_line(prompt: str) -> str:
    return " ".join(prompt.split())


CSV_HINT = ("a prompt with commas or quotes goes in double quotes, its own quotes doubled "
            '(\"a cat, studio lighting\" or \"\"\"OPEN\"\" on a door\"), or use a .txt file, one prompt a line')


def _from_csv(text: str, path: str) -> list[str]:
    """The prompt column (``prompt``, ``text`` or ``caption`` in a header; else the only column) of a CSV table. A row
    that does not parse as CSV, or that has more fields than the table has columns, is refused naming it: a comma
    or a quote inside an unquoted prompt would otherwise cut the prompt silently."""
    reader = csv.reader(io.StringIO(text), strict=True)
    rows = []
    try:
        for r in reader:
            if any(c.strip() for c in r):
                rows.append((reader.line_num, r))
    except csv.Error as e:
        raise PromptFileError(f"prompt file {path!r}, line {reader.line_num}: not valid CSV ({e}); {CSV_HINT}") from None
    if not rows:
        return []
    header = [c.strip().lower() for c in rows[0][1]]
    col = next((header.index(k) for k in PROMPT_KEYS if k in header), None)
    body = rows if col is None else rows[1:]
    width = 1 if col is None else len(header)
    for n, r in body:
        if len(r) > width:
            what = (f"the header has {width} column{'s' if width > 1 else ''}" if col is not None else
                    "the file has no header naming the prompt column (prompt, text or caption), so each row is one "
                    "prompt")
            raise PromptFileError(f"prompt file {path!r}, line {n}: {len(r)} fields where {what}; {CSV_HINT}")
    if col is None:
        return [r[0] for _, r in rows if r[0].strip()]
    out = []
    for n, r in body:
        if col >= len(r):
            raise PromptFileError(f"prompt file {path!r}, line {n}: has no {header[col]!r} column value")
        out.append(r[col])
    return out


def _from_jsonl(text: str, path: str) -> list[str]:
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"prompt file {path!r}, line {n}: not JSON ({e.msg}); write one object per line "
                                  'such as {"prompt": "a red circle"}') from None
        if isinstance(obj, str):
            out.append(obj)
        elif isinstance(obj, dict) and any(isinstance(obj.get(k), str) for k in PROMPT_KEYS):
            out.append(next(obj[k] for k in PROMPT_KEYS if isinstance(obj.get(k), str)))
        else:
            raise PromptFileError(f"prompt file {path!r}, line {n}: an object with a \"prompt\" string (or \"text\", "
                                  f"\"caption\") was expected, got {line.strip()[:60]!r}")
    return out


#: a comment line of a one-prompt-a-line file: ``#`` alone or followed by a space (as sd-scripts' prompt files
#: have them); ``#sunset, beach`` is a prompt
_COMMENT = re.compile(r"\s*#(\s|$)")


def comment_lines(text: str, path: str) -> int:
    """How many ``# comment`` lines the prompt file ``path`` (its contents ``text``) has that are not prompts (0 for
    a .csv or .jsonl file)."""
    if os.path.splitext(path)[1].lower() in (".csv", ".jsonl"):
        return 0
    return sum(1 for line in text.splitlines() if _COMMENT.match(line))


def parse_prompts(text: str, path: str) -> list[str]:
    """The prompts in ``text``, the contents of the prompt file ``path`` (its extension decides how it is read:
    ``.csv`` and ``.jsonl`` as below, anything else one prompt a line, ``# comment`` lines left out), each on one
    line (inner whitespace collapsed), blank ones dropped. Raises :class:`PromptFileError` for a malformed ``.csv``
    or ``.jsonl``."""
    ext = os.path.splitext(path)[1].lower()
    raw = _from_csv(text, path) if ext == ".csv" else _from_jsonl(text, path) if ext == ".jsonl" else \
        [line for line in text.splitlines() if not _COMMENT.match(line)]
    return [_one_line(p) for p in raw if p.strip()]


def shipped_prompt_file(name: str) -> str | None:
    """The path of a prompt set the pack ships, named ``treegrpo/<file>`` (as the Prompt List lists it and a config's
    ``prompts_file`` may name it), or None when ``name`` names none."""
    if not isinstance(name, str) or not name.startswith(SHIPPED_PREFIX):
        return None
    path = os.path.join(SHIPPED_DIR, name[len(SHIPPED_PREFIX):])
    return path if os.path.dirname(path) == SHIPPED_DIR and os.path.isfile(path) else None


def read_prompt_file(path: str, max_prompts: int = 100000) -> list[str]:
    """The prompts in ``path`` in file order, each on one line (inner whitespace collapsed), blank ones dropped:
    ``.txt`` one prompt a line (``# comment`` lines left out); ``.csv`` the ``prompt`` (or ``text``, ``caption``)
    column, else the first column;
    ``.jsonl`` one JSON object a line with a ``prompt`` (``text``, ``caption``) string, or a JSON string.
    Raises :class:`PromptFileError` for a missing, empty, binary or malformed file or more than ``max_prompts``."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in PROMPT_FILE_TYPES:
        raise PromptFileError(f"prompt file {path!r}: use a .txt (one prompt a line), .csv (a 'prompt' column) or "
                              ".jsonl ({\"prompt\": ...} a line) file")
    prompts = parse_prompts(_text(path), path)
    if not prompts:
        raise PromptFileError(f"prompt file {path!r} holds no prompts; write one prompt a line")
    if len(prompts) > max_prompts:
        raise PromptFileError(f"prompt file {path!r} holds {len(prompts)} prompts, more than the {max_prompts} this "
                              "run takes; split the file")
    return prompts


def split_heldout(prompts: list[str], heldout: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """(training prompts, held-out evaluation prompts): ``heldout`` prompts drawn with ``seed`` (0 = none: every
    prompt trains and the evaluation uses the training prompts). Both keep file order; duplicates stay together
    on one side."""
    if heldout <= 0:
        return list(prompts), []
    unique = list(dict.fromkeys(prompts))
    if heldout >= len(unique):
        raise PromptFileError(f"eval_count {heldout}: the file has {len(unique)} different prompts; hold out fewer "
                              "so that some are left to train on")
    chosen = set(random.Random(seed).sample(unique, heldout))
    return [p for p in prompts if p not in chosen], [p for p in unique if p in chosen]


_EMBEDDING = re.compile(r"embedding:[^\s,()]+", re.IGNORECASE)
_WEIGHTED = re.compile(r"\((?P<body>[^()]*?)(?::\s*[-+]?\d*\.?\d+)?\)")


def reward_text(prompt: str) -> str:
    """The prompt as a reward model should read it: ComfyUI's emphasis ``(word:1.2)`` and ``(word)`` unwrapped to
    ``word`` (nested ones too), ``embedding:name`` tokens removed, escaped brackets ``\\(`` ``\\)`` kept as
    literal brackets, whitespace and the commas left behind tidied. A prompt without that syntax comes back
    unchanged."""
    if "(" not in prompt and "embedding:" not in prompt.lower():
        return prompt
    text = prompt.replace("\\(", "\x01").replace("\\)", "\x02")
    text = _EMBEDDING.sub("", text)
    while True:
        new = _WEIGHTED.sub(lambda m: m.group("body"), text)
        if new == text:
            break
        text = new
    text = text.replace("\x01", "(").replace("\x02", ")")
    text = re.sub(r"\s+([,.;:!?])", r"\1", " ".join(text.split()))
    return text.strip(" ,")
