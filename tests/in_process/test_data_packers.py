"""The DataPacker seam (S-RUN-6): the Qwen2.5-VL packer on a tiny local model, the
per-sample multimodal inputs, media loading errors, packer selection and the
`data_packer.factory` config key."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from configs.loading import ConfigError, load_config
from configs.schema import TinyModelSpec, TinyVisionSpec
from data.packer_media import PromptMediaError
from data.packing import ChatTextPacker, MultimodalInputs, as_conversation
from data.packer_choice import build_packer
from data.vision_packer import IMAGE_TOKEN, VIDEO_TOKEN, QwenVLPacker, patchify_video
from models.tiny_vlm import build_tiny_vlm, mrope_section
from tests.conftest import REPO_ROOT, TINY_PROFILE
from tests.support.vlm_rows import write_mp4

VLM_PROFILE = str(REPO_ROOT / "configs" / "ppo_tiny_vlm_cpu.py")


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> str:
    return str(build_tiny_vlm(tmp_path_factory.mktemp("models") / "tiny-vlm", TinyModelSpec(vision=TinyVisionSpec())))


@pytest.fixture(scope="module")
def packer(vlm_dir) -> QwenVLPacker:
    built = build_packer(vlm_dir)
    assert isinstance(built, QwenVLPacker)
    return built


def _image(colour, size=(16, 24)) -> Image.Image:
    pixels = np.zeros((*size, 3), dtype=np.uint8)
    pixels[...] = colour
    pixels[0, 0] = (255, 255, 255)  # not flat, so a wrong patch order would show
    return Image.fromarray(pixels)


def _png_base64(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _user(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


# --- MultimodalInputs: per-sample selection -----------------------------------------


def test_forward_kwargs_concatenate_the_selected_rows_in_order_and_extend_token_types():
    inputs = MultimodalInputs(
        token_types=torch.tensor([[0, 1, 1], [0, 0, 0], [2, 2, 0]]),
        per_sample=(
            {"pixel_values": torch.full((2, 4), 1.0), "image_grid_thw": torch.tensor([[1, 2, 4]])},
            {},
            {"pixel_values_videos": torch.full((3, 4), 3.0), "video_grid_thw": torch.tensor([[2, 2, 2]])},
        ),
    )
    selected = inputs.forward_kwargs(5, torch.tensor([2, 0]))
    # Row 2 first, then row 0: its pixels are the only image ones, row 2's the only video ones.
    assert torch.equal(selected["pixel_values"], torch.full((2, 4), 1.0))
    assert torch.equal(selected["pixel_values_videos"], torch.full((3, 4), 3.0))
    # Token types of rows [2, 0], zero-extended over the two response columns.
    assert selected["mm_token_type_ids"].tolist() == [[2, 2, 0, 0, 0], [0, 1, 1, 0, 0]]
    # A text-only selection asks for the plain text call.
    assert inputs.forward_kwargs(5, [1]) == {}


def test_two_images_in_two_rows_keep_their_own_patches():
    inputs = MultimodalInputs(
        token_types=torch.zeros(2, 1, dtype=torch.long),
        per_sample=({"pixel_values": torch.zeros(2, 1)}, {"pixel_values": torch.ones(5, 1)}),
    )
    assert inputs.forward_kwargs(1, [1])["pixel_values"].shape == (5, 1)
    assert inputs.forward_kwargs(1, [1, 0])["pixel_values"][:5].sum() == 5  # row 1's patches come first


# --- the Qwen2.5-VL packer ---------------------------------------------------------------


def test_tiny_vlm_round_trips_through_auto_classes(vlm_dir):
    from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(vlm_dir)
    assert config.model_type == "qwen2_5_vl"
    assert AutoModelForImageTextToText.from_pretrained(vlm_dir).config.vision_config.patch_size == 4
    assert AutoImageProcessor.from_pretrained(vlm_dir).patch_size == 4
    assert mrope_section(16) == [2, 3, 3] and mrope_section(128) == [16, 24, 24]


def test_image_placeholders_expand_to_the_merged_patch_count(packer, tmp_path):
    path = tmp_path / "a.png"
    _image((10, 200, 30)).save(path)
    packed = packer.pack_prompts(["5", _user({"type": "image", "image": str(path)}, {"type": "text", "text": "5"})])
    text_row, image_row = packed.multimodal.per_sample
    assert text_row == {}
    grid = image_row["image_grid_thw"]
    # 16x24 px (multiples of patch 4 x merge 2) -> 4x6 patches of 4 px, 2x3 merged tokens.
    assert grid.tolist() == [[1, 4, 6]]
    assert image_row["pixel_values"].shape == (24, 3 * 2 * 4 * 4)
    ids = packed.input_ids
    assert (ids[1] == packer.image_token_id).sum() == 6 and (ids[0] == packer.image_token_id).sum() == 0
    assert torch.equal(packed.multimodal.token_types == 1, ids == packer.image_token_id)
    assert packed.attention_mask[0].sum() < packed.attention_mask[1].sum()  # left-padded text row


def test_path_file_url_data_url_and_bare_base64_give_the_same_pixels(packer, tmp_path):
    image = _image((120, 40, 7))
    path = tmp_path / "same.png"
    image.save(path)
    encoded = _png_base64(image)
    handles = [str(path), path.as_uri(), f"data:image/png;base64,{encoded}", encoded]
    packed = packer.pack_prompts([_user({"type": "image", "image": h}) for h in handles])
    pixels = [sample["pixel_values"] for sample in packed.multimodal.per_sample]
    assert all(torch.equal(pixels[0], other) for other in pixels[1:])
    image_url = packer.pack_prompts([_user({"type": "image_url", "image_url": {"url": path.as_uri()}})])
    assert torch.equal(image_url.multimodal.per_sample[0]["pixel_values"], pixels[0])


def test_video_patches_use_the_image_processor_layout(packer):
    """Two identical frames make one temporal patch whose content equals the image
    processor's patches for that frame (transformers repeats an image over T)."""
    from data.packer_media import VideoFrames

    frame = _image((33, 66, 99), size=(16, 24))
    video_pixels, video_grid = packer.video_patches(VideoFrames([frame, frame], fps=2.0))
    image = packer.image_processor(images=[frame], return_tensors="pt")
    assert video_grid.tolist() == image["image_grid_thw"].tolist() == [[1, 4, 6]]
    torch.testing.assert_close(video_pixels, image["pixel_values"], atol=1e-6, rtol=0)


