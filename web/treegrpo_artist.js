// TreeGRPO Artist Picks: the dialog that shows a tree's leaves and posts the artist's picks.
// Questions arrive as "treegrpo.artist.question" websocket events (only in the tab that queued the prompt) and are
// fetched again from /treegrpo/artist/pending after a reload. Keys: digits toggle a leaf (favourites) or pick the
// next one (ranking, best/worst), Shift+digit marks a leaf bad, Enter sends, 0 = no preference, Esc = skip the tree,
// Z zooms the leaf under the mouse. "Stop the run" interrupts the prompt that asks (the dialog is modal: ComfyUI's own
// Cancel button is under it). A question the server no longer has (it restarted, the run stopped) says so and only
// closes (one answered elsewhere, or expired, just closes); an answer that cannot reach the server keeps the dialog. A
// click or a key in the page while this tab's questions fall back unanswered tells the server its person is back
// (full waits again; a queued prompt does not say so: Auto Queue queues without anyone there). Keys are taken on window in the capture phase by one listener added when the
// extension is set up: window listeners of a phase run in the order they were added, and frontend popups that open
// later add theirs then (ComfyUI's ComfyPopup stops Escape there), so the dialog sees its keys first.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const STYLE = `
#treegrpo-artist{position:fixed;inset:0;z-index:10000;background:rgba(0,0,0,.72);display:flex;align-items:center;
 justify-content:center;font:14px sans-serif;color:#eee;width:100vw;height:100vh;max-width:none;max-height:none;
 margin:0;padding:0;border:0;pointer-events:auto}
#treegrpo-artist::backdrop{background:transparent}
#treegrpo-artist .away{color:#fc6;margin-bottom:6px}
#treegrpo-artist .box{background:#222;border:1px solid #555;border-radius:8px;padding:16px;max-width:92vw;max-height:92vh;
 overflow:auto}
