"""Asking the artist: questions about a tree's leaves shown in the web UI, answers posted back, waits done right.

The node that asks (the Artist Picks node, or the Train node every N-th tree) runs in ComfyUI's worker thread; the
pack's routes run in the server's event loop. They share :data:`BOARD` under a lock:

* ``ask`` stores a :class:`Question` (keyed by prompt, tree and a random nonce) and sends
  ``treegrpo.artist.question`` over the websocket to the tab that queued the prompt only (``client_id``); every other
  tab gets ``treegrpo.artist.waiting`` (a count, no images);
* ``GET /treegrpo/artist/pending?client_id=…`` serves the open questions of that tab again (a page reload), and those
  of a tab no longer open (a page opened again gets a new ``client_id``), and the count of the other open tabs';
* ``POST /treegrpo/artist/here`` with ``{"client_id"}``: the page saw its person (a click or a key) while that tab's
  questions fell back: full waits again (:meth:`ArtistBoard.back`);
* ``GET /treegrpo/artist/state?id=…&nonce=…``: what became of a showing the page no longer sees open (``state_of``);
* ``POST /treegrpo/artist/answer`` with ``{"id", "nonce", "answer"}``: 200 when it answers an open question, 404 for a
  question that does not exist, 409 for a stale nonce, an answered or an expired question, 400 for a bad answer;
* ``wait`` returns the answer, or None at the timeout (the caller applies its fallback); it checks ComfyUI's
  interrupt every 0.25 s, so Cancel stops the wait at once (the question is closed and a late answer refused); its end
  is sent to every tab as ``treegrpo.artist.closed`` (id, nonce and state, no images).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Optional

from ...artist.answers import LABELS_VERSION, Answer
from ...artist.replay import answers_given, checks_given, earlier_answer, earlier_check, to_levels
from ...artist.start_check import NO_ANSWER, side_picture
from ...config import ArtistConfig, from_label

if TYPE_CHECKING:     # annotations only: the module imports torch where it needs it
    import torch

QUESTION_EVENT = "treegrpo.artist.question"
WAITING_EVENT = "treegrpo.artist.waiting"
CLOSED_EVENT = "treegrpo.artist.closed"


@dataclasses.dataclass
class Question:
    """One tree shown to the person. ``images``: ComfyUI ``/view`` references ({"filename", "subfolder", "type"}),
    one per leaf; ``groups``: leaf indices that are siblings (same parent at the last branching)."""

    prompt_id: str
    client_id: Optional[str]
    tree: int
    prompt: str
    images: list
    groups: list
    mode: str
    timeout_s: float
    run_name: str = ""
    iteration: int = 0
    nonce: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    created: float = dataclasses.field(default_factory=time.time)
    state: str = "pending"               # pending | answered | expired | cancelled
    answer: Optional[Answer] = None
    away: int = 0                        # trees that fell back since this tab's last answer (0: the artist is here)
    kind: str = "tree"                   # tree | check (the run now beside its start: treegrpo.artist.start_check)

    @property
    def id(self) -> str:
        return f"{self.prompt_id}:{self.iteration}:{self.tree}"

    def payload(self) -> dict:
        """What the dialog gets (no server state)."""
        return {"id": self.id, "nonce": self.nonce, "prompt_id": self.prompt_id, "tree": self.tree,
                "prompt": self.prompt, "images": self.images, "groups": self.groups, "mode": self.mode,
                "deadline": self.created + self.timeout_s, "timeout_s": self.timeout_s, "away": self.away,
                "run_name": self.run_name, "kind": self.kind,
                "iteration": self.iteration}


class ArtistBoard:
    """The open questions, shared by the worker thread and the server's routes (see the module docstring)."""

    def __init__(self, send: Optional[Callable[[str, dict, Optional[str]], None]] = None,
                 connected: Callable[[Optional[str]], bool] = lambda client_id: True):
        self._cv = threading.Condition()
        self._questions: dict[str, Question] = {}
        self._send = send
        self._connected = connected                 # whether tab ``client_id`` has the page open (a websocket)
        self._away: dict[Optional[str], int] = {}   # tab → trees that fell back since its last answer
        self._fell_back_at: dict[Optional[str], float] = {}   # tab → when its last tree fell back (time.time())

    # -- an artist who walked away
    def away(self, client_id: Optional[str]) -> int:
        """Trees that fell back since tab ``client_id`` last answered (0: it answered the last question)."""
        with self._cv:
            return self._away.get(client_id, 0)

    def fell_back(self, client_id: Optional[str]) -> int:
        """A question of tab ``client_id`` was not answered in time; returns the trees that fell back since its
        last answer."""
        with self._cv:
            self._away[client_id] = self._away.get(client_id, 0) + 1
            self._fell_back_at[client_id] = time.time()
            return self._away[client_id]

    def back(self, client_id: Optional[str], queued_at: Optional[float] = None) -> None:
        """The person at tab ``client_id`` is here again (they used the page, or queued at ``queued_at``, s since the
        epoch; None: now): its questions wait the full time again; unless ``queued_at`` is before its last tree fell
        back (a prompt of a batch queued before they left says nothing)."""
        with self._cv:
            if queued_at is not None and queued_at < self._fell_back_at.get(client_id, -math.inf):
                return
            self._away.pop(client_id, None)
            self._fell_back_at.pop(client_id, None)

    def away_summary(self) -> Optional[str]:
        """``"artist away: N trees fell back"`` while some tab is away, else None (for the node's text)."""
        with self._cv:
            n = sum(self._away.values())
        return f"artist away: {n} tree{'s' if n != 1 else ''} fell back" if n else None

    # -- the asking side (worker thread)
    def ask(self, q: Question) -> Question:
        with self._cv:
            old = self._questions.get(q.id)
            if old is not None and old.state == "pending":
                old.state = "cancelled"
            self._questions[q.id] = q
            self._cv.notify_all()
        self._emit(QUESTION_EVENT, q.payload(), q.client_id)
        self._emit_waiting()
        return q

    def wait(self, q: Question, check_interrupt: Callable[[], None] = lambda: None) -> Optional[Answer]:
        """The answer to ``q``, or None once its timeout passed (the question is then expired). ``check_interrupt``
        raises to stop the wait (ComfyUI's interrupt); the question is closed either way."""
        deadline = q.created + q.timeout_s
        try:
            while True:
                with self._cv:
                    if q.state == "pending" and time.time() >= deadline:
                        q.state = "expired"
                    if q.state != "pending":
                        return q.answer if q.state == "answered" else None
                    self._cv.wait(min(0.25, max(0.0, deadline - time.time())))
                    if q.state != "pending":
                        continue
                check_interrupt()          # outside the lock: it raises on Cancel
        finally:
            with self._cv:
                if q.state == "pending":
                    q.state = "cancelled"
            # to every tab: a page that took over a closed tab's questions shows them too (it carries no images)
            self._broadcast(CLOSED_EVENT, {"id": q.id, "nonce": q.nonce, "state": q.state})
            self._emit_waiting()

    # -- the answering side (routes)
    def answer(self, qid: str, nonce: str, data: Any) -> tuple[int, str]:
        """(HTTP status, message) of an answer posted for question ``qid``; :meth:`state_of` says a 409's cause."""
        with self._cv:
            q = self._questions.get(qid)
            if q is None:
                return 404, f"no question {qid!r}: it was never asked here or the server restarted"
            if nonce != q.nonce:
                return 409, "this answer is for an older showing of the question (stale nonce): reload the dialog"
            if q.state != "pending":
                return 409, f"the question is {q.state}: the answer came too late or twice"
            try:
                a = Answer.from_dict(data)
                a.validate(len(q.images))
            except (ValueError, TypeError) as e:
                return 400, f"bad answer: {e}"
            q.answer, q.state = a, "answered"
            self._away.pop(q.client_id, None)      # the artist is back: full waits again
            self._fell_back_at.pop(q.client_id, None)
            self._cv.notify_all()
        return 200, "ok"

    def state_of(self, qid: str, nonce: str) -> Optional[str]:
        """The state of that showing of question ``qid`` (pending, answered, expired, cancelled; "replaced" when a
        newer showing took its place), or None when the server does not know it (it restarted)."""
        with self._cv:
            q = self._questions.get(qid)
            if q is None:
                return None
            return q.state if q.nonce == nonce else "replaced"

    def pending(self, client_id: Optional[str]) -> dict:
        """The open questions tab ``client_id`` can answer (in full): its own, and those of a tab that is no longer
        open (closed, or a prompt queued without one), so a page opened again takes them over; and how many open
        questions other open tabs have."""
        with self._cv:
            open_ = [q for q in self._questions.values() if q.state == "pending"]
        mine = [q.payload() for q in open_ if q.client_id == client_id or not self._connected(q.client_id)]
        return {"questions": mine, "waiting_elsewhere": len(open_) - len(mine), "away": self.away(client_id)}

    def _emit(self, event: str, data: dict, client_id: Optional[str]) -> None:
        if self._send is None or client_id is None:
            return
        try:
            self._send(event, data, client_id)
        except Exception as e:  # noqa: BLE001 - a closed socket must not stop the run; the page can poll /pending
            logging.warning("TreeGRPO: could not send %s to the page: %s", event, e)

    def _broadcast(self, event: str, data: dict) -> None:
        if self._send is None:
            return
        try:
            self._send(event, data, None)
        except Exception as e:  # noqa: BLE001 - a closed socket must not stop the run
            logging.warning("TreeGRPO: could not send %s to the pages: %s", event, e)

    def _emit_waiting(self) -> None:
        if self._send is None:
            return
        with self._cv:
            n = sum(1 for q in self._questions.values() if q.state == "pending")
        try:
            self._send(WAITING_EVENT, {"pending": n}, None)   # to every tab: only a count
        except Exception:  # noqa: BLE001
            pass


