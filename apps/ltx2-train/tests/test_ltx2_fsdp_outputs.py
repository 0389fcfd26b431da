"""The LTX-2 predictor as the FSDP2 root returns no view tensors (torch's "returned a view tensor" hazard)."""

from __future__ import annotations

import warnings


def test_fsdp2_root_forward_returns_no_view_and_warns_nothing(distributed, tiny_predictor, ltx2_inputs):
    build, inputs = tiny_predictor, ltx2_inputs()

    def body(rank, world_size):
        from torch.distributed.fsdp import fully_shard

        model = build()
        for block in model.transformer_blocks:
            fully_shard(block)
        fully_shard(model)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            video, audio = model(**inputs, return_dict=False)
        return video._base is None and audio._base is None

    assert distributed(body, 1) == [True]