#treegrpo-artist .prompt{font-size:16px;margin-bottom:8px}
#treegrpo-artist .groups{display:flex;gap:18px;flex-wrap:wrap}
#treegrpo-artist .group{display:flex;gap:6px;padding:6px;border:1px dashed #666;border-radius:6px}
#treegrpo-artist .leaf{position:relative;cursor:pointer;border:3px solid transparent;border-radius:4px}
#treegrpo-artist .leaf img{width:160px;height:160px;image-rendering:pixelated;display:block}
#treegrpo-artist .leaf.good{border-color:#3c3} #treegrpo-artist .leaf.bad{border-color:#c33}
#treegrpo-artist .leaf .tag{position:absolute;left:4px;top:2px;background:#000a;padding:0 4px;border-radius:3px}
#treegrpo-artist .bar{display:flex;gap:8px;margin-top:12px;align-items:center}
#treegrpo-artist button{padding:6px 12px}
#treegrpo-artist .zoom{position:fixed;inset:5vh 5vw;background:#111;display:flex;align-items:center;justify-content:center}
#treegrpo-artist .zoom img{max-width:100%;max-height:100%;image-rendering:pixelated}
#treegrpo-artist-badge{position:fixed;right:12px;bottom:12px;z-index:9999;background:#553;color:#fff;padding:6px 10px;
 border-radius:6px;font:13px sans-serif;display:none}`;

const QUESTION = "treegrpo.artist.question";
const queue = [];          // questions for this tab, oldest first
let current = null;        // {q, state, el, timer, shownAt}
let away = 0;               // this tab's trees that fell back unanswered (the server's count, from /pending)
let toldHere = 0;           // when the page last said its person is here (ms)
const finished = new Set(); // nonces of the showings answered, closed or expired here: a /pending response fetched
                            // before the answer reached the server, arriving after it, must not show them again

function viewUrl(ref) {
  const p = new URLSearchParams({ filename: ref.filename, subfolder: ref.subfolder || "", type: ref.type || "temp" });
  return api.apiURL(`/view?${p}`);
}

function badge(text) {
  let b = document.getElementById("treegrpo-artist-badge");
  if (!b) { b = document.createElement("div"); b.id = "treegrpo-artist-badge"; document.body.appendChild(b); }
  b.textContent = text; b.style.display = text ? "block" : "none";
}

function enqueue(q) {
  if (finished.has(q.nonce) || queue.some((x) => x.id === q.id && x.nonce === q.nonce)
      || (current && current.q.nonce === q.nonce)) return;
  queue.push(q);
  if (!current) showNext();
}

function close() {
  if (!current) return;
  finished.add(current.q.nonce);
  clearInterval(current.timer);
  current.el.remove();
  current = null;
}

const GONE = "Queue the workflow again to go on: the run resumes from its last checkpoint, and the answers you gave " +
  "are kept.";

function gone(c, why) {                         // the server no longer waits for this question: say so, only close
  if (c.gone) return;
  c.gone = true;
  clearInterval(c.timer);
  c.el.querySelector(".countdown").textContent = "";
  c.el.querySelectorAll("[data-act]").forEach((b) => { b.style.display = b.dataset.act === "close" ? "" : "none"; });
  c.el.querySelector(".msg").textContent = `${why} ${GONE}`;
}

function settle(c, state) {    // the server's word on a showing no longer open to answers (null: it does not know it)
  if (state === "pending") return;
  if (state === null || state === undefined) gone(c, "ComfyUI no longer knows this question (it restarted).");
  else if (state === "cancelled") gone(c, "The run stopped before this answer arrived.");
  else if (current === c) { close(); showNext(); }   // answered (here or in another tab), expired, shown again: the run goes on
}

async function send(answer) {
  const c = current;
  if (!c) return;
  if (c.gone) { close(); showNext(); return; }
  answer.seconds = (Date.now() - c.shownAt) / 1000;
  let res;
  c.sending = true;
  try {
    res = await api.fetchApi("/treegrpo/artist/answer", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ id: c.q.id, nonce: c.q.nonce, answer }) });
  } catch (e) {                                  // ComfyUI is down or restarting: nothing was sent, keep the dialog
    c.sending = false;
    c.el.querySelector(".msg").textContent = "ComfyUI cannot be reached (is it restarting?): the answer was not " +
      "sent. Press Send again when it is back.";
    return;
  }
  c.sending = false;
  if (!res.ok && res.status === 400) {          // a bad answer: say why, keep the dialog
    const j = await res.json().catch(() => ({}));
    c.el.querySelector(".msg").textContent = j.message || "the answer was refused";
    return;
  }
  if (!res.ok && res.status >= 500) {           // ComfyUI (or a proxy before it) failed: the question still waits
    c.el.querySelector(".msg").textContent = `ComfyUI could not take the answer (HTTP ${res.status}): press Send ` +
      "again.";
    return;
  }
  if (!res.ok && current === c) {               // 404: the server restarted; 409: closed, answered elsewhere
    const j = await res.json().catch(() => ({}));
    settle(c, res.status === 404 ? null : j.state);
    return;
  }
  finished.add(c.q.nonce);
  // the server's "closed" event may have closed this dialog already and the next question may be showing: close only
  // the question this answer was for
  if (current === c) { close(); showNext(); }
}

function answerOf(c) {
  const s = c.state;
  if (c.q.mode === "favourites") return { mode: "favourites", good: [...s.good], bad: [...s.bad] };
  if (c.q.mode === "ranking") {
    const rest = c.q.images.map((_, i) => i).filter((i) => !s.order.includes(i));
    const tiers = s.order.map((i) => [i]);
    if (rest.length) tiers.push(rest);               // the leaves not clicked tie at the bottom
    return { mode: "ranking", ranking: tiers };
  }
  return { mode: "best_worst", best: s.order[0], worst: s.order[1] };
}

function toggle(c, i, bad) {
  const s = c.state;
  if (c.q.mode === "favourites") {
    const [a, b] = bad ? [s.bad, s.good] : [s.good, s.bad];
    a.has(i) ? a.delete(i) : a.add(i); b.delete(i);
  } else {
    const k = s.order.indexOf(i);
    if (k >= 0) s.order.splice(k, 1);
    else if (c.q.mode === "ranking" || s.order.length < 2) s.order.push(i);
  }
  render(c);
}

function render(c) {
  const s = c.state;
  c.el.querySelectorAll(".leaf").forEach((el) => {
    const i = Number(el.dataset.leaf);
    el.classList.toggle("good", s.good.has(i) || s.order[0] === i);
    el.classList.toggle("bad", s.bad.has(i) || (c.q.mode === "best_worst" && s.order[1] === i));
    const rank = s.order.indexOf(i);
    el.querySelector(".tag").textContent = `${i + 1}` + (rank >= 0 ? (c.q.mode === "best_worst"
      ? (rank === 0 ? " best" : " worst") : ` #${rank + 1}`) : "");
  });
}

