"""The benchmark scripts keep running: each is started with its smallest settings."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> str:
    """A benchmark's stdout (the test fails with its stderr if it exits non-zero)."""
    return subprocess.run(
        [sys.executable, script, *args], cwd=REPO, capture_output=True, text=True, timeout=300, check=True
    ).stdout


def test_wan_step_prints_the_three_models_the_ratio_and_the_mfu_of_a_given_peak():
    small = ["--grid", "1", "4", "4", "--blocks", "1", "--dim", "64", "--heads", "2", "--ffn-dim", "128"]
    out = _run("benchmarks/wan_step.py", *small, "--text-dim", "32", "--text-len", "8", "--repeats", "1",
               "--peak-tflops", "0.5")  # fmt: skip
    for row in ("diffusers WanTransformer3DModel", "wan22_train WanDiT", "matmul skeleton (floor)"):
        assert re.search(rf"^{re.escape(row)}\s+\d+\.\d+", out, re.MULTILINE), out
    assert re.search(r"^ratio ours / diffusers: \d+\.\d{3}", out, re.MULTILINE), out
    assert re.search(r"^MFU \(of 0.5 TFLOP/s, --peak-tflops\): .*wan22_train WanDiT \d+\.\d%", out, re.M), out


def test_cli_start_prints_a_row_per_script_beside_python_c_pass():
    out = _run("benchmarks/cli_start.py", "--repeats", "1", "--scripts", "mm-config", "wan22-train")
    assert re.search(r"^python -c pass\s+\d+\.\d\d\s+1\.0\s+False$", out, re.M), out
    for script in ("mm-config", "wan22-train"):
        assert re.search(rf"^{script} --help\s+\d+\.\d\d\s+\d+\.\d\s+False$", out, re.M), out


def test_cp_memory_a14b_fused_block_is_at_most_a_twentieth_of_math_and_the_model_holds_on_cpu():
    # _run checks the exit status: 1 when a measured figure is off the model by more than 10%
    out = _run("benchmarks/cp_memory.py", "--validate", "--shape", "1024", "1024", "2", "64")
    high = re.search(r"^wan22-train/t2v_a14b_high .* flash .* 1/(\d+)$", out, re.MULTILINE)
    assert high and int(high.group(1)) >= 20, out
    checks = re.findall(
        r"^(float32|bfloat16)\s+(math|cpu_flash)\s+fwd .* = (\d\.\d+)\s+bwd .* = (\d\.\d+)\s+ok$", out, re.M
    )
    assert len(checks) == 4, out
    assert all(abs(float(r) - 1) <= 0.10 for *_, fwd, bwd in checks for r in (fwd, bwd))


def test_cp_kernel_check_dry_run_prints_one_table_of_ok_rows():
    out = _run("benchmarks/cp_kernel_check.py", "--device", "cpu", "--small")  # exit 1 on a FAIL row
    rows = re.findall(r"^(block|ring4)\s+cpu_flash\s+(float32|bfloat16)\s.*\s(ok|FAIL)$", out, re.MULTILINE)
    assert (
        len([r for r in rows if r[0] == "block"]) == 8 and len([r for r in rows if r[0] == "ring4"]) == 4
    ), out
    assert {r[2] for r in rows} == {"ok"}


@pytest.mark.slow  # two spawned gloo ranks
def test_cp_attention_overlap_table_prints_a_row_per_overlap_configuration():
    # the configurations share one pair of spawned ranks: off (1), 2 head groups, the projections (p1, p2)
    small = ["--seq", "64", "--heads", "4", "--dim", "8", "--layers", "1", "--repeats", "1"]
    out = _run("benchmarks/cp_attention.py", "--overlap", "1", "2", "p1", "p2", "--what", "stack", *small)
    rows = re.findall(r"^stack\s+(p?\d+)(?:\s+\d+\.\d{3}){5}$", out, re.MULTILINE)
    assert rows == ["1", "2", "p1", "p2"], out


def test_packed_step_prints_packed_and_padded_rows_and_their_ratio(monkeypatch, capsys):
    # in this process (the script imports packed_training beside it): no interpreter start
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("packed_step", REPO / "benchmarks" / "packed_step.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    small = ["--dim", "32", "--heads", "2", "--ffn-dim", "64", "--text-dim", "16", "--text-len", "4",
             "--blocks", "1", "--samples", "4", "--micro-batch", "2", "--repeats", "1", "--warmup", "0"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["packed_step.py", *small])
    threads = torch.get_num_threads()
    try:
        bench.main()
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    rows = dict(re.findall(r"^(padded|packed)\s+\d+\s+([\d.]+)%(?:\s+\d+\.\d{3}){2}\s+\d+\.\d\d$", out, re.M))
    assert float(rows["packed"]) == 0.0 < float(rows["padded"]), out  # the mixed shapes padded to the largest
    assert re.search(r"packed attention kernel: cpu_flash \(one dense call per sample\)", out), out
    assert re.search(r"^packed / padded samples/s: \d+\.\d\d$", out, re.M), out


