"""A pack installed without its requirements (a plain git clone): ComfyUI still starts, the pack logs one line
naming the missing packages and the install command, and every TreeGRPO node in a queued graph fails validation
with that message before anything runs. Tested on the real server with packages hidden from its Python."""
import json
import textwrap

import pytest

import comfy_harness as ch
from behaviour_fixture import train_node_graph
from treegrpo.deps import REQUIRED, install_command

pytestmark = pytest.mark.slow   # starts ComfyUI or Python in a subprocess: seconds a test

HIDDEN = ("diffusers", "peft", "open_clip", "matplotlib")   # ComfyUI itself imports none of them
# (ImageReward is optional: tests/e2e/test_install.py)


def hiding_sitecustomize(folder, names) -> str:
    """A sitecustomize.py that makes ``names`` unimportable (as if not installed) in a Python started with
    ``folder`` on PYTHONPATH."""
    (folder / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import sys
        class _Hide:
            names = {tuple(names)!r}
            def find_spec(self, fullname, path=None, target=None):
                if fullname.split(".")[0] in self.names:
                    raise ModuleNotFoundError(f"No module named {{fullname!r}}", name=fullname)
                return None
        sys.meta_path.insert(0, _Hide())
    """))
    return str(folder)


@pytest.fixture(scope="module")
def server_without_requirements(comfyui_dir, tmp_path_factory):
    hide = hiding_sitecustomize(tmp_path_factory.mktemp("hide"), HIDDEN)
    srv = ch.start_server(tmp_path_factory.mktemp("server_missing_deps"), comfy_dir=comfyui_dir,
                          env={"PYTHONPATH": hide})
    try:
        yield srv
    finally:
        srv.stop()


def test_missing_packages_are_named_at_start_up_and_refused_at_validation(server_without_requirements):
    srv = server_without_requirements
    wanted = sorted(REQUIRED[m] for m in HIDDEN)
    log = srv.log_text()
    lines = [ln for ln in log.splitlines() if "TreeGRPO needs Python packages that are not installed" in ln]
    assert len(lines) == 1, log[-4000:]
    assert all(p in lines[0] for p in wanted) and "pip install -r" in lines[0] and "requirements.txt" in lines[0]
    assert not any(REQUIRED[m] in lines[0] for m in REQUIRED if m not in HIDDEN and m not in ("torch",))

    info = ch.object_info(srv.port)
    assert "TreeGRPOTrain" in info and "TreeGRPOSaveLoRA" in info          # the nodes still load (no red graph)
    with pytest.raises(ch.ComfyValidationError) as e:
        ch.post_prompt(srv.port, train_node_graph("never_runs", 1))
    errors = e.value.node_errors
    assert errors, e.value
    # every pack node with widgets carries the message (ComfyUI validates a node only through its widgets; the
    # demo loader has none, and every graph feeds it into a node that has)
    pack_nodes = {nid for nid, n in train_node_graph("x", 1).items()
                  if n["class_type"].startswith("TreeGRPO") and n["class_type"] != "TreeGRPOLoadDemoModel"}
    assert pack_nodes == {"rm", "train", "save"} and pack_nodes <= set(errors), (pack_nodes, errors.keys())
    for nid in pack_nodes:
        text = json.dumps(errors[nid]["errors"])
        assert all(p in text for p in wanted) and "pip install -r" in text, text


def test_the_install_command_names_this_python_and_the_requirements_file():
    cmd = install_command()
    import sys
    assert sys.executable in cmd and cmd.endswith('requirements.txt"') and " -m pip install -r " in cmd