function onKey(e) {
  const c = current;
  if (!c) return;
  if (c.gone && (e.key === "Enter" || e.key === "Escape")) {
    close(); showNext(); e.preventDefault(); e.stopPropagation(); return;
  }
  if (c.zoom) { c.zoom.remove(); c.zoom = null; e.preventDefault(); e.stopPropagation(); return; }
  let handled = true;
  const digit = /^Digit([0-9])$/.exec(e.code);
  if (digit && digit[1] === "0") send({ mode: "none" });
  else if (digit && Number(digit[1]) <= c.q.images.length) toggle(c, Number(digit[1]) - 1, e.shiftKey);
  else if (e.key === "Enter") send(answerOf(c));
  else if (e.key === "Escape") send({ mode: "skip" });
  else if (e.key === "z" || e.key === "Z") { const h = c.el.querySelector(".leaf:hover"); if (h) zoom(c, h); }
  else handled = false;
  if (handled) { e.preventDefault(); e.stopPropagation(); }
}

function zoom(c, leafEl) {
  c.zoom = document.createElement("div");
  c.zoom.className = "zoom";
  c.zoom.innerHTML = `<img src="${leafEl.querySelector("img").src}">`;
  c.zoom.onclick = () => { c.zoom.remove(); c.zoom = null; };
  c.el.appendChild(c.zoom);
}

function showNext() {
  while (queue.length && queue[0].deadline * 1000 < Date.now()) queue.shift();   // expired while waiting
  const q = queue.shift();
  if (!q) return;
  if (!document.getElementById("treegrpo-artist-style")) {
    const st = document.createElement("style"); st.id = "treegrpo-artist-style"; st.textContent = STYLE;
    document.head.appendChild(st);
  }
  // a modal <dialog> lives in the browser's top layer, above whatever the front end has open (the template browser,
  // settings, the Manager); those modals also set pointer-events: none on <body>, which the dialog's own
  // pointer-events: auto (in STYLE) undoes for it and its leaves
  const el = document.createElement("dialog");
  el.id = "treegrpo-artist";
  el.addEventListener("cancel", (e) => e.preventDefault());   // Esc is "skip this tree" (the key handler)
  el.dataset.question = q.id;
  const how = { favourites: "click the ones you like (shift-click: the ones you dislike)",
                ranking: "click them best first (the rest tie last)", best_worst: "click the best, then the worst" };
  const check = q.kind === "check";   // the run now beside where it started: pick a side or no preference
  const hint = check ? "click the side closer to what you want" : how[q.mode];
  el.innerHTML = `<div class="box" role="dialog" aria-label="TreeGRPO artist picks">
    <div class="prompt"></div><div class="hint">${hint} · Enter sends · 0 no preference · Esc skip · Z zoom</div>
    <div class="groups"></div>
    <div class="bar"><button data-act="send">Send</button><button data-act="none">No preference</button>
    <button data-act="skip">${check ? "Skip" : "Skip this tree"}</button>
    <button data-act="stop" title="interrupt this run (ComfyUI's Cancel); the answers given so far are kept">Stop the run</button>
    <button data-act="close" style="display:none">Close</button>
    <span class="countdown"></span><span class="msg"></span></div></div>`;
  el.querySelector(".prompt").textContent = check ? q.prompt : `Tree ${q.tree + 1}: “${q.prompt}”`;
  if (q.away > 0) {
    const away = document.createElement("div"); away.className = "away";
    away.textContent = `You were away: ${q.away} tree${q.away === 1 ? "" : "s"} fell back without your answer; ` +
      `this one waits ${Math.round(q.timeout_s)} s (full waits again after you answer).`;
    el.querySelector(".prompt").after(away);
  }
  const groups = el.querySelector(".groups");
  for (const g of q.groups) {
    const ge = document.createElement("div"); ge.className = "group";
    for (const i of g) {
      const le = document.createElement("div"); le.className = "leaf"; le.dataset.leaf = String(i);
      le.innerHTML = `<img alt="leaf ${i + 1}"><span class="tag"></span>`;
      le.querySelector("img").src = viewUrl(q.images[i]);
      le.onclick = (e) => toggle(current, i, e.shiftKey);
      le.ondblclick = () => zoom(current, le);
      ge.appendChild(le);
    }
    groups.appendChild(ge);
  }
  el.querySelector('[data-act="send"]').onclick = () => send(answerOf(current));
  el.querySelector('[data-act="none"]').onclick = () => send({ mode: "none" });
  el.querySelector('[data-act="skip"]').onclick = () => send({ mode: "skip" });
  el.querySelector('[data-act="close"]').onclick = () => { if (current && current.el === el) { close(); showNext(); } };
  el.querySelector('[data-act="stop"]').onclick = () => stopRun(el, q);
  document.body.appendChild(el);
  if (el.showModal) el.showModal(); else el.setAttribute("open", "");
  current = { q, el, state: { good: new Set(), bad: new Set(), order: [] }, shownAt: Date.now(), zoom: null };
  const tick = () => {
    const left = Math.max(0, Math.round(q.deadline - Date.now() / 1000));
    el.querySelector(".countdown").textContent = `${left} s left`;
    if (left <= 0) { close(); showNext(); }
  };
  current.timer = setInterval(tick, 500); tick();
  render(current);
}

