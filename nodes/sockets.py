"""Custom socket types of the pack, and the base class of its nodes."""
import functools

from comfy_api.latest import io

from treegrpo.deps import missing_message

Tree = io.Custom("TREEGRPO_TREE")            # treegrpo.comfyui.steps.TreeResult
Rewards = io.Custom("TREEGRPO_REWARDS")      # {"rewards": {name: (n,) tensor}, "weights": {name: float}}
RewardModel = io.Custom("TREEGRPO_REWARD_MODEL")  # {"name": str, "model": callable}
Run = io.Custom("TREEGRPO_RUN")              # treegrpo.comfyui.steps.RunState

CATEGORY = "TreeGRPO"


@functools.lru_cache(maxsize=1)
def dependency_error():
    """The missing-packages message (checked once per ComfyUI process: installing needs a restart), or None."""
    return missing_message()


class PackNode(io.ComfyNode):
    """Base of the pack's nodes: a queued graph fails validation, before anything runs, when a required package
    is missing. ComfyUI 0.3.75 calls ``validate_inputs`` only with the widget inputs it names (and then leaves
    their range / list checks to it), so every node with widgets names one string or combo widget, checks it and
    calls :meth:`check_dependencies` first. Nodes with links only are always fed by such a node."""

    @classmethod
    def check_dependencies(cls) -> bool | str:
        return dependency_error() or True

    @classmethod
    def check_choice(cls, name: str, value, options) -> bool | str:
        """What ComfyUI checks for a combo widget that ``validate_inputs`` takes over."""
        deps = cls.check_dependencies()
        if deps is not True:
            return deps
        return True if value is None or value in options else f"{name}: {value!r} is not one of {list(options)}"

    @classmethod
    def check_numbers(cls, values: dict) -> bool | str:
        """ComfyUI compares a number widget with its min and max, which NaN passes (every comparison with NaN is
        false): the nodes refuse non-finite Float and Int values here, naming the input and its range."""
        import math

        for i in cls.define_schema().inputs:
            if not isinstance(i, (io.Float.Input, io.Int.Input)) or i.id not in values:
                continue
            v = values[i.id]
            if isinstance(v, float) and not math.isfinite(v):
                lo, hi = getattr(i, "min", None), getattr(i, "max", None)
                span = f" (it takes {lo}..{hi})" if lo is not None and hi is not None else ""
                return f"{i.id}: {v!r} is not a number to train with; give a finite value{span}"
        return True

    @classmethod
    def check_combos(cls, **values) -> bool | str:
        """ComfyUI 0.3.75 checks a V3 combo's value against its options only for V1 nodes: a stale or hand-made
        graph with a value the list lacks would reach ``execute``. The nodes check their combos here (``None``: a
        linked input; booleans pass for the old boolean ``gradient_checkpointing`` widget, mapped in execute)."""
        options = {i.id: list(i.options) for i in cls.define_schema().inputs if isinstance(i, io.Combo.Input)}
        for name, value in values.items():
            if value is None or isinstance(value, bool) or name not in options or value in options[name]:
                continue
            shown = options[name] if len(options[name]) <= 20 else f"{len(options[name])} choices"
            return f"{name}: {value!r} is not one of {shown}"
        return True

