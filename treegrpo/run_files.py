"""A run's files: the LoRA (ComfyUI's or PEFT's keys) with its metadata, the best LoRA, checkpoints (written and
resumed, with every random state), ``log.csv`` / ``eval.csv`` / ``log.json``, and claiming the output folder. A mixin of
:class:`treegrpo.trainer.Trainer`; the file formats are :mod:`treegrpo.checkpoint`'s and :mod:`treegrpo.lora`'s."""
from __future__ import annotations

import csv
import json
import os
import random
from typing import Optional

import torch

from . import checkpoint as ckpt
from .io import atomic_write, atomic_write_json
from .lora import save_lora_file, to_peft


def _numpy_state() -> list:
    import numpy as np
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]


def _set_numpy_state(st: list) -> None:
    import numpy as np
    np.random.set_state((st[0], np.array(st[1], dtype=np.uint32), st[2], st[3], st[4]))


#: the columns ``eval.csv`` begins with; the rest follow in name order
EVAL_FIRST = ("iteration", "train_time", "total_nfe", "eval_reward", "eval_judge", "eval_kl")


def write_csv(path: str, records: list[dict], first: tuple = (), join_lists: bool = False) -> None:
    """``records`` as a CSV table at ``path``: one row each, a column for every key any of them has (``first``
    in that order, the others sorted; a key a record lacks is an empty cell); ``join_lists``: lists joined by
    ``"; "`` (else written as Python shows them, as log.csv always had them)."""
    keys = sorted({k for r in records for k in r})
    keys = [k for k in first if k in keys] + [k for k in keys if k not in first]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        wr = csv.DictWriter(fh, fieldnames=keys)
        wr.writeheader()
        wr.writerows({k: "; ".join(map(str, v)) if join_lists and isinstance(v, list) else v for k, v in r.items()}
                     for r in records)


