"""TreeGRPO inside ComfyUI: the policy adapter over a ``ModelPatcher`` (``policy``), ComfyUI's side of a run
(``runtime``: progress bar, interrupt, run folders, reward models in its memory management, latent shapes), the step
nodes' run (``steps``), the Train node's run (``train_node``), a run one can watch (``watch``), the artist board
(``artist``, ``taste``) and the embedded demo model as ComfyUI objects (``demo``). Imported only inside ComfyUI; the
core (``treegrpo``) never imports this package."""
