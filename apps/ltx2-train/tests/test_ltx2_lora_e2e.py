"""LoRA on tiny LTX-2 (``configs/tiny_t2av_lora.yaml``), 2 gloo ranks (FSDP2 + Ulysses 2): the PEFT file of
the README's ``export --lora peft`` and the official-format file of ``export --lora comfyui``, each loaded
by ``LTX2Pipeline.load_lora_weights``, and the merged folder loaded by ``LTX2VideoTransformer3DModel``
compute the trained model's outputs."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

pytestmark = pytest.mark.slow

LORA = {
    "target_modules": [
        "transformer_blocks.{*}.*attn*.to_?",
        "transformer_blocks.{*}.*attn*.to_out.0",
        "transformer_blocks.{*}.*ff.net.2",
    ],
    "rank": 4,
    "alpha": 8,  # scale 2: an export that loses alpha computes something else
}
README = "apps/ltx2-train/README.md"
EXPORT_PEFT = (
    "ltx2-train export --checkpoint runs/ltx2_tiny/ckpt_lora --lora peft --out runs/ltx2_tiny/export/lora"
)
EXPORT_COMFYUI = "ltx2-train export --checkpoint runs/ltx2_tiny/ckpt_lora --lora comfyui --out runs/ltx2_tiny/export/ltx2_lora.safetensors"


def test_the_tiny_lora_config_adapts_what_this_file_checks(lora_config):
    assert yaml.safe_load(lora_config.read_text())["model"]["lora"] == LORA


def _train(rank: int, world: int, config: str, overrides: list[str], inputs: dict) -> dict:
    from mm_config import load_config
    from mm_trainer import Trainer

    trainer = Trainer(load_config(config, overrides, world_size=world))
    trainer.train()
    with torch.no_grad():
        video, audio = trainer.model.model(**inputs, return_dict=False)
    trainer.run_dir.release()
    return {"video": video, "audio": audio}


def _started(rank: int, world: int, config: str, overrides: list[str], inputs: dict) -> dict:
    """The outputs of a run's transformer as built, before any step (a run started from a LoRA file)."""
    from mm_config import load_config
    from mm_trainer import Trainer

    trainer = Trainer(load_config(config, overrides, world_size=world))
    with torch.no_grad():
        video, audio = trainer.model.model(**inputs, return_dict=False)
    trainer.run_dir.release()
    return {"video": video, "audio": audio}


def _pipeline(cache, transformer):
    """``LTX2Pipeline`` of the tiny components around ``transformer`` (what ``load_lora_weights`` adapts)."""
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2Pipeline,
    )
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
    from transformers import AutoTokenizer, Gemma3TextModel

    return LTX2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=AutoencoderKLLTX2Video.from_pretrained(cache / "vae"),
        audio_vae=AutoencoderKLLTX2Audio.from_pretrained(cache / "audio_vae"),
        text_encoder=Gemma3TextModel.from_pretrained(cache / "text_encoder"),
        tokenizer=AutoTokenizer.from_pretrained(cache / "tokenizer"),
        connectors=LTX2TextConnectors.from_pretrained(cache / "connectors"),
        transformer=transformer,
        vocoder=None,  # the tiny set has none; the transformer is what the LoRA adapts
    )


