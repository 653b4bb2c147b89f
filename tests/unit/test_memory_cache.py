"""The memory probe kept between runs (treegrpo/memory_cache.py): a second run of the same model at the same size plans
with the first run's measurement and the same plan; any change the probe depends on measures again; a file that
cannot be read, or a folder that cannot be written, costs a measurement and one line, never the run."""
import json
import os

import pytest
import torch

from treegrpo import cli, memory, memory_cache
from treegrpo.backends import load_policy
from treegrpo.config import TrainConfig
from treegrpo.run import build_rewards
from treegrpo.trainer import Trainer


def _trainer(tmp_path, **changes):
    d = cli.demo_config_dict()
    d.update(output_dir=str(tmp_path), eval_every=0, prompts_per_iter=1, iterations=1)
    d["memory"] = {"budget_gb": 4.0, **changes.pop("memory", {})}
    for section, values in changes.items():
        if isinstance(values, dict):
            d[section].update(values)
        else:
            d[section] = values
    cfg = TrainConfig.from_dict(d)
    tr = Trainer(cfg, load_policy(cfg, torch.device("cpu"))[0], build_rewards(cfg, "cpu"), progress=False)
    tr.lines = []
    tr.log = tr.lines.append
    return tr


def _kept():
    folder = memory_cache.cache_dir()
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


@pytest.fixture
def probes(monkeypatch):
    """Counts the probes that really run."""
    calls = []
    real = memory.probe_policy

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(memory, "probe_policy", counted)
    return calls


def test_a_second_run_plans_with_the_first_runs_measurement(tmp_path, probes):
    assert memory_cache.cache_dir() == os.path.join(os.environ["TREEGRPO_CACHE"], "memory_probes")
    first = _trainer(tmp_path)
    p1 = first.plan_memory()
    assert len(probes) == 1 and first.lines[0].startswith("TreeGRPO memory: measuring the models")
    assert len(_kept()) == 1
    second = _trainer(tmp_path)                  # a new process would load the same files: a new policy object
    p2 = second.plan_memory()
    assert len(probes) == 1, "the second run measured again"
    assert "with the measurement of an earlier run" in second.lines[0] and _kept()[0] in second.lines[0]
    assert p2.workload == p1.workload and p2.peak == p1.peak and p2.line() == p1.line()
    with open(os.path.join(memory_cache.cache_dir(), _kept()[0])) as f:
        data = json.load(f)
    assert data["format"] == memory_cache.FORMAT and data["facts"]["latent"] == list(first.policy.latent_shape())
    assert memory.Footprint.from_dict(data["footprint"]) == memory.Footprint.from_dict(
        json.loads(json.dumps(memory.Footprint.from_dict(data["footprint"]).to_dict())))


@pytest.mark.parametrize("change", [{"lora": {"rank": 4}}, {"optim": {"kl_beta": 0.0}}, {"optim": {"microbatch": 1}},
                                    {"guidance_scale": 3.0}])
def test_what_the_probe_depends_on_measures_again(tmp_path, probes, change):
    """A LoRA of another rank, the KL's reference forward off, other row counts to measure at, CFG on (cond and
    uncond in one call): new facts, a new measurement, kept beside the first."""
    _trainer(tmp_path).plan_memory()
    base = _trainer(tmp_path)
    changed = _trainer(tmp_path, **change)
    facts = [memory_cache.probe_facts(t.policy, t.prompts[0], t.cfg.guidance_scale, t.params,
                                      rewards=list(t.rewards.values()), kl=t.cfg.optim.kl_beta > 0,
                                      rows=memory.probe_rows(t.workload())) for t in (base, changed)]
    assert facts[0] != facts[1]
    changed.plan_memory()
    assert len(probes) == 2 and len(_kept()) == 2
    assert changed.lines[0].startswith("TreeGRPO memory: measuring")


