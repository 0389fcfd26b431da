import json
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from mm_data import VideoTextDataset, build_dataloader, frame_index_from_colour, make_synthetic_dataset
from mm_data.decode import probe_video
from PIL import Image


def frame_indices(video: torch.Tensor) -> list[int]:
    """Decode the index-colour of every frame of a [C, T, H, W] video in [-1, 1]."""
    rgb = (video + 1) * 127.5
    return [frame_index_from_colour(rgb[:, t].mean(dim=(1, 2)).tolist()) for t in range(video.shape[1])]


def all_frames(path: str) -> np.ndarray:
    """Independent reference: every frame of a clip, decoded front to back."""
    with av.open(path) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"fps": 8, "frame_offset": "start"}, [0, 2, 4, 6, 8, 10, 12, 14, 16]),
        ({"frame_stride": 3, "frame_offset": "center"}, [8, 11, 14, 17, 20, 23, 26, 29, 32]),
        ({"fps": 32, "frame_offset": "start"}, [0, 1, 1, 2, 2, 3, 3, 4, 4]),
        ({"frame_offset": "center"}, list(range(16, 25))),
    ],
)
def test_frame_sampling_picks_expected_indices(index_clip: Path, kwargs, expected):
    ds = VideoTextDataset(index_clip, num_frames=9, height=32, width=32, **kwargs)
    assert frame_indices(ds[0]["video"]) == expected


def test_random_offset_is_contiguous_reproducible_and_varies_by_epoch(index_clip: Path):
    ds = VideoTextDataset(index_clip, num_frames=5, height=16, width=16, frame_stride=2, seed=3)
    starts = []
    for epoch in range(6):
        ds.set_epoch(epoch)
        got = frame_indices(ds[0]["video"])
        assert got == list(range(got[0], got[0] + 10, 2)) and got[-1] <= 40
        assert frame_indices(ds[0]["video"]) == got
        starts.append(got[0])
    assert len(set(starts)) > 1


def test_decoded_frames_equal_a_front_to_back_decode(clips: Path):
    row = json.loads(clips.read_text())[0]  # 64x64, 33 frames
    ds = VideoTextDataset(clips, num_frames=9, height=64, width=64, frame_stride=2, frame_offset="center")
    video = ds[0]["video"]
    reference = all_frames(str(clips.parent / row["path"]))[8:26:2]  # slack 16 -> start 8
    got = ((video + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 3, 0).numpy()
    assert np.array_equal(got, reference)


def test_items_say_when_their_first_frame_plays_in_the_source_clip(clips: Path):
    ds = VideoTextDataset(clips, num_frames=9, height=64, width=64, frame_stride=2, frame_offset="center")
    fps = probe_video(str(clips.parent / json.loads(clips.read_text())[0]["path"])).fps
    assert ds[0]["start_s"] == pytest.approx(8 / fps)  # frames 8, 10, ... (slack 16 -> start 8)


def test_resize_and_center_crop_match_a_pil_reference(clips: Path):
    row = json.loads(clips.read_text())[1]  # 48x80 -> cover 32x53 -> crop 32x48
    ds = VideoTextDataset(clips, num_frames=1, height=32, width=48, frame_offset="start")
    frame = ((ds[1]["video"][:, 0] + 1) * 127.5).permute(1, 2, 0).numpy()
    first = all_frames(str(clips.parent / row["path"]))[0]
    reference = np.asarray(Image.fromarray(first).resize((53, 32), Image.BILINEAR), dtype=np.float32)[:, 2:50]
    assert np.abs(frame - reference).mean() < 6.0


def test_items_have_requested_shape_range_and_fields(clips: Path, kinds_of):
    ds = VideoTextDataset(
        clips, num_frames=17, height=32, width=48, return_first_frame=True, max_bad_fraction=0.5
    )
    caps = [row["cap"] for row in json.loads(clips.read_text())]
    for i, kind in enumerate(kinds_of(clips)):
        if kind != "clip":
            continue
        item = ds[i]
        video = item["video"]
        assert video.shape == (3, 17, 32, 48) and video.dtype == torch.float32
        assert video.min() >= -1 and video.max() <= 1 and video.std() > 0.05
        assert torch.equal(item["first_frame"], video[:, 0])
        assert item["prompt"] in caps[i] and item["index"] == i and item["bucket"] == 0


def test_caption_dropout_empties_prompts(clips: Path):
    always = VideoTextDataset(clips, num_frames=17, height=16, width=16, caption_dropout=1.0)
    assert always[0]["prompt"] == ""
    half = VideoTextDataset(clips, num_frames=17, height=16, width=16, caption_dropout=0.5)
    prompts = []
    for epoch in range(12):
        half.set_epoch(epoch)
        prompts.append(half[2]["prompt"])
    assert "" in prompts and any(prompts)


def test_tokenizer_adds_padded_ids_and_mask(clips: Path):
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"[PAD]": 0, "[UNK]": 1, "a": 2, "moving": 3}
    model = tokenizers.models.WordLevel(vocab, unk_token="[UNK]")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")
    ds = VideoTextDataset(clips, num_frames=17, height=16, width=16, tokenizer=hf, max_text_length=12)
    item = ds[0]
    words = item["prompt"].replace(".", " .").split()
    assert item["input_ids"].shape == (12,) and item["attention_mask"].shape == (12,)
    assert int(item["attention_mask"].sum()) == len(words)
    assert item["input_ids"][: len(words)].tolist() == [vocab.get(w, 1) for w in words]


