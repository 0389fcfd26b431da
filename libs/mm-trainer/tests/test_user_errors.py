"""Errors the user fixes end a command through ``mm_trainer.cli.run`` with one clean line, no traceback,
and the exit code the README documents for their class; bugs keep their traceback
(``test_cli_run.py``). Each case raises the error where the library raises it, in a process of its own."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from mm_trainer.run.exit_codes import (
    EXIT_CONFIG,
    EXIT_DEPENDENCY,
    EXIT_DESTINATION,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_REWARD,
)
from mm_trainer.run.user_errors import CLASSES, TRACEBACK_ENV, USER_ERRORS

ENTRY = """
import sys
from pathlib import Path
from mm_trainer.cli import run

def main():
    here = Path(sys.argv[1])
{body}

run(main, prog="tool")
"""


def run_entry(body: str, here: Path, **env: str) -> subprocess.CompletedProcess:
    """``body`` (the lines of a ``main()`` that may use ``here``) run through ``cli.run`` in a fresh process."""
    code = ENTRY.format(body="\n".join(f"    {line}" for line in body.strip().splitlines()))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_") and k != TRACEBACK_ENV}
    return subprocess.run(
        [sys.executable, "-c", code, str(here)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def a_dcp_checkpoint(folder: Path) -> Path:
    """A one-tensor DCP checkpoint of a training run without EMA (``model.weight``)."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save({"model": {"weight": torch.ones(4, 4)}}, checkpoint_id=str(folder), no_dist=True)
    return folder


