"""Every shell line a user is told to run in the root and app READMEs is run by a test, or named here
with the reason it cannot be.

Each line of the READMEs' ```bash blocks (``conftest.readme_shell_lines``) has one entry below:

- ``RUN``: run by this file, in this process (a ``hatch run`` prefix dropped; placeholder paths replaced
  by a shipped config, as listed; ``NO_PLAN``: a real-size ``--dry-run`` with ``--no-plan`` added, its
  full estimate being the one-step trace that ``apps/wan22-train/tests/test_wan_plan.py`` and the root
  README's Wan dry-run line run end to end);
- ``covered(test file)``: run by that test, which takes the argv from the README by the line's text
  (the ``readme`` fixture), adding only the documented shortenings; this file checks that the test
  names the line;
- ``excused(reason)``: cannot run here (a cluster, placeholders, the suite itself), with what runs
  the same code instead.

A README line without an entry, or an entry without its line, fails: a README command cannot change or
appear without a test deciding how it is checked.

Each README names the directory its lines run from ("Run every command of this README from the
repository root": ``readme.workdir``); the ``RUN`` lines run there, its ``hatch run`` lines need
``hatch.toml`` there, the files its lines name exist there, and the ``runs/...`` folders its tiny configs
read are those its ``make-tiny`` lines write.
"""

from __future__ import annotations

import importlib
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib
import yaml

REPO = Path(__file__).resolve().parents[1]
ROOT, WAN, LTX2, QWEN = READMES = (
    "README.md",
    "apps/wan22-train/README.md",
    "apps/ltx2-train/README.md",
    "apps/qwen-vl-train/README.md",
)
PLACEHOLDER_FILES = {"my_run.yaml", "X.yaml"}  # the user's own config, named as such in the READMEs
READ_FILES = (".yaml", ".sh", ".sbatch")  # arguments that name a file of the checkout a line reads
A14B_HIGH = REPO / "apps" / "wan22-train" / "configs" / "t2v_a14b_high.yaml"


@dataclass(frozen=True)
class How:
    kind: str  # "run", "covered", "excused"
    detail: str = ""
    paths: tuple[tuple[str, str], ...] = ()
    in_tmp: bool = False  # run in a fresh directory (the line writes relative paths), not the repository
    shortened: tuple[str, ...] = ()  # documented flags appended to the line, to keep CI short (say why)


RUN = How("run")
NO_PLAN = How("run", shortened=("--no-plan",))


def covered(test_file: str) -> How:
    return How("covered", test_file)


def excused(reason: str) -> How:
    return How("excused", reason)


PACKAGING = excused("installs packages: tests/test_packaging.py runs hatch.toml's wheels script and "
                    "pip install --find-links dist <member> in a fresh virtual environment")  # fmt: skip