class RunFiles:
    """The Trainer's LoRA files, checkpoints and logs (rank 0 writes; other ranks return without writing)."""

    #: the iteration of the checkpoint written or read last (None: none yet)
    checkpointed_iteration: Optional[int] = None
    replace_earlier: bool = True       # a fresh start moves an earlier run of its name aside (False: refuses it)
    #: this process among ``world`` (data parallel, :class:`treegrpo.distributed.DataParallel` as ``dist``); the
    #: Trainer sets them, one process by default
    rank, world, dist = 0, 1, None
    #: which front-end trains the run, kept in its checkpoints: "steps" for the step nodes (one iteration per queued
    #: prompt, settings that may change between queues), "train" for the Train node and the command line
    frontend = "train"
    #: what the model is on top of its checkpoint, where the front-end knows (the ComfyUI nodes:
    #: :func:`treegrpo.comfyui.model_chain.describe`): kept in ``run.json``, and in the LoRA's metadata when the model
    #: is more than its checkpoint
    model_chain: Optional[dict] = None

    @property
    def best_lora_path(self) -> str:
        return os.path.join(self.out, f"{self.cfg.run_name}_best.safetensors")

    def save_best(self, rec: Optional[dict] = None) -> Optional[str]:
        """Write the current LoRA as the run's best (atomically), with the evaluation that chose it (``rec``: the
        newest by default; another when the LoRA went back to the state it evaluated)."""
        if self.rank != 0:
            return None
        rec = rec if rec is not None else self.evals[-1]
        key = "eval_judge" if rec.get("eval_judge") is not None else "eval_reward"
        meta = dict(self.metadata(), **{"treegrpo.best_iteration": str(rec["iteration"]), "treegrpo.best_metric": key,
                                        "treegrpo.best_score": f"{rec[key]:.6f}"})
        return save_lora_file(self.best_lora_path, self.lora_tensors("comfy"), meta)

    # ------------------------------------------------------------------ files
    def lora_weights(self):
        return self.lora.weights()

    def lora_tensors(self, fmt: str = "comfy") -> dict:
        w = self.lora_weights()
        return self.policy.comfy_lora_state_dict(w) if fmt == "comfy" else to_peft(w)

    def metadata(self) -> dict:
        tree = dict(self.cfg.tree.__dict__)
        for key in ("branch_schedule", "tail_steps_schedule"):   # a tree without them is described as before the
            if not tree[key]:                                      # fields existed
                del tree[key]
        meta = {"treegrpo.method": self.cfg.tree.method, "treegrpo.tree_config": tree,
                "treegrpo.step": str(self.iteration), "treegrpo.base_model": self.base_model_name,
                "treegrpo.run_name": self.cfg.run_name, "treegrpo.lora_alpha": str(self.cfg.lora.alpha),
                "treegrpo.lora_rank": str(self.cfg.lora.rank), "treegrpo.backend": self.cfg.backend}
        if self.cfg.optim.loss != "grpo":      # NFT / AWM; a GRPO LoRA is described as before the field existed
            meta["treegrpo.loss"] = self.cfg.optim.loss
        if self.model_chain and self.model_chain.get("on_top"):     # trained on top of a LoRA or patched sampling
            meta["treegrpo.model_chain"] = self.model_chain
        return meta

    @property
    def lora_path(self) -> str:
        return os.path.join(self.out, f"{self.cfg.run_name}.safetensors")

    def save_lora(self, path: Optional[str] = None, fmt: str = "comfy") -> str:
        path = path or self.lora_path
        if self.rank != 0:
            return path
        return save_lora_file(path, self.lora_tensors(fmt), self.metadata())

    def checkpoint_state(self) -> dict:
        named = self.lora.named_lora_parameters()
        return {"base_model": self.base_model_name,
                "lora": {n: p.detach().cpu().clone() for n, p in named}, "param_names": [n for n, _ in named],
                "optimizer": self.optimizer.state_dict(), "history": json.dumps(self.history),
                "evals": json.dumps(self.evals), "train_time": self.train_time, "total_nfe": self.total_nfe,
                "config": json.dumps(self.cfg.to_dict(), default=str), "sigmas": self.sigmas(),
                "torch_rng": torch.get_rng_state(), "python_rng": json.dumps(random.getstate()),
                "numpy_rng": json.dumps(_numpy_state()), "callbacks": self.callback_states(),
                "prompts_sha256": ckpt.prompts_digest(self.prompts), "frontend": self.frontend,
                "eval_pending": bool(getattr(self, "eval_pending", False))}

    def callback_states(self) -> dict:
        """The callbacks' own state for a resumed run (``TrainerCallback.state_dict``), by :meth:`callback_key`."""
        out = {}
        for i, cb in enumerate(self.callbacks):
            st = cb.state_dict(self) if hasattr(cb, "state_dict") else None
            if st is not None:
                out[self.callback_key(i)] = st
        return out

    def callback_key(self, i: int) -> str:
        """The checkpoint's name of callback ``i``: its class, numbered when the class is there more than once."""
        name = type(self.callbacks[i]).__qualname__
        same = [j for j, cb in enumerate(self.callbacks) if type(cb).__qualname__ == name]
        return name if len(same) == 1 else f"{name}.{same.index(i)}"

    def save_checkpoint(self) -> Optional[str]:
        """Write ``checkpoints/<run>-<iteration>.pt`` (see :mod:`treegrpo.checkpoint`)."""
        if self.rank != 0:
            return None
        path = ckpt.write_checkpoint(self.out, self.cfg.run_name, self.iteration, self.checkpoint_state(),
                                     self.cfg.keep_checkpoints)
        self.checkpointed_iteration = self.iteration
        for cb in self.callbacks:
            cb.on_checkpoint(self, path)
        return path

    def latest_checkpoint(self) -> Optional[str]:
        found = ckpt.checkpoint_paths(self.out, self.cfg.run_name)
        return found[-1] if found else None

    def load_checkpoint(self, path: str, state: Optional[dict] = None) -> None:
        state = state if state is not None else ckpt.read_checkpoint(path, self.cfg.run_name)
        named = self.lora.named_lora_parameters()
        names = [n for n, _ in named]
        opt = ckpt.optimizer_state_in_order(state["optimizer"], state["param_names"], names)
        with torch.no_grad():
            for n, p in named:
                if state["lora"][n].shape != p.shape:
                    raise ckpt.CheckpointError(f"checkpoint {path} does not fit the model: LoRA parameter {n} is "
                                               f"{tuple(state['lora'][n].shape)}, the model's {tuple(p.shape)} "
                                               "(another LoRA rank?)")
                p.copy_(state["lora"][n])
        with torch.inference_mode(False):
            self.optimizer.load_state_dict(opt)  # the lr is re-set from (iteration, train_time)
        self.iteration = int(state["iteration"])
        self.checkpointed_iteration = self.iteration
        self.history = json.loads(state["history"])
        self.evals = json.loads(state["evals"])
        self.eval_pending = bool(state.get("eval_pending", False))    # a checkpoint written before the field: none
        self.train_time = float(state["train_time"])
        self.total_nfe = int(state["total_nfe"])
        self._keep_schedule(state.get("sigmas"), json.loads(state.get("config", "{}")).get("backend", self.cfg.backend))
        torch.set_rng_state(state["torch_rng"])
        st = json.loads(state["python_rng"])
        random.setstate((st[0], tuple(st[1]), st[2]))
        _set_numpy_state(json.loads(state["numpy_rng"]))
        saved = state.get("callbacks") or {}
        for i, cb in enumerate(self.callbacks):
            if self.callback_key(i) in saved and hasattr(cb, "load_state_dict"):
                cb.load_state_dict(self, saved[self.callback_key(i)])

    def _keep_schedule(self, saved: Optional[torch.Tensor], saved_backend: str) -> None:
        """A run moved to another front-end (the checkpoint's backend is not this one's) continues on the noise levels
        it was trained with, when this policy's own differ at the same step count: ComfyUI's schedulers and the CLI's
        backends space them differently, and the moved run must compute what it would have computed where it
        started. On the same front-end the policy's own apply (a new scheduler or shift is the user's choice), as
        they do for another step count or a checkpoint without a schedule (older versions)."""
        self.kept_sigmas = None
        if saved is None or saved_backend == self.cfg.backend:
            return
        own = self.policy.sigmas(self.cfg.tree.steps).float().cpu()
        if saved.numel() != own.numel() or torch.equal(saved.float(), own):
            return
        self.kept_sigmas = saved.float().cpu()
        if self.rank == 0:
            self.log(f"run {self.cfg.run_name!r} was trained on the {saved_backend!r} backend and continues on its "
                     f"noise levels (from its checkpoint; this model's own schedule differs by up to "
                     f"{float((own - self.kept_sigmas).abs().max()):.4g})")

    def begin(self, resume: bool) -> None:
        """Claim the output folder; resume the run's latest checkpoint (``resume``), or start afresh and move an
        earlier run's files aside (``checkpoint.archive_run``; also where ``resume`` finds no checkpoint but the run
        left files). ``started_fresh`` says which. Several processes: the first reads the folder and sends what it
        found to the others (:meth:`treegrpo.distributed.DataParallel.broadcast_object`), so every process resumes
        at the same iteration with the same LoRA and optimiser state, and a refusal stops them all."""
        found, failure = None, None
        if self.rank == 0:
            try:
                found = self._open_run_folder(resume)
            except BaseException as e:        # told to the other processes before it is raised here
                failure = e
        if self.world > 1 and hasattr(self.dist, "broadcast_object"):
            sent = self.dist.broadcast_object(None if self.rank else
                                              ("failed", f"{type(failure).__name__}: {failure}") if failure is not None
                                              else ("found", found))
            if self.rank:
                if sent[0] == "failed":
                    raise ckpt.CheckpointError(f"the first process could not start the run ({sent[1]})")
                found = sent[1]
        if failure is not None:
            raise failure
        self.started_fresh = found is None
        if found is not None:
            path, state = found
            self.load_checkpoint(path, state)
            if self.rank == 0:
                self.log(f"TreeGRPO {self.cfg.run_name}: resumed from {path} after iteration {state['iteration']}")

    def _open_run_folder(self, resume: bool) -> Optional[tuple[str, dict]]:
        """The first process's part of :meth:`begin`: ``(path, state)`` of the newest readable checkpoint when
        resuming one, else None once the folder is ours for a fresh start."""
        found = ckpt.checkpoint_paths(self.out, self.cfg.run_name) if resume else []
        if found:   # the newest readable one: a damaged latest falls back to the one before
            ckpt.claim_output_dir(self.out, self.cfg.run_name, self.base_model_name, chain=self.model_chain)
            return ckpt.read_latest_checkpoint(found, self.cfg.run_name)
        # the earlier run of this name aside (also one on another base model), then the folder is ours; unless
        # replacing it was not asked for (the command line without --overwrite): one that finished iterations
        # since the checks before the model loaded (a run of the same name ending meanwhile) is refused
        if not self.replace_earlier:
            ckpt.check_fresh_start(self.out, self.cfg.run_name)
        ckpt.check_run_folder(self.out, self.cfg.run_name, self.base_model_name, fresh=True)
        moved = ckpt.archive_run(self.out, self.cfg.run_name)
        if moved:
            self.log(f"an earlier run {self.cfg.run_name!r} was moved to {moved}")
        ckpt.claim_output_dir(self.out, self.cfg.run_name, self.base_model_name, fresh=True, chain=self.model_chain)
        return None

    def write_logs(self) -> None:
        """``log.csv`` (one row per iteration), ``eval.csv`` (one row per evaluation, once there is one) and
        ``log.json`` (training and evaluation records, the run's whole config and the package version;
        docs/design.md §6 says what each column counts)."""
        if self.rank != 0 or not self.history:
            return
        os.makedirs(self.out, exist_ok=True)
        atomic_write(os.path.join(self.out, "log.csv"), lambda tmp: write_csv(tmp, self.history, first=()))
        if self.evals:
            atomic_write(os.path.join(self.out, "eval.csv"), lambda tmp: write_csv(tmp, self.evals, first=EVAL_FIRST,
                                                                             join_lists=True))
        from . import __version__
        atomic_write_json(os.path.join(self.out, "log.json"), {
            "train": self.history, "eval": self.evals, "version": __version__,
            "config": json.loads(json.dumps(self.cfg.to_dict(), default=str))})
