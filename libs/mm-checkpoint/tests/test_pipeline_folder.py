"""write_pipeline_folder: components saved once, model_index.json lists them."""

import json

from mm_checkpoint import write_pipeline_folder


class Saves:
    built = 0

    def __init__(self) -> None:
        Saves.built += 1

    def save_pretrained(self, path) -> None:
        path.mkdir(parents=True)
        (path / "config.json").write_text("{}")


def test_components_are_saved_once_and_indexed(tmp_path):
    components = {"transformer": ("diffusers", "X", Saves), "vae": ("diffusers", "Y", Saves)}
    for _ in range(2):
        write_pipeline_folder(tmp_path, "P", components, extra_index={"tokenizer": ["transformers", "T"]})
    assert Saves.built == 2  # the second call finds both config.json files and builds nothing
    index = json.loads((tmp_path / "model_index.json").read_text())
    assert (
        index["_class_name"] == "P"
        and index["vae"] == ["diffusers", "Y"]
        and index["tokenizer"] == ["transformers", "T"]
    )
