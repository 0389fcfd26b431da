"""``mm-train plan`` on the toy plugin: per-rank state counted exactly, layouts read off a trace equal
their own traces, bad inputs refused with the config check's report (exit 2, no traceback)."""

import math
import re
from dataclasses import replace

import pytest
from mm_config import load_config
from mm_trainer.cli import main
from mm_trainer.planner import register_host_term, render, render_search, search_layouts, summarize, trace_run
from mm_trainer.planner.categories import HOST_TERMS
from mm_trainer.planner.device_specs import device_spec
from mm_trainer.planner.layouts import layout_view
from mm_trainer.planner.report import gib

BIG = {"model": {"models": {"predictor": {"config": {"dim": 64, "hidden": 512, "num_blocks": 3}}}},
       "data": {"dataset": {"dim": 64}}, "features": {"activation_offload_plan": {"apply_modules": []}}}  # fmt: skip
CPU = device_spec("cpu", memory_gib=1.0)


def _plan(path, world, *overrides, views=None):
    config = load_config(str(path), list(overrides), world_size=world, check_paths=False)
    return trace_run(config, world_size=world, device=CPU, extra_views=views)


def _predictor_params(hidden=512, dim=64, cond=16, blocks=3):
    """Shapes of every toy predictor parameter (tests/plugins/toy_plugin.py ``ToyPredictor``)."""
    shapes = [(hidden, dim + cond + 1), (hidden,)]  # in_proj
    for _ in range(blocks):
        shapes += [(hidden, hidden), (hidden,)] * 2  # fc1, fc2
    return shapes + [(dim, hidden), (dim,)]  # head


def test_per_rank_state_is_the_shards_of_the_trainable_parameters(toy_yaml):
    run = _plan(toy_yaml("plan", **BIG), 2, "training.ema.decay=0.9")
    summary = summarize(run)
    shard_numel = sum(math.ceil(s[0] / 2) * math.prod(s[1:]) for s in _predictor_params())
    steps = 4 * len(_predictor_params())  # AdamW's float32 step counter per parameter
    assert summary.categories["optimizer states"] == 2 * 4 * shard_numel + steps  # exp_avg + exp_avg_sq
    assert summary.categories["EMA"] == 4 * shard_numel
    assert summary.peak_bytes == pytest.approx(sum(summary.categories.values()))


def test_a_later_change_adds_a_host_memory_line_as_a_term_of_the_traced_run(toy_yaml):
    def staging(run):  # e.g. an asynchronous checkpoint's host copy of the per-rank state
        return (
            "checkpoint staging",
            sum(p.local_numel(p.traced_shard) * p.itemsize for p in run.shards),
            "async saves",
        )

    register_host_term(staging)
    try:
        run = _plan(toy_yaml("plan", **BIG), 2)
        summary = summarize(run)
    finally:
        HOST_TERMS.remove(staging)
    assert summary.host["checkpoint staging"] == staging(run)[1] > 0
    assert "checkpoint staging" in render(summary, run)


def test_async_saves_plan_their_host_staging_copy_of_the_checkpointed_state(toy_yaml):
    run = _plan(toy_yaml("plan", **BIG), 2, "training.async_save=true", "training.ema.decay=0.9")
    shard_numel = sum(math.ceil(s[0] / 2) * math.prod(s[1:]) for s in _predictor_params())
    weights_moments_ema = 4 * shard_numel * 4  # fp32: the weights, exp_avg, exp_avg_sq, the EMA
    steps = 4 * len(_predictor_params())  # AdamW's float32 step counter per parameter
    assert summarize(run).host["async checkpoint staging"] == weights_moments_ema + steps
    training = run.config.training.model_copy(update={"async_save": False})
    synchronous = replace(run, config=run.config.model_copy(update={"training": training}))
    assert "async checkpoint staging" not in summarize(synchronous).host


@pytest.mark.parametrize(
    ("derived", "overrides"),
    [
        ({"default_shard": 1, "cpu_offload": False}, ["parallel.replicate_parallel_size=2"]),
        ({"default_shard": 2, "cpu_offload": True}, ["parallel.fsdp_plan.cpu_offload=true"]),
    ],
)
def test_a_layout_read_off_a_trace_equals_its_own_trace(toy_yaml, derived, overrides):
    path = toy_yaml("plan", **BIG)
    run = _plan(path, 2, views=lambda shards: [layout_view("other", shards, **derived)])
    direct = _plan(path, 2, *overrides)
    assert summarize(run, "other").peak_bytes == pytest.approx(summarize(direct).peak_bytes, rel=1e-3)
    assert sum(summarize(run, "other").host.values()) == pytest.approx(sum(summarize(direct).host.values()))


def test_units_kept_gathered_after_forward_equal_a_trace_without_resharding(toy_yaml):
    path = toy_yaml("plan", **BIG)

    def kept(shards):
        return [replace(layout_view("kept", shards, default_shard=2, cpu_offload=False), keep_gathered=True)]

    run = _plan(path, 2, views=kept)
    direct = _plan(path, 2, "parallel.fsdp_plan.reshard_after_forward=false")
    assert summarize(run, "kept").peak_bytes == pytest.approx(summarize(direct).peak_bytes, rel=1e-3)


