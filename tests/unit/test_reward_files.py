"""The Reward Model Loader's per-reward file list (treegrpo/rewards/files.py): what a user's models/reward_models
holds, as published, and which file each reward's list shows."""
from treegrpo.rewards.files import files_for

USER_FILES = [
    "HPS_v2.1_compressed.pt", "ViT-L-14.pt", "my_run_taste.safetensors", "notes.txt",
    "ImageReward/ImageReward.pt", "ImageReward/med_config.json", "ImageReward/bert-base-uncased/vocab.txt",
    "PickScore_v1/config.json", "PickScore_v1/model.safetensors", "PickScore_v1/processor/tokenizer.json",
    "aesthetic/sac+logos+ava1-l14-linearMSE.pth", "aesthetic/ViT-L-14.pt",
    "HPSv3/HPSv3.safetensors", "HPSv3/config.json", "HPSv3/tokenizer.json", "HPSv3/chat_template.json",
    "Qwen2-VL-2B-Instruct/config.json", "Qwen2-VL-2B-Instruct/generation_config.json",
    "Qwen2-VL-2B-Instruct/model-00001-of-00002.safetensors", "Qwen2-VL-2B-Instruct/model-00002-of-00002.safetensors",
    "Qwen2-VL-2B-Instruct/model.safetensors.index.json", "Qwen2-VL-2B-Instruct/preprocessor_config.json",
    "tiny_vlm/config.json", "tiny_vlm/chat_template.jinja", "tiny_vlm/model.safetensors",
]


def test_each_reward_lists_only_its_own_files():
    assert files_for("hpsv2", USER_FILES) == ["HPS_v2.1_compressed.pt"]
    assert files_for("image_reward", USER_FILES) == ["ImageReward/ImageReward.pt"]
    assert files_for("pickscore", USER_FILES) == ["PickScore_v1/model.safetensors"]
    assert files_for("laion_aesthetic", USER_FILES) == ["aesthetic/sac+logos+ava1-l14-linearMSE.pth"]
    assert files_for("taste", USER_FILES) == ["my_run_taste.safetensors"]
    assert files_for("clipscore", USER_FILES) == ["HPS_v2.1_compressed.pt", "ViT-L-14.pt"]
    assert files_for("hpsv3", USER_FILES) == ["HPSv3/HPSv3.safetensors"]
    # HPS v2 beside another reward's files in one flat folder still shows
    assert files_for("hpsv2", ["HPS_v2.1_compressed.pt", "sac+logos+ava1-l14-linearMSE.pth", "ViT-L-14.pt"]) == \
        ["HPS_v2.1_compressed.pt"]
    assert files_for("vlm_judge", USER_FILES) == ["Qwen2-VL-2B-Instruct/model-00001-of-00002.safetensors",
                                                  "tiny_vlm/model.safetensors"]
    # another reward's file put in a folder of its own before the rest of that reward's files: not a CLIP file
    alone = ["HPSv3/HPSv3.safetensors", "ir/ImageReward.pt", "head/sac+logos+ava1-l14-linearMSE.pth", "ViT-L-14.pt"]
    assert files_for("clipscore", alone) == ["ViT-L-14.pt"]
    assert files_for("hpsv3", alone) == ["HPSv3/HPSv3.safetensors"]
    assert files_for("jpeg_compressibility", USER_FILES, needs_file=False) == []
    assert files_for("someone_elses_reward", USER_FILES) == USER_FILES
