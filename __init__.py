"""ComfyUI entry point of the TreeGRPO node pack.

ComfyUI (V3 API) calls ``comfy_entrypoint()``; the nodes live in ``nodes/``. Importing this file outside
ComfyUI neither fails nor imports ComfyUI: the node modules are imported only when ComfyUI asks.
(No NODE_CLASS_MAPPINGS here: ComfyUI would then ignore the entrypoint.)
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # make the bundled core package `treegrpo` importable inside ComfyUI;
    sys.path.append(_HERE)  # appended, so ComfyUI's own `nodes` module keeps precedence over our nodes/


#: the pack's web extension (the Artist Picks dialog), served by ComfyUI
WEB_DIRECTORY = "./web"


async def comfy_entrypoint():
    from .nodes import TreeGRPOExtension

    return TreeGRPOExtension()

