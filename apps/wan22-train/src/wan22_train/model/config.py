"""`WanDiTConfig`: the native Wan2.x DiT hyper-parameters, and conversion from/to diffusers' config.json.

Native field names follow the official Wan release (`dim`, `num_heads`, `in_dim`, ...). Diffusers'
`WanTransformer3DModel` config.json is mapped by `WanDiTConfig.from_diffusers`; features of that class
this model does not implement (the Wan2.1 I2V CLIP image branch) fail with the offending key named.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

ModelType = Literal["t2v", "i2v", "ti2v"]
_MODEL_TYPES = ("t2v", "i2v", "ti2v")
DIFFUSERS_CLASS_NAME = "WanTransformer3DModel"
OFFICIAL_CLASS_NAME = "WanModel"

OFFICIAL_DEFAULTS: dict[str, Any] = {
    "model_type": "t2v", "patch_size": [1, 2, 2], "text_len": 512, "in_dim": 16, "dim": 2048,
    "ffn_dim": 8192, "freq_dim": 256, "text_dim": 4096, "out_dim": 16, "num_heads": 16, "num_layers": 32,
    "window_size": [-1, -1], "qk_norm": True, "cross_attn_norm": True, "eps": 1e-6,
}  # fmt: skip
"""The keyword defaults of the official ``WanModel.__init__`` (``wan/modules/model.py`` of Wan-Video/Wan2.2):
what a key missing from a release's config.json means."""
OFFICIAL_UNSTORED = ("patch_size", "cross_attn_norm", "qk_norm", "text_dim", "window_size")
"""``WanModel.ignore_for_config``: never written to the official config.json, and when loading the
official class always takes its default for them (a config.json value is not passed on)."""
OFFICIAL_ROPE = {"rope_max_seq_len": 1024, "rope_theta": 10000.0}
"""The official model's RoPE tables (``rope_params(1024, ...)``, base 10000): fixed, not config keys."""
_OFFICIAL_FIXED = {
    **{k: OFFICIAL_DEFAULTS[k] for k in OFFICIAL_UNSTORED if k != "window_size"},
    **OFFICIAL_ROPE,
}

# diffusers config.json keys that are accepted only with a value this model can honour.
_DIFFUSERS_UNSUPPORTED = {
    "image_dim": "the Wan2.1 I2V CLIP image embedder (Wan2.2 I2V concatenates image latents instead)",
    "added_kv_proj_dim": "the Wan2.1 I2V image key/value projections in cross-attention",
    "pos_embed_seq_len": "the Wan2.1 FLF2V image position embedding",
}
_DIFFUSERS_KNOWN = {
    "patch_size",
    "num_attention_heads",
    "attention_head_dim",
    "in_channels",
    "out_channels",
    "text_dim",
    "freq_dim",
    "ffn_dim",
    "num_layers",
    "cross_attn_norm",
    "qk_norm",
    "eps",
    "rope_max_seq_len",
    *_DIFFUSERS_UNSUPPORTED,
}