def _server_send(event: str, data: dict, client_id: Optional[str]) -> None:
    from server import PromptServer

    PromptServer.instance.send_sync(event, data, client_id)


def _server_connected(client_id: Optional[str]) -> bool:
    from server import PromptServer

    return client_id is not None and client_id in PromptServer.instance.sockets


BOARD = ArtistBoard(send=_server_send, connected=_server_connected)


def register_routes() -> None:
    """Add the pack's routes to ComfyUI's server (once; a no-op without a server)."""
    from ..runtime import server_routes

    srv, web = server_routes("_treegrpo_artist_routes")
    if srv is None:
        return

    @srv.routes.get("/treegrpo/artist/pending")
    async def pending(request):
        return web.json_response(BOARD.pending(request.rel_url.query.get("client_id")))

    @srv.routes.get("/treegrpo/artist/state")
    async def state(request):
        q = request.rel_url.query
        return web.json_response({"state": BOARD.state_of(q.get("id", ""), q.get("nonce", ""))})

    @srv.routes.post("/treegrpo/artist/here")
    async def here(request):      # the page saw its person (a click or a key) while its questions fell back
        try:
            body = await request.json()
        except (ValueError, json.JSONDecodeError):
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("client_id"), str):
            return web.json_response({"error": 'post {"client_id": …}'}, status=400)
        BOARD.back(body["client_id"])
        return web.json_response({"ok": True})

    @srv.routes.post("/treegrpo/artist/answer")
    async def answer(request):
        try:
            body = await request.json()
        except (ValueError, json.JSONDecodeError):
            return web.json_response({"error": "the body is not JSON"}, status=400)
        if not isinstance(body, dict) or not isinstance(body.get("id"), str) or not isinstance(body.get("nonce"), str):
            return web.json_response({"error": 'post {"id": …, "nonce": …, "answer": {…}}'}, status=400)
        status, msg = BOARD.answer(body["id"], body["nonce"], body.get("answer"))
        return web.json_response({"ok": status == 200, "message": msg,
                                  "state": BOARD.state_of(body["id"], body["nonce"])}, status=status)


