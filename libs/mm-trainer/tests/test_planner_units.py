"""The planner's pieces that need no trace: device table, layout views, categories, the roofline."""

import pytest
import torch
from mm_parallel import BlockShape, block_step_bytes, kernel_workspace_bytes
from mm_trainer.loop.metrics import PEAK_FLOPS
from mm_trainer.planner.categories import DEVICE_CATEGORIES, HOST_CATEGORIES, HOST_TAGS, Tag
from mm_trainer.planner.cost_model import CostModel
from mm_trainer.planner.device_specs import DEVICES, device_spec
from mm_trainer.planner.layouts import ParamShard, layout_view
from torch._subclasses.fake_tensor import FakeTensorMode


def test_an_unknown_device_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown device 'h300'.*h200.*910c.*cpu"):
        device_spec("h300")


def test_device_memory_replaces_the_table_entry_only_for_that_plan():
    assert device_spec("h100", 24).memory_gib == 24 and DEVICES["h100"].memory_gib == pytest.approx(79.6)


def test_the_mfu_metric_reads_the_planner_device_table():
    assert PEAK_FLOPS["H200"] == PEAK_FLOPS["H100"] == 989e12 == DEVICES["h200"].bf16_tflops * 1e12
    assert PEAK_FLOPS["910B"] == DEVICES["910b"].bf16_tflops * 1e12


def test_every_tag_is_on_exactly_one_report_line_or_host_only():
    device = [tag for c in DEVICE_CATEGORIES for tag in c.tags]
    host_only = [tag for c in HOST_CATEGORIES for tag in c.tags if tag in HOST_TAGS]
    assert sorted(device + host_only) == sorted(Tag) and len(set(device)) == len(device)


def _shard(rows: int, *, trainable: bool = True, fixed: int | None = None) -> ParamShard:
    return ParamShard(shape=(rows, 10), itemsize=4, trainable=trainable, fsdp=True, fixed_shard=fixed,
                      owner_offload=None, traced_shard=fixed or 8, traced_offload=False)  # fmt: skip


def test_a_view_at_another_shard_degree_scales_each_tag_by_its_exact_padded_bytes():
    shards = [_shard(10), _shard(7, trainable=False)]  # 8 ranks: ceil(10/8)=2 and ceil(7/8)=1 rows
    view = layout_view("replicate 2", shards, default_shard=4, cpu_offload=False)  # 4 ranks: 3 and 2 rows
    assert view.device[Tag.SHARDED_PARAM] == pytest.approx((3 + 2) / (2 + 1))
    assert (
        view.device[Tag.SHARDED_GRAD] == view.device[Tag.OPT] == view.device[Tag.EMA] == pytest.approx(3 / 2)
    )


def test_a_sub_model_with_its_own_shard_size_keeps_it_in_every_view():
    view = layout_view("v", [_shard(16, fixed=2)], default_shard=1, cpu_offload=False)
    assert view.device[Tag.SHARDED_PARAM] == 1.0


def test_cpu_offload_moves_the_per_rank_state_to_the_host_and_nothing_else():
    view = layout_view("offload", [_shard(16)], default_shard=8, cpu_offload=True)
    for tag in (Tag.SHARDED_PARAM, Tag.SHARDED_GRAD, Tag.OPT, Tag.EMA):
        assert (view.device[tag], view.host[tag]) == (0.0, 1.0)
    assert Tag.UNSHARDED_PARAM not in view.device and Tag.ACT not in view.device


