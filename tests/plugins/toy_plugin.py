"""A tiny plugin for the trainer's end-to-end tests: frozen encoder + trainable predictor.

It is a real plugin (registered through ``training.plugin``), shaped like the
Wan2.2 container: a frozen ``text_encoder`` whose weights come from a
safetensors directory, a trainable ``predictor`` with ``blocks``, a pipeline that
does flow-match noising, and a synthetic dataset.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from mm_pipelines import GenerativePipelineBase, PipelineOutput, SampleRNG
from mm_trainer import BaseModel, ModelContainer, data_register, model_register
from torch import nn
from torch.utils.data import Dataset, default_collate


@model_register("toy_encoder")
class ToyEncoder(BaseModel, nn.Module):
    """Frozen condition encoder: features [B, in_dim] -> [B, cond_dim]."""

    def __init__(self, in_dim: int = 8, cond_dim: int = 16) -> None:
        super().__init__()
        self.proj = nn.Linear(in_dim, cond_dim)
        self.norm = nn.LayerNorm(cond_dim)

    @classmethod
    def build_from_config(cls, args: Any) -> ToyEncoder:
        return cls(**args.config)

    @classmethod
    def from_pretrained(cls, args: Any) -> ToyEncoder:
        model = cls.build_from_config(args)
        model.setup_weights(args)
        return model

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(features))


class ToyBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, dim)
        self.fc2 = nn.Linear(dim, dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.fc2(torch.nn.functional.gelu(self.fc1(h)))


@model_register("toy_predictor")
class ToyPredictor(BaseModel, nn.Module):
    """Trainable predictor with ``blocks.{*}`` (FSDP units) and a head."""

    def __init__(self, dim: int = 8, hidden: int = 32, cond_dim: int = 16, num_blocks: int = 3) -> None:
        super().__init__()
        self.in_proj = nn.Linear(dim + cond_dim + 1, hidden)
        self.blocks = nn.ModuleList(ToyBlock(hidden) for _ in range(num_blocks))
        self.head = nn.Linear(hidden, dim)

    @classmethod
    def build_from_config(cls, args: Any) -> ToyPredictor:
        return cls(**args.config)

    @classmethod
    def from_pretrained(cls, args: Any) -> ToyPredictor:
        model = cls.build_from_config(args)
        model.setup_weights(args)
        return model

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.in_proj(torch.cat([x, cond, sigma[:, None]], dim=-1))
        for block in self.blocks:
            h = block(h)
        return self.head(h)


class ToyPipeline(GenerativePipelineBase):
    """Flow-match noising of ``x0``. ``noise``: ``keyed`` draws through the trainer's ``SampleRNG``
    (the same at any layout); ``global`` from the global torch RNG (which the engine reseeds per
    micro-batch); ``rank_seeded`` from a generator seeded by the process rank, the way runs drew
    before keyed randomness (what ``mm-train check-layouts`` must catch)."""

    def __init__(
        self,
        noise: str = "keyed",
        sleep_s: float = 0.0,
        nan_calls: tuple = (),
        stall: dict | None = None,
    ) -> None:
        super().__init__()
        if noise not in ("keyed", "global", "rank_seeded"):
            raise ValueError(f"model.pipeline.noise must be keyed, global or rank_seeded, got {noise!r}")
        self.noise, self.sleep_s = noise, sleep_s
        self.nan_calls, self.calls = set(nan_calls), 0  # forward calls (1-based) whose loss is NaN
        self.stall = stall  # {rank, call, seconds}: that rank sleeps before that forward call's predictor
        self._rank_generator: torch.Generator | None = None

    def prepare_conditions(self, container: Any, batch: dict) -> dict:
        cond = self.call(container, "text_encoder", batch["features"])
        return {"x0": batch["x0"], "cond": cond, "index": batch["index"]}

    def noising(self, conditions: dict, rng: SampleRNG | None = None) -> dict:
        x0 = conditions["x0"]
        if self.noise == "keyed":
            rng = self.require_rng(rng, x0.shape[0])
            eps = rng.randn("noise", x0.shape[1:])
            sigma = rng.per_sample("sigma", lambda g: torch.rand((), generator=g))
        elif self.noise == "global":
            eps, sigma = torch.randn(x0.shape), torch.rand(x0.shape[0])
        else:
            if self._rank_generator is None:
                rank = dist.get_rank() if dist.is_initialized() else 0
                self._rank_generator = torch.Generator().manual_seed(1234 + rank)
            eps = torch.randn(x0.shape, generator=self._rank_generator)
            sigma = torch.rand(x0.shape[0], generator=self._rank_generator)
        x_t = (1 - sigma[:, None]) * x0 + sigma[:, None] * eps
        return {**conditions, "x_t": x_t, "sigma": sigma, "target": eps - x0}

    def predict(self, container: Any, noised: dict) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        stall = self.stall
        if stall and self.calls + 1 == stall["call"] and torch.distributed.get_rank() == stall["rank"]:
            time.sleep(stall["seconds"])
        return self.call(container, "predictor", noised["x_t"], noised["sigma"], noised["cond"])

    def compute_loss(self, prediction: torch.Tensor, noised: dict) -> torch.Tensor:
        self.calls += 1
        loss = torch.nn.functional.mse_loss(prediction.float(), noised["target"].float())
        return loss * float("nan") if self.calls in self.nan_calls else loss

    def metrics(self, container: Any, noised: dict) -> dict:
        # forward + backward of a dense model: ~6 FLOPs per parameter per sample
        params = sum(p.numel() for p in container.predictor.parameters())
        return {"num_tokens": noised["x0"].numel(), "flops": 6.0 * params * noised["x0"].shape[0]}


@model_register("toy_container")
class ToyContainer(ModelContainer):
    checkpoint_submodels = ("predictor",)

    @classmethod
    def build_pipeline(cls, options: dict) -> ToyPipeline:
        return ToyPipeline(**options)

    def planning_batch(self, data: Any, micro_batch_size: int) -> dict:
        """One micro-batch of ``toy_regression``'s shapes, for ``mm-train plan`` (the model contract)."""
        options, size = dict(data.dataset or {}), micro_batch_size
        return {
            "x0": torch.zeros(size, options.get("dim", 8)),
            "features": torch.zeros(size, options.get("in_dim", 8)),
            "index": torch.arange(size),
            "sample_ids": list(range(size)),
        }


