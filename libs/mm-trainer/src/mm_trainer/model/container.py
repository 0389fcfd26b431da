"""ModelContainer and ModelContainerHub: several sub-models trained as one.

The container holds its sub-models as plain attributes, so module paths read
``predictor.blocks.0`` and match FSDP plan patterns directly. It owns the life
cycle (what is trainable, what is checkpointed, train/eval) and delegates the
data flow to a pipeline (a plain object, not a module).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch
from mm_pipelines import SampleRNG
from torch import nn

from mm_trainer.model.hub import ModelHub
from mm_trainer.model.lora import adapters_disabled
from mm_trainer.registry.registries import MODEL_REGISTRY


class ModelContainer(nn.Module):
    """Heterogeneous sub-models (e.g. frozen ``ae`` and ``text_encoder``, trainable ``predictor``).

    Subclasses set ``checkpoint_submodels`` and may build a pipeline in
    :meth:`build_pipeline`. ``forward(**batch)`` delegates to ``self.pipeline``.
    """

    #: Only these sub-models are saved in training checkpoints; the others reload from their source.
    #: None means "the trainable ones".
    checkpoint_submodels: tuple[str, ...] | None = None
    #: The FSDP plan never wraps the container root: sharding granularity is the plan's.
    _fsdp_skip_root_wrap = True

    def __init__(
        self,
        sub_models: Mapping[str, nn.Module],
        *,
        trainable: tuple[str, ...] | list[str] = (),
        pipeline: Any = None,
    ) -> None:
        super().__init__()
        unknown = set(trainable) - set(sub_models)
        if unknown:
            raise ValueError(f"trainable sub-models {sorted(unknown)} are not among {sorted(sub_models)}")
        for name, module in sub_models.items():
            setattr(self, name, module)
        self.sub_model_names: tuple[str, ...] = tuple(sub_models)
        self.trainable_submodels: tuple[str, ...] = tuple(trainable)
        self.pipeline = pipeline
        #: Sub-models whose checkpoints hold only these state-dict keys (LoRA: the adapters, see
        #: :func:`mm_trainer.inject_lora`); the rest of them reloads from its pretrained source.
        self.partial_checkpoints: dict[str, frozenset[str]] = {}
        if self.checkpoint_submodels is None:
            self.checkpoint_submodels = self.trainable_submodels

    @classmethod
    def sub_model_problems(cls, model_section: Any) -> dict[str, str]:
        """Why sub-models of ``model_section`` (the validated ``model`` section) cannot be trained together
        in this container, by sub-model name, judged from their config sections alone (nothing built, no
        weight read: at most a ``config.json``). ``ModelContainerHub.build`` refuses them before building
        any sub-model, ``mm-config check`` reports them at ``model.models.<name>``. None by default; e.g. a
        distillation's student whose architecture is not its teacher's."""
        return {}

    @classmethod
    def build_pipeline(cls, options: Mapping[str, Any]) -> Any:
        """Create the pipeline from ``model.pipeline`` options; the base container has none."""
        if options:
            raise ValueError(f"{cls.__name__} takes no pipeline options, got {sorted(options)}")
        return None

    def sub_models(self) -> dict[str, nn.Module]:
        """Sub-models by name, in build order."""
        return {name: getattr(self, name) for name in self.sub_model_names}

    def is_trainable(self, role: str) -> bool:
        """Whether sub-model ``role`` is trained (the pipeline runs it with autograd)."""
        return role in self.trainable_submodels

    def adapters_disabled(self) -> contextlib.AbstractContextManager[None]:
        """Inside, the trainable sub-models' LoRA adapters are off: each computes its frozen base
        (Diffusion-DPO's reference of a LoRA policy, ``mm_pipelines.DiffusionDPO``). Raises when no trainable
        sub-model has adapters."""
        return adapters_disabled([getattr(self, name) for name in self.trainable_submodels])

    def train(self, mode: bool = True) -> ModelContainer:
        """Switch only trainable sub-models; frozen ones stay in eval (no dropout drift)."""
        self.training = mode
        for name in self.trainable_submodels:
            getattr(self, name).train(mode)
        return self

    def state_dict(
        self, *args: Any, destination: Any = None, prefix: str = "", keep_vars: bool = False
    ) -> dict:
        """Only ``checkpoint_submodels`` (of those in ``partial_checkpoints``, only the listed keys);
        frozen sub-models reload from their pretrained source."""
        out: dict[str, Any] = {} if destination is None else destination
        for name in self.checkpoint_submodels:
            sub_prefix = f"{prefix}{name}."
            state = getattr(self, name).state_dict(prefix=sub_prefix, keep_vars=keep_vars)
            keep = self.partial_checkpoints.get(name)
            out.update((k, v) for k, v in state.items() if keep is None or k[len(sub_prefix) :] in keep)
        return out

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        """Dispatch keys to sub-models by prefix; sub-models outside ``checkpoint_submodels`` are untouched."""
        missing: list[str] = []
        unexpected = [k for k in state_dict if k.split(".", 1)[0] not in self.checkpoint_submodels]
        for name in self.checkpoint_submodels:
            sub_sd = {k[len(name) + 1 :]: v for k, v in state_dict.items() if k.startswith(name + ".")}
            result = getattr(self, name).load_state_dict(sub_sd, strict=False, assign=assign)
            keep = self.partial_checkpoints.get(name)
            missing += [f"{name}.{k}" for k in result.missing_keys if keep is None or k in keep]
            unexpected += [f"{name}.{k}" for k in result.unexpected_keys]
        if strict and (missing or unexpected):
            raise RuntimeError(
                f"container load_state_dict: missing keys {missing}, unexpected keys {unexpected}"
            )
        return torch.nn.modules.module._IncompatibleKeys(missing, unexpected)

    def forward(
        self, conditions: dict[str, Any] | None = None, rng: SampleRNG | None = None, **batch: Any
    ) -> Any:
        """``pipeline.forward(self, rng, **batch)``; without a pipeline, a single sub-model's own forward.

        ``rng`` keys the pipeline's random draws by sample and step (the engine builds it from the
        batch's ``sample_ids``). With ``conditions`` (from :meth:`encode_conditions`, possibly on
        another rank) the pipeline skips encoding: ``pipeline.train_on_conditions(self, conditions, rng)``.
        A sub-model trained without a pipeline draws nothing through ``rng``.
        """
        if conditions is not None:
            return self._conditioned_pipeline().train_on_conditions(self, conditions, rng)
        if self.pipeline is not None:
            return self.pipeline.forward(self, rng, **batch)
        if len(self.sub_model_names) == 1:
            return getattr(self, self.sub_model_names[0])(**batch)
        raise NotImplementedError(f"{type(self).__name__} has no pipeline; set one or override forward")

    def encode_conditions(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The pipeline's ``prepare_conditions`` for one micro-batch (frozen encoders: no grad)."""
        return self._conditioned_pipeline().prepare_conditions(self, batch)

    def validation_loss(self, batch: Mapping[str, Any], rng: SampleRNG, num_timesteps: int) -> torch.Tensor:
        """Per-sample loss ``[B]`` of a held-out batch at ``num_timesteps`` fixed timesteps and noise
        from ``rng`` (``training.validation.data_path``): the pipeline's ``validation_loss``."""
        if not self.has_validation_loss:
            raise TypeError(
                f"{type(self).__name__}'s pipeline {type(self.pipeline).__name__} has no validation_loss(container, "
                "batch, rng, num_timesteps) (mm_pipelines.FlowMatchT2VPipeline has one)"
            )
        return self.pipeline.validation_loss(self, batch, rng, num_timesteps)

    def planning_batch(self, data: Any, micro_batch_size: int) -> dict[str, Any]:
        """One micro-batch of the run's real shapes, for ``mm-train plan`` (docs/DESIGN.md "The model
        contract"): the keys the batch stream yields (``sample_ids`` included), built from the ``data``
        section and the sub-models' configs (frames, resolution, VAE compression, text length). The
        planner calls it under ``FakeTensorMode``, so the tensors hold no data.

        The container's pipeline answers (``pipeline.planning_batch(container, data, micro_batch_size)``),
        else in the single-model form the model (``model.planning_batch(data, micro_batch_size)``).
        """
        hook = getattr(self.pipeline, "planning_batch", None)
        if callable(hook):
            return hook(self, data, micro_batch_size)
        if len(self.sub_model_names) == 1:
            single = getattr(getattr(self, self.sub_model_names[0]), "planning_batch", None)
            if callable(single):
                return single(data, micro_batch_size)
        raise NotImplementedError(
            f"{type(self).__name__} (pipeline {type(self.pipeline).__name__}) does not describe a batch of its real "
            "shapes: mm-train plan needs planning_batch(data, micro_batch_size) on the container, its pipeline "
            '(planning_batch(container, data, micro_batch_size)) or the single model (docs/DESIGN.md "The model contract")'
        )

    @property
    def has_validation_loss(self) -> bool:
        """Whether the pipeline computes a held-out loss at fixed timesteps (:meth:`validation_loss`)."""
        return callable(getattr(self.pipeline, "validation_loss", None))

    @property
    def encodes_conditions(self) -> bool:
        """Whether the pipeline separates condition encoding from the rest (``features.condition_micro_steps``)."""
        return all(
            callable(getattr(self.pipeline, name, None))
            for name in ("prepare_conditions", "train_on_conditions")
        )

    def _conditioned_pipeline(self) -> Any:
        if not self.encodes_conditions:
            raise TypeError(
                f"{type(self).__name__}'s pipeline {type(self.pipeline).__name__} has no prepare_conditions / "
                "train_on_conditions (mm_pipelines.GenerativePipelineBase); features.condition_micro_steps needs both"
            )
        return self.pipeline


