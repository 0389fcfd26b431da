"""Export a single-model HF run: a training checkpoint -> a folder upstream ``from_pretrained`` loads.

Weights: the ``model.`` tensors of the DCP checkpoint as HF safetensors (sharded, with an index) under
the model's own keys. ``config.json``: the run's transformers config (the source's merged with
``hf_config``) naming the upstream class. Tokenizer / processor files are copied from the source
folder, so ``AutoTokenizer`` / ``AutoImageProcessor`` load from the export too.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from mm_checkpoint import export_checkpoint, export_into
from mm_checkpoint.layout import resolve_dcp_dir
from mm_checkpoint.runtime import get_rank

from mm_trainer.model.hf_model import HFCausalLM, HFModel, hf_class, load_hf_config
from mm_trainer.registry.registries import MODEL_REGISTRY

__all__ = ["export_hf_model"]

#: files of a model folder that are neither weights nor the model config
_SIDE_FILES = ("tokenizer*", "special_tokens_map.json", "vocab*", "merges.txt", "chat_template*",
               "preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json",
               "generation_config.json")  # fmt: skip


def upstream_class(args: Any) -> type:
    """The transformers class a ``model`` section trains."""
    registered = MODEL_REGISTRY.get(args.model_id)
    if registered is HFCausalLM:
        return hf_class(args)
    if isinstance(registered, type) and issubclass(registered, HFModel):
        return registered.upstream_class()
    raise TypeError(f"model {args.model_id!r} is {registered}, not a transformers model of the HF path")


def export_hf_model(
    config: Any, checkpoint: str | Path, out: str | Path, *, max_shard_size: str = "5GB"
) -> Path:
    """Write the latest iteration of ``checkpoint`` (a run of ``config``, single-model form) to ``out``."""
    args = config.model.sub_models()["model"]
    upstream = upstream_class(args)
    hf_config = load_hf_config(args, upstream.config_class)
    hf_config.architectures = [upstream.__name__]
    source = args.from_pretrained or args.checkpoint_path
    read = resolve_dcp_dir(checkpoint)[0]
    with tempfile.TemporaryDirectory() as side, export_into(out, sources=(read, source)) as folder:
        hf_config.save_pretrained(side)
        export_checkpoint(
            checkpoint, folder, to="hf", config_from=side, submodule="model", max_shard_size=max_shard_size
        )
        if source and Path(source).is_dir() and get_rank() == 0:
            for pattern in _SIDE_FILES:
                for file in Path(source).glob(pattern):
                    shutil.copy2(file, folder / file.name)
    return Path(out)
