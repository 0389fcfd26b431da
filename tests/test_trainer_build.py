"""The trainer's build order and life-cycle contracts, in-process on real gloo groups."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from mm_pipelines import SampleRNG
from safetensors.torch import load_file

PLUGIN_DIR = str(Path(__file__).parent / "plugins")


def build_trainer(config_path: Path, world_size: int, *overrides: str):
    if PLUGIN_DIR not in sys.path:
        sys.path.insert(0, PLUGIN_DIR)
    from mm_config import load_config
    from mm_trainer import Trainer

    return Trainer(load_config(config_path, list(overrides), world_size=world_size))


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


@pytest.mark.slow
def test_features_sit_inside_fsdp_units_and_loaded_weights_survive_init(
    distributed, toy_yaml, toy_encoder_dir
):
    config = toy_yaml()
    source = load_file(toy_encoder_dir / "model.safetensors")

    def body(rank, world_size):
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor

        trainer = build_trainer(config, world_size)
        blocks = trainer.model.predictor.blocks
        assert all(isinstance(block, FSDPModule) for block in blocks)
        calls = []  # (block, its fc1 weight is a DTensor shard?, shape) at every fc1 forward
        for i, block in enumerate(blocks):
            block.fc1.register_forward_hook(
                lambda m, args, out, i=i: calls.append(
                    (i, isinstance(m.weight, DTensor), tuple(m.weight.shape))
                )
            )
        batch = trainer.batches.next_batch()
        rng = SampleRNG.for_batch(len(batch["sample_ids"]))
        trainer.model(rng=rng, **batch).loss.backward()
        encoder = trainer.model.text_encoder
        assert isinstance(encoder, FSDPModule)
        return sorted(calls), {k: full(v).clone() for k, v in encoder.state_dict().items()}

    for calls, loaded in distributed(body, 2):
        # recompute_plan blocks.{*} (block 0 offloaded too): every block runs again in backward, and
        # both runs see the unsharded weights, so the wrappers sit inside the FSDP units' hooks
        assert calls == [(i, False, (32, 32)) for i in range(3) for _ in range(2)]
        assert loaded.keys() == source.keys()
        for key, value in source.items():
            assert torch.equal(loaded[key], value), key


def test_a_failed_weight_load_raises_instead_of_random_init(distributed, toy_yaml, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    config = toy_yaml(model={"models": {"text_encoder": {"from_pretrained": str(broken)}}})

    def body(rank, world_size):
        try:
            build_trainer(config, world_size)
        except Exception as exc:  # noqa: BLE001
            return f"{type(exc).__name__}: {exc}"
        return "no error"

    (message,) = distributed(body, 1)
    assert "broken" in message and message != "no error"


@pytest.mark.slow
def test_frozen_submodels_stay_bitwise_and_in_eval_and_only_the_predictor_is_checkpointed(
    distributed, toy_yaml, toy_encoder_dir
):
    config = toy_yaml(training={"train_iters": 3, "save_interval": 3, "tensorboard": True})
    source = load_file(toy_encoder_dir / "model.safetensors")

    def body(rank, world_size):
        trainer = build_trainer(config, world_size)
        predictor_before = {k: full(v).clone() for k, v in trainer.model.predictor.state_dict().items()}
        trainer.train()
        encoder = trainer.model.text_encoder
        frozen_equal = all(torch.equal(full(v), source[k]) for k, v in encoder.state_dict().items())
        predictor_changed = any(
            not torch.equal(full(v), predictor_before[k])
            for k, v in trainer.model.predictor.state_dict().items()
        )
        return frozen_equal, encoder.training, trainer.model.predictor.training, predictor_changed

    for frozen_equal, encoder_training, predictor_training, predictor_changed in distributed(body, 2):
        assert frozen_equal and not encoder_training and predictor_training and predictor_changed

    from torch.distributed.checkpoint import FileSystemReader

    ckpt = config.parent / "ckpt"
    iter_dirs = sorted(ckpt.glob("iter_*"))
    keys = FileSystemReader(str(iter_dirs[-1])).read_metadata().state_dict_metadata.keys()
    model_keys = [k for k in keys if "predictor" in k or "text_encoder" in k]
    assert model_keys and all("text_encoder" not in k for k in model_keys)
    assert (ckpt / "config.yaml").is_file()
    assert list((ckpt / "tensorboard").glob("events.out.tfevents.*"))


def test_condition_micro_steps_without_a_pipeline_that_separates_encoding_is_refused_at_build(
    distributed, toy_yaml
):
    config = toy_yaml(
        model={"container_id": None}, features={"condition_micro_steps": 2}
    )  # plain container: no pipeline

    def body(rank, world_size):
        try:
            build_trainer(config, world_size)
        except ValueError as exc:
            return str(exc)
        return "no error"

    (message,) = distributed(body, 1)
    assert "features.condition_micro_steps=2 needs a pipeline that encodes conditions separately" in message


def test_a_ring_run_logs_its_attention_kernel_and_why_before_building(distributed, toy_yaml):
    import logging

    config = toy_yaml()

    def body(rank, world_size):
        seen: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda record: seen.append(record.getMessage())
        logging.getLogger("mm_trainer").addHandler(handler)
        with pytest.raises(
            ValueError, match="no sub-model defines setup_context_parallel"
        ):  # the toy has no CP
            build_trainer(config, world_size, "parallel.ring_attention_size=2")
        return [m for m in seen if m.startswith("ring attention kernel")]

    logged = distributed(body, 2)
    assert logged[0] == [
        "ring attention kernel: cpu_flash on cpu: auto: the fused kernel of cpu (torch's CPU flash kernel)"
    ]
    assert logged[1] == []  # rank 0 only


def test_a_ring_kernel_that_does_not_run_on_the_device_stops_the_run_naming_both(distributed, toy_yaml):
    config = toy_yaml()

    def body(rank, world_size):
        with pytest.raises(ValueError, match=r"'flash' runs on \['cuda'\], not on this run's device 'cpu'"):
            build_trainer(
                config, world_size, "parallel.ring_attention_size=2", "parallel.attention_backend=flash"
            )
        return True

    assert all(distributed(body, 2))
