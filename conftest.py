"""Repository-wide pytest fixtures.

`run_distributed` starts a real gloo process group of N CPU processes and runs a
function on every rank. Processes are forked, so the function may be a local
closure of the test (no pickling by module name, which --import-mode=importlib
would break); results and exceptions come back through a queue.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing as mp
import os
import pickle
import random
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Warnings are errors (pyproject.toml) except the project's allowlist, with its reasons, in
    :mod:`mm_config.warning_policy` (shared with the console scripts).

    The processes the tests start (console scripts, torchrun and its workers, helper scripts) get
    ``PYTHONWARNINGS=error``: a warning there fails the test too; the console scripts install the
    allowlist in front of it.
    """
    from mm_config.warning_policy import pytest_filter_lines

    for line in pytest_filter_lines():
        config.addinivalue_line("filterwarnings", line)
    os.environ["PYTHONWARNINGS"] = "error"
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _one_thread_per_worker()


def _one_thread_per_worker() -> None:
    """Under pytest-xdist (the test command runs as many workers as CI has cores) each worker and the
    processes it starts compute on one thread. With two threads per worker, each small op of one worker
    waits for a thread that the other worker's process holds: two sampled LTX-2 clips took 8.1 s beside a
    busy process instead of 1.46 s on one."""
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _forget_inherited_compile_pool() -> None:
    """Make a forked rank compile in its own process, with no worker pool.

    torch's after-fork hook resets inductor's process pool but not its thread pool. After a test
    in the parent process compiled something, a forked rank inherited that pool without its threads,
    and its first compile waited forever (CI stalled this way). Each rank compiles serially instead:
    two ranks already fill the two cores.
    """
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    if "torch._inductor.config" in sys.modules:
        sys.modules["torch._inductor.config"].compile_threads = 1
    if "torch._inductor.async_compile" in sys.modules:
        sys.modules["torch._inductor.async_compile"].AsyncCompile.pool.cache_clear()


def _worker(
    rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple, queue: Any, all_forked: Any
) -> None:
    import torch
    import torch.distributed as dist

    _forget_inherited_compile_pool()
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",  # every rank a client of the parent's store, as under torchrun
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(1)
    try:
        if not all_forked.wait(timeout=120):
            raise RuntimeError(f"rank {rank}: the parent did not finish forking the ranks within 120 s")
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        # every rank's connections are up before any rank may finish and close its own: a rank whose body
        # returned at once closed its side while its peer still connected ("Connection closed by peer")
        dist.barrier()
        result = fn(rank, world_size, *args)
        # Plain pickle: torch's multiprocessing reductions would pass tensors as shared-memory
        # handles that die with this process.
        queue.put((rank, "ok", pickle.dumps(result)))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _fork_ranks(procs: list[Any], all_forked: Any) -> None:
    """Fork the ranks; they start their work (``all_forked``) only once every one of them is forked.

    Forking copies the forking thread only, with every lock the parent's other threads hold at that
    moment held forever in the child:

    - while rank 0 connected, the parent's store thread was resolving its address (glibc's resolver
      lock); rank 3, forked at that moment, hung in its own ``getnameinfo``. No rank connects before
      the last fork now.
    - a cycle left in the test process by an earlier test (a failed run's traceback, say) may hold a
      TCPStore whose server thread exists only in the parent: collected in a rank, its destructor
      joined that thread, and the rank hung. The parent collects its garbage first, where its threads
      are; what remains is frozen across the fork (the recipe of :func:`gc.freeze`'s documentation).
    """
    gc.collect()
    gc.freeze()
    try:
        for p in procs:
            p.start()
    finally:
        gc.unfreeze()
        all_forked.set()


def fork_frozen() -> int:
    """``os.fork()`` with the parent's objects frozen across it (see :func:`_fork_ranks`): the child
    never collects garbage it inherited. Returns what ``os.fork`` returns."""
    gc.collect()
    gc.freeze()
    pid = os.fork()
    if pid:
        gc.unfreeze()
    return pid


@pytest.fixture(scope="session")
def fork() -> Callable[[], int]:
    """:func:`fork_frozen`: for tests that fork a child of their own (the conftest is not importable)."""
    return fork_frozen