COMMANDS: dict[tuple[str, str], How] = {
    (ROOT, "pip install hatch && hatch run demo"): excused(
        "installs hatch; `hatch run demo` is hatch.toml's demo script, `wan22-train demo` "
        "(test_the_hatch_demo_script_is_the_wan_demo), which apps/wan22-train/tests/test_wan_demo_e2e.py runs"
    ),
    (ROOT, "pip install hatch && hatch run test"): excused("the test suite itself (what CI runs)"),
    (
        ROOT,
        "hatch run mm-config check apps/wan22-train/configs/t2v_a14b_high.yaml --world-size 8 --no-path-check",
    ): RUN,
    (
        ROOT,
        "hatch run wan22-train --config apps/wan22-train/configs/t2v_a14b_high.yaml --dry-run --world-size 8",
    ): RUN,
    (ROOT, "torchrun --nproc-per-node 8 -m wan22_train --config my_run.yaml training.lr=1e-5"): excused(
        "8 accelerators and the user's config; the 2-rank tiny launches of the app READMEs run the same entry"
    ),
    (ROOT, "hatch run wan22-train make-tiny runs/tiny"): covered("tests/test_check_layouts.py"),
    (
        ROOT,
        "hatch run mm-train check-layouts --config apps/wan22-train/configs/tiny_t2v.yaml --layouts 1 2 2:ulysses=2",
    ): covered("tests/test_check_layouts.py"),
    (
        ROOT,
        "torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint node0.example:29500 "
        "--rdzv-id my-run --max-restarts 3 -m wan22_train --config my_run.yaml",
    ): excused(
        "two machines; apps/wan22-train/tests/test_wan_two_nodes_e2e.py runs two simulated nodes on one host"
    ),
    (ROOT, "sbatch --nodes 4 launch/slurm.sbatch --config my_run.yaml"): excused(
        "a SLURM cluster; the script is shellchecked (tests/test_lint_checks.py)"
    ),
    (ROOT, "MASTER_ADDR=10.0.0.1 NNODES=2 bash launch/ascend.sh --config my_run.yaml"): excused(
        "Ascend NPUs; the script is shellchecked (tests/test_lint_checks.py)"
    ),
    (ROOT, "wan22-train --config my_run.yaml --dry-run --nnodes 2 --nproc-per-node 8"): How(
        "run",
        paths=(("my_run.yaml", "apps/wan22-train/configs/t2v_a14b_high.yaml"),),
        shortened=(
            "--no-plan",
        ),  # the node table is what this line adds; the line above traces the same step
    ),
    (WAN, "hatch run wheels"): PACKAGING,
    (WAN, 'pip install --find-links dist wan22-train "mm-trainer[plot]"'): covered("tests/test_packaging.py"),
    (WAN, "wan22-train --help"): RUN,
    (WAN, "wan22-train demo"): covered("apps/wan22-train/tests/test_wan_demo_e2e.py"),
    (WAN, "wan22-train demo --steps 8 training.save_interval=4"): covered(
        "apps/wan22-train/tests/test_wan_demo_e2e.py"
    ),
    (WAN, "wan22-train make-tiny runs/tiny"): covered("apps/wan22-train/tests/test_wan_cli.py"),
    (WAN, "wan22-train make-tiny runs/tiny_random --vae-fit-steps 0"): How("run", in_tmp=True),
    (
        WAN,
        "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_t2v.yaml training.ema.decay=0.99",
    ): covered("apps/wan22-train/tests/test_wan_cli.py"),
    (WAN, "wan22-train export --checkpoint runs/tiny/ckpt --out runs/tiny/export/transformer"): covered(
        "apps/wan22-train/tests/test_wan_cli.py"
    ),
    (WAN, "wan22-train export --checkpoint runs/tiny/ckpt --ema --out runs/tiny/export/ema"): covered(
        "apps/wan22-train/tests/test_wan_cli.py"
    ),
    (
        WAN,
        "wan22-train export --checkpoint runs/tiny/ckpt --layout native --out runs/tiny/export/high_noise_model",
    ): covered("apps/wan22-train/tests/test_wan_cli.py"),
    (WAN, "wan22-train plot runs/tiny/ckpt"): covered("apps/wan22-train/tests/test_wan_cli.py"),
    (
        WAN,
        'wan22-train sample --checkpoint runs/tiny/ckpt --prompt "a green circle moving left" --out runs/tiny/clip.mp4',
    ): covered("apps/wan22-train/tests/test_wan_cli.py"),
    (
        WAN,
        "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_t2v_lora.yaml",
    ): covered("apps/wan22-train/tests/test_wan_lora_e2e.py"),
    (
        WAN,
        "wan22-train export --checkpoint runs/tiny_lora/ckpt --lora peft --out runs/tiny_lora/peft",
    ): covered("apps/wan22-train/tests/test_wan_lora_e2e.py"),
    (
        WAN,
        "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_t2v_both.yaml",
    ): covered("apps/wan22-train/tests/test_wan_modes_readme.py"),
    (
        WAN,
        "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_t2v_distill.yaml",
    ): covered("apps/wan22-train/tests/test_wan_modes_readme.py"),
    (WAN, "wan22-train export --checkpoint runs/tiny/ckpt_distill --out runs/tiny/export/student"): covered(
        "apps/wan22-train/tests/test_wan_modes_readme.py"
    ),
    (
        WAN,
        'wan22-train sample --checkpoint runs/tiny/ckpt_distill --steps 4 --prompt "a red circle moving up" '
        "--out runs/tiny/student.mp4",
    ): covered("apps/wan22-train/tests/test_wan_modes_readme.py"),
    (
        WAN,
        "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_t2v_both_distill.yaml",
    ): covered("apps/wan22-train/tests/test_wan_modes_readme.py"),
    (WAN, "wan22-train make-pairs runs/tiny --target 1 0 0"): covered(
        "apps/wan22-train/tests/test_wan_modes_readme.py"
    ),
    (
        WAN,
        "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_dpo.yaml",
    ): covered("apps/wan22-train/tests/test_wan_modes_readme.py"),
    (
        WAN,
        "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_grpo.yaml",
    ): covered("apps/wan22-train/tests/test_wan_modes_readme.py"),
    (
        WAN,
        "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_nft.yaml",
    ): covered("apps/wan22-train/tests/test_wan_modes_readme.py"),
    (WAN, "wan22-train preprocess --config apps/wan22-train/configs/tiny_t2v_cached.yaml"): covered(
        "apps/wan22-train/tests/test_wan_conditions_e2e.py"
    ),
    (
        WAN,
        "torchrun --nproc-per-node 2 -m wan22_train --config apps/wan22-train/configs/tiny_t2v_cached.yaml",
    ): covered("apps/wan22-train/tests/test_wan_conditions_e2e.py"),
    (
        WAN,
        "wan22-train --config apps/wan22-train/configs/t2v_a14b_high.yaml --dry-run --world-size 8",
    ): NO_PLAN,
    (
        WAN,
        "wan22-train plan --config apps/wan22-train/configs/t2v_a14b_high_cached.yaml --world-size 8 --device h200",
    ): covered("apps/wan22-train/tests/test_wan_plan.py"),
    (
        WAN,
        "wan22-train plan --config apps/wan22-train/configs/t2v_a14b_high.yaml --world-size 8 --device h200",
    ): excused(
        "a 20 s trace; test_wan_plan.py plans the same 14B expert end to end from the README (on its cached "
        "config: the same step without the VAE and UMT5 passes), tests/test_planner.py the planner's parts"
    ),
    (
        WAN,
        "wan22-train plan --config apps/wan22-train/configs/t2v_a14b_high.yaml --world-size 8 --device h100 --search",
    ): excused("minutes (12 traces); tests/test_planner.py runs --search on the toy plugin"),
    (
        WAN,
        "torchrun --standalone --nproc-per-node 8 -m wan22_train preprocess --config apps/wan22-train/configs/t2v_a14b_high_cached.yaml",
    ): excused(
        "8 ranks and the 14B release; test_wan_conditions_e2e.py runs `preprocess` under 2 ranks (UMT5 FSDP2-"
        "sharded) to the cache one process writes"
    ),
    (LTX2, "hatch run wheels"): PACKAGING,
    (LTX2, "pip install --find-links dist ltx2-train"): PACKAGING,
    (LTX2, "ltx2-train --help"): RUN,
    (LTX2, "ltx2-train make-tiny runs/ltx2_tiny"): covered("apps/ltx2-train/tests/test_ltx2_preprocess.py"),
    (LTX2, "ltx2-train make-tiny runs/ltx2_tiny --single-file"): covered(
        "apps/ltx2-train/tests/test_ltx2_train_e2e.py"
    ),
    (LTX2, "ltx2-train make-tiny runs/ltx2_tiny_23 --release 2.3"): covered(
        "apps/ltx2-train/tests/test_ltx2_release_e2e.py"
    ),
    (LTX2, "ltx2-train make-tiny runs/ltx2_tiny_25 --release 2.5"): covered(
        "apps/ltx2-train/tests/test_ltx2_release_e2e.py"
    ),
    (LTX2, "ltx2-train preprocess --config apps/ltx2-train/configs/tiny_t2av.yaml"): excused(
        "its code path (ltx2_train.preprocess.run_preprocess, as 2 ranks) builds the tests' tiny cache "
        "(apps/ltx2-train/tests/conftest.py tiny_cache), not from this argv"
    ),
    (
        LTX2,
        "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av.yaml",
    ): excused(
        "test_ltx2_train_e2e.py launches this config under torchrun (ltx2_train_torchrun), on the tests' "
        "model set and cache, not from this argv"
    ),
    (LTX2, "torchrun ... -m ltx2_train --config X.yaml"): excused(
        "a placeholder for the line above run again; test_ltx2_train_e2e.py checks the resume"
    ),
    (
        LTX2,
        "ltx2-train export --checkpoint runs/ltx2_tiny/ckpt --out runs/ltx2_tiny/export/transformer",
    ): covered("apps/ltx2-train/tests/test_ltx2_train_e2e.py"),
    (
        LTX2,
        "ltx2-train export --checkpoint runs/ltx2_tiny/ckpt --ema --out runs/ltx2_tiny/export/ema",
    ): excused(
        "needs a run trained with training.ema (the README says so); `export --ema` of the same mm-checkpoint "
        "exporter runs in apps/wan22-train/tests/test_wan_cli.py"
    ),
    (
        LTX2,
        'ltx2-train sample --checkpoint runs/ltx2_tiny/ckpt --prompt "a red circle moving up" --out runs/ltx2_tiny/sample.mp4',
    ): covered("apps/ltx2-train/tests/test_ltx2_train_e2e.py"),
    (
        LTX2,
        "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av_lora.yaml",
    ): excused(
        "test_ltx2_lora_e2e.py trains this config (its paths moved to the tests' model set and cache) on 2 gloo "
        "ranks through the Trainer, 4 steps (the torchrun launch of the app: test_ltx2_train_e2e.py)"
    ),
    (
        LTX2,
        "ltx2-train export --checkpoint runs/ltx2_tiny/ckpt_lora --lora peft --out runs/ltx2_tiny/export/lora",
    ): covered("apps/ltx2-train/tests/test_ltx2_lora_e2e.py"),
    (
        LTX2,
        "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av_lora.yaml "
        "model.lora.init_from=runs/ltx2_tiny/export/ltx2_lora.safetensors training.save=runs/ltx2_tiny/ckpt_lora_cont",
    ): excused(
        "test_ltx2_lora_e2e.py starts a run from the exported official file with this override "
        "(model.lora.init_from) through the Trainer on one gloo rank and checks their first forward, not "
        "this argv (the torchrun launch of the app: test_ltx2_train_e2e.py)"
    ),
    (
        LTX2,
        "ltx2-train export --checkpoint runs/ltx2_tiny/ckpt_lora --lora comfyui "
        "--out runs/ltx2_tiny/export/ltx2_lora.safetensors",
    ): covered("apps/ltx2-train/tests/test_ltx2_lora_e2e.py"),
    (
        LTX2,
        "ltx2-train export --checkpoint runs/ltx2_tiny/ckpt --layout native --out runs/ltx2_tiny/export/ltx2.safetensors",
    ): covered("apps/ltx2-train/tests/test_ltx2_official_single_file.py"),
    (
        LTX2,
        "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av_extension.yaml",
    ): covered("apps/ltx2-train/tests/test_ltx2_modes_e2e.py"),
    **{
        (
            LTX2,
            "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av.yaml "
            f"model.pipeline.{key} training.save=runs/ltx2_tiny/{save}",
        ): covered("apps/ltx2-train/tests/test_ltx2_modes_e2e.py")
        for key, save in (
            ("frozen_modality=audio", "ckpt_video_only"),
            ("frozen_modality=video", "ckpt_audio_only"),
            ("audio_timesteps=independent", "ckpt_independent"),
            # A2V, V2A, audio extension: 2 steps each on one rank, the three runs in one process, no
            # checkpoint written (what the mode means is checked in the transformer's inputs and the metrics)
            ("condition_modality=audio", "ckpt_a2v"),
            ("condition_modality=video", "ckpt_v2a"),
            ("audio_conditioning_frames=4", "ckpt_audio_extension"),
        )
    },
    **dict.fromkeys(
        [
            (LTX2, "ltx2-train preprocess --config apps/ltx2-train/configs/tiny_t2av_ic_lora.yaml"),
            (
                LTX2,
                "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config "
                "apps/ltx2-train/configs/tiny_t2av_ic_lora.yaml",
            ),
            (
                LTX2,
                'ltx2-train sample --checkpoint runs/ltx2_tiny/ckpt_ic_lora --prompt "a red circle moving up" '
                "--reference runs/ltx2_tiny/data/references/clip_0000.mp4 --out runs/ltx2_tiny/sample_ic_lora.mp4",
            ),
        ],
        covered("apps/ltx2-train/tests/test_ltx2_modes_e2e.py"),
    ),
    (LTX2, "ltx2-train preprocess --config apps/ltx2-train/configs/tiny_t2av_distill.yaml"): excused(
        "the distillation config's data section is tiny_t2av.yaml's (apps/ltx2-train/tests/test_ltx2_distill.py "
        "checks it), whose preprocess builds the tests' tiny cache (conftest tiny_cache)"
    ),
    (
        LTX2,
        "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config apps/ltx2-train/configs/tiny_t2av_distill.yaml",
    ): excused(
        "test_ltx2_distill_e2e.py runs this config on 2 forked gloo ranks through ltx2-train's main (the "
        "torchrun launch of the app: test_ltx2_train_e2e.py)"
    ),
    (
        LTX2,
        "ltx2-train export --checkpoint runs/ltx2_tiny/ckpt_distill --out runs/ltx2_tiny/export_distill/transformer",
    ): covered("apps/ltx2-train/tests/test_ltx2_distill_e2e.py"),
    (
        LTX2,
        'ltx2-train sample --checkpoint runs/ltx2_tiny/ckpt_distill --steps 4 --prompt "a red circle moving up" '
        "--out runs/ltx2_tiny/sample_distill.mp4",
    ): covered("apps/ltx2-train/tests/test_ltx2_distill_e2e.py"),
    (LTX2, "ltx2-train preprocess --config apps/ltx2-train/configs/tiny_t2av_grpo.yaml"): excused(
        "the reward configs' data section is tiny_t2av.yaml's (apps/ltx2-train/tests/test_ltx2_reward_modes_e2e.py "
        "checks it), whose preprocess builds the tests' tiny cache (conftest tiny_cache)"
    ),
    **dict.fromkeys(
        [
            (
                LTX2,
                "torchrun --standalone --nproc-per-node 2 -m ltx2_train --config "
                f"apps/ltx2-train/configs/tiny_t2av_{mode}.yaml",
            )
            for mode in ("grpo", "nft")
        ],
        covered("apps/ltx2-train/tests/test_ltx2_reward_modes_e2e.py"),
    ),
    (LTX2, "ltx2-train --config apps/ltx2-train/configs/t2av.yaml --dry-run --world-size 8"): NO_PLAN,
    (
        LTX2,
        "ltx2-train --config apps/ltx2-train/configs/tiny_t2av.yaml training.micro_batch_size=16 data.drop_last=false "
        "training.train_iters=200 training.lr_scheduler=cosine training.lr_warmup_iters=20 "
        "parallel.ulysses_parallel_size=1 training.save=runs/ltx2_tiny/learned",
    ): excused(
        "apps/ltx2-train/tests/test_ltx2_configs.py ties this line to ltx2_train.tiny.LEARN_TRAINING, which "
        "test_ltx2_train_e2e.py trains (its learned fixture)"
    ),
    (
        LTX2,
        'ltx2-train sample --checkpoint runs/ltx2_tiny/learned --prompt "A red circle slides up across a dark grey '
        'background." --out runs/ltx2_tiny/learned/sample.mp4',
    ): excused(
        "test_ltx2_train_e2e.py samples every training caption of the learned run (sample_clip, the command's "
        "code path)"
    ),
    (LTX2, "ltx2-train plan --config apps/ltx2-train/configs/t2v.yaml --world-size 8 --device h200"): excused(
        "a 77-110 s trace of the 19B model; apps/ltx2-train/tests/test_ltx2_planning.py checks its planning "
        "batch, apps/wan22-train/tests/test_wan_plan.py runs the same planner end to end"
    ),
    (
        LTX2,
        "ltx2-train plan --config apps/ltx2-train/configs/t2av_25.yaml --world-size 8 --device h200",
    ): excused(
        "a trace of the 19B LTX-2.5 model (26-33 min on busy CPUs); apps/ltx2-train/tests/test_ltx2_configs.py "
        "checks the config is 2.5's transformer, apps/wan22-train/tests/test_wan_plan.py runs the planner end to end"
    ),
    (
        LTX2,
        "ltx2-train plan --config apps/ltx2-train/configs/t2av_25.yaml --world-size 16 --device h200",
    ): excused("the line above at 16 ranks"),
    (QWEN, "hatch run wheels"): PACKAGING,
    (QWEN, "pip install --find-links dist qwen-vl-train"): PACKAGING,
    (QWEN, "qwen-vl-train --help"): RUN,
    (QWEN, "qwen-vl-train make-tiny runs/qwen_vl_tiny"): excused(
        "apps/qwen-vl-train/tests/conftest.py builds the tests' tiny folder with make_tiny, the command's code path"
    ),
    (
        QWEN,
        "torchrun --standalone --nproc-per-node 2 -m qwen_vl_train --config apps/qwen-vl-train/configs/tiny_sft.yaml",
    ): excused(
        "test_qwen_vl_train_e2e.py launches tiny_sft.yaml (pointed at the tests' folder) under torchrun"
    ),
    (
        QWEN,
        "qwen-vl-train export --checkpoint runs/qwen_vl_tiny/ckpt --out runs/qwen_vl_tiny/export",
    ): covered("apps/qwen-vl-train/tests/test_qwen_vl_train_e2e.py"),
    (
        QWEN,
        "qwen-vl-train --config apps/qwen-vl-train/configs/qwen2_5_vl_7b_sft.yaml --dry-run --world-size 8",
    ): RUN,
}


