"""The config's list of ring-attention kernels and mm-parallel's registry agree."""

from __future__ import annotations

from typing import get_args


def test_parallel_attention_backend_accepts_exactly_auto_and_the_registered_ring_kernels():
    from mm_config.parallel import AttentionBackendName
    from mm_parallel import ring_backend_names

    assert set(get_args(AttentionBackendName)) == {"auto", *ring_backend_names()}
