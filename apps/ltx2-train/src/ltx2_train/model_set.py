"""Whether an LTX-2 model set's parts belong together, from their configs (no weights read): the transformer's
release and the text side's (:mod:`ltx2_train.text_side`), the transformer's ``vae_scale_factors`` and the video
VAE's compression, and the clip size against that compression (:mod:`ltx2_train.vae_factors`).

``preprocess`` asks :func:`check_preprocess_model_set` before any encoder loads (the model set is
``data.dataset.preprocess.model_root``, its transformer the one in ``transformer/`` where there is one); a
training run asks :func:`run_problems` through ``mm_trainer.check_model_set`` before anything is built (its
transformer is ``model.from_pretrained``, its text side and VAE those the cache was encoded with). Mismatched
parts are refused with ``mm_trainer.ModelSetError`` (exit 66), one line per problem naming the files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mm_trainer import ModelSetError

from ltx2_train.text_side import has_text_side, model_set_problems, read_text_side
from ltx2_train.vae_factors import clip_size_problem, scale_factor_problem, vae_config_file, video_vae_factors
from ltx2_train.version import checkpoint_version


def _vae_problems(model_root: str | Path, transformer: dict[str, Any] | None, where: Any) -> list[str]:
    factors = video_vae_factors(model_root)
    if factors is None or transformer is None:
        return []
    why = scale_factor_problem(factors, vae_config_file(model_root), transformer, where)
    return [why] if why else []


def check_preprocess_model_set(options: Any) -> None:
    """``preprocess``'s check of ``data.dataset.preprocess`` (``options``) before any encoder loads: the text
    side alone and against ``model_root/transformer`` (where there is one), that transformer's scale factors
    against the VAE, and the clip size against the VAE's compression.

    Raises:
        mm_trainer.ModelSetError: one line per problem, naming the files and what was expected.
    """
    root = Path(options.model_root)
    transformer_file = root / "transformer" / "config.json"
    transformer = json.loads(transformer_file.read_text()) if transformer_file.is_file() else None
    release = checkpoint_version(transformer_file.parent) if transformer is not None else None
    problems = (
        model_set_problems(read_text_side(root), release, transformer_file) if has_text_side(root) else []
    )
    problems += _vae_problems(root, transformer, transformer_file)
    factors = video_vae_factors(root)
    if factors is not None:
        why = clip_size_problem(
            factors, vae_config_file(root), options.num_frames, options.height, options.width
        )
        if why:
            problems.append(f"data.dataset.preprocess: {why}")
    if problems:
        raise ModelSetError("\n".join(problems))


def run_problems(section: Any, preprocess: dict[str, Any]) -> list[str]:
    """A training run's check: the transformer of the model ``section`` (its checkpoint's config or metadata)
    against the text side and the VAE of ``preprocess``'s ``model_root`` (where their configs are)."""
    from ltx2_train.predictor import transformer_config, transformer_version

    root = preprocess.get("model_root")
    if section is None or not root:
        return []
    release, where = transformer_version(section)
    problems = model_set_problems(read_text_side(root), release, where) if has_text_side(root) else []
    return problems + _vae_problems(root, transformer_config(section), where)