MAINS = {"wan22-train": "wan22_train.cli", "ltx2-train": "ltx2_train.cli", "qwen-vl-train": "qwen_vl_train.cli",
         "mm-config": "mm_config.cli"}  # fmt: skip
"""Console script -> the module whose ``main(argv)`` it runs (imported when a line needs it)."""


def _main(program: str) -> Callable[[list[str]], int]:
    return importlib.import_module(MAINS[program]).main


def test_each_readme_line_has_one_entry_and_each_entry_its_line(readme):
    lines = {(name, line) for name in READMES for line in readme.lines(name)}
    assert sorted(lines - COMMANDS.keys()) == [], "README lines with no entry in COMMANDS"
    assert sorted(COMMANDS.keys() - lines) == [], "COMMANDS entries whose line is no longer in the README"


@pytest.mark.parametrize(("name", "line"), [k for k, v in COMMANDS.items() if v.kind == "covered"])
def test_a_covered_line_is_named_by_the_test_that_runs_it(name, line):
    source = (REPO / COMMANDS[name, line].detail).read_text()
    assert "readme.command(" in source, f"{COMMANDS[name, line].detail} takes no command from a README"
    assert repr(line) in source or f'"{line}"' in source, (
        f"{COMMANDS[name, line].detail} does not name {line!r}"
    )