class ModelContainerHub:
    """Builds every sub-model of ``model.models`` and assembles the container."""

    @staticmethod
    def build(
        model_section: Any,
        *,
        device: torch.device | str,
        trainable: tuple[str, ...] | list[str],
        meta_init: bool | None = None,
    ) -> ModelContainer:
        """Build each sub-model with its own ``meta_init``/``dtype``/``freeze`` (``meta_init=True``
        builds every one on meta: the planner, which reads no weights).

        Frozen sub-models go to eval with ``requires_grad`` off; a frozen
        sub-model that is already materialized moves to ``device`` at once, meta
        ones wait for FSDP. Weights of meta sub-models are loaded by the trainer
        after sharding.
        """
        cls = container_class(model_section)
        problems = cls.sub_model_problems(model_section)  # before any sub-model is built or a weight read
        if problems:
            raise ValueError("; ".join(f"model.models.{name}: {why}" for name, why in problems.items()))
        sub_models: dict[str, nn.Module] = {}
        for name, args in model_section.sub_models().items():
            module = ModelHub.build(args, meta_init=args.meta_init if meta_init is None else meta_init)
            if name not in trainable:
                freeze(module)
                if not _is_meta(module) and not getattr(module, "_skip_to_device", False):
                    module.to(device)
            sub_models[name] = module
        pipeline = pipeline_factory(model_section, cls)(dict(getattr(model_section, "pipeline", None) or {}))
        return cls(sub_models, trainable=tuple(trainable), pipeline=pipeline)


