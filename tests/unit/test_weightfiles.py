"""Weight files are read without executing anything in them, and a file cut short is called incomplete."""
from __future__ import annotations

import os
import warnings
import zipfile

import pytest
import torch

import reward_fixtures as rf
from treegrpo.rewards.weightfiles import WeightFileError, read_torchscript, read_weights


@pytest.fixture(scope="module")
def torchscript_clip(tmp_path_factory):
    return rf.make_clip_file(str(tmp_path_factory.mktemp("ts")), "torchscript")[0]


def test_a_torchscript_archive_is_read_like_torch_jit_load_without_running_it(torchscript_clip):
    ours = read_torchscript(torchscript_clip, "clipscore")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = dict(torch.jit.load(torchscript_clip, map_location="cpu").state_dict())
    assert ours.keys() == ref.keys()
    assert all(torch.equal(ours[k], ref[k]) and ours[k].dtype == ref[k].dtype for k in ref)


def _with_data_pkl(src: str, dst: str, payload: bytes) -> str:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            zout.writestr(item, payload if item.filename.endswith("/data.pkl") else data)
    return dst


def test_code_in_a_torchscript_archive_is_never_run(torchscript_clip, tmp_path):
    marker = tmp_path / "ran"
    evil = f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()
    path = _with_data_pkl(torchscript_clip, str(tmp_path / "ViT-L-14.pt"), evil)
    with pytest.raises(WeightFileError, match=r"holds a os.system object, which is not read"):
        read_weights(path, "clipscore")
    assert not marker.exists()


def test_a_pickle_with_objects_is_refused(tmp_path):
    path = str(tmp_path / "head.pth")
    torch.save({"layers.0.weight": torch.ones(2, 2), "opt": torch.optim.SGD}, path)
    with pytest.raises(WeightFileError, match="Python objects besides tensors"):
        read_weights(path, "laion_aesthetic")


@pytest.mark.parametrize("fmt", ["safetensors", "zip", "torchscript"])
def test_a_truncated_file_is_called_incomplete(fmt, tmp_path, torchscript_clip):
    if fmt == "torchscript":
        src = torchscript_clip
        path = str(tmp_path / "ViT-L-14.pt")
    else:
        src = str(tmp_path / ("full.safetensors" if fmt == "safetensors" else "full.pt"))
        sd = {"w": torch.randn(64, 64), "b": torch.randn(64)}
        if fmt == "safetensors":
            from safetensors.torch import save_file
            save_file(sd, src)
        else:
            torch.save(sd, src)
        path = str(tmp_path / ("cut" + os.path.splitext(src)[1]))
    data = open(src, "rb").read()
    open(path, "wb").write(data[: len(data) * 2 // 3])
    with pytest.raises(WeightFileError) as e:
        read_weights(path, "hpsv2")
    msg = str(e.value)
    assert "is incomplete" in msg and path in msg and "download the file again" in msg, msg


def test_a_safetensors_file_cut_inside_its_header(tmp_path):
    from safetensors.torch import save_file
    src = str(tmp_path / "a.safetensors")
    save_file({"w": torch.ones(3)}, src)
    cut = str(tmp_path / "b.safetensors")
    open(cut, "wb").write(open(src, "rb").read()[:20])
    with pytest.raises(WeightFileError, match="is incomplete"):
        read_weights(cut, "pickscore")


@pytest.mark.parametrize("kind,body,said", [
    ("web page", b"\n<!DOCTYPE html>\n<html><head><title>PickScore_v1 at main</title>", "is a web page \\(HTML\\), not the weights"),
    ("lfs pointer", b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7f\nsize 3944692",
     "is a Git LFS pointer, not the weights.*git lfs pull"),
])
@pytest.mark.parametrize("ext", [".safetensors", ".pt"])
def test_a_web_page_or_lfs_pointer_in_place_of_the_weights_says_what_it_is(tmp_path, kind, body, said, ext):
    path = tmp_path / f"model{ext}"
    path.write_bytes(body)
    with pytest.raises(WeightFileError, match=f"pickscore: .*model\\{ext} {said}"):
        read_weights(str(path), "pickscore")


def test_a_model_folder_is_checked_on_the_files_transformers_reads(tmp_path):
    """model.safetensors before the shards its index names before pytorch_model.bin: a pointer left beside the file
    that is read does not matter, one among the shards read is named."""
    import json

    from safetensors.torch import save_file
    from treegrpo.rewards.weightfiles import check_folder_weights, loaded_weight_files

    pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1\n"
    (tmp_path / "pytorch_model.bin").write_text(pointer)
    save_file({"w": torch.ones(2)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    (tmp_path / "model-00002-of-00002.safetensors").write_text(pointer)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    assert [os.path.basename(p) for p in loaded_weight_files(str(tmp_path))] == \
        ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    with pytest.raises(WeightFileError, match="model-00002-of-00002.safetensors is a Git LFS pointer"):
        check_folder_weights(str(tmp_path), "vlm_judge")
    save_file({"w": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    assert loaded_weight_files(str(tmp_path)) == [str(tmp_path / "model.safetensors")]
    check_folder_weights(str(tmp_path), "vlm_judge")
