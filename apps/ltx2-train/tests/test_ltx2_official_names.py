"""mm-checkpoint's ``ltx2`` key map names the tiny LTX-2 transformer's weights as the official LTX-2 files
do: diffusers' own converters (0.42.1) turn the mapped names back into the model's keys."""

from __future__ import annotations

import re

import pytest
import torch
from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_ltx2_lora_to_diffusers
from diffusers.loaders.single_file_utils import convert_ltx2_transformer_to_diffusers
from ltx2_train.export import OFFICIAL_KEY_MAP
from ltx2_train.tiny import tiny_transformer
from mm_checkpoint import get_weight_transform

#: LTX-2.3-style options (gated attention, cross-attention modulation, prompt AdaLN) on the tiny shape.
OPTIONS_23 = dict(
    gated_attn=True, cross_attn_mod=True, audio_gated_attn=True, audio_cross_attn_mod=True,
    perturbed_attn=True, use_prompt_embeddings=False,
)  # fmt: skip
#: The names diffusers' converters write (their renames' targets), which no official key holds: a map that
#: left one of them unrenamed would convert back unchanged, so the tests also look for them.
DIFFUSERS_ONLY = re.compile(
    r"(^|\.)(audio_)?proj_in\.|(^|\.)(audio_)?time_embed\.|^av_cross_attn_|_a2v_cross_attn_scale_shift_table"
    r"|\.norm_[qk]\.|(^|\.)(audio_)?prompt_adaln\."
)


def _official(keys: list[str]) -> dict[str, str]:
    """Model (diffusers) key -> official key through the ``ltx2`` map (no diffusers-only name left)."""
    transform = get_weight_transform(OFFICIAL_KEY_MAP)
    official = {key: next(iter(transform.plan_export([key]))) for key in keys}
    assert [k for k in keys if DIFFUSERS_ONLY.search(k)], "the pattern finds the model's own names"
    assert not [name for name in official.values() if DIFFUSERS_ONLY.search(name)]
    return official


def test_the_official_single_file_names_convert_back_to_every_transformer_key():
    keys = list(tiny_transformer().state_dict())
    official = _official(keys)
    assert official["proj_in.weight"] == "patchify_proj.weight"
    assert official["transformer_blocks.1.attn1.norm_q.weight"] == "transformer_blocks.1.attn1.q_norm.weight"
    checkpoint = {f"model.diffusion_model.{name}": torch.zeros(1) for name in official.values()}
    assert sorted(convert_ltx2_transformer_to_diffusers(checkpoint)) == sorted(keys)


@pytest.mark.parametrize("options", [{}, OPTIONS_23], ids=["2.0", "2.3-options"])
def test_the_official_lora_names_convert_back_to_every_transformer_module(options):
    keys = [k for k in tiny_transformer(**options).state_dict() if k.endswith(".weight")]
    official = _official(keys)
    if options:
        assert official["prompt_adaln.linear.weight"] == "prompt_adaln_single.linear.weight"
    lora = {
        f"diffusion_model.{name.removesuffix('.weight')}.lora_{ab}.weight": torch.zeros(1)
        for name in official.values()
        for ab in "AB"
    }
    converted = _convert_non_diffusers_ltx2_lora_to_diffusers(lora)
    expected = [f"transformer.{k.removesuffix('.weight')}.lora_{ab}.weight" for k in keys for ab in "AB"]
    assert sorted(converted) == sorted(expected)