def container_class(model_section: Any) -> type[ModelContainer]:
    """The registered ``model.container_id`` class; in the single-model form (``model.model_id``) the
    container the model class names in its ``single_model_container`` attribute (a registered id: e.g.
    LTX-2's, whose hooks serve both forms); else the plain :class:`ModelContainer`."""
    container_id = getattr(model_section, "container_id", None)
    if not container_id and not getattr(model_section, "is_container", True):
        model_id = getattr(model_section, "model_id", None)
        model_cls = MODEL_REGISTRY.get(model_id) if model_id in MODEL_REGISTRY else None
        container_id = getattr(model_cls, "single_model_container", None)
    cls = MODEL_REGISTRY.get(container_id) if container_id else ModelContainer
    if not (isinstance(cls, type) and issubclass(cls, ModelContainer)):
        raise TypeError(f"model.container_id {container_id!r} is registered to {cls}, not a ModelContainer")
    return cls


def pipeline_factory(model_section: Any, cls: type[ModelContainer]) -> Any:
    """Who builds the pipeline from ``model.pipeline``: the container class, or in the single-model
    form (``model.model_id``) the model class when it defines ``build_pipeline``."""
    if not model_section.is_container and model_section.model_id in MODEL_REGISTRY:
        model_cls = MODEL_REGISTRY.get(model_section.model_id)
        if hasattr(model_cls, "build_pipeline"):
            return model_cls.build_pipeline
    return cls.build_pipeline


def freeze(module: nn.Module) -> None:
    """eval() + requires_grad False on every parameter."""
    module.eval()
    module.requires_grad_(False)


def _is_meta(module: nn.Module) -> bool:
    return any(t.is_meta for t in module.parameters()) or any(t.is_meta for t in module.buffers())
