"""Each library and app is its own package with its own version, and installs from the checkout with
its sibling libraries the way every README says: `hatch run wheels`, then
`pip install --find-links dist <member>`, in a fresh virtual environment.

A fresh install costs minutes on a small machine, so one venv grows in stages, each checked before
the next is installed: mm-config alone (no torch); then mm-checkpoint with torch at the tested
version (no diffusers / transformers / trainer): its `mm-ckpt` converts a tiny diffusers Wan
transformer to the native layout with the shipped `wan2_2` table and back, and its README example
runs; then wan22-train with everything it needs, by the Wan README's install line (its plot extra
included). From there the Wan README's lines run as a user types them: make-tiny, and its LoRA training
(peft comes with wan22-train: it depends on mm-trainer[lora]), shortened to 2 steps on 1 process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib
import torch
from mm_checkpoint.dcp_io import DcpReader
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
MEMBERS = sorted([*REPO.glob("libs/*/pyproject.toml"), *REPO.glob("apps/*/pyproject.toml")])
TORCH = "torch==2.13.0"  # the tested version; pip takes the machine's local CPU wheel
CONFIG_EXAMPLE = REPO / "apps" / "wan22-train" / "configs" / "t2v_a14b_high.yaml"
NOT_WITH_MM_CHECKPOINT = ("diffusers", "transformers", "safetensors", "mm_trainer", "wan22_train")
WAN_README = "apps/wan22-train/README.md"
WAN_INSTALL = 'pip install --find-links dist wan22-train "mm-trainer[plot]"'
WAN_MAKE_TINY = "wan22-train make-tiny runs/tiny"
WAN_LORA = "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_t2v_lora.yaml"
WAN_PLOT = "wan22-train plot runs/tiny/ckpt"

# The staged installs run in the first test's setup: ~4 min of CPU on 2 idle cores, more when shared.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _run(
    *cmd: object, check: bool = True, env: dict[str, str] | None = None, **kwargs
) -> subprocess.CompletedProcess:
    # without PYTHONPATH: a venv sees what was installed into it, not the sources a dev shell puts first
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, check=False, env=env, **kwargs
    )
    if check:
        assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def _version(member: Path) -> str:
    package = next((member / "src").iterdir())
    return re.search(r'__version__ = "([^"]+)"', (package / "__init__.py").read_text()).group(1)


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's `hatch run wheels`: hatch.toml's script, run with this environment's tools."""
    script = tomllib.loads((REPO / "hatch.toml").read_text())["envs"]["default"]["scripts"]["wheels"]
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    _run("bash", "-c", script.replace("{args:dist}", str(out)), cwd=REPO, env=env)
    return out


def test_wheels_script_builds_every_member_with_its_own_version(wheels: Path):
    built = sorted(w.name for w in wheels.glob("*.whl"))
    expected = [f"{m.parent.name.replace('-', '_')}-{_version(m.parent)}-py3-none-any.whl" for m in MEMBERS]
    assert built == sorted(expected)


@dataclass
class Installed:
    """What each stage did in the one venv; ``bin`` is the venv with wan22-train in the end."""

    config_probe: subprocess.CompletedProcess
    config_check: subprocess.CompletedProcess
    present_with_mm_checkpoint: str
    wan_dir: Path
    converted: Path  # the native DCP copy that mm-ckpt wrote
    back: Path  # and converted back to diffusers
    readme_example: subprocess.CompletedProcess
    bin: Path


def _tiny_diffusers_wan(out: Path) -> Path:
    """A tiny diffusers Wan transformer, written here (this environment has diffusers), in shards."""
    from wan22_train.tiny import tiny_transformer

    torch.manual_seed(0)
    tiny_transformer().save_pretrained(out, max_shard_size="20KB", safe_serialization=True)
    return out


@pytest.fixture(scope="module")
def installed(wheels: Path, tmp_path_factory: pytest.TempPathFactory, readme) -> Installed:
    work = tmp_path_factory.mktemp("members")
    _run(sys.executable, "-m", "venv", work / "venv")  # no --system-site-packages: nothing leaks in
    bin_dir = work / "venv" / "bin"
    # pip is no project code: it runs without the suite's PYTHONWARNINGS=error (the venv's pip warns
    # that pkg_resources is deprecated); the installed members still run under it.
    # --no-compile: byte-compiling every installed module (torch's and diffusers' thousands) took
    # about 40% of this fixture; the few modules these tests import compile when first imported
    pip = [
        *("env", "-u", "PYTHONWARNINGS", bin_dir / "pip"),
        *("install", "-q", "--no-compile", "--find-links", wheels),
    ]

    _run(*pip, "mm-config")
    probe = "import sys, mm_config; assert 'torch' not in sys.modules; print(mm_config.__version__)"
    config_probe = _run(bin_dir / "python", "-c", probe, check=False)
    check = [
        bin_dir / "mm-config",
        "check",
        CONFIG_EXAMPLE,
        "--world-size",
        "8",
        "--no-plugins",
        "--no-path-check",
    ]
    config_check = _run(*check, check=False)

    _run(*pip, TORCH, "mm-checkpoint")
    probe = f"import importlib.util as u; print([m for m in {NOT_WITH_MM_CHECKPOINT} if u.find_spec(m)])"
    present = _run(bin_dir / "python", "-c", probe).stdout.strip()
    wan_dir = _tiny_diffusers_wan(work / "wan")
    ckpt = [bin_dir / "mm-ckpt", "convert", "--model-type", "wan2_2"]
    _run(*ckpt, wan_dir, work / "dcp", "--to", "dcp")
    _run(*ckpt, work / "dcp", work / "back", "--to", "diffusers")
    ckpt_readme = REPO / "libs" / "mm-checkpoint" / "README.md"
    code = re.findall(r"```python\n(.*?)```", ckpt_readme.read_text(), re.S)[0]
    (work / "example.py").write_text(code.replace("/tmp/demo", str(work / "demo")))
    example = _run(bin_dir / "python", work / "example.py", cwd=work, check=False)

    # the Wan README's install line; torch first, as it says (here the machine's local CPU wheel)
    install = readme.command(WAN_README, WAN_INSTALL, paths={"dist": wheels})
    assert install[:4] == ["pip", "install", "--find-links", str(wheels)]
    _run(*pip, TORCH, *install[4:])
    return Installed(
        config_probe, config_check, present, wan_dir, work / "dcp", work / "back", example, bin_dir
    )


