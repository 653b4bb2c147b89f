"""The artist as the reward, in the core (no ComfyUI): what a person's answers mean and what learns from them.

* :mod:`.answers` — a pick among a tree's leaves → pairwise wins → leaf rewards (answer kinds, label records);
* :mod:`.taste` — the taste model: Bradley–Terry heads on frozen image features, asking only where it may be wrong;
* :mod:`.features` — the frozen image features it learns on (the demo's encoder, a reward model's image tower);
* :mod:`.start_check` — checks against where the run started, and the guard that keeps a run on the artist's side.

ComfyUI's side (the questions in the web UI, the Train node's taste model) is :mod:`treegrpo.comfyui.artist`.
"""