@data_register("toy_regression")
class ToyRegression(Dataset):
    """``num_samples`` fixed (x0, features) pairs drawn from ``seed``."""

    collate_fn = staticmethod(default_collate)

    def __init__(self, num_samples: int = 64, dim: int = 8, in_dim: int = 8, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x0 = torch.randn(num_samples, dim, generator=g)
        self.features = torch.randn(num_samples, in_dim, generator=g)

    def __len__(self) -> int:
        return len(self.x0)

    def __getitem__(self, i: int) -> dict:
        return {"x0": self.x0[i], "features": self.features[i], "index": i}


class ToyPhasedPipeline(ToyPipeline):
    """Two phases (``training.phases``): ``fit`` trains ``predictor`` on the flow-match target, ``follow``
    trains ``critic`` to match the predictor's detached output (so it reads the weights the step's
    ``fit`` update left), the shape of a distillation's generator / critic pair."""

    def forward(self, container: Any, rng: SampleRNG | None = None, phase: str | None = None, **batch: Any):
        if phase not in ("fit", "follow"):
            raise ValueError(f"toy_phased_container: phase must be 'fit' or 'follow', got {phase!r}")
        noised = self.noising(self.prepare_conditions(container, batch), rng)
        args = (noised["x_t"], noised["sigma"], noised["cond"])
        if phase == "fit":
            prediction, target = self.call(container, "predictor", *args), noised["target"]
        else:
            with torch.no_grad():
                target = container.predictor(*args)
            prediction = self.call(container, "critic", *args)
        return PipelineOutput(loss=torch.nn.functional.mse_loss(prediction.float(), target.float()))


@model_register("toy_phased_container")
class ToyPhasedContainer(ToyContainer):
    """Trainable ``predictor`` and ``critic`` (both checkpointed), frozen ``text_encoder``."""

    checkpoint_submodels = None  # the trainable ones

    @classmethod
    def build_pipeline(cls, options: dict) -> ToyPhasedPipeline:
        return ToyPhasedPipeline(**options)