@dataclass
class WanDiTConfig:
    """Shape and numerics of a native Wan DiT.

    Attributes:
        model_type: `t2v`, `i2v` (mask + image latents concatenated to the noise, `in_dim` 36) or `ti2v`.
        patch_size: (frames, height, width) patch of the Conv3d patch embedding.
        text_len: number of text tokens the pipeline pads prompts to (the model accepts any length).
        in_dim: latent channels in (16 T2V, 36 I2V, 48 TI2V-5B).
        dim: hidden size; `dim // num_heads` is the head size.
        ffn_dim: hidden size of the feed-forward network.
        freq_dim: size of the sinusoidal timestep embedding.
        text_dim: size of the text-encoder embeddings (UMT5-XXL: 4096).
        out_dim: latent channels out.
        num_heads: attention heads.
        num_layers: transformer blocks.
        qk_norm: RMSNorm over the whole query/key projection (all heads together), as Wan does.
        cross_attn_norm: affine LayerNorm (`norm3`) before cross-attention.
        eps: epsilon of every norm.
        rope_max_seq_len: the largest post-patch frame/height/width index RoPE supports.
        rope_theta: RoPE base.
    """

    model_type: ModelType = "t2v"
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_len: int = 512
    in_dim: int = 16
    dim: int = 2048
    ffn_dim: int = 8192
    freq_dim: int = 256
    text_dim: int = 4096
    out_dim: int = 16
    num_heads: int = 16
    num_layers: int = 32
    qk_norm: bool = True
    cross_attn_norm: bool = True
    eps: float = 1e-6
    rope_max_seq_len: int = 1024
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        self.patch_size = tuple(int(p) for p in self.patch_size)  # type: ignore[assignment]
        if self.model_type not in _MODEL_TYPES:
            raise ValueError(f"WanDiTConfig.model_type={self.model_type!r}: expected one of {_MODEL_TYPES}")
        if len(self.patch_size) != 3 or min(self.patch_size) < 1:
            raise ValueError(f"WanDiTConfig.patch_size={self.patch_size}: expected 3 positive integers")
        if self.dim % self.num_heads:
            raise ValueError(f"WanDiTConfig.dim={self.dim} is not divisible by num_heads={self.num_heads}")
        if self.head_dim % 2:
            raise ValueError(f"WanDiTConfig head size dim/num_heads={self.head_dim} must be even for RoPE")

    @property
    def head_dim(self) -> int:
        """Channels per attention head."""
        return self.dim // self.num_heads

    @property
    def patch_volume(self) -> int:
        """Number of latent voxels in one patch."""
        return math.prod(self.patch_size)

    # ----------------------------------------------------------------- presets
    @classmethod
    def t2v_a14b(cls) -> WanDiTConfig:
        """One expert of Wan2.2 T2V-A14B (each of the high/low-noise experts has this shape)."""
        return cls(
            model_type="t2v", in_dim=16, out_dim=16, dim=5120, ffn_dim=13824, num_heads=40, num_layers=40
        )

    @classmethod
    def i2v_a14b(cls) -> WanDiTConfig:
        """One expert of Wan2.2 I2V-A14B: 16 noise + 4 mask + 16 image latent channels in."""
        return cls(
            model_type="i2v", in_dim=36, out_dim=16, dim=5120, ffn_dim=13824, num_heads=40, num_layers=40
        )

    @classmethod
    def ti2v_5b(cls) -> WanDiTConfig:
        """Wan2.2 TI2V-5B (48-channel Wan2.2 VAE latents)."""
        return cls(
            model_type="ti2v", in_dim=48, out_dim=48, dim=3072, ffn_dim=14336, num_heads=24, num_layers=30
        )

    # ---------------------------------------------------------------- diffusers
    @classmethod
    def from_diffusers(cls, config: dict[str, Any], model_type: ModelType | None = None) -> WanDiTConfig:
        """Build from a diffusers `WanTransformer3DModel` config.json dict.

        Args:
            config: the parsed config.json (keys starting with `_` are metadata and ignored).
            model_type: overrides the guess from `in_channels` (36 -> i2v, 48 -> ti2v, else t2v).

        Raises:
            ValueError: for a key this model does not implement, or an unknown key, naming it.
        """
        unknown = sorted(k for k in config if not k.startswith("_") and k not in _DIFFUSERS_KNOWN)
        if unknown:
            raise ValueError(
                f"diffusers WanTransformer3DModel config has unsupported key(s) {unknown}; "
                f"WanDiT understands {sorted(_DIFFUSERS_KNOWN)}"
            )
        for key, what in _DIFFUSERS_UNSUPPORTED.items():
            if config.get(key) is not None:
                raise ValueError(
                    f"diffusers config key {key!r}={config[key]!r} enables {what}, which WanDiT does not "
                    f"implement; expected {key}: null"
                )
        qk_norm = config.get("qk_norm", "rms_norm_across_heads")
        if qk_norm != "rms_norm_across_heads":
            raise ValueError(
                f"diffusers config key 'qk_norm'={qk_norm!r}: WanDiT supports only 'rms_norm_across_heads' "
                "(diffusers itself applies that norm whatever the value)"
            )
        heads = int(config.get("num_attention_heads", 40))
        in_dim = int(config.get("in_channels", 16))
        guessed: ModelType = {36: "i2v", 48: "ti2v"}.get(in_dim, "t2v")  # type: ignore[assignment]
        return cls(
            model_type=model_type or guessed,
            patch_size=tuple(config.get("patch_size", (1, 2, 2))),  # type: ignore[arg-type]
            in_dim=in_dim,
            dim=heads * int(config.get("attention_head_dim", 128)),
            ffn_dim=int(config.get("ffn_dim", 13824)),
            freq_dim=int(config.get("freq_dim", 256)),
            text_dim=int(config.get("text_dim", 4096)),
            out_dim=int(config.get("out_channels", 16) or in_dim),  # diffusers: default 16, null = in
            num_heads=heads,
            num_layers=int(config.get("num_layers", 40)),
            qk_norm=True,
            cross_attn_norm=bool(config.get("cross_attn_norm", True)),
            eps=float(config.get("eps", 1e-6)),
            rope_max_seq_len=int(config.get("rope_max_seq_len", 1024)),
        )

    def to_diffusers(self) -> dict[str, Any]:
        """The diffusers `WanTransformer3DModel` config.json dict for this shape."""
        if not self.qk_norm:
            raise ValueError(
                "WanDiTConfig.qk_norm=False has no diffusers equivalent (diffusers always norms q/k)"
            )
        if self.rope_theta != 10000.0:
            raise ValueError(f"WanDiTConfig.rope_theta={self.rope_theta} has no diffusers equivalent (10000)")
        return {
            "_class_name": DIFFUSERS_CLASS_NAME,
            "patch_size": list(self.patch_size),
            "num_attention_heads": self.num_heads,
            "attention_head_dim": self.head_dim,
            "in_channels": self.in_dim,
            "out_channels": self.out_dim,
            "text_dim": self.text_dim,
            "freq_dim": self.freq_dim,
            "ffn_dim": self.ffn_dim,
            "num_layers": self.num_layers,
            "cross_attn_norm": self.cross_attn_norm,
            "qk_norm": "rms_norm_across_heads",
            "eps": self.eps,
            "image_dim": None,
            "added_kv_proj_dim": None,
            "rope_max_seq_len": self.rope_max_seq_len,
            "pos_embed_seq_len": None,
        }

    # ------------------------------------------------------------------ native
    @classmethod
    def from_native(cls, config: dict[str, Any]) -> WanDiTConfig:
        """Build from a native (official Wan release) config.json dict.

        A key the release's config.json omits takes the official ``WanModel``'s default
        (:data:`OFFICIAL_DEFAULTS`: the release never stores ``text_dim``, ``qk_norm``,
        ``cross_attn_norm``, ``patch_size``, ``window_size``). Keys starting with `_` are metadata;
        `window_size` is accepted only as global attention (-1, -1).
        """
        names = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in (OFFICIAL_DEFAULTS | config).items():
            if key.startswith("_"):
                continue
            if key == "window_size":
                if tuple(value) != (-1, -1):
                    raise ValueError(
                        f"native Wan config 'window_size'={value}: only global attention (-1, -1)"
                    )
                continue
            if key not in names:
                raise ValueError(
                    f"native Wan config has unknown key {key!r}; expected one of {sorted(names)}"
                )
            values[key] = value
        return cls(**values)

    def to_native(self) -> dict[str, Any]:
        """The native config.json dict as an official release has it: ``_class_name`` ``WanModel``, the
        ``_diffusers_version``, and the keys ``WanModel`` stores (``model_type``, ``text_len``, ``in_dim``,
        ``dim``, ``ffn_dim``, ``freq_dim``, ``out_dim``, ``num_heads``, ``num_layers``, ``eps``). A field
        the official class does not store or know (:data:`OFFICIAL_UNSTORED`, :data:`OFFICIAL_ROPE`) is
        written only when it differs from the official value, so this loader reads the model back; the
        official code cannot build such a model (:meth:`official_mismatches`)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values["patch_size"] = list(self.patch_size)
        out = {k: v for k, v in values.items() if k not in _OFFICIAL_FIXED or v != _OFFICIAL_FIXED[k]}
        return {
            "_class_name": OFFICIAL_CLASS_NAME,
            "_diffusers_version": _diffusers_version(),
            **dict(sorted(out.items())),
        }

    def official_mismatches(self) -> list[str]:
        """The fields whose value the official ``WanModel`` cannot take from a config.json (it fixes
        them): empty for every released Wan2.2 shape."""
        current = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}
        return sorted(k for k, v in _OFFICIAL_FIXED.items() if current[k] != v)

    @classmethod
    def from_json_dict(cls, config: dict[str, Any]) -> WanDiTConfig:
        """Build from either layout's config.json, telling them apart by their field names."""
        return cls.from_diffusers(config) if is_diffusers_config(config) else cls.from_native(config)

    @classmethod
    def from_file(cls, path: str | Path) -> WanDiTConfig:
        """Read a config.json of either layout."""
        path = Path(path)
        try:
            config = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"cannot read Wan DiT config {path}: {err}") from err
        return cls.from_json_dict(config)


def _diffusers_version() -> str:
    """The installed diffusers version (what ``register_to_config`` writes as ``_diffusers_version``)."""
    try:
        return version("diffusers")
    except PackageNotFoundError:  # pragma: no cover - diffusers is a dependency of the app
        return "0.0.0"


def is_diffusers_config(config: dict[str, Any]) -> bool:
    """True for a diffusers `WanTransformer3DModel` config.json, False for a native Wan one."""
    return config.get("_class_name") == DIFFUSERS_CLASS_NAME or "num_attention_heads" in config