def test_patchify_video_orders_rows_by_time_then_merged_blocks():
    # 2 frames, 1 channel, 4x4 px, patch 2, merge 2, T 2: one temporal patch of 4 patches.
    frames = np.arange(2 * 1 * 4 * 4, dtype=np.float32).reshape(2, 1, 4, 4)
    patches, grid = patchify_video(frames, patch_size=2, merge_size=2, temporal_patch_size=2)
    assert grid == [1, 2, 2]
    # Row 0 is the top-left patch: frame 0 pixels [0, 1, 4, 5], then frame 1's [16, 17, 20, 21].
    assert patches[0].tolist() == [0, 1, 4, 5, 16, 17, 20, 21]
    # Row 1 is the top-right patch of the same merged block.
    assert patches[1].tolist() == [2, 3, 6, 7, 18, 19, 22, 23]


def test_video_frames_with_and_without_fps_and_a_video_file(packer, tmp_path):
    frames = []
    for i in range(3):
        frame = tmp_path / f"f{i}.png"
        _image((40 * i, 0, 0)).save(frame)
        frames.append(str(frame))
    video_file = tmp_path / "clip.mp4"
    write_mp4(video_file, num_frames=8, fps=4)
    packed = packer.pack_prompts([
        _user({"type": "video", "video": frames, "fps": 1}, {"type": "text", "text": "1"}),
        _user({"type": "video", "video": frames, "fps": None}, {"type": "text", "text": "2"}),
        _user({"type": "video", "video": str(video_file)}),
    ])
    with_fps, without_fps, from_file = packed.multimodal.per_sample
    # 3 frames padded to 4 -> 2 temporal patches; T / fps seconds per temporal patch.
    assert with_fps["video_grid_thw"].tolist() == [[2, 4, 6]]
    assert with_fps["second_per_grid_ts"].tolist() == [2.0]
    assert without_fps["second_per_grid_ts"].tolist() == [1.0]  # the 2 fps default
    # 8 frames at 4 fps sampled at 2 fps -> 4 frames -> 2 temporal patches of 32x24 px.
    assert from_file["video_grid_thw"].tolist() == [[2, 6, 8]]
    assert from_file["second_per_grid_ts"].tolist() == [1.0]
    counts = (packed.input_ids == packer.video_token_id).sum(dim=1).tolist()
    assert counts == [2 * 4 * 6 // 4, 2 * 4 * 6 // 4, 2 * 6 * 8 // 4]
    assert (packed.multimodal.token_types == 2).sum(dim=1).tolist() == counts


def test_missing_image_names_the_row_the_key_and_the_path(packer, tmp_path):
    missing = tmp_path / "nowhere" / "cat.png"
    where = "rows.jsonl row 3 (line 4, column 1)"
    with pytest.raises(PromptMediaError) as caught:
        packer.pack_prompts(["1", _user({"type": "text", "text": "2"}, {"type": "image", "image": str(missing)})],
                            ["rows.jsonl row 2 (line 3, column 1)", where])
    message = str(caught.value)
    assert message.startswith(where) and "prompt[0].content[1].image" in message and str(missing) in message
    frame = tmp_path / "frame.png"
    _image((1, 2, 3)).save(frame)
    with pytest.raises(PromptMediaError, match=r"`prompt\[0\]\.content\[0\]\.video\[1\]` names image file .*cat\.png"):
        packer.pack_prompts([_user({"type": "video", "video": [str(frame), str(missing)]})], [where])


@pytest.mark.parametrize(
    ("part", "expected"),
    [
        ({"type": "video", "video": []}, "empty list of frames"),
        ({"type": "video", "video": ["a.png"], "fps": 0}, r"content\[0\]\.fps"),
        ({"type": "image"}, "no payload"),
        ({"type": "image", "image": "data:image/png;base64,AAAA"}, "not an image"),
    ],
)
def test_bad_media_parts_are_refused_by_key_path(packer, part, expected):
    with pytest.raises(PromptMediaError, match=expected):
        packer.pack_prompts([_user(part)], ["r.jsonl row 0 (line 1, column 1)"])


def test_vision_placeholders_are_outside_the_action_space(packer):
    packed = packer.pack_prompts(["3"])
    ids = [packer.tokenizer.convert_tokens_to_ids(t) for t in (IMAGE_TOKEN, VIDEO_TOKEN)]
    assert set(ids) <= set(packed.multimodal.never_generate)
    assert packer.decode_completions(torch.tensor([[ids[0], packer.tokenizer.convert_tokens_to_ids("3")]]),
                                     torch.ones(1, 2)) == ["3"]


# --- selection and the config key ------------------------------------------------------------


def test_text_models_keep_the_chat_text_packer(tiny_model_dir):
    text_packer = build_packer(tiny_model_dir)
    assert isinstance(text_packer, ChatTextPacker)
    assert text_packer.pack_prompts(["7"]).multimodal is None


class _Marker:
    def __init__(self, model_path, label="x"):
        self.model_path, self.label = model_path, label

    def pack_prompts(self, prompts, sources=None):
        raise NotImplementedError

    def decode_completions(self, response_ids, response_mask):
        raise NotImplementedError


def marker_factory(model_path: str, label: str = "default") -> _Marker:
    return _Marker(model_path, label)


def not_a_packer(model_path: str) -> dict:
    return {}


def test_a_configured_factory_is_called_with_the_model_path_and_kwargs(vlm_dir):
    built = build_packer(vlm_dir, "tests.in_process.test_data_packers:marker_factory", {"label": "mine"})
    assert isinstance(built, _Marker) and (built.model_path, built.label) == (vlm_dir, "mine")
    with pytest.raises(TypeError, match=r"data_packer.factory: .*not_a_packer returned dict"):
        build_packer(vlm_dir, "tests.in_process.test_data_packers:not_a_packer")
    with pytest.raises(
        ValueError,
        match=r"data_packer.factory: '.*:nothing_here': module 'tests.in_process.test_data_packers' has no attribute",
    ):
        build_packer(vlm_dir, "tests.in_process.test_data_packers:nothing_here")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("data.packing", "not a 'package.module:callable' path"),
        ("data.packing:", "not a 'package.module:callable' path"),
        ("no_such_package.mod:make", "which an override may not name"),  # S-SEC-3, before any lookup
    ],
)
def test_bad_factory_strings_fail_config_validation_naming_the_key(value, expected):
    with pytest.raises(ConfigError) as caught:
        load_config(TINY_PROFILE, [f"data_packer.factory={value}"])
    assert len(caught.value.problems) == 1
    problem = caught.value.problems[0]
    assert problem.startswith("data_packer.factory:")
    assert __import__("re").search(expected, problem), problem


