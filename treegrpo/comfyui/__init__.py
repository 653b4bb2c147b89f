"""TreeGRPO inside ComfyUI: the policy adapter over a ``ModelPatcher`` (``policy``), ComfyUI's side of a run
(``runtime``: progress bar, interrupt, run folders, reward models in its memory management, latent shapes), the step
nodes' run (``steps``), the Train node's run (``train_node``), a run one can watch (``watch``), the artist's dialog
and taste model (``artist/``), the embedded demo model as ComfyUI objects (``demo``), the model families it trains
(``families``), the ComfyUI versions it knows (``versions``), and the prompt and reward files its loaders list
(``prompt_files``, ``reward_files``). Imported only inside ComfyUI; the
core (``treegrpo``) never imports this package."""
