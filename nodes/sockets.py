"""Custom socket types of the pack, and the base class of its nodes."""
import functools

from comfy_api.latest import io

from treegrpo.deps import missing_message

Tree = io.Custom("TREEGRPO_TREE")            # treegrpo.comfyui.session.TreeResult
Rewards = io.Custom("TREEGRPO_REWARDS")      # {"rewards": {name: (n,) tensor}, "weights": {name: float}}
RewardModel = io.Custom("TREEGRPO_REWARD_MODEL")  # {"name": str, "model": callable}
Run = io.Custom("TREEGRPO_RUN")              # treegrpo.comfyui.session.RunState

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