def test_the_same_shapes_with_other_weights_reuse_it(tmp_path, probes):
    """Facts hold shapes and dtypes only: the demo model with other weights (a fine-tune) reuses the measurement;
    a policy on another dtype does not."""
    _trainer(tmp_path).plan_memory()
    other = _trainer(tmp_path)
    with torch.no_grad():
        for p in other.policy.model.parameters():
            p.add_(0.5)
    other.plan_memory()
    assert len(probes) == 1
    sig = memory_cache.module_signature(other.policy.model)
    assert sig != memory_cache.module_signature(other.policy.model.to(torch.float64))


def test_reuse_off_measures_again_and_keeps_nothing(tmp_path, probes):
    _trainer(tmp_path).plan_memory()
    t = _trainer(tmp_path, memory={"reuse_probe": False})
    t.plan_memory()
    assert len(probes) == 2 and len(_kept()) == 1


def test_a_kept_file_that_cannot_be_read_is_measured_again_and_rewritten(tmp_path, probes):
    _trainer(tmp_path).plan_memory()
    path = os.path.join(memory_cache.cache_dir(), _kept()[0])
    with open(path, "w") as f:
        f.write('{"format": "treegrpo-memory-probe", "version": 1, "facts": ')     # cut off mid-write
    t = _trainer(tmp_path)
    p = t.plan_memory()
    assert p is not None and len(probes) == 2
    assert t.lines[0].startswith(f"TreeGRPO memory: the kept measurement {path} cannot be read (JSONDecodeError")
    with open(path) as f:
        assert json.load(f)["format"] == memory_cache.FORMAT
    _trainer(tmp_path).plan_memory()
    assert len(probes) == 2


def test_a_cache_folder_that_cannot_be_written_costs_one_line(tmp_path, probes, monkeypatch):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    monkeypatch.setenv("TREEGRPO_CACHE", str(blocker))
    t = _trainer(tmp_path)
    p = t.plan_memory()
    assert p is not None and len(probes) == 1
    said = [line for line in t.lines if "cannot keep the measurement" in line]
    assert len(said) == 1 and "TREEGRPO_CACHE" in said[0] and "memory.reuse_probe false" in said[0]


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("TREEGRPO_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert memory_cache.cache_dir() == str(tmp_path / "xdg" / "treegrpo" / "memory_probes")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert memory_cache.cache_dir() == str(tmp_path / "home" / ".cache" / "treegrpo" / "memory_probes")


def test_an_updated_pack_measures_again(tmp_path, probes, monkeypatch):
    """The facts hold a hash of the package's source: a changed module (an update) is a new key."""
    _trainer(tmp_path).plan_memory()
    real = memory_cache.source_hash()
    monkeypatch.setattr(memory_cache, "source_hash", lambda: "0" * 16)
    _trainer(tmp_path).plan_memory()
    assert len(probes) == 2 and len(_kept()) == 2 and real != "0" * 16


def test_the_folder_keeps_the_probes_used_last(tmp_path):
    """KEEP probes stay: storing one more removes the least recently used (a load counts as a use); a file not
    named like a probe is never removed."""
    folder = str(tmp_path / "probes")
    c = memory.Curve(((1, 10), (2, 20)))
    fp = memory.Footprint(weights={"denoiser": 100}, lora=1, latent=2, image=3, sample=c, update=c, update_ckpt=None)
    paths = []
    for i in range(memory_cache.KEEP):
        paths.append(memory_cache.store({"i": i}, fp, folder=folder))
        os.utime(paths[-1], (1_000_000 + i, 1_000_000 + i))        # probe i used at time i
    other = os.path.join(folder, "notes.json")
    with open(other, "w") as f:
        f.write("{}")
    os.utime(other, (0, 0))
    assert memory_cache.load({"i": 0}, folder=folder)[1] == paths[0]           # probe 0 used again: now the newest
    new = memory_cache.store({"i": "new"}, fp, folder=folder)
    left = set(os.listdir(folder))
    assert os.path.basename(paths[1]) not in left                              # the least recently used went
    assert {os.path.basename(p) for p in paths[:1] + paths[2:] + [new]} | {"notes.json"} == left
    assert len(left) == memory_cache.KEEP + 1
    assert memory_cache.prune(str(tmp_path / "missing")) == []

