"""The ``conversation`` dataset id: :class:`mm_data.ConversationDataset` built from ``data.dataset``.

The tokenizer and image processor are loaded with transformers' Auto classes from
``data.dataset.processor`` (no network: a local folder); the chat template and the multimodal plugin
are looked up by name in mm-data's registries (plugins registered by ``training.plugin`` modules or
installed ``mm_trainer.plugins`` entry points).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mm_config import ConversationDatasetConfig
from mm_data import (
    MM_PLUGINS,
    TEMPLATES,
    ChatTemplate,
    ConversationColumns,
    ConversationDataset,
    MediaBudget,
    MultimodalPlugin,
)

from mm_trainer.model.hf_model import import_transformers
from mm_trainer.registry.plugins import load_entry_point_plugins
from mm_trainer.registry.registries import data_register

__all__ = ["build_plugin", "conversation_dataset", "load_processor_parts"]


def load_processor_parts(path: str) -> tuple[Any, Any]:
    """``(tokenizer, image_processor or None)`` from a local folder."""
    transformers = import_transformers("data.dataset.processor (the conversation dataset)")
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"data.dataset.processor: no directory {folder}")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    has_images = (folder / "preprocessor_config.json").is_file()
    return tokenizer, transformers.AutoImageProcessor.from_pretrained(folder) if has_images else None


def build_plugin(
    options: ConversationDatasetConfig, tokenizer: Any, image_processor: Any
) -> MultimodalPlugin:
    """The registered multimodal plugin named by ``options.mm_plugin`` with the media budget."""
    if options.mm_plugin not in MM_PLUGINS:
        load_entry_point_plugins()
    budget = MediaBudget(
        image_max_pixels=options.image_max_pixels,
        image_min_pixels=options.image_min_pixels,
        video_max_pixels=options.video_max_pixels,
        video_min_pixels=options.video_min_pixels,
        video_fps=options.video_fps,
        video_max_frames=options.video_max_frames,
    )
    return MM_PLUGINS.get(options.mm_plugin)(tokenizer, image_processor, budget=budget)


@data_register("conversation")
def conversation_dataset(
    *, data_path: str, data_root: str | None = None, **dataset: Any
) -> ConversationDataset:
    """``ConversationDataset`` over the conversation file ``data.data_path``."""
    options = ConversationDatasetConfig.model_validate(dataset)
    tokenizer, image_processor = load_processor_parts(options.processor)  # type: ignore[arg-type]
    if options.template != "tokenizer" and options.template not in TEMPLATES:
        load_entry_point_plugins()
    columns = ConversationColumns(formatting=options.formatting, **options.columns.model_dump())
    return ConversationDataset(
        data_path,
        template=ChatTemplate(tokenizer, options.template),
        plugin=build_plugin(options, tokenizer, image_processor),
        columns=columns,
        data_root=data_root,
        train_on=options.train_on,
        cutoff_len=options.cutoff_len,
        packing=options.packing,
        max_bad_fraction=options.max_bad_fraction,
        decode_timeout_s=options.decode_timeout_s,
    )
