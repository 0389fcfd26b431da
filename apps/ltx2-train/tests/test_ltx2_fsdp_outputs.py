"""The LTX-2 predictor as the FSDP2 root returns no view tensors (torch's "returned a view tensor" hazard)."""

from __future__ import annotations


def test_fsdp2_root_forward_returns_no_view_and_warns_nothing(
    fsdp2_root_outputs, tiny_predictor, ltx2_inputs
):
    inputs = ltx2_inputs()
    forward = lambda model: model(**inputs, return_dict=False)  # noqa: E731
    assert fsdp2_root_outputs(tiny_predictor, forward, blocks="transformer_blocks") == [True, True]
