"""Every config key acts or is refused: a walk over the whole config schema (the six sections, every
nested model, every registered plugin schema) fails on a key that no code outside the schemas reads.

How "read" is decided, and its limits. A static check over the sources (not a recorded run, which would
see only the paths one tiny run takes): the non-test Python files of every member, less the schema
modules (all of mm-config, which validates, and the apps' ``config_schema.py``), are parsed, and a key
counts as read when its name appears as an attribute read (``cfg.key``), a string subscript
(``cfg["key"]``), a string argument of a call (``.get("key")``, ``getattr(x, "key")``, ``_get(cfg,
"key")``), a ``"key" in cfg`` test, a keyword argument name of a call, or a function parameter that its
body uses (options passed on as ``**options``). The check is by name: a key whose name some other
object's attribute shares counts as read (a common name such as ``seed`` can hide an unread key), and
a key read only on a path the trainer never takes (what ``data.dataset.max_text_length`` was: mm-data
read it, the trainer passed no tokenizer) is not caught; such keys are for the per-key tests that change
a key and see its effect. Schemas whose keys are passed on whole as keyword arguments of an upstream
constructor or of a dataset are tied to those signatures by their own tests and listed in
``FORWARDED``; keys acted on by mm-config itself are in ``EXCEPTIONS`` with the reason.
"""

from __future__ import annotations

import ast
import types
import typing
from functools import cache
from pathlib import Path

from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[1]

EXCEPTIONS: dict[str, str] = {
    "TrainingConfig.plugin": "mm-config's loader imports these modules (load_config), before validation",
    "TrainingConfig.global_batch_size": "the root validator derives gradient_accumulation_steps from it, which "
    "the trainer reads",
    "ParallelConfig.fully_shard_parallel_size": "resolved by the root validator ('auto' = world / replicate) into "
    "the degrees ParallelState reads",
    "ParallelConfig.tensor_parallel_size": "refused unless 1 (tensor parallelism is not implemented)",
    "LoraConfig.dropout": "refused unless 0 (the dropout mask would depend on the rank's sequence shard)",
    "ModelConfig.freeze": "folded by mm-config into training.trainable_submodels (ModelConfig.trainable_submodels()), "
    "which the trainer reads",
    "SubModelConfig.freeze": "the same as ModelConfig.freeze, per sub-model",
    "ValidationConfig.seeds": "read through ValidationConfig.prompt_seeds(), which the trainer calls",
    **{
        f"{schema}.{key}": "renamed to a SigmaSampler field by ltx2_train.config_schema.SAMPLER_KEYS, "
        "through which the pipeline reads it (test_ltx2_config_schema ties the two)"
        for schema in ("LTX2PipelineOptions", "LTX2ContainerPipelineOptions")  # the second: ltx2_container's
        for key in (
            "timestep_sampling",
            "sigma_std",
            "shift_min_tokens",
            "shift_min",
            "shift_max_tokens",
            "shift_max",
        )
    },
}
"""``Schema.key`` -> why it needs no reader outside the schemas."""

FORWARDED: dict[str, str] = {
    "VideoTextDatasetConfig": "data.dataset of video_text is passed whole to mm_data.VideoTextDataset "
    "(libs/mm-trainer/tests/test_builtin_datasets.py ties the schema to its signature)",
    "PrecomputedLatentsConfig": "passed whole to mm_data.PrecomputedLatentDataset (the same test)",
    "WanVAEConfig": "AutoencoderKLWan keywords (test_wan_config_schema ties them to its signature)",
    "_UMT5Keywords": "UMT5Config keywords (test_wan_config_schema ties them to its signature)",
    "LTX2PredictorConfig": "LTX2VideoTransformer3DModel keywords (test_ltx2_config_schema ties them to its signature)",
}
"""Schemas whose keys reach their reader as keyword arguments, by class name, with where that is tested."""


def _schema_files() -> set[Path]:
    return {
        *(REPO / "libs" / "mm-config" / "src").rglob("*.py"),
        *(REPO / "apps").glob("*/src/*/config_schema.py"),
    }


@cache
def read_names(roots: tuple[Path, ...] = ()) -> frozenset[str]:
    """Names the non-schema sources read as attributes, string keys or call keywords (module docstring)."""
    files = [p for root in roots or (REPO / "libs", REPO / "apps") for p in root.glob("*/src/**/*.py")]
    skip = _schema_files()
    names: set[str] = set()
    for file in files:
        if file in skip:
            continue
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                names.add(node.attr)
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                names.add(str(node.slice.value))
            elif isinstance(node, ast.Call):
                names |= {
                    a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                }
                names |= {k.arg for k in node.keywords if k.arg}
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                params = {a.arg for a in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]}
                used = {
                    n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                }
                names |= params & used
            elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant):
                if any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
                    names.add(str(node.left.value))
    return frozenset(names)


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        return [m for a in args for m in _models_in(a)]
    return []


def walk_schema(roots: list[type[BaseModel]]) -> dict[str, type[BaseModel]]:
    """``{"Schema.key": schema}`` of every field of ``roots`` and the models nested in them."""
    seen: set[type[BaseModel]] = set()
    out: dict[str, type[BaseModel]] = {}
    todo = list(roots)
    while todo:
        schema = todo.pop()
        if schema in seen:
            continue
        seen.add(schema)
        for name, field in schema.model_fields.items():
            out[f"{schema.__name__}.{name}"] = schema
            todo += _models_in(field.annotation)
    return out


def every_schema() -> list[type[BaseModel]]:
    """The root config and every registered plugin schema (entry points loaded)."""
    from mm_config import TrainConfig
    from mm_config.registry import _SCHEMAS, load_schema_entry_points

    assert load_schema_entry_points() == []
    return [TrainConfig, *(s for table in _SCHEMAS.values() for s in table.values())]


def unread_keys(roots: list[type[BaseModel]], names: frozenset[str]) -> list[str]:
    """The ``Schema.key`` entries of ``roots`` whose key no non-schema source reads (less the listed ones)."""
    keys = walk_schema(roots)
    return sorted(
        k for k, schema in keys.items()
        if k not in EXCEPTIONS and not _forwarded(schema, k.split(".", 1)[1]) and k.split(".", 1)[1] not in names
    )  # fmt: skip


def _forwarded(schema: type[BaseModel], key: str) -> bool:
    """True when ``key`` is declared by a class of ``schema``'s MRO listed in :data:`FORWARDED`."""
    return any(
        cls.__name__ in FORWARDED and key in getattr(cls, "model_fields", {}) for cls in schema.__mro__
    )


def test_every_config_key_is_read_by_the_code_or_listed_with_its_reason():
    assert unread_keys(every_schema(), read_names()) == []


def test_the_walk_fails_on_a_key_nothing_reads():
    class ProbeSection(BaseModel):
        num_layers: int = 1
        zz_unread_probe_key: int = 0

    class ProbeRoot(BaseModel):
        training: ProbeSection | None = None

    assert unread_keys([ProbeRoot], read_names()) == ["ProbeSection.zz_unread_probe_key"]


def test_every_listed_exception_names_a_real_key():
    keys = walk_schema(every_schema())
    assert [k for k in EXCEPTIONS if k not in keys] == []
    names = {k.split(".")[0] for k in keys} | {c.__name__ for s in every_schema() for c in s.__mro__}
    assert [k for k in FORWARDED if k not in names] == []
