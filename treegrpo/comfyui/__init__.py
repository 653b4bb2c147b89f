"""TreeGRPO inside ComfyUI: the policy adapter over a ``ModelPatcher`` (``policy``), the training session the
nodes share (``session``: runs, model management, progress bar, interrupt) and the embedded demo model as ComfyUI
objects (``demo``). Imported only inside ComfyUI; the core (``treegrpo``) never imports this package."""
