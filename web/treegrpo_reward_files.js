// TreeGRPO Reward Model Loader: the file list shows only the files that can be the chosen reward (and the "none"
// entry for rewards that need no file). The lists come from /treegrpo/reward_files, read again whenever the node
// definitions are refreshed. Choosing another reward moves the file to the first one that fits; a workflow that is
// loaded keeps its file even when it is not in the list (ComfyUI accepts any file of models/reward_models).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const NODE = "TreeGRPORewardModelLoader";
let lists = null;           // {reward: [file, ...]}
let loading = null;

async function fetchLists() {
  try {
    const r = await api.fetchApi("/treegrpo/reward_files");
    if (r.ok) lists = (await r.json()).files;
  } catch (e) {
    lists = null;           // the full list stays: nothing is hidden when the route cannot answer
  }
  loading = null;
  return lists;
}

function ensureLists() {
  if (lists) return Promise.resolve(lists);
  return (loading = loading || fetchLists());
}

function widget(node, name) {
  return (node.widgets || []).find((w) => w.name === name);
}

function apply(node, { moveValue }) {
  const reward = widget(node, "reward");
  const file = widget(node, "file");
  if (!reward || !file || !lists) return;
  if (!file._treegrpoAll) file._treegrpoAll = [...(file.options.values || [])];
  const fits = lists[reward.value];
  const values = fits && fits.length ? fits : file._treegrpoAll;
  file.options.values = values;
  if (moveValue && !values.includes(file.value)) {
    file.value = values[0];
    file.callback?.(file.value);
  }
  node.setDirtyCanvas?.(true, true);
}

app.registerExtension({
  name: "treegrpo.rewardFiles",
  async refreshComboInNodes() {
    lists = null;
    await ensureLists();
    for (const node of app.graph?._nodes || []) if (node.comfyClass === NODE) {
      const file = widget(node, "file");
      if (file) file._treegrpoAll = null;
      apply(node, { moveValue: false });
    }
  },
  async loadedGraphNode(node) {     // a workflow's values are set after nodeCreated: filter again for them
    if (node.comfyClass !== NODE) return;
    await ensureLists();
    apply(node, { moveValue: false });
  },
  async nodeCreated(node) {
    if (node.comfyClass !== NODE) return;
    const reward = widget(node, "reward");
    if (reward) {
      const previous = reward.callback;
      reward.callback = function (...args) {
        const out = previous?.apply(this, args);
        ensureLists().then(() => apply(node, { moveValue: true }));
        return out;
      };
    }
    await ensureLists();
    apply(node, { moveValue: false });
  },
});
