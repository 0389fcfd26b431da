"""``data.sources``: several data sets of one dataset id, each with its repeats; what does not apply to the
dataset id is refused naming the key."""

from __future__ import annotations

VIDEO_TEXT = {"dataset_id": "video_text", "dataset": {"num_frames": 9, "height": 32, "width": 32}}
TWO = [{"data_path": "images/", "repeats": 3}, {"data_path": "clips.json", "data_root": "clips"}]


def test_video_text_sources_load_with_their_paths_and_repeats(load):
    data = load({"data": {**VIDEO_TEXT, "sources": TWO}}).data
    assert [(s.data_path, s.data_root, s.repeats) for s in data.sources] == [
        ("images/", None, 3),
        ("clips.json", "clips", 1),
    ]
    assert data.data_path is None


def test_a_data_path_or_data_root_beside_sources_is_refused(load_error, problem_at):
    err = load_error({"data": {**VIDEO_TEXT, "sources": TWO, "data_path": "x.json", "data_root": "clips"}})
    for key in ("data.data_path", "data.data_root"):
        assert "give it in each entry of data.sources instead" in problem_at(err, key)


def test_a_repeat_count_below_one_is_refused(load_error, problem_at):
    err = load_error({"data": {**VIDEO_TEXT, "sources": [{"data_path": "a.json", "repeats": 0}]}})
    assert "greater than or equal to 1" in problem_at(err, "data.sources[0].repeats")


def test_an_empty_source_list_is_refused(load_error, problem_at):
    err = load_error({"data": {**VIDEO_TEXT, "sources": []}})
    assert "at least 1 item" in problem_at(err, "data.sources")


def test_a_sources_data_root_is_refused_where_the_dataset_reads_no_media_paths(load_error, problem_at):
    sources = [{"data_path": "cache_a"}, {"data_path": "cache_b", "data_root": "clips"}]
    err = load_error({"data": {"dataset_id": "precomputed_latents", "sources": sources}})
    assert "reads no relative media paths" in problem_at(err, "data.sources[1].data_root")
    assert [p.path for p in err.problems] == ["data.sources[1].data_root"]


def test_sources_are_refused_by_a_dataset_that_reads_one_data_set(load_error, problem_at):
    pairs = {"num_frames": 9, "height": 32, "width": 32}
    err = load_error({"data": {"dataset_id": "video_pairs", "dataset": pairs, "sources": TWO}})
    assert "dataset `video_pairs` reads one data set" in problem_at(err, "data.sources")
