"""What both apps' preprocess commands share: the ``run`` keys reach the cache writer, encoders load once in
their dtype, the text encoder is sharded when large, the weights are identified by their bytes, the cache
records its section's keys and a training run is checked against them (docs/DESIGN.md "Latent cache")."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mm_config import ConfigModel, PreprocessRunConfig
from mm_data import CacheIndex, CacheMismatchError, VideoTextDataset, make_synthetic_dataset
from mm_trainer import (
    FSDP_AUTO_BYTES,
    check_cache_made_as_configured,
    data_register,
    load_frozen,
    preprocess_recipe,
    register_preprocess_section,
    use_text_encoder_fsdp,
    weights_identity,
    write_latent_cache,
)

transformers = pytest.importorskip("transformers")

READ = {"num_frames": 5, "height": 16, "width": 16, "frame_offset": "start"}


class PidDataset(VideoTextDataset):
    """Records which process decoded each clip."""

    def sample(self, index: int) -> dict:
        return {**super().sample(index), "decoded_by": os.getpid()}


def encoder(pids: list[int]):
    def encode(item: dict) -> dict:
        pids.append(item["decoded_by"])
        return {"latents": item["video"].mean(dim=0)}

    return encode


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    return make_synthetic_dataset(
        tmp_path_factory.mktemp("clips"), num_clips=4, sizes=[(16, 16)], num_frames=5
    )


def test_the_run_keys_reach_the_cache_writer(clips, tmp_path, monkeypatch):
    import mm_data.cache_encode as cache_encode

    loaders = []
    monkeypatch.setattr(
        cache_encode,
        "DataLoader",
        lambda *a, **kw: loaders.append(kw) or torch.utils.data.DataLoader(*a, **kw),
    )
    dataset, pids = PidDataset(clips, **READ), []
    run = PreprocessRunConfig(shard_size=1, decode_workers=1, prefetch=3)
    report = write_latent_cache(
        dataset, encoder(pids), tmp_path / "a", run=run, identity={}, uses_prompt=False
    )
    assert len(CacheIndex.load(tmp_path / "a").shards) == len(report.computed) == 4
    assert loaders[-1]["prefetch_factor"] == 3 and os.getpid() not in pids  # decoded in a worker

    pids.clear()
    run = PreprocessRunConfig(shard_size=64, decode_workers=0)
    write_latent_cache(dataset, encoder(pids), tmp_path / "b", run=run, identity={}, uses_prompt=False)
    assert len(CacheIndex.load(tmp_path / "b").shards) == 1 and set(pids) == {os.getpid()}


def test_vae_tiling_is_in_every_samples_key(clips, tmp_path):
    dataset = PidDataset(clips, **READ)

    def write(run: PreprocessRunConfig):
        return write_latent_cache(dataset, encoder([]), tmp_path, run=run, identity={}, uses_prompt=False)

    write(PreprocessRunConfig(decode_workers=0))
    assert write(PreprocessRunConfig(decode_workers=0, vae_tiling=True)).computed == [0, 1, 2, 3]
    assert write(PreprocessRunConfig(decode_workers=0, vae_tiling=True, vae_tile=64)).computed == [0, 1, 2, 3]
    assert write(PreprocessRunConfig(decode_workers=0, vae_tiling=True, vae_tile=64)).computed == []


def test_text_encoder_fsdp_auto_shards_only_a_large_encoder_over_several_ranks(tmp_path):
    small, large = tmp_path / "small", tmp_path / "large"
    for folder, size in ((small, 1000), (large, FSDP_AUTO_BYTES + 1)):
        folder.mkdir()
        with open(folder / "model.safetensors", "wb") as f:
            f.truncate(size)  # sparse: the size is what counts
    assert use_text_encoder_fsdp("auto", weights=large, world_size=2)
    assert not use_text_encoder_fsdp("auto", weights=large, world_size=1)
    assert not use_text_encoder_fsdp("auto", weights=small, world_size=8)
    assert use_text_encoder_fsdp(True, weights=small, world_size=1) and not use_text_encoder_fsdp(
        False, weights=large, world_size=8
    )


def test_a_frozen_encoder_loads_once_in_its_dtype(tmp_path):
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    reference = transformers.Qwen2ForCausalLM(config)
    reference.save_pretrained(tmp_path)
    args = SimpleNamespace(model_id="hf_causal_lm", from_pretrained=str(tmp_path), checkpoint_path=None, meta_init=False,
                           dtype="bf16", config={}, load_format="auto", weight_transform=None,
                           checkpoint_conversion_dir=None)  # fmt: skip
    model = load_frozen(args, device=torch.device("cpu"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16} and not any(
        p.requires_grad for p in model.parameters()
    )
    want = reference.state_dict()
    assert all(torch.equal(v, want[k].to(torch.bfloat16)) for k, v in model.state_dict().items() if k in want)


def test_a_frozen_encoder_that_loads_nothing_is_refused(monkeypatch):
    import mm_trainer.data.frozen_encoders as frozen

    monkeypatch.setattr(
        frozen.ModelHub, "build", lambda args, meta_init: torch.nn.Linear(2, 2, device="meta")
    )
    with pytest.raises(FileNotFoundError, match="text encoder: no weights loaded from '/nowhere'"):
        load_frozen(
            SimpleNamespace(from_pretrained="/nowhere"), device=torch.device("cpu"), what="text encoder"
        )


def _sharded_logits(rank: int, world_size: int, folder: str) -> torch.Tensor:
    from mm_trainer import shard_frozen

    model = transformers.Qwen2ForCausalLM.from_pretrained(folder).eval()
    sharded = shard_frozen(model, blocks="*layers.{*}", device=torch.device("cpu"))
    local = [p.to_local().numel() for p in sharded.parameters()]
    ids = torch.arange(9)[None] % 64
    with torch.no_grad():
        return sharded(input_ids=ids).logits, sum(local)


@pytest.mark.slow
def test_a_text_encoder_sharded_over_two_ranks_computes_what_the_whole_one_does(tmp_path, distributed):
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    whole = transformers.Qwen2ForCausalLM(config).eval()
    whole.save_pretrained(tmp_path)
    with torch.no_grad():
        want = whole(input_ids=torch.arange(9)[None] % 64).logits
    results = distributed(_sharded_logits, 2, str(tmp_path))
    total = sum(p.numel() for p in whole.parameters())
    for logits, local in results:
        torch.testing.assert_close(logits, want, rtol=0, atol=0)
        assert local < total  # each rank holds a shard


def test_weights_rewritten_in_place_with_their_size_and_mtime_kept_get_another_digest(tmp_path):
    weights = tmp_path / "vae"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    tensor = weights / "model.safetensors"
    tensor.write_bytes(b"a" * 4096)
    first = weights_identity(tmp_path / "cache", {"ae": weights, "none": None})
    before = tensor.stat()
    tensor.write_bytes(b"b" * 4096)
    os.utime(tensor, ns=(before.st_atime_ns, before.st_mtime_ns))  # what rsync -t, tar and cp -p leave
    second = weights_identity(tmp_path / "cache", {"ae": weights, "none": None})
    assert second["ae"] != first["ae"] and second["none"] is first["none"] is None


class ToySection(ConfigModel):
    """A preprocess section: what is read, how it is encoded, how the run goes."""

    source: str
    height: int = 16
    encoder: dict = {}
    device: str | None = None
    run: PreprocessRunConfig = PreprocessRunConfig()


def test_the_recipe_holds_every_key_of_the_section_but_those_that_only_say_how_the_preprocess_runs():
    section = ToySection(source="m.json", encoder={"dtype": "bf16", "tiles": {"size": 64}}, device="cpu",
                         run=PreprocessRunConfig(shard_size=8, decode_workers=4, prefetch=3, text_encoder_fsdp=True))  # fmt: skip
    pre = "data.dataset.preprocess"
    assert preprocess_recipe(section) == {
        f"{pre}.source": "m.json", f"{pre}.height": 16, f"{pre}.encoder.dtype": "bf16",
        f"{pre}.encoder.tiles.size": 64, f"{pre}.run.vae_tiling": False,
    }  # fmt: skip
    tiled = section.model_copy(update={"run": PreprocessRunConfig(vae_tiling=True, vae_tile=128)})
    assert preprocess_recipe(tiled)[f"{pre}.run.vae_tile"] == 128


@data_register("toy_cache_check")
def _toy_cache_dataset(**kwargs):  # pragma: no cover - only its registration is used
    raise AssertionError("not built: the check runs before any dataset")


register_preprocess_section("toy_cache_check", ToySection)


def test_a_run_whose_section_differs_from_what_its_cache_records_is_refused_naming_the_key(clips, tmp_path):
    section = {"source": str(clips), "height": 16}
    report = write_latent_cache(PidDataset(clips, **READ), encoder([]), tmp_path, run=PreprocessRunConfig(decode_workers=0),
                                identity={}, uses_prompt=False, recipe=preprocess_recipe(ToySection(**section)))  # fmt: skip
    assert len(report.computed) == 4

    def data(**changes) -> SimpleNamespace:
        return SimpleNamespace(dataset_id="toy_cache_check", data_path=str(tmp_path),
                               dataset={"preprocess": {**section, **changes}})  # fmt: skip

    check_cache_made_as_configured(data())
    check_cache_made_as_configured(data(device="cpu", run={"decode_workers": 7}))  # how it runs: not compared
    with pytest.raises(
        CacheMismatchError,
        match=r"data.dataset.preprocess.height: the cache was made with 16, this run says 32",
    ):
        check_cache_made_as_configured(data(height=32))
    check_cache_made_as_configured(
        SimpleNamespace(dataset_id="toy_cache_check", data_path=str(tmp_path), dataset={})
    )
