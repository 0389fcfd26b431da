"""Write a diffusers pipeline folder (``model_index.json`` + one sub-folder per component)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

Component = tuple[str, str, Callable[[], Any]]
"""(library, class name, build): ``build()`` returns an object with ``save_pretrained(dir)``."""


def write_pipeline_folder(
    out: str | os.PathLike,
    class_name: str,
    components: Mapping[str, Component],
    *,
    diffusers_version: str = "0.35.0",
    extra_index: Mapping[str, Any] | None = None,
) -> Path:
    """Build and save each component whose ``<name>/config.json`` (a scheduler's
    ``scheduler_config.json``) is missing, then write the index.

    ``extra_index`` adds index entries for parts saved otherwise (e.g. a tokenizer) or absent (an
    optional component as ``[None, None]``).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, (_, _, build) in components.items():
        if not any((out / name / f).is_file() for f in ("config.json", "scheduler_config.json")):
            build().save_pretrained(out / name)
    index: dict[str, Any] = {"_class_name": class_name, "_diffusers_version": diffusers_version}
    index.update({name: [library, cls] for name, (library, cls, _) in components.items()})
    index.update(extra_index or {})
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    return out