LABELS_FILE, CHECKS_FILE = "artist_labels.jsonl", "artist_checks.jsonl"


def append_label(folder: str, record: dict, name: str = LABELS_FILE) -> str:
    """Append one answer to ``<folder>/<name>`` (flushed and synced: nothing the artist did is lost)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return path


ON_TIMEOUT = ("skip", "reward_model")   # treegrpo.config.ArtistConfig.on_timeout


def _save_png(image, path: str) -> None:
    import numpy as np
    from PIL import Image

    Image.fromarray(np.ascontiguousarray(to_levels(image).numpy())).save(path)


def ask_artist(tree, images, *, mode: str, timeout_s: float, on_timeout: str = ON_TIMEOUT[0], reward_model=None,
               board: ArtistBoard = BOARD, check_interrupt: Optional[Callable[[], None]] = None,
               prompt_id: Optional[str] = None, client_id: Optional[str] = None, away_s: float = 30.0) -> dict:
    """Ask the person about every tree of ``tree`` (a TreeResult, the Artist Picks node) and turn the answers into
    leaf rewards: :func:`ask_trees` with the run's folder. Returns the Reward Scorer's socket value (``{"rewards":
    {"artist": (n,)}, "weights": {"artist": 1.0}}``) plus ``exclude_trees``, the trees without a preference."""
    import folder_paths

    run = tree.run
    folder = run.folder if run is not None else os.path.join(folder_paths.get_output_directory(), "treegrpo", "artist")
    fallback = None
    if reward_model is not None:
        fallback = lambda imgs, prompts: reward_model["model"](imgs, prompts)  # noqa: E731
    rewards, exclude = ask_trees(tree.batch, images, folder=folder, iteration=tree.iteration,
                                 seed=getattr(getattr(tree.trainer, "cfg", None), "seed", None),
                                 run_name=getattr(run, "run_name", ""), mode=mode, timeout_s=timeout_s,
                                 on_timeout=on_timeout, fallback=fallback,
                                 fallback_name=(reward_model or {}).get("name", "the reward model"), board=board,
                                 check_interrupt=check_interrupt, prompt_id=prompt_id, client_id=client_id,
                                 away_grace_s=away_s)
    return {"rewards": {"artist": rewards}, "weights": {"artist": 1.0}, "exclude_trees": exclude}


def ask_trees(batch, images, *, folder: str, iteration: int, seed, run_name: str, mode: str, timeout_s: float,
              on_timeout: str = ON_TIMEOUT[0], fallback: Optional[Callable] = None, fallback_name: str = "",
              trees: Optional[list] = None, base: Optional[torch.Tensor] = None, board: ArtistBoard = BOARD,
              check_interrupt: Optional[Callable[[], None]] = None, prompt_id: Optional[str] = None,
              client_id: Optional[str] = None, answers: Optional[dict] = None, away_grace_s: float = 30.0,
              timeout_by: str = ""):
    """Ask about the trees ``trees`` (all by default) of ``batch`` (a TreeBatch), one question each, in order.
    ``answers``: filled with tree -> its Answer (None when nobody answered), for the taste model.

    ``images``: the decoded leaves (n_leaves, H, W, 3) in [0, 1]. Returns ``(rewards (n_leaves,), exclude
    (n_trees,) bool)``: an answered tree's leaves get their win rates (:mod:`treegrpo.artist.answers`); leaves of
    trees not asked keep ``base`` (½ without it); a tree with no preference is excluded; at a question's timeout,
    ``on_timeout`` ``skip`` ("skip the tree") excludes it, ``reward_model`` ("use the reward model") scores it with
    ``fallback(images (k, 3, H, W), prompts)``.
    An artist who walked away: after a question of this tab timed out, the next ones wait only ``away_grace_s``
    (when that is shorter) until the tab answers again or its page is used (``/here``); the dialog shows how many
    trees fell back meanwhile.
    Each record says who scored the tree (``answered_by``: ``artist`` — also for no preference and a skip, which
    ``outcome`` names —, ``reward model``, ``timeout_by`` — e.g. the taste model — or ``skipped``). Every answer is appended to ``<folder>/artist_labels.jsonl`` with the leaf images
    kept in ``<folder>/artist/``. A tree the artist answered about before a crash cut this iteration (the same run,
    iteration, seed, tree, mode and pictures: :mod:`treegrpo.artist.replay`) takes that answer without asking."""
    import math

    import torch

    from ...artist.answers import MODES, answer_rewards, sibling_groups

    b = batch
    leaf_tree = b.leaf_tree.cpu()
    n = leaf_tree.numel()
    if mode not in MODES[:3]:
        raise ValueError(f"mode {mode!r}: use one of {', '.join(MODES[:3])}")
    if not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ValueError(f"timeout_s {timeout_s!r}: give the seconds to wait for an answer (> 0)")
    on_timeout = from_label(ArtistConfig, "on_timeout", on_timeout)
    if on_timeout not in ON_TIMEOUT:
        raise ValueError(f"on_timeout {on_timeout!r}: use one of {ON_TIMEOUT}")
    if on_timeout == ON_TIMEOUT[1] and fallback is None:
        raise ValueError("on_timeout is 'use the reward model' but no reward_model is connected: connect a Reward "
                         "Model Loader or choose 'skip the tree'")
    if images.shape[0] != n:
        raise ValueError(f"{images.shape[0]} images for {n} leaves: connect the VAE Decode of this tree's leaves")
    import folder_paths

    temp = os.path.join(folder_paths.get_temp_directory(), "treegrpo_artist")
    os.makedirs(temp, exist_ok=True)
    prompt_id = prompt_id or uuid.uuid4().hex
    rewards = base.detach().float().cpu().clone() if base is not None else torch.full((n,), 0.5)
    exclude = torch.zeros(b.n_trees, dtype=torch.bool)
    given = answers_given(os.path.join(folder, LABELS_FILE), run_name=run_name, iteration=iteration, seed=seed,
                          mode=mode)
    for t in (range(b.n_trees) if trees is None else trees):
        idx = (leaf_tree == t).nonzero().flatten().tolist()
        before = earlier_answer(given, folder, t, [images[i] for i in idx]) if given else None
        if before is not None:     # answered before a crash cut this iteration: the same pictures, not asked twice
            answer = before[1]
            if answers is not None:
                answers[t] = answer
            r = answer_rewards(answer, len(idx))
            if r is None:
                exclude[t] = True
            else:
                rewards[idx] = r
            logging.info("TreeGRPO artist: tree %d of iteration %d was answered before the run stopped; that answer "
                         "is used again (%s)", t, iteration, LABELS_FILE)
            continue
        stem = f"{prompt_id[:8]}_{iteration}_{t}"
        refs, kept = [], []
        label_dir = os.path.join(folder, "artist", stem)
        os.makedirs(label_dir, exist_ok=True)
        for pos, i in enumerate(idx):
            name = f"{stem}_{pos}.png"
            _save_png(images[i], os.path.join(temp, name))
            _save_png(images[i], os.path.join(label_dir, f"leaf_{pos}.png"))
            refs.append({"filename": name, "subfolder": "treegrpo_artist", "type": "temp"})
            kept.append(os.path.relpath(os.path.join(label_dir, f"leaf_{pos}.png"), folder))
        away = board.away(client_id)
        wait_s = min(float(timeout_s), float(away_grace_s)) if away else float(timeout_s)
        q = board.ask(Question(prompt_id=prompt_id, client_id=client_id, tree=t, prompt=b.prompts[t], images=refs,
                               groups=sibling_groups(b.parents, idx), mode=mode, timeout_s=wait_s,
                               run_name=run_name, iteration=int(iteration), away=away))
        answer = board.wait(q, check_interrupt or (lambda: None))
        if answers is not None:
            answers[t] = answer
        outcome, answered_by = "answered", "artist"
        if answer is None:
            outcome = "timeout"
            if on_timeout == ON_TIMEOUT[1]:
                imgs = images[idx].movedim(-1, 1).float()
                rewards[idx] = fallback(imgs, [b.prompts[t]] * len(idx)).float().cpu().reshape(-1)
                outcome = "timeout: scored by " + (fallback_name or "the reward model")
                answered_by = "reward model"
            else:
                exclude[t] = True
                answered_by = timeout_by or "skipped"
            n_away = board.fell_back(client_id)
            logging.info("TreeGRPO artist: no answer about tree %d of iteration %d in %.0f s (%s); %d tree%s fell back "
                         "since your last answer, the next questions wait %.0f s until you answer", t, iteration,
                         wait_s, answered_by, n_away, "s" if n_away != 1 else "",
                         min(float(timeout_s), float(away_grace_s)))
        else:
            r = answer_rewards(answer, len(idx))
            if r is None:                # no preference, or skip: the artist's answer, which trains nothing
                exclude[t] = True
                outcome = answer.mode
            else:
                rewards[idx] = r
        append_label(folder, {"version": LABELS_VERSION, "time": time.time(), "prompt_id": prompt_id,
                              "run_name": run_name, "iteration": iteration, "seed": seed,
                              "tree": t, "prompt": b.prompts[t], "leaves": kept, "groups": q.groups, "mode": mode,
                              "answer": answer.to_dict() if answer is not None else None, "outcome": outcome,
                              "answered_by": answered_by, "waited_s": wait_s,
                              "seconds": round(answer.seconds if answer is not None else time.time() - q.created, 3),
                              "rewards": [round(float(v), 6) for v in rewards[idx]] if not exclude[t] else None})
    return rewards, exclude


CHECK_TEXT = ("Is the run still going your way? One side is the model now, the other the base model it started from, "
              "from the same noises (which is which is drawn at random). Pick the side closer to what you want, or "
              "no preference. If you pick the start, the LoRA goes back to the last state you approved.")
CHECK_AGAIN_TEXT = ("Once more, on other noises, before your pick counts (a check decides only when both looks "
                    "agree): which side is closer to what you want?")
CHECK_TREE, CHECK_AGAIN_TREE = -1, -2      # a check's Question.tree (first and second look): not trees of the batch


def ask_check(first, second, prompts: list, iteration: int, *, folder: str, run_name: str, timeout_s: float,
              board: ArtistBoard = BOARD, check_interrupt: Optional[Callable[[], None]] = None,
              prompt_id: Optional[str] = None, client_id: Optional[str] = None,
              away_grace_s: float = 30.0, again: bool = False, replayed: Optional[list] = None):
    """A check against the start (:class:`treegrpo.artist.start_check.StartCheck`'s ``ask``) as one question in the
    artist's dialog: the two sides (B, 3, H, W) each as one picture (a grid), favourites mode. Returns the side
    picked (0 / 1; a side marked bad picks the other), None (no preference, skipped, both or neither marked) or
    :data:`treegrpo.artist.start_check.NO_ANSWER` (no answer in time — an artist who is away gets the grace period
    only). ``again``: the second look after a side was picked (its own text). Each check is appended to
    ``<folder>/artist_checks.jsonl`` with its two pictures
    kept in ``<folder>/artist/``. A check the artist answered before a crash cut this iteration (an earlier prompt;
    the same run, iteration, look and pictures: :func:`treegrpo.artist.replay.earlier_check`) takes that answer
    without asking; its record is appended to ``replayed`` (a list) when one is given."""
    import folder_paths

    temp = os.path.join(folder_paths.get_temp_directory(), "treegrpo_artist")
    os.makedirs(temp, exist_ok=True)
    prompt_id = prompt_id or uuid.uuid4().hex
    pictures = [side_picture(side if side.ndim == 4 else side[:, 0]) for side in (first, second)]
    given = checks_given(os.path.join(folder, CHECKS_FILE), run_name=run_name, iteration=iteration, again=again,
                         prompt_id=prompt_id)
    before = earlier_check(given, folder, pictures) if given else None
    if before is not None:     # answered before a crash cut this iteration: the same pictures, not asked twice
        if replayed is not None:
            replayed.append(before[0])
        logging.info("TreeGRPO artist: the check at iteration %d was answered before the run stopped; that answer is "
                     "used again (%s)", iteration, CHECKS_FILE)
        return before[1]
    stem = first_stem = f"{prompt_id[:8]}_{iteration}_check" + ("_again" if again else "")
    n = 1
    while os.path.exists(os.path.join(folder, "artist", stem)):
        n += 1          # asked again at this iteration (the end's re-check): never over an earlier answer's pictures
        stem = f"{first_stem}_{n}"
    label_dir = os.path.join(folder, "artist", stem)
    os.makedirs(label_dir, exist_ok=True)
    refs, kept = [], []
    for pos, pic in enumerate(pictures):
        _save_png(pic, os.path.join(temp, f"{stem}_{pos}.png"))
        _save_png(pic, os.path.join(label_dir, f"side_{pos}.png"))
        refs.append({"filename": f"{stem}_{pos}.png", "subfolder": "treegrpo_artist", "type": "temp"})
        kept.append(os.path.relpath(os.path.join(label_dir, f"side_{pos}.png"), folder))
    away = board.away(client_id)
    wait_s = min(float(timeout_s), float(away_grace_s)) if away else float(timeout_s)
    q = board.ask(Question(prompt_id=prompt_id, client_id=client_id, tree=CHECK_AGAIN_TREE if again else CHECK_TREE,
                           prompt=CHECK_AGAIN_TEXT if again else CHECK_TEXT, images=refs,
                           groups=[[0], [1]], mode="favourites", timeout_s=wait_s, run_name=run_name,
                           iteration=int(iteration), away=away, kind="check"))
    answer = board.wait(q, check_interrupt or (lambda: None))
    pick = None
    if answer is not None and answer.mode == "favourites":
        good, bad = set(answer.good), set(answer.bad)
        if len(good) == 1 and not bad & good:
            pick = next(iter(good))
        elif not good and len(bad) == 1:
            pick = 1 - next(iter(bad))
    append_label(folder, {"version": LABELS_VERSION, "time": time.time(), "prompt_id": prompt_id,
                          "run_name": run_name, "iteration": iteration, "again": again, "prompts": list(prompts),
                          "sides": kept,
                          "answer": answer.to_dict() if answer is not None else None, "pick": pick,
                          "outcome": "answered" if answer is not None else "timeout", "waited_s": wait_s},
                 name=CHECKS_FILE)
    return pick if answer is not None else NO_ANSWER


def train_node_artist(every: int, mode: str, timeout_s: float, *, board: ArtistBoard = BOARD,
                      check_interrupt: Optional[Callable[[], None]] = None, prompt_id: Optional[str] = None,
                      client_id: Optional[str] = None, away_s: float = 30.0) -> Callable:
    """The Train node's leaf scorer (treegrpo.scores): every ``every``-th tree of the run (counted over iterations)
    is asked about; the other trees, and those the person does not answer in ``timeout_s``, keep the reward models'
    weighted score. One reward per leaf either way (each tree is z-scored on its own, so the two scales do not mix)."""
    from ...advantages import weighted_raw
    from ...scores import LeafScores

    from ..runtime import prompt_queued_at

    board.back(client_id, prompt_queued_at())     # whoever queued this run since a tree fell back is at the page

    def ask(ctx, batch, images, raw):
        first = ctx.iteration * batch.n_trees
        trees = [t for t in range(batch.n_trees) if (first + t) % every == 0]
        mixed = weighted_raw(raw, ctx.weights).float().cpu()
        if not trees:
            return LeafScores({"reward": mixed}, {"reward": 1.0})
        pictures = images if images.ndim == 4 else images[:, 0]          # video leaves: their first frame
        score = {"fn": lambda imgs, prompts: weighted_raw(ctx.score_images(imgs, prompts), ctx.weights)}
        rewards, exclude = ask_trees(batch, pictures.movedim(1, -1).float().cpu(), folder=ctx.output_dir,
                                     iteration=ctx.iteration, seed=ctx.seed,
                                     run_name=ctx.run_name, mode=mode, timeout_s=timeout_s,
                                     on_timeout=ON_TIMEOUT[1], fallback=score["fn"], fallback_name="the reward models",
                                     trees=trees, base=mixed, board=board, check_interrupt=check_interrupt,
                                     prompt_id=prompt_id, client_id=client_id, away_grace_s=away_s)
        return LeafScores({"reward": rewards}, {"reward": 1.0}, exclude)

    return ask