def test_validate_manifest_reports_a_bad_factory_by_key(capsys):
    from cli.manifest import validate_manifest

    code = validate_manifest(TINY_PROFILE, ["data_packer.factory=nowhere_pkg.x:y"])
    captured = capsys.readouterr()
    assert code != 0 and "data_packer.factory" in captured.err


def test_vlm_profile_loads_and_refuses_pretraining():
    config = load_config(VLM_PROFILE)
    assert config.model.tiny.vision is not None and config.data_packer.factory is None
    with pytest.raises(ConfigError, match="pretrain_task"):
        load_config(VLM_PROFILE, ["model.tiny.pretrain_task=addition", "model.tiny.pretrain_steps=1",
                                  "model.tiny.task_alphabet=0123456789+="])


def test_synthetic_vision_rows_project_untouched():
    from data.prompt_projection import project_prompt
    from data.synthetic_vision import copy_digit_with_pictures

    rows = list(copy_digit_with_pictures(num_rows=6, seed=1))
    kinds = [r["prompt"] if isinstance(r["prompt"], str) else r["prompt"][0]["content"][0]["type"] for r in rows]
    assert kinds[1::3] == ["image", "image"] and kinds[2::3] == ["video", "video"]
    assert all(project_prompt(r) is r["prompt"] for r in rows)
    assert json.loads(json.dumps(rows)) == rows  # plain JSON, as a user's file would hold