def test_the_hatch_demo_script_is_the_wan_demo():
    scripts = tomllib.loads((REPO / "hatch.toml").read_text())["envs"]["default"]["scripts"]
    assert scripts["demo"] == ["sync", "wan22-train demo {args}"]


@pytest.mark.parametrize(("name", "line"), [k for k, v in COMMANDS.items() if v.kind == "run"])
def test_a_readme_line_runs(name, line, readme, monkeypatch, capsys, tmp_path):
    how = COMMANDS[name, line]
    paths = {old: REPO / new for old, new in how.paths}
    argv = readme.command(name, line, paths=paths) + list(how.shortened)
    if argv[:2] == ["hatch", "run"]:
        argv = argv[2:]  # hatch's environment is this one
    monkeypatch.chdir(tmp_path if how.in_tmp else readme.workdir(name))
    try:
        code = _main(argv[0])(argv[1:])
    except SystemExit as exit_:  # --help
        code = exit_.code
    out = capsys.readouterr()
    assert code in (0, None), out.err[-3000:]
    assert out.out.strip(), f"{line} printed nothing"


@pytest.mark.parametrize("name", READMES)
def test_a_readme_names_where_its_commands_run_and_hatch_works_there(name, readme):
    # hatch.toml's header: in a member folder `hatch run` builds that member's own environment (the Wan
    # README's `hatch run wheels`, run from apps/wan22-train as it once said, failed to resolve mm-checkpoint)
    workdir = readme.workdir(name)
    assert workdir.is_dir()
    hatch_lines = [line for line in readme.lines(name) if "hatch run " in line]
    assert not hatch_lines or (workdir / "hatch.toml").is_file(), (
        f"{name}: {hatch_lines} run where hatch fails"
    )