def run_killed_after(main: Callable[[list[str]], int], argv: list[str], save: Path, steps: int) -> int:
    """``main(argv)`` (an app's ``cli.main``) in a forked child (one rank, as ``python -m <app>`` without a
    fresh interpreter's imports), SIGKILLed once it logged ``steps`` steps in ``save/metrics.jsonl``: its
    exit status (``os.waitpid``'s; a run that ended before it could be killed: its own)."""
    pid = fork_frozen()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            logging.root.handlers.clear()
            import torch

            torch.set_num_threads(1)  # the parent's OpenMP pool does not survive a fork
            code = main(argv)
        finally:
            os._exit(code)
    log, deadline = save / "metrics.jsonl", time.monotonic() + 300
    while not (log.exists() and len(log.read_text().splitlines()) >= steps) and time.monotonic() < deadline:
        ended, status = os.waitpid(pid, os.WNOHANG)
        if ended:
            return status  # it ended before it could be killed
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


@pytest.fixture(scope="session")
def killed_after() -> Callable[..., int]:
    """``killed_after(main, argv, save, steps)``: :func:`run_killed_after` (test files cannot import conftest)."""
    return run_killed_after


# ---------------------------------------------------------------- killing a launched job
def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc), whatever its session or process group."""
    parents = {}
    for entry in Path("/proc").iterdir():
        with suppress(OSError):
            if entry.name.isdigit():
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def sigkill_job(proc: subprocess.Popen) -> None:
    """SIGKILL a launched job, as a machine that goes down: every process below ``proc`` (its ranks)
    and ``proc`` itself, then reap it. ``os.killpg`` on the launcher's group is not enough: torchrun
    starts its workers in sessions of their own, so they outlive it, get SIGTERM when it dies
    (``mm_parallel.signal_when_launcher_dies``) and stop cleanly, with a checkpoint: a stop, not a crash.
    A ``proc`` already reaped is left alone: its pid may belong to another process by now."""
    if proc.poll() is not None:
        return
    for pid in [*descendants(proc.pid), proc.pid]:  # collected first: an orphan's parent becomes init
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="session")
def kill_job() -> Callable[[subprocess.Popen], None]:
    """``kill_job(proc)``: :func:`sigkill_job` (test files cannot import conftest)."""
    return sigkill_job


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 300) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return per-rank results."""
    import torch.distributed as dist

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    # The parent hosts the rendezvous store on a port it holds from the start (torchrun's agent does the
    # same): a port picked free and bound later by rank 0 could be taken meanwhile by another test's
    # store, and two runs then shared one rendezvous.
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
    port = store.port
    all_forked = ctx.Event()
    procs = [
        ctx.Process(target=_worker, args=(r, world_size, port, fn, args, queue, all_forked))
        for r in range(world_size)
    ]
    _fork_ranks(procs, all_forked)
    results: dict[int, Any] = {}
    errors: list[str] = []
    all_reported = False
    try:
        for _ in range(world_size):
            rank, status, payload = queue.get(timeout=timeout)
            if status == "ok":
                results[rank] = pickle.loads(payload)
            else:
                errors.append(f"rank {rank} failed:\n{payload}")
                break
        all_reported = not errors
    finally:
        # ranks that reported are only exiting; after a failure, a timeout or an interrupt (pytest's
        # own timeout) the others are stopped at once rather than waited for
        for p in procs:
            p.join(timeout=timeout if all_reported else 5)
            if p.is_alive():
                p.kill()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world_size)]


EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port_below_ephemeral_range() -> int:
    """A port for a run's rendezvous: free now, and below the kernel's ephemeral range. A port from
    ``bind(0)`` is drawn from that range, as every gloo connection's and client socket's is, so between
    this call and the run's bind another test's process could take it (a rank then failed to serve its
    store and the other waited for it until the test's timeout, CI of 2026-12-07)."""
    low = int(EPHEMERAL_PORTS.read_text().split()[0]) if EPHEMERAL_PORTS.exists() else 32768
    draw = random.SystemRandom()
    for _ in range(200):
        port = draw.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port below the ephemeral range (from {low}) after 200 draws")


