"""Table-driven key maps: renames with regex groups, tensor ops, inversion, registry."""

from __future__ import annotations

import pytest
import torch
from mm_checkpoint import (
    KEY_MAP_REGISTRY,
    ConcatRule,
    KeyMapError,
    KeyMapTransform,
    RenameRule,
    Reshape,
    SplitRule,
    Transpose,
    get_weight_transform,
    register_weight_transform,
)

WAN_LIKE = KeyMapTransform(
    [
        RenameRule(r"^blocks\.(\d+)\.attn1\.to_q\.", r"blocks.\1.self_attn.q."),
        RenameRule(r"^blocks\.(\d+)\.ffn\.net\.0\.proj\.", r"blocks.\1.ffn.0."),
        RenameRule(r"^blocks\.(\d+)\.norm2\.", r"blocks.\1.norm3."),  # swap: first match wins
        RenameRule(r"^blocks\.(\d+)\.norm3\.", r"blocks.\1.norm2."),
        RenameRule(r"^condition_embedder\.text_embedder\.linear_(\d)\.", r"text_embedding.\1."),
    ]
)


def test_rename_with_groups_forward_and_inverse() -> None:
    assert WAN_LIKE.forward("blocks.11.attn1.to_q.weight") == "blocks.11.self_attn.q.weight"
    assert WAN_LIKE.inverse("blocks.11.self_attn.q.weight") == "blocks.11.attn1.to_q.weight"
    assert WAN_LIKE.forward("blocks.0.ffn.net.0.proj.bias") == "blocks.0.ffn.0.bias"


def test_first_matching_rule_wins_so_swaps_invert() -> None:
    assert WAN_LIKE.forward("blocks.1.norm2.weight") == "blocks.1.norm3.weight"
    assert WAN_LIKE.forward("blocks.1.norm3.weight") == "blocks.1.norm2.weight"
    assert WAN_LIKE.inverse("blocks.1.norm3.weight") == "blocks.1.norm2.weight"
    WAN_LIKE.check_roundtrip(["blocks.1.norm2.weight", "blocks.1.norm3.weight", "scale_shift_table"])


def test_unmatched_keys_pass_through_unless_disabled() -> None:
    assert WAN_LIKE.forward("patch_embedding.weight") == "patch_embedding.weight"
    with pytest.raises(KeyMapError, match="'patch_embedding.weight' matches no rule"):
        KeyMapTransform(WAN_LIKE.rules, passthrough=False).forward("patch_embedding.weight")


def test_groups_may_be_reordered_in_replacement() -> None:
    rule = RenameRule(r"^a\.(\d+)\.b\.(\w+)$", r"x.\2.y.\1")
    assert rule.forward_key("a.3.b.q") == "x.q.y.3"
    assert rule.inverse_key("x.q.y.3") == "a.3.b.q"


def test_non_invertible_pattern_needs_explicit_inverse() -> None:
    with pytest.raises(KeyMapError, match="non-invertible"):
        RenameRule(r"^model.*\.w", "w")
    rule = RenameRule(r"^model\.(.*)$", r"\1", inverse_pattern=r"^(.*)$", inverse_replacement=r"model.\1")
    assert rule.inverse_key("x.y") == "model.x.y"


def test_replacement_dropping_a_group_is_rejected() -> None:
    with pytest.raises(KeyMapError, match="drops group"):
        RenameRule(r"^a\.(\d+)\.b$", "c")


def test_tensor_ops_are_inverted_on_export() -> None:
    table = KeyMapTransform(
        [
            RenameRule(r"^proj\.weight$", "linear.weight", op=Transpose(0, 1)),
            RenameRule(r"^emb$", "embedding", op=Reshape(model_shape=(2, 6), source_shape=(12,))),
            ConcatRule((r"^(.*)\.to_k\.weight$", r"^(.*)\.to_v\.weight$"), r"\1.kv.weight"),
            SplitRule((r"^(.*)\.q\.weight$", r"^(.*)\.kv\.w$"), r"\1.qkv.weight", sizes=(2, 4)),
        ]
    )
    ckpt = {
        "proj.weight": torch.arange(6.0).reshape(2, 3),
        "emb": torch.arange(12.0),
        "attn.to_k.weight": torch.ones(3, 2),
        "attn.to_v.weight": torch.zeros(3, 2),
        "attn.qkv.weight": torch.arange(12.0).reshape(6, 2),
    }
    model = table.to_model(ckpt)
    assert torch.equal(model["linear.weight"], ckpt["proj.weight"].T)
    assert model["embedding"].shape == (2, 6)
    assert torch.equal(model["attn.kv.weight"], torch.cat([torch.ones(3, 2), torch.zeros(3, 2)]))
    assert torch.equal(model["attn.q.weight"], ckpt["attn.qkv.weight"][:2])
    assert torch.equal(model["attn.kv.w"], ckpt["attn.qkv.weight"][2:])
    back = table.from_model(model)
    assert back.keys() == ckpt.keys()
    assert all(torch.equal(back[k], ckpt[k]) for k in ckpt)


def test_concat_with_missing_part_names_it() -> None:
    table = KeyMapTransform([ConcatRule((r"^(.*)\.to_k\.weight$", r"^(.*)\.to_v\.weight$"), r"\1.kv.weight")])
    with pytest.raises(KeyMapError, match="missing part.*'a.to_v.weight'"):
        table.plan_load(["a.to_k.weight"])


def test_two_checkpoint_keys_mapping_to_one_model_key_is_an_error() -> None:
    table = KeyMapTransform([RenameRule(r"^old\.", "new.")])
    with pytest.raises(KeyMapError, match="both map to 'new.w'"):
        table.plan_load(["old.w", "new.w"])


def test_registry_registers_once_and_lists_names_on_miss() -> None:
    name = "toy_registry_test"
    register_weight_transform(name, KeyMapTransform([RenameRule(r"^a\.", "b.")]))
    try:
        assert get_weight_transform(name).plan_load(["a.w"]).keys() == {"b.w"}
        # registering an equal table again (a plugin imported twice) is fine
        register_weight_transform(name, KeyMapTransform([RenameRule(r"^a\.", "b.")]))
        with pytest.raises(KeyMapError, match="already registered"):
            register_weight_transform(name, KeyMapTransform())
        with pytest.raises(KeyMapError, match=f"'nope'.*{name}"):
            get_weight_transform("nope")
    finally:
        KEY_MAP_REGISTRY.pop(name)


def test_register_as_class_decorator() -> None:
    @register_weight_transform("toy_decorated")
    class Toy(KeyMapTransform):
        def __init__(self) -> None:
            super().__init__([RenameRule(r"^x\.", "y.")])

    try:
        assert isinstance(KEY_MAP_REGISTRY["toy_decorated"], Toy)
    finally:
        KEY_MAP_REGISTRY.pop("toy_decorated")
