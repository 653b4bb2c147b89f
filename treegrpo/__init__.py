"""TreeGRPO core: tree-structured GRPO post-training of diffusion/flow models (Ding & Ye, 2025).

Importable without ComfyUI. See docs/design.md §2 for the layout of the modules."""

__version__ = "0.1.0"
