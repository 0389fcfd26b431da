"""Video/image + caption datasets (PyAV), buckets, a layout-independent stateful sampler, and the latent cache.

The public names below are imported on first use (PEP 562), so ``import mm_data`` and its console
script's ``--help`` / ``--version`` do not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # name: submodule that defines it
    "BadSample": "bad_samples",
    "BadSampleError": "bad_samples",
    "BadSampleTracker": "bad_samples",
    "Bucket": "buckets",
    "assign_bucket": "buckets",
    "make_buckets": "buckets",
    "parse_buckets": "buckets",
    "same_bucket_order": "buckets",
    "CacheReport": "cache",
    "cache_dataset": "cache",
    "CacheIndex": "cache_index",
    "INDEX_NAME": "cache_index",
    "ShardEntry": "cache_index",
    "shard_layout": "cache_index",
    "shard_name": "cache_index",
    "canonical_json": "cache_keys",
    "content_key": "cache_keys",
    "tree_digest": "cache_keys",
    "CACHE_MANIFEST": "cache_store",
    "FileStore": "cache_store",
    "ShardedStore": "cache_store",
    "bad_marker_name": "cache_store",
    "cache_file_name": "cache_store",
    "open_cache": "cache_store",
    "read_cache_manifest": "cache_store",
    "write_per_file_copy": "cache_store",
    "CAPTION_KEY": "cached_dataset",
    "CachedVideoTextDataset": "cached_dataset",
    "caption_entries": "cached_dataset",
    "write_caption_tokenizer": "caption_tokenizer",
    "caption_candidates": "captions",
    "draw_caption": "captions",
    "sample_rng": "captions",
    "ChatTemplate": "chat_template",
    "EncodedConversation": "chat_template",
    "IGNORE_INDEX": "chat_template",
    "TEMPLATES": "chat_template",
    "register_template": "chat_template",
    "caption_direction": "clip_checks",
    "moves_as_captioned": "clip_checks",
    "psnr": "clip_checks",
    "shape_centroids": "clip_checks",
    "clip_info": "clip_info",
    "clip_info_path": "clip_info",
    "record_info": "clip_info",
    "collate_video_text": "collate",
    "contact_sheet": "contact_sheet",
    "contact_sheet_size": "contact_sheet",
    "write_contact_sheet": "contact_sheet",
    "Conversation": "conversation",
    "ConversationColumns": "conversation",
    "ConversationError": "conversation",
    "Message": "conversation",
    "to_conversation": "conversation",
    "ConversationDataset": "conversation_dataset",
    "VideoTextDataset": "dataset",
    "load_clip_tensors": "dataset",
    "to_video_tensor": "dataset",
    "SampleTimeout": "deadline",
    "call_with_deadline": "deadline",
    "DecodeError": "decode",
    "VideoInfo": "decode",
    "decode_frames": "decode",
    "load_image": "decode",
    "probe_video": "decode",
    "require_regular_file": "decode",
    "FileRecords": "file_records",
    "file_stat": "file_records",
    "sha256_file": "file_records",
    "check_frame_rule": "frames",
    "frame_step": "frames",
    "sample_frame_indices": "frames",
    "ResumableDataLoader": "loader",
    "build_dataloader": "loader",
    "MetadataError": "metadata",
    "read_metadata": "metadata",
    "MM_PLUGINS": "mm_plugin",
    "MediaBudget": "mm_plugin",
    "MediaFeatures": "mm_plugin",
    "MultimodalPlugin": "mm_plugin",
    "SampleError": "mm_plugin",
    "VideoClip": "mm_plugin",
    "MultimodalCollator": "multimodal_collate",
    "load_precomputed": "precomputed",
    "save_precomputed": "precomputed",
    "PrecomputedLatentDataset": "precomputed_dataset",
    "PAIR_KEYS": "pairs",
    "PreferencePairs": "pairs",
    "read_pairs": "pairs",
    "Registry": "registry",
    "check_samples": "sample_check",
    "GlobalOrderSampler": "sampler",
    "CorruptShardError": "shards",
    "ShardReader": "shards",
    "read_shard_header": "shards",
    "write_shard": "shards",
    "caption_vocabulary": "synthetic",
    "frame_index_from_colour": "synthetic",
    "index_colour_rgb": "synthetic",
    "make_synthetic_dataset": "synthetic",
    "write_clip": "synthetic",
    "to_video_frames": "video_out",
    "write_video": "video_out",
    "CacheLock": "cache_lock",
    "CacheLockedError": "cache_lock",
    "CacheMismatchError": "cache_made_with",
    "CaptionError": "caption_folder",
    "cache_made_with": "cache_made_with",
    "caption_path": "caption_folder",
    "check_cache_made_with": "cache_made_with",
    "clip_digests": "clip_info",
    "from_rank0": "cache",
    "read_caption": "caption_folder",
    "read_caption_folder": "caption_folder",
    "recipe_differences": "cache_made_with",
    "verify_shard": "shards",
    "write_wav": "audio_out",
    "LossCurve": "contact_sheet",
    "loss_plot_area": "contact_sheet",
    "smooth_losses": "contact_sheet",
}

__all__ = sorted([*_EXPORTS])


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
