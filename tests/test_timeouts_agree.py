"""The collective timeout, the long-wait timeout and the launch scripts' backend timeouts agree."""

from __future__ import annotations

import re
from pathlib import Path

from mm_config import TrainingConfig

REPO = Path(__file__).resolve().parents[1]


def _script_default(script: str, variable: str) -> float:
    text = (REPO / "launch" / script).read_text()
    match = re.search(rf"export {variable}=\$\{{{variable}:-(\d+)\}}", text)
    assert match, f"launch/{script} sets no default for {variable}"
    return float(match.group(1))


def test_hccl_reports_a_failed_collective_before_the_process_group_timeout() -> None:
    collective = TrainingConfig().collective_timeout_s
    assert collective is not None and _script_default("ascend.sh", "HCCL_EXEC_TIMEOUT") < collective


def test_long_waits_have_their_own_longer_timeout() -> None:
    training = TrainingConfig()
    assert training.collective_timeout_s is not None
    assert training.long_wait_timeout_s > training.collective_timeout_s


def test_the_readme_states_the_defaults_the_code_has() -> None:
    readme = (REPO / "README.md").read_text()
    training = TrainingConfig()
    hccl = _script_default("ascend.sh", "HCCL_EXEC_TIMEOUT")
    assert f"defaults: {training.collective_timeout_s:g} s and `launch/ascend.sh`'s {hccl:g} s" in readme
    assert f"default {training.long_wait_timeout_s:g} s" in readme