def test_mm_config_installs_alone_and_imports_no_torch(installed: Installed):
    assert installed.config_probe.returncode == 0, installed.config_probe.stderr
    assert installed.config_probe.stdout.strip() == _version(REPO / "libs" / "mm-config")


def test_mm_config_alone_checks_a_shipped_config(installed: Installed):
    assert installed.config_check.returncode == 0, installed.config_check.stderr
    assert "train_iters" in installed.config_check.stdout


def test_mm_checkpoint_installs_without_diffusers_transformers_or_the_trainer(installed: Installed):
    assert installed.present_with_mm_checkpoint == "[]"


def test_mm_ckpt_alone_converts_diffusers_wan_to_the_native_layout(installed: Installed):
    native = DcpReader(installed.converted / "iter_0000000").keys()
    assert "blocks.0.self_attn.q.weight" in native and "head.modulation" in native
    assert not [k for k in native if "attn1" in k or "condition_embedder" in k]


def test_mm_ckpt_alone_converts_native_back_to_diffusers_bit_exact(installed: Installed):
    source, back = _tensors(installed.wan_dir), _tensors(installed.back)
    assert source.keys() == back.keys()
    for key, tensor in source.items():
        assert tensor.dtype == back[key].dtype, key
        assert tensor.view(torch.uint8).equal(back[key].view(torch.uint8)), key


def test_mm_checkpoint_readme_example_runs_with_mm_checkpoint_alone(installed: Installed):
    assert installed.readme_example.returncode == 0, installed.readme_example.stderr[-3000:]
    assert "dcp 4 []" in installed.readme_example.stdout


def test_wan22_train_installed_from_the_wheels_reports_its_version(installed: Installed):
    out = _run(installed.bin / "wan22-train", "--version").stdout.strip()
    assert out == f"wan22-train {_version(REPO / 'apps' / 'wan22-train')}"


@pytest.fixture(scope="module")
def wan_session(installed: Installed, tmp_path_factory: pytest.TempPathFactory, readme) -> Path:
    """A working directory (as the repository root is for the Wan README) after the README's make-tiny,
    run by the installed ``wan22-train`` (without the VAE fit, as the README's tests shorten it)."""
    cwd = tmp_path_factory.mktemp("wan_session")
    argv = readme.command(WAN_README, WAN_MAKE_TINY, extra=("--vae-fit-steps", "0"))
    _run(installed.bin / argv[0], *argv[1:], cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return cwd


def test_wan22_train_installed_from_the_wheels_makes_a_tiny_model_set(wan_session: Path):
    tiny = wan_session / "runs" / "tiny"
    for part in ("transformer", "vae", "text_encoder", "tokenizer"):
        assert (tiny / part).is_dir(), part
    assert (tiny / "data" / "metadata.json").is_file()
    assert any((tiny / "data").rglob("*.mp4"))


def test_the_wan_readmes_lora_line_trains_and_plots_after_its_install_line(
    installed: Installed, wan_session: Path, readme
):
    # Installed as the README says, peft (mm-trainer[lora]) came with wan22-train: before, the LoRA line
    # failed for want of it. 1 process (the README's 2 cost a second interpreter), 2 steps.
    configs = {"apps/wan22-train/configs": REPO / "apps" / "wan22-train" / "configs"}
    module, _, args = readme.launched(readme.command(WAN_README, WAN_LORA, paths=configs))
    shortened = ("training.train_iters=2", "parallel.ulysses_parallel_size=1")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    _run(installed.bin / "python", "-m", module, *args, *shortened, cwd=wan_session, env=env)
    ckpt = wan_session / "runs" / "tiny_lora" / "ckpt"
    rows = [json.loads(line) for line in (ckpt / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    saved = DcpReader(ckpt / "iter_0000002").keys()  # the model's keys: the adapters only
    assert saved and all(".lora_A." in k or ".lora_B." in k for k in saved), saved[:5]
    # the README's plot line, on this run: matplotlib came with the install line's mm-trainer[plot]
    plot = readme.command(WAN_README, WAN_PLOT, paths={"runs/tiny/ckpt": ckpt})
    _run(installed.bin / plot[0], *plot[1:], cwd=wan_session, env=env)
    assert (ckpt / "metrics.png").stat().st_size > 0
