"""Which LTX-2 release a model set's text side is, read from its files, and whether it fits the transformer.

The text side is the text encoder and the connectors that turn its stacked hidden states into the
transformer's text embeddings (what ``preprocess`` caches). Facts of diffusers' LTX-2 pipelines (0.42):

==========  =========================================  ==================================
release     text encoder (``text_encoder/config.json``)  connectors (``connectors/config.json``)
==========  =========================================  ==================================
2.0         Gemma-3 (``model_type`` ``gemma3*``)         one projection (``per_modality_projections: false``)
2.3         Gemma-3                                      per-modality projections (``true``)
2.5         Gemma-4 (``gemma4*``: ``Gemma4UnifiedForConditionalGeneration``)  per-modality projections
==========  =========================================  ==================================

Within a text side, the connectors' ``caption_channels`` is the encoder's ``hidden_size`` and their
``text_proj_in_factor`` its layers + 1 (every hidden state, the embeddings' included, is stacked). A text side
that fits no release, or that does not fit the transformer's release (read by :mod:`ltx2_train.version`), is
refused with :class:`mm_trainer.ModelSetError` (exit 66), naming the files: by ``preprocess`` before any
encoder loads, and by a training run before any model is built (:mod:`ltx2_train.model_set`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Each release's text side: (text encoder family, per-modality connectors).
RELEASE_TEXT_SIDES: dict[str, tuple[str, bool]] = {
    "2.0": ("Gemma-3", False),
    "2.3": ("Gemma-3", True),
    "2.5": ("Gemma-4", True),
}
#: ``model_type`` prefix of a text encoder's config -> its family.
FAMILIES = {"gemma3": "Gemma-3", "gemma4": "Gemma-4"}


@dataclass(frozen=True)
class TextSide:
    """What a model set's ``text_encoder/`` and ``connectors/`` configs say (no weights read)."""

    encoder_file: Path
    connectors_file: Path
    family: str | None
    """``Gemma-3`` / ``Gemma-4``, None for another ``model_type``."""
    model_type: str
    hidden_size: int
    layers: int
    per_modality: bool
    caption_channels: int
    proj_in_factor: int

    @property
    def release(self) -> str | None:
        """The release whose text side this is (:data:`RELEASE_TEXT_SIDES`), None for none."""
        for release, side in RELEASE_TEXT_SIDES.items():
            if side == (self.family, self.per_modality):
                return release
        return None

    def describe(self) -> str:
        projection = "per-modality projections" if self.per_modality else "one projection"
        return (
            f"{self.family or self.model_type} ({self.encoder_file}) with connectors of {projection} "
            f"({self.connectors_file})"
        )

    def problem(self) -> str | None:
        """Why the encoder and the connectors do not go together, or fit no release; None when they do."""
        if (self.caption_channels, self.proj_in_factor) != (self.hidden_size, self.layers + 1):
            return (
                f"{self.connectors_file}: caption_channels {self.caption_channels} x text_proj_in_factor "
                f"{self.proj_in_factor}, but the text encoder {self.encoder_file} gives {self.layers + 1} hidden "
                f"states of {self.hidden_size}: expected caption_channels {self.hidden_size} and "
                f"text_proj_in_factor {self.layers + 1} (connectors of another text encoder)"
            )
        if self.release is None:
            known = "; ".join(f"{r}: {f}, per_modality_projections={str(p).lower()}"
                              for r, (f, p) in RELEASE_TEXT_SIDES.items())  # fmt: skip
            return f"the text side {self.describe()} is no LTX-2 release's; expected one of {known}"
        return None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing, so the LTX-2 text side cannot be read")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from err


def read_text_side(model_root: str | Path) -> TextSide:
    """The text side of the model set ``model_root`` (``text_encoder/`` and ``connectors/`` configs)."""
    root = Path(model_root)
    encoder_file, connectors_file = root / "text_encoder" / "config.json", root / "connectors" / "config.json"
    encoder, connectors = _read_json(encoder_file), _read_json(connectors_file)
    text = encoder.get("text_config") or encoder  # a multimodal Gemma's language model
    model_type = str(encoder.get("model_type", ""))
    family = next((name for prefix, name in FAMILIES.items() if model_type.startswith(prefix)), None)
    return TextSide(
        encoder_file=encoder_file, connectors_file=connectors_file, family=family, model_type=model_type,
        hidden_size=int(text.get("hidden_size", 0)), layers=int(text.get("num_hidden_layers", 0)),
        per_modality=bool(connectors.get("per_modality_projections", False)),
        caption_channels=int(connectors.get("caption_channels", 3840)),
        proj_in_factor=int(connectors.get("text_proj_in_factor", 49)),
    )  # fmt: skip


def model_set_problems(side: TextSide, release: str | None = None, where: Any = None) -> list[str]:
    """What is wrong with the text side ``side`` alone, or against an LTX-``release`` transformer read from
    ``where``: one line per problem."""
    own = side.problem()
    if own is not None:
        return [own]
    if release is None or side.release == release:
        return []
    family, per_modality = RELEASE_TEXT_SIDES[release]
    projection = "per-modality projections" if per_modality else "one projection"
    return [
        f"{where}: an LTX-{release} transformer, but the text side is LTX-{side.release}'s: {side.describe()}; "
        f"expected LTX-{release}'s, {family} with connectors of {projection} (use the text encoder and "
        "connectors of the transformer's release, and preprocess the captions with them)"
    ]


def has_text_side(model_root: str | Path) -> bool:
    """Whether ``model_root`` holds both text side configs (a placeholder path of a plan does not)."""
    root = Path(model_root)
    return all((root / part / "config.json").is_file() for part in ("text_encoder", "connectors"))
