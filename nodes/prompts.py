"""Prompt List node: training (and held-out evaluation) prompts from a file in ComfyUI's input/ folder."""
from __future__ import annotations

import os

from comfy_api.latest import io

from treegrpo.comfyui.prompt_files import prompt_file_choices, resolve_prompt_file
from treegrpo.prompts import PromptFileError, read_prompt_file, split_heldout

from .sockets import CATEGORY, PackNode


class PromptList(PackNode):
    @classmethod
    def define_schema(cls):
        choices = prompt_file_choices()
        return io.Schema(
            node_id="TreeGRPOPromptList", display_name="TreeGRPO Prompt List", category=f"{CATEGORY}/training",
            description="Prompts from a file in ComfyUI's input/ folder (.txt one a line, '# ' lines comments, .csv "
                        "with a 'prompt' column, "
                        ".jsonl with {\"prompt\": ...} a line), or a set the pack ships (treegrpo/...). Connect "
                        "'prompts' to the Train node's prompts and 'eval_prompts' to its eval_prompts.",
            inputs=[
                io.Combo.Input("file", options=choices, default=choices[0] if choices else None,
                               tooltip="a .txt, .csv or .jsonl prompt file in ComfyUI/input/ (refresh after adding one; "
                                       "other files are not listed), or a shipped set"),
                io.Int.Input("eval_count", default=0, min=0, max=100000,
                             tooltip="prompts held out for evaluation only (never trained on), drawn with the seed; "
                                     "0 = evaluate on the training prompts"),
                io.Int.Input("seed", default=0, min=0, max=2 ** 31 - 1, tooltip="which prompts are held out"),
            ],
            outputs=[io.String.Output(display_name="prompts", tooltip="training prompts, one a line"),
                     io.String.Output(display_name="eval_prompts",
                                      tooltip="held-out evaluation prompts, one a line (empty when eval_count is 0)"),
                     io.Int.Output(display_name="count", tooltip="number of training prompts")],
        )

    @classmethod
    def fingerprint_inputs(cls, file=None, **kwargs):
        """The file's size and modification time: an edited file is read again."""
        try:
            st = os.stat(resolve_prompt_file(file))
            return f"{st.st_size}-{st.st_mtime_ns}"
        except (OSError, ValueError):
            return file

    @classmethod
    def validate_inputs(cls, file=None):
        deps = cls.check_dependencies()
        if deps is not True or file is None:
            return deps
        try:
            resolve_prompt_file(file)
        except (PromptFileError, ValueError) as e:
            return str(e)
        return True

    @classmethod
    def execute(cls, file, eval_count=0, seed=0):
        train, held = split_heldout(read_prompt_file(resolve_prompt_file(file)), eval_count, seed)
        return io.NodeOutput("\n".join(train), "\n".join(held), len(train))


NODES = [PromptList]