async function stopRun(el, q) {      // ComfyUI's Cancel for the prompt that asks: its wait ends, "closed" closes this
  const msg = el.querySelector(".msg");
  try {
    const res = await api.fetchApi("/interrupt", { method: "POST", headers: { "Content-Type": "application/json" },
                                                   body: JSON.stringify({ prompt_id: q.prompt_id }) });
    msg.textContent = res.ok ? "Stopping the run…" : `ComfyUI refused to stop (${res.status})`;
  } catch (e) {
    msg.textContent = "ComfyUI cannot be reached (is it restarting?)";
  }
}

function here() {           // a click or a key while this tab's questions fall back: its person is here again
  if (!away || Date.now() - toldHere < 5000) return;
  toldHere = Date.now();
  api.fetchApi("/treegrpo/artist/here", { method: "POST", headers: { "Content-Type": "application/json" },
                                          body: JSON.stringify({ client_id: api.clientId || "" }) })
    .then((res) => { if (res.ok) away = 0; }).catch(() => {});
}

async function refresh() {
  const asked = Date.now();
  try {
    const res = await api.fetchApi(`/treegrpo/artist/pending?client_id=${encodeURIComponent(api.clientId || "")}`);
    if (!res.ok) return;
    const j = await res.json();
    const c = current;    // shown before this request left and not answered meanwhile, yet not open on the server:
    if (c && !c.gone && !c.sending && c.shownAt < asked && !finished.has(c.q.nonce)   // ask what became of it
        && !j.questions.some((q) => q.nonce === c.q.nonce)) {
      const q = new URLSearchParams({ id: c.q.id, nonce: c.q.nonce });
      const st = await api.fetchApi(`/treegrpo/artist/state?${q}`);
      if (st.ok && current === c && !c.sending) settle(c, (await st.json()).state);
    }
    away = j.away || 0;
    j.questions.forEach(enqueue);
    badge(j.waiting_elsewhere ? `TreeGRPO: ${j.waiting_elsewhere} question(s) waiting in another tab` : "");
  } catch (e) { /* the server restarted: the next event brings the state */ }
}

app.registerExtension({
  name: "treegrpo.artist",
  async setup() {
    window.addEventListener("keydown", onKey, true);        // first in line (see the note at the top)
    window.addEventListener("keydown", here, true);
    window.addEventListener("pointerdown", here, true);
    api.addEventListener(QUESTION, (e) => enqueue(e.detail));
    api.addEventListener("treegrpo.artist.closed", (e) => {   // sent to every tab; only the question's showing closes
      const id = e.detail && e.detail.id, nonce = e.detail && e.detail.nonce;
      const mine = (q) => q.id === id && (!nonce || q.nonce === nonce);
      for (let k = queue.length - 1; k >= 0; k--) if (mine(queue[k])) finished.add(queue.splice(k, 1)[0].nonce);
      if (current && mine(current.q)) { close(); showNext(); }
    });
    api.addEventListener("treegrpo.artist.waiting", () => refresh());
    api.addEventListener("status", () => refresh());
    api.addEventListener("reconnected", () => refresh());  // ComfyUI came back (restarted?)
    window.__treegrpoArtist = { queue, refresh, get current() { return current; } };   // for the browser tests
    refresh();
  },
});