def test_lora_peft_comfyui_and_merged_exports_compute_the_trained_outputs(
    tiny_cache, run_config, lora_config, one_token_inputs, tmp_path, distributed, readme
):
    from diffusers import LTX2VideoTransformer3DModel
    from ltx2_train.cli import main as ltx2_main
    from ltx2_train.export import export_transformer_lora
    from mm_trainer import load_run_config
    from safetensors.torch import load_file

    save = tmp_path / "ckpt"
    config = run_config(
        tiny_cache, lora_config, train_iters=4, save_interval=4, deterministic=True, save=str(save)
    )
    ours = distributed(_train, 2, str(config), [], one_token_inputs(), timeout=600)[0]
    losses = [json.loads(line)["loss"] for line in (save / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    run = load_run_config(save)

    # PEFT: LTX2Pipeline.load_lora_weights on a pipeline of the tiny components.
    paths = {"runs/ltx2_tiny/ckpt_lora": save, "runs/ltx2_tiny/export/lora": tmp_path / "peft"}
    assert ltx2_main(readme.command(README, EXPORT_PEFT, paths=paths)[1:]) == 0
    peft_dir = tmp_path / "peft"

    def base():
        return LTX2VideoTransformer3DModel.from_pretrained(tiny_cache / "transformer").eval()

    pipe = _pipeline(tiny_cache, base())
    pipe.load_lora_weights(str(peft_dir))

    # ComfyUI / the official trainer's file: official module names, read through diffusers' LTX-2 conversion.
    paths["runs/ltx2_tiny/export/ltx2_lora.safetensors"] = tmp_path / "ltx2_lora.safetensors"
    assert ltx2_main(readme.command(README, EXPORT_COMFYUI, paths=paths)[1:]) == 0
    comfy = load_file(tmp_path / "ltx2_lora.safetensors")
    assert "diffusion_model.transformer_blocks.0.attn1.to_q.lora_A.weight" in comfy
    assert all(k.startswith("diffusion_model.") and ".lora_" in k for k in comfy)
    comfy_pipe = _pipeline(tiny_cache, base())
    comfy_pipe.load_lora_weights(str(tmp_path / "ltx2_lora.safetensors"))
    merged = export_transformer_lora(run, save, tmp_path / "merged", fmt="merged")
    exported = LTX2VideoTransformer3DModel.from_pretrained(merged).eval()
    with torch.no_grad():
        for model in (pipe.transformer, comfy_pipe.transformer, exported):
            video, audio = model(**one_token_inputs(), return_dict=False)
            torch.testing.assert_close(video, ours["video"], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(audio, ours["audio"], rtol=1e-5, atol=1e-5)
        # a new run started from the official file (model.lora.init_from; the PEFT layout reads through the same
        # mm_checkpoint.read_lora_file, tests/test_lora_files.py) computes the trained outputs before any step
        overrides = [f"model.lora.init_from={tmp_path / 'ltx2_lora.safetensors'}", "parallel.ulysses_parallel_size=1",
                     f"training.save={tmp_path / 'from_official'}"]  # fmt: skip
        started = distributed(_started, 1, str(config), overrides, one_token_inputs(), timeout=300)[0]
        torch.testing.assert_close(started["video"], ours["video"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(started["audio"], ours["audio"], rtol=1e-5, atol=1e-5)
        untrained = LTX2VideoTransformer3DModel.from_pretrained(tiny_cache / "transformer").eval()
        assert not torch.allclose(
            untrained(**one_token_inputs(), return_dict=False)[0], ours["video"], atol=1e-4
        )


def _refusal(rank: int, world: int, config: str, overrides: list[str]) -> tuple[str, str, int | None, float]:
    """What building the run raises: its class, message, exit code (a user error's) and the seconds it took."""
    import time

    from mm_config import load_config
    from mm_trainer import Trainer
    from mm_trainer.run.user_errors import user_error_class

    start = time.perf_counter()
    try:
        Trainer(load_config(config, overrides, world_size=world))
    except Exception as exc:  # noqa: BLE001 - the test asserts which one
        kind = user_error_class(exc)
        return type(exc).__name__, str(exc), kind and kind.exit_code, time.perf_counter() - start
    return "nothing raised", "", None, time.perf_counter() - start


def test_a_lora_file_of_another_release_is_refused_before_the_base_weights_are_read(
    tiny_cache, run_config, lora_config, tmp_path, distributed
):
    """The file's header against the transformer built on meta, before any weight: the run's base weights
    file here has no safetensors header, so a run that read it before checking the LoRA file would fail on
    it (a CheckpointFormatError) instead."""
    import shutil

    from mm_checkpoint import CheckpointFormatError, open_weights
    from safetensors.torch import save_file

    # an LTX-2.3 LoRA adapts the gate of 2.3's gated attention (to_gate_logits), which a 2.0 transformer
    # does not have: written in the official layout, as the official trainer would
    file = tmp_path / "ltx23_lora.safetensors"
    gate = "diffusion_model.transformer_blocks.0.attn1.to_gate_logits"
    save_file(
        {f"{gate}.lora_A.weight": torch.zeros(4, 384), f"{gate}.lora_B.weight": torch.zeros(4, 4)}, file
    )
    base = tmp_path / "transformer"
    shutil.copytree(tiny_cache / "transformer", base)
    (weights,) = base.glob("*.safetensors")
    weights.write_bytes(b"\0" * 8)  # a header length of 0: unreadable
    with pytest.raises(CheckpointFormatError):
        open_weights(weights)
    config = run_config(tiny_cache, lora_config, save=str(tmp_path / "refused"))
    overrides = [
        f"model.lora.init_from={file}",
        f"model.from_pretrained={base}",
        "parallel.ulysses_parallel_size=1",
    ]
    name, message, exit_code, seconds = distributed(_refusal, 1, str(config), overrides, timeout=300)[0]
    assert (name, exit_code) == ("LoraFileError", 66), message
    assert f"model.lora.init_from={file}: its adapters do not fit this LTX-2.0 transformer" in message
    assert "transformer_blocks.0.attn1.to_gate_logits: no such adapted layer here" in message
    print(f"refused after {seconds:.2f} s")