def test_the_files_a_readme_line_names_exist_where_its_readme_runs_it(readme):
    missing = [
        (name, line, arg)
        for name in READMES
        for line in readme.lines(name)
        for arg in shlex.split(line)
        if arg.endswith(READ_FILES)
        and arg not in PLACEHOLDER_FILES
        and not (readme.workdir(name) / arg).is_file()
    ]
    assert missing == []


def _read_paths(node: object, key: str = "") -> Iterator[str]:
    """Every string of a config but ``training.save`` (what the run writes, anywhere)."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for name, value in node.items():
            if f"{key}.{name}" != ".training.save":
                yield from _read_paths(value, f"{key}.{name}")
    elif isinstance(node, list):
        for value in node:
            yield from _read_paths(value, key)


def _made_tiny(line: str) -> str | None:
    argv = shlex.split(line)
    return argv[argv.index("make-tiny") + 1] if "make-tiny" in argv else None


def _tiny_config(line: str) -> str | None:
    argv = shlex.split(line)
    config = argv[argv.index("--config") + 1] if "--config" in argv else None
    return config if config and Path(config).name.startswith("tiny_") else None


@pytest.mark.parametrize("name", READMES)
def test_the_runs_folders_a_readmes_tiny_configs_read_are_those_its_make_tiny_lines_write(name, readme):
    # relative paths read from the working directory: the README's make-tiny line and the tiny configs
    # its lines train must agree on the folder (runs/tiny, runs/ltx2_tiny, runs/qwen_vl_tiny)
    made = {folder for line in readme.lines(name) if (folder := _made_tiny(line))}
    configs = {config for line in readme.lines(name) if (config := _tiny_config(line))}
    unmade = {
        (config, value)
        for config in configs
        for value in _read_paths(yaml.safe_load((readme.workdir(name) / config).read_text()))
        if value.startswith("runs/") and not any(value == f or value.startswith(f"{f}/") for f in made)
    }
    assert configs and made, f"{name} trains no tiny config, or makes no tiny set"
    assert unmade == set()
