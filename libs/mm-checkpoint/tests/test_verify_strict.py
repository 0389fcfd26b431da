"""``mm-ckpt verify`` compares dtypes and validates its tolerance: equal values at another precision,
a bad ``--atol`` or opposite infinities are never SAME."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mm_checkpoint.cli import main
from safetensors.torch import save_file


def _pair(tmp_path: Path, a: torch.Tensor, b: torch.Tensor) -> tuple[str, str]:
    for name, tensor in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        save_file({"w": tensor}, str(tmp_path / name / "model.safetensors"))
    return str(tmp_path / "a"), str(tmp_path / "b")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int32])
def test_equal_values_in_another_dtype_are_different(dtype, tmp_path, capsys):
    values = torch.tensor([1.0, 2.0, -3.0])
    a, b = _pair(tmp_path, values, values.to(dtype))
    assert main(["verify", a, b]) == 1
    out = capsys.readouterr().out
    assert f"dtype mismatch (1): ['w (float32 vs {str(dtype)[6:]})']" in out and out.strip().endswith(
        "DIFFERENT"
    )


def test_ignore_dtype_compares_the_values_only(tmp_path, capsys):
    values = torch.tensor([1.0, 2.0, -3.0])
    a, b = _pair(tmp_path, values, values.bfloat16())
    assert main(["verify", a, b, "--ignore-dtype"]) == 0
    assert capsys.readouterr().out.strip().endswith("SAME")


@pytest.mark.parametrize("atol", ["-1", "-1e-9", "nan", "-inf", "x"])
def test_a_negative_nan_or_non_numeric_atol_is_refused_with_exit_2(atol, tmp_path, capsys):
    a, b = _pair(tmp_path, torch.zeros(2), torch.zeros(2))
    with pytest.raises(SystemExit) as exit_info:
        main(["verify", a, b, f"--atol={atol}"])
    assert exit_info.value.code == 2
    assert "argument --atol: expected" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("a", "b"),
    [(float("inf"), -float("inf")), (float("inf"), 1.0), (-float("inf"), 3.4e38)],
    ids=["+inf vs -inf", "+inf vs finite", "-inf vs finite"],
)
def test_an_infinity_against_anything_else_is_different_even_with_atol_inf(a, b, tmp_path, capsys):
    path_a, path_b = _pair(tmp_path, torch.tensor([a, 0.0]), torch.tensor([b, 0.0]))
    assert main(["verify", path_a, path_b, "--atol", "inf"]) == 1
    out = capsys.readouterr().out
    assert "infinity differs (1): ['w']" in out and out.strip().endswith("DIFFERENT")


def test_atol_inf_accepts_any_finite_difference(tmp_path, capsys):
    a, b = _pair(tmp_path, torch.tensor([float("inf"), -3e38]), torch.tensor([float("inf"), 3e38]))
    assert main(["verify", a, b, "--atol", "inf"]) == 0
    assert capsys.readouterr().out.strip().endswith("SAME")
