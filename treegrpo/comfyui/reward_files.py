"""The Reward Model Loader's file list per reward, for the web UI: ``GET /treegrpo/reward_files`` answers
``{"files": {reward: [file, ...]}}`` from ``models/reward_models`` (read when asked, so a file added while ComfyUI
runs shows after the page refreshes its node definitions). The front end (``web/treegrpo_reward_files.js``) shows
only the chosen reward's files; ComfyUI still accepts any file of the folder."""
from __future__ import annotations

FOLDER = "reward_models"
NO_FILE = "(none: built-in weights or none needed)"


def register_model_folder() -> None:
    """Register ``models/reward_models`` with ComfyUI's folder_paths (files and model folders), first, before the
    folders an ``extra_model_paths.yaml`` names for it: ComfyUI reads that file before it loads node packs, so a
    ``reward_models:`` entry there would otherwise be the only folder listed (as ComfyUI orders its own folders,
    ``models/<name>`` and then the extra paths)."""
    import os

    import folder_paths
    own = os.path.join(folder_paths.models_dir, FOLDER)
    if FOLDER not in folder_paths.folder_names_and_paths:
        folder_paths.add_model_folder_path(FOLDER, own)
        return
    paths = folder_paths.folder_names_and_paths[FOLDER][0]
    if own not in paths:
        paths.insert(0, own)
        folder_paths.filename_list_cache.pop(FOLDER, None)


def reward_folder() -> str:
    """The folder the pack writes reward models into (a taste model): the first of ``reward_models`` (as LoRAs go
    to the first ``loras`` folder), created when missing."""
    import os

    import folder_paths
    register_model_folder()
    root = folder_paths.get_folder_paths(FOLDER)[0]
    os.makedirs(root, exist_ok=True)
    return root


def all_reward_files() -> list[str]:
    """Every file under ``models/reward_models`` (relative, '/'-separated), as the loader's combo lists them."""
    import folder_paths
    register_model_folder()
    return [f.replace("\\", "/") for f in folder_paths.get_filename_list(FOLDER)]


def files_by_reward() -> dict[str, list[str]]:
    """reward → the loader's choices for it: ``NO_FILE`` for rewards that need no file, else the files that can be
    that reward (:func:`treegrpo.rewards.files.files_for`), or ``NO_FILE`` alone when there are none yet."""
    from ..rewards.base import available, reward_files
    from ..rewards.files import files_for

    files = all_reward_files()
    out = {}
    for name in available():
        needs = bool(reward_files(name)["files"]) or name == "taste"
        out[name] = files_for(name, files, needs) or [NO_FILE]
    return out


def register_routes() -> None:
    """Add ``GET /treegrpo/reward_files`` to ComfyUI's server (once; a no-op without a server)."""
    from .runtime import server_routes

    srv, web = server_routes("_treegrpo_reward_file_routes")
    if srv is None:
        return

    @srv.routes.get("/treegrpo/reward_files")
    async def reward_files_route(request):
        return web.json_response({"files": files_by_reward()})