def test_the_roofline_of_a_matmul_is_its_flops_at_the_peak_or_its_bytes_at_the_bandwidth():
    h200 = device_spec("h200")
    model = CostModel(h200, ranks_per_node=8)
    with FakeTensorMode():
        a, b = torch.empty(4096, 4096, dtype=torch.bfloat16), torch.empty(4096, 4096, dtype=torch.bfloat16)
        out = a @ b
        small = torch.empty(4096, 1, dtype=torch.bfloat16)
        thin = a @ small
    func = torch.ops.aten.mm.default
    flops = model.op_flops(func, (a, b), {}, out)
    assert flops == 2 * 4096**3
    assert model.op_seconds(func, flops, (a, b), {}, out) == pytest.approx(flops / 989e12)
    moved = (4096 * 4096 + 4096 + 4096) * 2  # a, the thin operand and the output, bf16
    thin_flops = model.op_flops(func, (a, small), {}, thin)
    assert model.op_seconds(func, thin_flops, (a, small), {}, thin) == pytest.approx(moved / 4.8e12)


def test_the_flash_kernel_workspace_is_its_fp32_dq_accumulator_and_softmax_d():
    # FlashAttention-2 backward (flash_api.cpp mha_bwd): dq_accum [B, ceil128(Sq), H, ceil32(D)] and
    # softmax_d [B, H, ceil128(Sq)], both float32; its forward returns all it allocates (out, lse)
    shape = BlockShape(batch=1, q_len=1000, k_len=3000, heads=10, head_dim=100, dtype=torch.bfloat16)
    assert kernel_workspace_bytes("flash", shape) == (0, 4 * 1024 * 10 * 128 + 4 * 10 * 1024)


@pytest.mark.parametrize("kernel", ["flash", "efficient", "npu", "cpu_flash", "math"])
def test_a_ring_block_step_holds_at_least_its_kernel_workspace_and_outputs(kernel):
    shape = BlockShape(batch=1, q_len=1000, k_len=3000, heads=10, head_dim=128, dtype=torch.bfloat16)
    forward, backward = kernel_workspace_bytes(kernel, shape)
    step_forward, step_backward = block_step_bytes(kernel, shape)
    grads = shape.itemsize * (shape.q_elems + 2 * shape.k_elems)
    assert 0 <= forward <= step_forward and 0 <= backward <= step_backward
    if kernel != "math":  # math's gradients are float32 inside its kernel phase
        assert step_backward >= grads + backward