def test_lora_step_reports_full_and_lora_rows_of_one_config():
    # The modes run in this process (the script starts one child per mode so that peaks stay apart;
    # the smoke test checks the counts and the table, not the peaks): seconds instead of three imports.
    spec = importlib.util.spec_from_file_location("lora_step", REPO / "benchmarks" / "lora_step.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    small = ["--dim", "64", "--heads", "2", "--blocks", "1", "--ffn-dim", "128", "--text-dim", "32"]
    small += ["--text-len", "8", "--grid", "1", "4", "4", "--rank", "4", "--repeats", "1", "--warmup", "0"]
    threads = torch.get_num_threads()
    try:
        results = {mode: bench.measure(bench.parse_args([*small, "--mode", mode])) for mode in bench.MODES}
    finally:
        torch.set_num_threads(threads)
    out = bench.report(bench.parse_args(small), results)
    rows = {}
    for mode in ("full", "lora", "lora, bf16 base"):
        found = re.search(rf"^{re.escape(mode)}\s+([\d,]+)\s+([\d,]+)\s+(\d+\.\d)", out, re.MULTILINE)
        assert found, out
        rows[mode] = [float(g.replace(",", "")) for g in found.groups()]
    assert rows["full"][1] == 0 and rows["lora"][1] == rows["full"][0]  # LoRA freezes the whole base
    assert rows["lora"][0] < rows["full"][0] and rows["lora"][2] < rows["full"][2]  # trainable, state MB


@pytest.mark.slow  # a child interpreter that compiles a variant (aot_eager)
def test_wan_levers_prints_the_chosen_variants_as_ratios_to_eager():
    # one recompute setting: the base row and the selective pair (compiling every variant cost minutes
    # of CI on a cold inductor cache; the three settings share one code path). aot_eager: the compile
    # path without inductor's C++ builds (~55 s of a cold cache for this one variant); inductor compiles
    # in apps/wan22-train/tests/test_wan_compile_recompute_e2e.py.
    small = ["--grid", "1", "4", "4", "--blocks", "1", "--dim", "64", "--heads", "2", "--ffn-dim", "128",
             "--text-dim", "32", "--text-len", "8", "--repeats", "1", "--recompute", "selective",
             "--compile-backend", "aot_eager"]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "benchmarks/wan_levers.py", *small],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    row = r"\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\d{3}\s+\d+\s+\d+\.\d{3}"
    for name in ("eager, no recompute", "eager, selective recompute", "compiled, selective recompute"):
        assert re.search(rf"^{re.escape(name)}{row}", out, re.M), out
    for name in ("compiled, no recompute", "eager, full recompute", "compiled, full recompute"):
        assert name not in out, out
    assert re.search(r"^eager, no recompute\s+\S+\s+\S+\s+1\.000\s+\d+\s+1\.000", out, re.M), out


def test_preprocess_throughput_integrity_prints_what_hashing_and_verifying_cost_per_gb():
    out = _run("benchmarks/preprocess_throughput.py", "--integrity", "--integrity-gb", "0.01")
    rows = re.findall(
        r"^(clip digests, .*?|shard verification .*?)\s+([12])\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\d+$", out, re.M
    )
    assert len(rows) == 6, out


@pytest.mark.slow
def test_checkpoint_save_prints_every_mode_and_the_checksums_cost_per_gib_saved_and_loaded(tmp_path):
    out = _run("benchmarks/checkpoint_save.py", "--dim", "64", "--layers", "2", "--batch", "4", "--steps", "4",
               "--save-every", "2", "--repeats", "1", "--workdir", str(tmp_path))  # fmt: skip
    for mode in ("no saving", "synchronous", "asynchronous", "synchronous, no CRC", "asynchronous, no CRC"):
        assert re.search(rf"^{re.escape(mode)}\s+\d+\.\d+", out, re.MULTILINE), out
    assert re.search(
        r"^synchronous save of .* the checksums cost [+-]\d+\.\d+ s per GiB saved$", out, re.M
    ), out
    assert re.search(r"^load of .* the checksums cost [+-]\d+\.\d+ s per GiB loaded$", out, re.M), out
    assert re.search(r"^zlib\.crc32 on this machine: \d+\.\d+ GB/s", out, re.M), out


def test_packed_training_prints_padding_imbalance_and_rate_of_the_four_modes():
    small = ["--samples", "96", "--global-batch", "4", "--micro-steps", "1", "--dim", "64", "--blocks", "1"]
    out = _run("benchmarks/packed_training.py", *small, "--steps", "1")
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(
        r"^(bucketed|bucket-pad|padded|packed)\s+([\d.]+)%\s+([\d.]+)%\s+([\d.]+)%(?:\s+[\d.]+){5}$", out, re.M
    )}  # fmt: skip
    assert rows.keys() == {"bucketed", "bucket-pad", "padded", "packed"}, out
    assert float(rows["packed"][0]) == float(rows["bucketed"][0]) == 0.0  # no padding
    assert float(rows["padded"][0]) > 10.0  # mixed shapes padded to the largest
    assert float(rows["bucket-pad"][0]) > 0.0  # one resolution, lengths (and images) padded to the longest
    assert float(rows["packed"][2]) == 100.0 > float(rows["bucketed"][2])  # buckets drop their leftovers