def test_images_are_one_frame_videos_in_their_own_bucket(tmp_path: Path):
    meta = make_synthetic_dataset(tmp_path, num_clips=3, num_images=3)
    ds = VideoTextDataset(meta, num_frames=17, height=32, width=32)
    assert ds[3]["video"].shape == (3, 1, 32, 32)
    loader = build_dataloader(ds, global_batch_size=3, dp_rank=0, dp_size=1, seed=1)
    shapes = sorted(tuple(b["video"].shape) for b in loader)
    assert shapes == [(3, 3, 1, 32, 32), (3, 3, 17, 32, 32)]


def test_load_clip_tensors_stacks_every_clip_from_its_first_frame(index_clip: Path):
    from mm_data import load_clip_tensors

    clips = load_clip_tensors(index_clip, num_frames=5, height=16, width=16)
    assert clips.shape == (1, 3, 5, 16, 16)
    # frame k of the index clip is the colour of index k: the stack starts at frame 0, in order
    rgb = ((clips[0].mean(dim=(2, 3)) + 1) * 127.5).T.numpy()
    assert [frame_index_from_colour(c) for c in rgb] == [0, 1, 2, 3, 4]


def test_synthetic_clips_with_tones_carry_an_aac_track_of_each_clips_frequency(tmp_path):
    meta = make_synthetic_dataset(tmp_path, num_clips=2, sizes=[(16, 16)], num_frames=(5,), fps=(8,),
                                  tones=(500.0, 2000.0), sample_rate=16000)  # fmt: skip
    for row, frequency in zip(json.loads(meta.read_text()), (500.0, 2000.0), strict=True):
        with av.open(str(tmp_path / row["path"])) as container:
            assert (
                len(container.streams.video) == 1 and container.streams.audio[0].codec_context.name == "aac"
            )
            wave = np.concatenate([f.to_ndarray() for f in container.decode(audio=0)], axis=1)
        assert wave.shape[0] == 2 and wave.shape[1] >= 16000 * (
            5 / 8 + 0.5
        )  # the frames' span + half a second
        spectrum = np.abs(np.fft.rfft(wave[0, 2048:10240]))  # past the encoder's priming
        assert np.fft.rfftfreq(8192, 1 / 16000)[spectrum.argmax()] == pytest.approx(frequency, abs=4)
    silent = make_synthetic_dataset(
        tmp_path / "silent", num_clips=1, sizes=[(16, 16)], num_frames=(5,), fps=(8,)
    )
    with av.open(str(silent.parent / "clip_0000.mp4")) as container:
        assert not container.streams.audio
