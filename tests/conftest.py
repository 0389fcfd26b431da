"""Fixtures for the cross-package tests: the toy plugin's weights and YAML, and an mm-train runner."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from safetensors.torch import save_file

PLUGIN_DIR = Path(__file__).parent / "plugins"
REPO = Path(__file__).resolve().parents[1]


def toy_config(tmp: Path, *, encoder_dir: Path, predictor_dir: Path, **sections: dict) -> dict:
    """A toy run config; ``sections`` update the defaults section by section."""
    cfg = {
        "parallel": {
            "fsdp_plan": {
                "apply_modules": ["predictor.blocks.{*}", "text_encoder"],
                "num_to_forward_prefetch": 1,
                "num_to_backward_prefetch": 1,
            }
        },
        "model": {
            "container_id": "toy_container",
            "models": {
                "text_encoder": {
                    "model_id": "toy_encoder",
                    "from_pretrained": str(encoder_dir),
                    "freeze": True,
                    "meta_init": True,
                    "config": {"in_dim": 8, "cond_dim": 16},
                },
                "predictor": {
                    "model_id": "toy_predictor",
                    "from_pretrained": str(predictor_dir),
                    "meta_init": True,
                    "config": {"dim": 8, "hidden": 32, "cond_dim": 16, "num_blocks": 3},
                },
            },
        },
        "data": {"dataset_id": "toy_regression", "dataset": {"num_samples": 64}},
        "training": {
            "plugin": ["toy_plugin"],
            "seed": 7,
            "micro_batch_size": 4,
            "gradient_accumulation_steps": 1,
            "train_iters": 30,
            "lr": 3e-3,
            "lr_scheduler": "constant",
            "clip_grad": 1.0,
            "save": str(tmp / "ckpt"),
            "save_interval": 10,
            "log_interval": 1,
            "deterministic": True,
            "tensorboard": False,  # on by default where installed: off here, one import less per run
        },
        "features": {
            "recompute_plan": {"apply_modules": ["predictor.blocks.{*}"]},
            "activation_offload_plan": {"apply_modules": ["predictor.blocks.0"]},
        },
    }
    for name, values in sections.items():
        _deep_update(cfg.setdefault(name, {}), values)
    return cfg


def _deep_update(dst: dict, src: dict) -> None:
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _deep_update(dst[key], value)
        else:
            dst[key] = value


def _toy_module(name: str, **kwargs):
    sys.path.insert(0, str(PLUGIN_DIR))
    try:
        import toy_plugin
    finally:
        sys.path.remove(str(PLUGIN_DIR))
    return getattr(toy_plugin, name)(**kwargs)


def _save_hf_dir(module: torch.nn.Module, out: Path, config: dict) -> Path:
    out.mkdir()
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config))
    return out


def _toy_encoder(root: Path) -> Path:
    torch.manual_seed(123)
    encoder = _toy_module("ToyEncoder", in_dim=8, cond_dim=16)
    with torch.no_grad():
        for p in encoder.parameters():
            p.add_(torch.randn_like(p))  # LayerNorm weights are not the default 1/0
    return _save_hf_dir(encoder, root / "encoder", {"in_dim": 8, "cond_dim": 16})


def _toy_predictor(root: Path) -> Path:
    torch.manual_seed(321)
    config = {"dim": 8, "hidden": 32, "cond_dim": 16, "num_blocks": 3}
    return _save_hf_dir(_toy_module("ToyPredictor", **config), root / "predictor", config)


@pytest.fixture
def toy_encoder_dir(tmp_path: Path) -> Path:
    """A frozen encoder checkpoint in HF safetensors layout (config.json + model.safetensors)."""
    return _toy_encoder(tmp_path)


@pytest.fixture
def toy_predictor_dir(tmp_path: Path) -> Path:
    """Initial predictor weights, so that runs at different world sizes start from the same point."""
    return _toy_predictor(tmp_path)


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def mm_train_command(
    config: Path, *overrides: str, nproc: int = 1, torchrun: str = "torch.distributed.run"
) -> list[str]:
    """``mm-train`` as a single process or under torchrun with ``nproc`` CPU ranks (``torchrun``: the
    launcher's module, e.g. ``mm_trainer.run.torchrun``, the launch scripts')."""
    if nproc == 1:
        return [sys.executable, "-m", "mm_trainer", "--config", str(config), *overrides]
    return [
        sys.executable, "-m", torchrun, "--standalone", f"--nproc-per-node={nproc}",
        "-m", "mm_trainer", "--config", str(config), *overrides,
    ]  # fmt: skip


def train_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN_DIR), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_mm_train(
    config: Path, *overrides: str, nproc: int = 1, timeout: float = 300, wrapper: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """Run mm-train to completion (under the command ``wrapper``, if given); fail the test with its
    output if it fails."""
    proc = subprocess.run(
        [*wrapper, *mm_train_command(config, *overrides, nproc=nproc)],
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"mm-train exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-6000:]}"
        )
    return proc


def read_metrics(log_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]


def _toy_yaml_factory(root: Path, encoder_dir: Path, predictor_dir: Path):
    def make(name: str = "run", **sections: dict) -> Path:
        run_dir = root / name
        run_dir.mkdir(exist_ok=True)
        cfg = toy_config(run_dir, encoder_dir=encoder_dir, predictor_dir=predictor_dir, **sections)
        return write_config(run_dir / "config.yaml", cfg)

    return make


@pytest.fixture
def toy_yaml(tmp_path: Path, toy_encoder_dir: Path, toy_predictor_dir: Path):
    """Factory: ``toy_yaml(name, **sections) -> Path`` of a written toy config."""
    return _toy_yaml_factory(tmp_path, toy_encoder_dir, toy_predictor_dir)


@pytest.fixture(scope="module")
def module_toy_yaml(tmp_path_factory: pytest.TempPathFactory):
    """``toy_yaml`` for a whole test module, for runs that several of its tests share (e.g. one
    checkpoint that each test resumes in a copy of its own)."""
    root = tmp_path_factory.mktemp("toy")
    return _toy_yaml_factory(root, _toy_encoder(root), _toy_predictor(root))


@pytest.fixture
def mm_train():
    """``mm_train(config, *overrides, nproc=1)`` runs the real CLI in a subprocess."""
    return run_mm_train


PEAK_OF_ONE_CHILD = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:]).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def _stdout_and_peak_rss_kib(config: Path, *overrides: str) -> tuple[str, int]:
    """Run mm-train (one process) under a parent of its own, whose only child it is: that parent's
    ``RUSAGE_CHILDREN`` peak is mm-train's (this test process's own counts every process that
    the tests before it in this worker started)."""
    proc = run_mm_train(config, *overrides, wrapper=(sys.executable, "-c", PEAK_OF_ONE_CHILD))
    return proc.stdout, int(proc.stderr.strip().splitlines()[-1])


@pytest.fixture
def mm_train_peak_rss():
    """``mm_train_peak_rss(config, *overrides) -> (stdout, peak resident KiB)`` of a one-process mm-train."""
    return _stdout_and_peak_rss_kib


@pytest.fixture
def metrics_of():
    """``metrics_of(log_dir)`` -> the JSONL records."""
    return read_metrics


@pytest.fixture
def mm_train_popen():
    """``mm_train_popen(config, *overrides)`` starts a single-process mm-train without waiting."""

    def start(config: Path, *overrides: str) -> subprocess.Popen:
        return subprocess.Popen(
            mm_train_command(config, *overrides),
            env=train_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    return start


@pytest.fixture
def mm_train_result():
    """``mm_train_result(config, *overrides)`` runs mm-train and returns the process, failed or not."""

    def run(config: Path, *overrides: str) -> subprocess.CompletedProcess:
        command = mm_train_command(config, *overrides)
        return subprocess.run(command, env=train_env(), capture_output=True, text=True, timeout=300)

    return run


def build_toy_trainer(config: Path, world_size: int, *overrides: str):
    """A ``Trainer`` of a toy config, built in this (rank) process."""
    if str(PLUGIN_DIR) not in sys.path:
        sys.path.insert(0, str(PLUGIN_DIR))
    from mm_config import load_config
    from mm_trainer import Trainer

    return Trainer(load_config(config, list(overrides), world_size=world_size))


@pytest.fixture
def trainer_build_error():
    """``trainer_build_error(config, world_size)`` -> ``"ErrorType: message"`` of building its Trainer
    on this rank, or ``"no error"``."""

    def build(config: Path, world_size: int) -> str:
        try:
            build_toy_trainer(config, world_size)
        except Exception as exc:  # noqa: BLE001 - the error is the result
            return f"{type(exc).__name__}: {exc}"
        return "no error"

    return build


@pytest.fixture
def toy_trainer():
    """``toy_trainer(config, world_size, *overrides)`` -> a built ``Trainer`` (call inside a rank)."""
    return build_toy_trainer


# ---------------------------------------------------------------- processes of a multi-rank run
def plain_launch_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """What a launcher other than torchrun (srun, mpirun, a script) sets for one rank."""
    env = train_env()
    for key in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"):
        env.pop(key, None)
    env.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
    )  # fmt: skip
    return env


def _parent_pid(pid: str) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def worker_pids(launcher_pid: int, world_size: int, timeout: float = 120) -> dict[int, int]:
    """``{rank: pid}`` of the workers a torchrun process started (Linux /proc), once all exist."""
    deadline = time.monotonic() + timeout
    while True:
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or _parent_pid(entry.name) != launcher_pid:
                continue
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            ranks = [int(item[5:]) for item in env if item.startswith(b"RANK=")]
            if ranks:
                found[ranks[0]] = int(entry.name)
        if len(found) == world_size:
            return found
        assert time.monotonic() < deadline, f"torchrun {launcher_pid} started {found} of {world_size} workers"
        time.sleep(0.1)


def process_running(pid: int) -> bool:
    """False once ``pid`` has exited (gone, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for_steps(log: Path, steps: int, *procs: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until rank 0 logged ``steps`` steps to ``log`` (metrics.jsonl) while ``procs`` run."""
    deadline = time.monotonic() + timeout
    while not (log.exists() and len(log.read_text().splitlines()) >= steps):
        assert all(p.poll() is None for p in procs), "the run ended before it logged its first steps"
        assert time.monotonic() < deadline, f"no {steps} steps in {log} after {timeout} s"
        time.sleep(0.05)


def start_run(
    config: Path, *overrides: str, nproc: int = 2, launcher: str = "torchrun", free_port: Callable[[], int]
) -> list[subprocess.Popen]:
    """Start an ``nproc``-rank mm-train: one torchrun process, one ``mm_trainer.run.torchrun`` process
    (``launcher="wrapped"``: the launch scripts' torchrun), or (``launcher="plain"``) one process per
    rank with the rendezvous in its environment, as srun / mpirun / a script would. Each process
    writes stdout and stderr to ``<config dir>/<launcher>-<i>.log`` (a file: workers that outlive
    their launcher keep writing, and a pipe nobody reads would block them)."""
    if launcher in ("torchrun", "wrapped"):
        module = "mm_trainer.run.torchrun" if launcher == "wrapped" else "torch.distributed.run"
        commands = [(mm_train_command(config, *overrides, nproc=nproc, torchrun=module), train_env())]
    else:
        port = free_port()
        commands = [
            (mm_train_command(config, *overrides), plain_launch_env(r, nproc, port)) for r in range(nproc)
        ]
    procs = []
    for i, (command, env) in enumerate(commands):
        with open(config.parent / f"{launcher}-{i}.log", "w") as log:
            procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
        procs[-1].log = config.parent / f"{launcher}-{i}.log"
    return procs


def finish(procs: list[subprocess.Popen], timeout: float, kill_job) -> tuple[list[int | None], str]:
    """Wait up to ``timeout`` seconds in all for ``procs``; return their exit codes (None: still
    running after it, then killed) and their output, one after the other."""
    deadline = time.monotonic() + timeout
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            kill_job(proc)  # torchrun's workers too: they have their own session
            codes.append(None)
    return codes, "\n".join(proc.log.read_text() for proc in procs)


@pytest.fixture
def processes(kill_job, free_port) -> SimpleNamespace:
    """Start, watch and signal the processes of a multi-rank mm-train (test files cannot import conftest)."""
    return SimpleNamespace(
        start=functools.partial(start_run, free_port=free_port), finish=functools.partial(finish, kill_job=kill_job), worker_pids=worker_pids, running=process_running,
        wait_for_steps=wait_for_steps, env=train_env, free_port=free_port,
    )  # fmt: skip


@pytest.fixture
def mm_train_in_process(monkeypatch, capsys):
    """``mm_train_in_process(*args)``: mm-train's ``main(args)`` called in this process (e.g. ``check-layouts``,
    whose runs are processes of their own), the toy plugin importable here and in what it starts. Returns
    ``returncode``, ``stdout`` and ``stderr`` like a finished process."""
    monkeypatch.setenv("PYTHONPATH", train_env()["PYTHONPATH"])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))

    def run(*args: str) -> SimpleNamespace:
        from mm_trainer.cli import main

        code = main(list(args))
        captured = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=captured.out, stderr=captured.err)

    return run


@pytest.fixture
def mm_train_cli():
    """``mm_train_cli(*args)`` runs ``python -m mm_trainer *args`` (e.g. a subcommand) with the toy plugin
    importable, and returns the process, failed or not."""

    def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "mm_trainer", *args]
        return subprocess.run(command, env=train_env(), capture_output=True, text=True, timeout=timeout)

    return run


def _mm_train_with_toy_plugin(argv: list[str]) -> int:
    """mm-train's ``main`` with the toy plugin importable (call in a forked rank)."""
    sys.path.insert(0, str(PLUGIN_DIR))
    from mm_trainer.cli import main

    return main(argv)


@pytest.fixture(scope="session")
def mm_train_forked(main_forked):
    """``mm_train_forked(config, *overrides, nproc=1)``: mm-train's ``main`` on ``nproc`` forked gloo ranks
    (the command line's code path without a fresh interpreter per run); a failure on any rank raises
    with its traceback. Returns the metrics records (of the config file's ``training.log_dir``, else
    ``<config dir>/ckpt``)."""

    def run(config: Path, *overrides: str, nproc: int = 1) -> list[dict]:
        main_forked(_mm_train_with_toy_plugin, ["--config", str(config), *overrides], nproc)
        log_dir = yaml.safe_load(config.read_text())["training"].get("log_dir")
        return read_metrics(Path(log_dir) if log_dir else config.parent / "ckpt")

    return run