def test_the_cost_model_times_ulysses_attentions_functional_all_to_alls():
    """mm-parallel's Ulysses all-to-all is a functional collective (``_c10d_functional.all_to_all_single``):
    the cost model names it and puts its bytes on the wire, at real size in the fake world."""
    import torch.distributed as dist
    from mm_parallel import ulysses_attention
    from mm_trainer.planner.cost_model import is_collective
    from mm_trainer.planner.fake_world import fake_world
    from torch.utils._python_dispatch import TorchDispatchMode

    class Collectives(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            out = func(*args, **(kwargs or {}))
            if is_collective(func):
                self.calls.append((func, args, kwargs or {}, out))
            return out

    model = CostModel(device_spec("h200"), ranks_per_node=8)
    with fake_world(8) as mode, mode:
        q = torch.empty(1, 4096, 8, 64, dtype=torch.bfloat16)  # this rank's 4096 of 32768 tokens
        with Collectives() as seen:
            ulysses_attention(q, q, q, dist.group.WORLD)
        costs = [model.collective(*call) for call in seen.calls]
    moved = [c for c in costs if c is not None]
    assert [kind for kind, _, _ in moved] == ["all-to-all"] * 4  # q, k, v in; the output back
    assert moved[0][1] == pytest.approx(q.numel() * 2 * 7 / 8)  # all but this rank's own share
    assert all(seconds > 0 for _, _, seconds in moved)


class _UlyssesAttention(torch.nn.Module):
    def __init__(self, groups: int | None) -> None:
        super().__init__()
        self.groups = groups

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        from mm_parallel import ulysses_attention

        return ulysses_attention(q, q, q, dist.group.WORLD, overlap_heads=self.groups)


def _traced_ulysses(groups: int | None, device: str = "h200") -> dict:
    """One Ulysses 8 attention, forward and backward, under the planner's tracker: its parts' costs."""
    from mm_trainer.planner.fake_world import fake_world
    from mm_trainer.planner.overlap import target_overlap
    from mm_trainer.planner.tracker import PlanTracker

    spec = device_spec(device)
    with fake_world(8) as mode, mode:
        model = _UlyssesAttention(groups)
        q = torch.empty(1, 4096, 32, 128, dtype=torch.bfloat16, requires_grad=True)
        tracker = PlanTracker(model, None, device=spec, cost=CostModel(spec, 8), views=[])
        with tracker, target_overlap(spec):
            tracker.part = "forward"
            out = model(q)
            tracker.part = "backward"
            out.sum().backward()
    return tracker.parts


def test_head_groups_all_to_alls_hide_behind_the_other_groups_attention_and_one_group_hides_none():
    """``overlap_heads``: the trace's timeline waits for an all-to-all at the first read of its result
    (``mm_trainer.planner.overlap``); the backward's transposed all-to-alls are read at once."""
    one, two = _traced_ulysses(1), _traced_ulysses(2)
    for parts in (one, two):
        assert parts["backward"].overlapped_s.get("all-to-all", 0.0) == pytest.approx(0.0, abs=1e-12)
    assert one["forward"].overlapped_s.get("all-to-all", 0.0) == pytest.approx(0.0, abs=1e-12)
    sent = two["forward"].comm_s["all-to-all"]
    assert sent == pytest.approx(one["forward"].comm_s["all-to-all"])  # the same bytes, in groups
    assert 0.5 * sent < two["forward"].overlapped_s["all-to-all"] < sent  # the first group's stay exposed
    assert two["forward"].exposed_comm_s() < one["forward"].exposed_comm_s()


def test_the_trace_runs_the_target_device_types_overlap_default_not_the_cpus():
    """A GPU target plans its own default (off until measured), not the CPU trace's 2 head groups."""
    from mm_parallel.ulysses import OVERLAP_HEADS_DEFAULT, resolve_overlap_heads
    from mm_trainer.planner.overlap import target_overlap

    assert OVERLAP_HEADS_DEFAULT["cpu"] == 2 and OVERLAP_HEADS_DEFAULT["cuda"] == 1
    with target_overlap(device_spec("h200")) as chosen:
        assert resolve_overlap_heads(None, 32, 8, "cpu") == 1 and chosen == {
            "ulysses overlap_heads": 1,
            "ulysses overlap_projections": False,
        }
    assert resolve_overlap_heads(None, 32, 8, "cpu") == 2  # restored after the trace
    traced = _traced_ulysses(None, "h200")["forward"]
    assert traced.comm_s["all-to-all"] > 0
    assert traced.overlapped_s.get("all-to-all", 0.0) == pytest.approx(0.0, abs=1e-12)


def test_an_all_to_all_holds_its_send_buffer_and_stalls_compute_only_at_the_first_read_of_its_result():
    """The eager semantics the trace's timeline puts back: a view hands the result on without waiting."""
    import weakref

    from mm_trainer.planner.overlap import AsyncTimeline

    aten = torch.ops.aten
    timeline = AsyncTimeline()
    send, result = torch.zeros(4), torch.zeros(4)
    held = weakref.ref(send)
    timeline.start("all-to-all", 1.0, send, result)
    del send
    timeline.compute(0.25)  # compute issued while it is in flight
    view = aten.view.default(result, [2, 2])
    assert timeline.before(aten.view.default, (result, [2, 2])) == []
    timeline.after(aten.view.default, (result, [2, 2]), view)
    assert held() is not None  # the collective still holds its send buffer
    assert timeline.before(aten.add.Tensor, (view, view)) == [("all-to-all", 0.25)]  # 0.75 s stalled
    assert timeline.clock == 1.0 and held() is None
    assert timeline.before(aten.add.Tensor, (result, result)) == []  # read once
