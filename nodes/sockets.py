"""Custom socket types of the pack."""
from comfy_api.latest import io

Tree = io.Custom("TREEGRPO_TREE")            # treegrpo.comfyui.session.TreeResult
Rewards = io.Custom("TREEGRPO_REWARDS")      # {"rewards": {name: (n,) tensor}, "weights": {name: float}}
RewardModel = io.Custom("TREEGRPO_REWARD_MODEL")  # {"name": str, "model": callable}
Run = io.Custom("TREEGRPO_RUN")              # treegrpo.comfyui.session.RunState

CATEGORY = "TreeGRPO"