@pytest.fixture(scope="session")
def free_port() -> Callable[[], int]:
    """:func:`free_port_below_ephemeral_range`, for a test's own rendezvous (test files cannot import conftest)."""
    return free_port_below_ephemeral_range


@pytest.fixture(scope="session")
def distributed() -> Callable[..., list[Any]]:
    """Fixture form of :func:`run_distributed`: ``distributed(fn, world_size, *args)`` (session-scoped, so
    that module-scoped fixtures can start process groups too)."""
    return run_distributed


def run_main_forked(
    main: Callable[[list[str]], int], argv: list[str], nproc: int = 1, timeout: float = 600
) -> None:
    """A command line's ``main(argv)`` on ``nproc`` forked gloo ranks; fail unless every rank returns 0."""

    def body(rank: int, world_size: int) -> int:
        # as in a fresh interpreter: log records reach stderr (logging.lastResort), not the handlers
        # pytest's logging plugin installed in the parent
        logging.root.handlers.clear()
        return main(list(argv))

    codes = run_distributed(body, nproc, timeout=timeout)
    assert codes == [0] * nproc, f"{getattr(main, '__module__', main)} {argv} returned {codes}"


@pytest.fixture(scope="session")
def main_forked() -> Callable[..., None]:
    """``main_forked(main, argv, nproc=1)``: an app's ``cli.main`` run on forked ranks, the command line's
    code path without a fresh interpreter (and its torch / diffusers imports) per run."""
    return run_main_forked


class _CreatesFile:
    """Unpickling this creates ``path``: a stand-in for the code a crafted checkpoint file would run."""

    def __init__(self, path: Any) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (str(self.path), "w"))


@pytest.fixture
def pickle_payload() -> Callable[[Any], Any]:
    """``pickle_payload(marker)``: an object whose unpickling creates the file ``marker``."""
    return _CreatesFile


@pytest.fixture(scope="session")
def fsdp2_root_outputs() -> Callable[..., list[bool]]:
    """``fsdp2_root_outputs(build, forward, blocks="blocks")``: on one gloo rank, ``build()`` with each
    module of ``model.<blocks>`` (a dotted path) and the root wrapped by FSDP2, ``forward(model)`` run with warnings as
    errors; returns, per tensor output, whether it requires grad and is no view."""

    def run(build: Callable[[], Any], forward: Callable[[Any], Any], blocks: str = "blocks") -> list[bool]:
        def body(rank: int, world_size: int) -> list[bool]:
            import warnings

            import torch
            from torch.distributed.fsdp import fully_shard

            model = build()
            for block in model.get_submodule(blocks):
                fully_shard(block)
            fully_shard(model)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                out = forward(model)
            outputs = [out] if isinstance(out, torch.Tensor) else list(out)
            return [t.requires_grad and t._base is None for t in outputs]

        return run_distributed(body, 1)[0]

    return run


