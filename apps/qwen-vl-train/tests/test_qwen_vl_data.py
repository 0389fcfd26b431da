"""The qwen2_vl data path: media token counts vs the processor and the vision tower, labels, bad samples."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mm_data import IGNORE_INDEX


# within the budget: 48 x 32 (sides rounded to the 8-pixel factor); over it: 64 x 56 (scaling into the
# budget first trained 72 x 56, 63 tokens); under image_min_pixels: 40 x 32
@pytest.mark.parametrize(
    ("height", "width", "min_pixels", "max_pixels", "tokens"),
    [(44, 36, 0, 64 * 64, 24), (96, 80, 0, 64 * 64, 56), (12, 10, 32 * 32, 64 * 64, 20)],
)
def test_images_train_at_the_resolution_and_pixels_the_processor_gives_the_raw_image(
    tiny_dataset, tiny_root, height, width, min_pixels, max_pixels, tokens
):
    from PIL import Image
    from transformers import AutoImageProcessor

    raw = Image.fromarray(np.random.default_rng(height).integers(0, 256, (height, width, 3), dtype=np.uint8))
    raw.save(tiny_root / "data" / f"raw_{height}x{width}.png")
    rows = [{"conversations": [{"from": "human", "value": "<image>what is it?"}, {"from": "gpt", "value": "noise"}],
             "images": [f"raw_{height}x{width}.png"]}]  # fmt: skip
    ds = tiny_dataset(rows, image_min_pixels=min_pixels, image_max_pixels=max_pixels)
    item = ds.encode(0)
    # inference: the model's processor on the raw image, its pixel bounds set to the training budget
    processor = AutoImageProcessor.from_pretrained(tiny_root / "model")
    bounds = {"shortest_edge": min_pixels or processor.size["shortest_edge"], "longest_edge": max_pixels}
    reference = processor(images=[raw], size=bounds, return_tensors="pt")
    assert item["input_ids"].count(ds.plugin.image_token_id) == tokens
    assert int(reference["image_grid_thw"].prod()) // ds.plugin.merge**2 == tokens
    assert torch.equal(item["media"]["image_grid_thw"], reference["image_grid_thw"])
    assert torch.equal(item["media"]["pixel_values"], reference["pixel_values"])


def test_media_tokens_are_what_the_vision_tower_produces(tiny_dataset, tiny_model):
    ds, model = tiny_dataset(), tiny_model()
    plugin = ds.plugin
    checked = set()
    for index in range(len(ds)):
        item = ds.encode(index)
        for kind, token, pixels, grid in (
            ("image", plugin.image_token_id, "pixel_values", "image_grid_thw"),
            ("video", plugin.video_token_id, "pixel_values_videos", "video_grid_thw"),
        ):
            if pixels in item["media"]:
                with torch.no_grad():
                    features = model.model.visual(
                        item["media"][pixels], grid_thw=item["media"][grid]
                    ).pooler_output
                assert item["input_ids"].count(token) == features.shape[0] > 0, (index, kind)
                checked.add(kind)
    assert checked == {"image", "video"}


def test_video_frames_are_stacked_per_temporal_patch(tiny_dataset):
    plugin = tiny_dataset().plugin
    levels = [0, 40, 80, 120, 160, 200]  # six solid frames -> three temporal patches of two frames
    frames = np.stack([np.full((16, 16, 3), v, np.uint8) for v in levels])
    patches, grid = plugin.video_patches(frames)
    t, h, w = grid.tolist()
    assert (t, h * w) == (3, 16) and patches.shape[0] == t * h * w
    p = plugin.image_processor.patch_size
    per_frame = patches.view(t, h * w, 3, 2, p, p)  # [grid_t, positions, C, tp, p, p]
    for k in range(len(levels)):
        got = per_frame[k // 2, :, 0, k % 2]  # channel 0 of frame k
        want = plugin.image_processor(images=[frames[k]], return_tensors="pt")["pixel_values"].view(
            h * w, 3, 2, p, p
        )
        torch.testing.assert_close(got, want[:, 0, 0])
    assert not torch.equal(per_frame[0, :, 0, 0], per_frame[0, :, 0, 1])


def test_labels_are_the_assistant_answers(tiny_dataset):
    ds = tiny_dataset()
    row = next(i for i, r in enumerate(ds.rows) if len(r["conversations"]) == 4)
    item = ds.encode(row)
    tok = ds.template.tokenizer
    answers = [t["value"] for t in ds.rows[row]["conversations"] if t["from"] == "gpt"]
    labelled = tok.decode([t for t in item["labels"] if t != IGNORE_INDEX])
    assert labelled == "".join(f"{a}<|im_end|>\n" for a in answers)
    assert item["labels"][0] == IGNORE_INDEX


def test_bad_samples_are_named_skipped_and_counted(tiny_dataset, tiny_root):
    rows = [
        {"id": "two-placeholders", "conversations": [{"from": "human", "value": "<image><image>hi"},
                                                     {"from": "gpt", "value": "x"}], "images": ["image_0000.png"]},
        {"id": "missing-file", "conversations": [{"from": "human", "value": "<image>hi"},
                                                 {"from": "gpt", "value": "x"}], "images": ["nowhere.png"]},
        {"id": "good", "conversations": [{"from": "human", "value": "<image>hi"}, {"from": "gpt", "value": "x"}],
         "images": ["image_0000.png"]},
    ]  # fmt: skip
    ds = tiny_dataset(rows, max_bad_fraction=1.0)
    item = ds[0]
    assert item["index"] == 2 and item["skipped"] == [0, 1]
    first, second = ds.tracker.bad_samples
    assert first.path.endswith("[0] (id two-placeholders)")
    assert "2 <image> placeholder(s) in the text but 1 image(s) listed" in first.reason
    assert second.path.endswith("[1] (id missing-file)")
    assert "nowhere.png: no such file" in second.reason


def test_too_many_bad_samples_stop_with_a_report(tiny_dataset):
    from mm_data import BadSampleError

    rows = [{"id": "bad", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "x"}],
             "images": ["image_0000.png"]}]  # fmt: skip
    with pytest.raises(BadSampleError, match=r"rows_\d+\.json\[0\] \(id bad\): 0 <image> placeholder"):
        tiny_dataset(rows, max_bad_fraction=0.0)[0]


def test_a_fifo_listed_as_an_image_is_a_bad_sample_and_decode_timeout_s_reaches_the_dataset(
    tiny_dataset, tiny_root
):
    import os

    fifo = tiny_root / "data" / "stalled.png"
    if not fifo.exists():
        os.mkfifo(fifo)
    rows = [
        {"id": "fifo", "conversations": [{"from": "human", "value": "<image>hi"}, {"from": "gpt", "value": "x"}],
         "images": ["stalled.png"]},
        {"id": "good", "conversations": [{"from": "human", "value": "<image>hi"}, {"from": "gpt", "value": "x"}],
         "images": ["image_0000.png"]},
    ]  # fmt: skip
    ds = tiny_dataset(rows, max_bad_fraction=1.0, decode_timeout_s=7.5)
    assert ds.decode_timeout_s == 7.5
    assert ds[0]["index"] == 1  # a FIFO is refused without being opened: no wait
    (bad,) = ds.tracker.bad_samples
    assert bad.path.endswith("[0] (id fifo)") and f"image {fifo}: a FIFO (named pipe)" in bad.reason