CASES = {
    "a missing optional package": (
        'sys.modules["peft"] = None  # not installed\n'
        "from mm_trainer.model.lora import require_peft\n"
        'require_peft("model.models.predictor.lora")',
        EXIT_DEPENDENCY,
        "tool: error: model.models.predictor.lora: LoRA is trained through peft, which is not installed",
    ),
    "a checkpoint without its run's config": (
        "from mm_trainer import load_run_config\nload_run_config(here / 'nowhere')",
        EXIT_INPUT,
        "tool: error: {here}/nowhere/config.yaml not found",
    ),
    "an export destination holding other files": (
        "(here / 'out').mkdir()\n(here / 'out' / 'notes.txt').write_text('mine')\n"
        "from mm_checkpoint import check_destination\ncheck_destination(here / 'out')",
        EXIT_DESTINATION,
        "tool: error: export destination {here}/out holds files and no .mm_export.json (not an export): notes.txt",
    ),
    "an --ema export of a run trained without EMA": (
        "from mm_checkpoint import export_checkpoint\n"
        "export_checkpoint(here / 'ckpt', here / 'out', to='safetensors', ema=True)",
        EXIT_INPUT,
        "tool: error: {here}/ckpt holds no EMA weights",
    ),
    "a checkpoint missing a shard": (
        "(here / 'ckpt' / '__0_0.distcp').unlink()\n"
        "from mm_checkpoint import export_checkpoint\n"
        "export_checkpoint(here / 'ckpt', here / 'out', to='safetensors')",
        EXIT_INPUT,
        "tool: error: DCP checkpoint {here}/ckpt: ",
    ),
    "a config that cannot be read": (
        "from mm_config import load_config\nload_config(here / 'missing.yaml')",
        EXIT_CONFIG,
        "tool: error: {here}/missing.yaml: 1 problem in the config:",
    ),
    "arguments that do not fit the run": (
        "from mm_trainer.run.user_errors import UsageError\n"
        "raise UsageError('export: --expert needs a run with both A14B experts')",
        EXIT_CONFIG,
        "tool: error: export: --expert needs a run with both A14B experts",
    ),
    "a reward that scores a sample NaN": (
        "import torch\nfrom types import SimpleNamespace\nfrom mm_trainer import Rewards\n"
        "entry = SimpleNamespace(id='colour_target', weight=1.0, options={'target': [1, 0, 0]})\n"
        "Rewards.from_config([entry]).score(['a ball'], frames=torch.full((1, 3, 1, 2, 2), torch.nan), names=['clip 0'])",
        EXIT_REWARD,
        "tool: error: reward 'colour_target' (training.rewards[0]) scored clip 0 non-finite: [nan]",
    ),
    "Ctrl-C outside the training loop": ("raise KeyboardInterrupt", EXIT_INTERRUPTED, "tool: interrupted"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_user_error_prints_one_clean_message_and_exits_with_its_class_code(case, tmp_path):
    body, code, start = CASES[case]
    if "'ckpt'" in body:
        a_dcp_checkpoint(tmp_path / "ckpt")
    done = run_entry(body, tmp_path)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr and "[rank" not in done.stderr, done.stderr
    assert done.stderr.startswith(start.format(here=tmp_path)), done.stderr
    assert done.stdout == ""


def test_the_traceback_variable_shows_a_user_errors_traceback_with_the_same_code(tmp_path):
    body = "from mm_trainer import load_run_config\nload_run_config(here / 'nowhere')"
    done = run_entry(body, tmp_path, **{TRACEBACK_ENV: "1"})
    assert done.returncode == EXIT_INPUT
    assert "[rank 0] Traceback (most recent call last):" in done.stderr
    assert "CheckpointNotFoundError: " in done.stderr.splitlines()[-1], done.stderr


MARKED = (
    "from mm_checkpoint.errors import raised_on_every_rank\n"
    "from mm_trainer.run.lock import RunLockedError\n"
    "raise raised_on_every_rank(RunLockedError(f'{here} is in use by another training run'))"
)
ONE_RANKS = (
    "from mm_data.shards import CorruptShardError\n"
    "raise CorruptShardError(here / 'shard_00003.pt', 'truncated', [7, 8])"
)


def ranks_of(body: str, here: Path, world: int = 2) -> list[subprocess.CompletedProcess]:
    """``body`` as ranks 0..world-1 of one job on one node (the launcher's environment, no process group)."""
    env = lambda rank: {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)}  # noqa: E731
    return [run_entry(body, here, **env(rank)) for rank in range(world)]


def test_an_error_every_rank_raised_alike_is_printed_by_rank_0_alone(tmp_path):
    rank0, rank1 = ranks_of(MARKED, tmp_path)
    assert (rank0.returncode, rank1.returncode) == (EXIT_DESTINATION, EXIT_DESTINATION)
    assert rank0.stderr == f"tool: error: {tmp_path} is in use by another training run\n"
    assert rank1.stderr == ""


def test_an_error_of_one_rank_is_printed_by_that_rank_with_its_rank(tmp_path):
    rank1 = ranks_of(ONE_RANKS, tmp_path)[1]
    assert rank1.returncode == EXIT_INPUT
    assert rank1.stderr.startswith(f"[rank 1] tool: error: {tmp_path}/shard_00003.pt"), rank1.stderr
    assert "Traceback" not in rank1.stderr


def test_an_error_a_data_loader_worker_raised_is_told_without_the_workers_traceback():
    from mm_data.bad_samples import BadSampleError
    from mm_trainer.run.user_errors import user_error_class, user_error_message
    from torch._utils import ExceptionWrapper

    try:
        raise BadSampleError("too many bad samples: 3 of 8: /data/a.mp4: cannot decode")
    except BadSampleError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")  # what the worker sends back
    with pytest.raises(BadSampleError) as raised:
        wrapped.reraise()
    message = user_error_message(raised.value, user_error_class(raised.value), "tool")
    assert message == (
        "tool: error: too many bad samples: 3 of 8: /data/a.mp4: cannot decode "
        "(Caught BadSampleError in DataLoader worker process 0)"
    )


def test_every_class_named_as_a_user_error_exists_under_that_name():
    for name in USER_ERRORS:
        module, _, qualname = name.rpartition(".")
        cls = getattr(importlib.import_module(module), qualname)
        assert isinstance(cls, type) and issubclass(cls, BaseException), name
        assert f"{cls.__module__}.{cls.__qualname__}" == name  # the name its instances report


def test_each_class_has_its_own_documented_exit_code():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    for kind in CLASSES:
        assert f"| {kind.name} | {kind.exit_code} |" in readme, kind.name
    assert len({kind.exit_code for kind in CLASSES}) == len(CLASSES)