def test_the_planner_reads_no_weights_and_names_what_it_traced(toy_yaml, tmp_path, capsys):
    path = toy_yaml("plan", **BIG)
    text = path.read_text().replace(
        str(tmp_path), "/nonexistent"
    )  # placeholder paths, as the shipped configs
    (tmp_path / "placeholders.yaml").write_text(text)
    assert (
        main(
            ["plan", "--config", str(tmp_path / "placeholders.yaml"), "--world-size", "2", "--device", "h200"]
        )
        == 0
    )
    out = capsys.readouterr()
    assert (
        "peak memory per rank" in out.out
        and "FITS on NVIDIA H200" in out.out
        and "step time (roofline" in out.out
    )
    assert "forward" in out.err and "optimizer step" in out.err  # progress lines while tracing


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--world-size", "3", "parallel.ulysses_parallel_size=2"], "ulysses_parallel_size"),
        (["--world-size", "2", "training.micro_batch_size=0"], "micro_batch_size"),
    ],
)
def test_a_bad_layout_gets_the_config_check_report_and_exit_2(toy_yaml, capsys, args, message):
    assert main(["plan", "--config", str(toy_yaml("plan")), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def _search(path, memory_gib):
    return search_layouts(str(path), ["training.micro_batch_size=1"], world=2, ranks_per_node=2,
                          device=device_spec("h100", memory_gib))  # fmt: skip


def test_search_ranks_the_layouts_that_fit_fastest_first_and_gives_their_overrides(toy_yaml):
    result = _search(toy_yaml("plan", **BIG), 2.0)  # H100 figures with 2 GiB (0.5 GiB usable)
    fits = result.fitting
    assert fits and [c.summary.step_seconds for c in fits] == sorted(c.summary.step_seconds for c in fits)
    assert all(c.layout.ulysses == c.layout.ring == 1 for c in fits)  # the toy predictor has no CP hooks
    text = render_search(result, top=2)
    assert "layouts fit; fastest first" in text and text.count("layout 1:\n  torchrun") == 1


def test_search_names_the_smallest_gap_when_nothing_fits(toy_yaml):
    result = _search(toy_yaml("plan", **BIG), 1.501)  # ~1 MiB usable: not even a gathered unit
    assert not result.fitting and result.closest is not None
    closest = result.closest.summary
    assert render_search(result).endswith(f"of {gib(closest.usable_bytes * 0.9)} usable)")
    assert "nothing fits: the smallest gap is" in render_search(result)
    # full recompute did not fit: less recomputation was not traced, every layout of it accounted for
    assert result.traces <= 3 and all(c.status for c in result.candidates)


PHASED = {
    "model": {
        "container_id": "toy_phased_container",
        "models": {"critic": {"model_id": "toy_predictor", "meta_init": True,
                              "config": {"dim": 8, "hidden": 32, "cond_dim": 16, "num_blocks": 3}}},
    },
    "training": {"phases": {"fit": {"submodels": ["predictor"], "every": 2}, "follow": {"submodels": ["critic"]}}},
}  # fmt: skip


def test_a_phased_run_is_traced_at_the_step_where_every_phase_updates(toy_yaml):
    run = _plan(toy_yaml("phased", **PHASED), 2)
    assert list(run.parts) == [
        "micro-step 1/1 (fit)",
        "optimizer (fit)",
        "micro-step 1/1 (follow)",
        "optimizer (follow)",
    ]
    step = run.step_cost()  # the step at which both update: both phases' micro-steps and optimizer steps
    assert step.flops == pytest.approx(sum(part.flops for part in run.parts.values())) and step.flops > 0
    assert step.compute_s == pytest.approx(sum(part.compute_s for part in run.parts.values()))
    assert summarize(run).categories["optimizer states"] > 0  # both phases' AdamW states


def test_the_trace_counts_each_phases_fsdp_units_with_a_rate_and_the_time_left(toy_yaml):
    import io

    from mm_trainer.tools.progress import PhaseLog

    config = load_config(str(toy_yaml("plan")), [], world_size=2, check_paths=False)
    out = io.StringIO()
    trace_run(config, world_size=2, device=CPU, progress=PhaseLog("plan", stream=out, interval_s=0))
    lines = out.getvalue().splitlines()
    counted = [line.split(" | ")[0] for line in lines if line.startswith("plan: ")]
    # 5 units (text encoder, 3 blocks, the predictor's root) run forward; the 4 that train, backward
    assert counted[-1] == "plan: micro-step 1/1: backward 4/4 FSDP units", lines
    assert "plan: micro-step 1/1: forward 5/5 FSDP units" in counted, lines
    rate_and_eta = r" \| [\d.]+ FSDP units/s \| eta \d:\d\d:\d\d$"
    assert all(re.search(rate_and_eta, line) for line in lines if line.startswith("plan: ")), lines
    # the first line announces the build (its clock: the seconds since the log began, 1-2 s on a loaded CI
    # machine, where the trace's garbage collection and plugin imports come first)
    assert re.match(r"\[plan +\d+ s\] building the model on meta", lines[0]), lines
