"""WanDiT with the Ulysses all-to-all overlapped (projections, head groups) computes bitwise what it
computes without overlap: unpacked and packed forwards, forward and backward, fp64, Ulysses 2."""

from __future__ import annotations

import pytest
import torch

CONFIG = dict(
    model_type="t2v", patch_size=(1, 2, 2), in_dim=4, dim=32, ffn_dim=48, freq_dim=16, text_dim=8,
    out_dim=4, num_heads=4, num_layers=2, qk_norm=True, cross_attn_norm=True, eps=1e-6, rope_max_seq_len=32,
)  # fmt: skip
SHAPES = [(2, 4, 6), (1, 6, 4)]  # post-patch 12 and 6 tokens
OVERLAPS = {"off": (1, False), "projections": (1, True), "projections+heads2": (2, True)}


def _build():
    from wan22_train.model import WanDiTConfig
    from wan22_train.predictor import WanPredictor

    torch.manual_seed(0)
    model = WanPredictor(WanDiTConfig(**CONFIG)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def _forward_backward(model, packed: bool) -> list[torch.Tensor]:
    """Outputs, input gradients and every parameter gradient (this rank's, not averaged)."""
    gen = torch.Generator().manual_seed(3)
    latents = [torch.randn(4, *fhw, generator=gen, dtype=torch.float64) for fhw in SHAPES]
    texts = [torch.randn(n, 8, generator=gen, dtype=torch.float64) for n in (5, 3)]
    timesteps = torch.tensor([700.0, 20.0], dtype=torch.float64)
    if not packed:  # one batch of two same-shape samples
        latents, texts = torch.stack([latents[0], latents[0] * 0.5]), torch.stack([texts[0], texts[0]])
    inputs = [z.requires_grad_() for z in (latents if packed else [latents])]
    outputs = model(inputs if packed else inputs[0], timesteps, texts)
    outputs = outputs if packed else [outputs]
    sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum() for o in outputs).backward()
    return [*(o.detach() for o in outputs), *(z.grad for z in inputs), *(p.grad for p in model.parameters())]


def _body(rank: int, world_size: int) -> dict[str, bool]:
    import mm_parallel.ulysses as ulysses
    from mm_parallel import ParallelState, UlyssesOverlap

    calls = []
    real = ulysses.projections_pipeline
    ulysses.projections_pipeline = lambda *a: calls.append(1) or real(*a)  # counts, runs the real one
    report = {}
    for packed in (False, True):
        results = {}
        for name, (heads, projections) in OVERLAPS.items():
            overlap = UlyssesOverlap(heads=heads, projections=projections)
            model = _build()
            model.setup_context_parallel(
                ParallelState(world_size=world_size, ulysses=2, ulysses_overlap=overlap)
            )
            results[name] = _forward_backward(model, packed)
        for name in OVERLAPS:
            same = all(torch.equal(a, b) for a, b in zip(results["off"], results[name], strict=True))
            report[f"{'packed' if packed else 'unpacked'}-{name}"] = same
    report["projections ran"] = len(calls) == 2 * 2 * CONFIG["num_layers"]  # 2 settings x 2 forwards
    return report


_REPORT: dict[str, bool] = {}


@pytest.mark.slow
@pytest.mark.parametrize("case", [f"{p}-{o}" for p in ("unpacked", "packed") for o in OVERLAPS if o != "off"])
def test_wan_with_the_ulysses_all_to_all_overlapped_is_bitwise_the_synchronous_result(distributed, case):
    if not _REPORT:
        reports = distributed(_body, 2)
        _REPORT.update({key: all(r[key] for r in reports) for key in reports[0]})
    assert _REPORT["projections ran"] is True
    assert _REPORT[case] is True