@pytest.fixture(
    params=[
        "as_trained",
        pytest.param(
            "inverted", marks=pytest.mark.xfail(strict=True, reason="a check of samples must catch it")
        ),
    ]
)
def euler_step(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a sampling test twice: with the flow-match Euler step as it is, and with its direction
    deliberately flipped (``x - (sigma_next - sigma) v``), a case the test must fail (strict xfail)."""
    from mm_pipelines import FlowMatchScheduler

    if request.param == "inverted":
        euler = FlowMatchScheduler.step
        flipped = staticmethod(lambda v, sigma, sigma_next, x: euler(-v, sigma, sigma_next, x))
        monkeypatch.setattr(FlowMatchScheduler, "step", flipped)
    return request.param


# The files that take minutes (durations of a full run), started first, longest first.
LONGEST_FILES = (
    "apps/wan22-train/tests/test_wan_compile_recompute_e2e.py",
    "tests/test_packaging.py",
    "apps/wan22-train/tests/test_wan_two_nodes_e2e.py",
    "apps/ltx2-train/tests/test_ltx2_train_e2e.py",
    "apps/wan22-train/tests/test_wan_demo_e2e.py",
    "apps/wan22-train/tests/test_wan_distill_e2e.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first, then the other files with a slow test, then the rest; each file's
    tests in their own order.

    The suite runs on two workers, each taking the next whole file (``--dist loadfile``). With the
    multi-minute files first and the many quick ones last, the two workers finish close together
    instead of one running a long file alone at the end.
    """
    root = config.rootpath
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> tuple[int, int]:
        name = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        if name in LONGEST_FILES:
            return (0, LONGEST_FILES.index(name))
        return (1 if item.path in slow_files else 2, 0)

    items.sort(key=rank)  # stable: ties keep the collection order


# ------------------------------------------------------------------------------ README commands

REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parent
COMMAND_READMES = (
    "README.md",
    "apps/wan22-train/README.md",
    "apps/ltx2-train/README.md",
    "apps/qwen-vl-train/README.md",
)
"""The READMEs whose shell blocks a user is told to run (``tests/test_readme_commands.py`` classifies every line)."""


def readme_shell_lines(readme: str) -> list[str]:
    """The commands of a README's ```bash blocks (``readme`` relative to the repository root): comment
    lines and trailing ``# ...`` comments dropped, ``\\``-continued lines joined, blanks collapsed."""
    import re

    lines, block, pending = [], False, ""
    for raw in (REPO_ROOT / readme).read_text().splitlines():
        if raw.startswith("```"):
            block = raw.strip() in ("```bash", "```sh", "```shell")
            continue
        if not block or not raw.strip() or raw.lstrip().startswith("#"):
            continue
        text = pending + raw.strip()
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        command = re.sub(r"\s+#\s.*$", "", text)  # a trailing comment ("  # ..."); quotes hold no " # " here
        lines.append(" ".join(command.split()))
    return lines


README_WORKDIR = r"run every command of this README from (the repository root|`([^`]+)`)"
"""How a README names the directory its shell lines run from (case and line breaks aside)."""


def readme_workdir(readme: str) -> Any:
    """The directory ``readme``'s shell lines run from, as the README names it once ("Run every command
    of this README from the repository root", or "... from `apps/x`": relative to the root)."""
    import re

    text = " ".join((REPO_ROOT / readme).read_text().split())
    named = re.findall(README_WORKDIR, text, flags=re.IGNORECASE)
    assert len(named) == 1, (
        f"{readme} names the directory its commands run from {len(named)} times, expected once: "
        "'Run every command of this README from the repository root' (or from `a/folder`)"
    )
    return REPO_ROOT / named[0][1] if named[0][1] else REPO_ROOT


def readme_command(
    readme: str, line: str, *, paths: dict[str, Any] | None = None, extra: tuple[str, ...] = ()
) -> list[str]:
    """The argv of the shell line ``line`` of ``readme`` (as :func:`readme_shell_lines` gives it; a test
    that runs a README command names it by its text, so the README cannot change it silently), with the
    documented shortenings: each argument starting with a key of ``paths`` gets that prefix replaced,
    and ``extra`` (dotted overrides, flags) is appended."""
    import shlex

    assert line in readme_shell_lines(readme), f"{readme} has no shell line {line!r}"
    argv = []
    for arg in shlex.split(line):
        for prefix, new in (paths or {}).items():
            if arg == prefix or arg.startswith(prefix + "/"):
                arg = str(new) + arg[len(prefix) :]
                break
        argv.append(arg)
    return [*argv, *extra]


def launched_module(argv: list[str]) -> tuple[str, int, list[str]]:
    """``(module, processes, arguments)`` of a ``torchrun ... -m MODULE ARGS`` or ``python -m`` argv."""
    at = argv.index("-m")
    nproc = next((int(a.split("=", 1)[1]) for a in argv[:at] if a.startswith("--nproc-per-node=")), None)
    if nproc is None and "--nproc-per-node" in argv[:at]:
        nproc = int(argv[argv.index("--nproc-per-node") + 1])
    return argv[at + 1], nproc or 1, argv[at + 2 :]


@pytest.fixture(scope="session")
def readme() -> Any:
    """``readme.command(readme, line, paths=, extra=)``, ``readme.lines(readme)``, ``readme.launched(argv)``,
    ``readme.workdir(readme)``: README shell commands for the tests that run them (test files cannot
    import conftest)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        command=readme_command, lines=readme_shell_lines, launched=launched_module, workdir=readme_workdir
    )