# --- the worked example of docs/howto/custom-datapacker.md, verbatim ---------------------


class SystemPromptPacker:
    def __init__(self, inner, system: str):
        self.inner = inner
        self.system = system

    def pack_prompts(self, prompts, sources=None):
        conversations = [[{"role": "system", "content": self.system}, *as_conversation(p)] for p in prompts]
        return self.inner.pack_prompts(conversations, sources)

    def decode_completions(self, response_ids, response_mask):
        return self.inner.decode_completions(response_ids, response_mask)


def with_system_prompt(model_path: str, system: str = "answer with one digit.") -> SystemPromptPacker:
    return SystemPromptPacker(build_packer(model_path), system)


def test_the_howto_factory_wraps_the_built_in_packer(vlm_dir, tmp_path):
    path = tmp_path / "p.png"
    _image((5, 5, 5)).save(path)
    wrapped = build_packer(vlm_dir, "tests.in_process.test_data_packers:with_system_prompt", {"system": "be brief."})
    packed = wrapped.pack_prompts([_user({"type": "image", "image": str(path)}, {"type": "text", "text": "4"})])
    text = wrapped.inner.tokenizer.decode(packed.input_ids[0])
    assert text.startswith("<|im_start|>system\nbe brief.<|im_end|>\n<|im_start|>user\n<|vision_start|>")
    assert packed.multimodal.per_sample[0]["image_grid_thw"].tolist() == [[1, 4, 6]]
