"""Video/image + caption datasets (PyAV), buckets, a layout-independent stateful sampler, and the latent cache."""

__version__ = "0.1.0"

from .bad_samples import BadSample, BadSampleError, BadSampleTracker
from .buckets import Bucket, assign_bucket, make_buckets, parse_buckets, same_bucket_order
from .cache import CacheReport, cache_dataset
from .cache_index import INDEX_NAME, CacheIndex, ShardEntry, shard_layout, shard_name
from .cache_keys import canonical_json, content_key, tree_digest
from .cache_store import (
    CACHE_MANIFEST,
    FileStore,
    ShardedStore,
    bad_marker_name,
    cache_file_name,
    open_cache,
    read_cache_manifest,
    write_per_file_copy,
)
from .cached_dataset import CAPTION_KEY, CachedVideoTextDataset, caption_entries
from .caption_tokenizer import write_caption_tokenizer
from .captions import caption_candidates, draw_caption, sample_rng
from .chat_template import IGNORE_INDEX, TEMPLATES, ChatTemplate, EncodedConversation, register_template
from .clip_checks import caption_direction, moves_as_captioned, psnr, shape_centroids
from .clip_info import clip_info, clip_info_path, record_info
from .collate import collate_video_text
from .contact_sheet import (
    LossCurve,
    contact_sheet,
    contact_sheet_size,
    loss_plot_area,
    smooth_losses,
    write_contact_sheet,
)
from .conversation import Conversation, ConversationColumns, ConversationError, Message, to_conversation
from .conversation_dataset import ConversationDataset
from .dataset import VideoTextDataset, load_clip_tensors, to_video_tensor
from .deadline import SampleTimeout, call_with_deadline
from .decode import DecodeError, VideoInfo, decode_frames, load_image, probe_video, require_regular_file
from .file_records import FileRecords, file_stat, sha256_file
from .frames import check_frame_rule, frame_step, sample_frame_indices
from .loader import ResumableDataLoader, build_dataloader
from .metadata import MetadataError, read_metadata
from .mm_plugin import MM_PLUGINS, MediaBudget, MediaFeatures, MultimodalPlugin, SampleError, VideoClip
from .multimodal_collate import MultimodalCollator
from .precomputed import load_precomputed, save_precomputed
from .precomputed_dataset import PrecomputedLatentDataset
from .registry import Registry
from .sample_check import check_samples
from .sampler import GlobalOrderSampler
from .shards import CorruptShardError, ShardReader, read_shard_header, write_shard
from .synthetic import (
    caption_vocabulary,
    frame_index_from_colour,
    index_colour_rgb,
    make_synthetic_dataset,
    write_clip,
)
from .video_out import to_video_frames, write_video

__all__ = [
    "CACHE_MANIFEST",
    "INDEX_NAME",
    "CacheIndex",
    "CorruptShardError",
    "FileRecords",
    "FileStore",
    "ShardEntry",
    "ShardReader",
    "ShardedStore",
    "canonical_json",
    "clip_info",
    "clip_info_path",
    "content_key",
    "file_stat",
    "open_cache",
    "read_shard_header",
    "record_info",
    "sha256_file",
    "shard_layout",
    "shard_name",
    "tree_digest",
    "write_per_file_copy",
    "write_shard",
    "CAPTION_KEY",
    "CachedVideoTextDataset",
    "bad_marker_name",
    "caption_candidates",
    "caption_entries",
    "draw_caption",
    "read_cache_manifest",
    "sample_rng",
    "same_bucket_order",
    "IGNORE_INDEX",
    "MM_PLUGINS",
    "TEMPLATES",
    "BadSample",
    "BadSampleError",
    "BadSampleTracker",
    "Bucket",
    "CacheReport",
    "ChatTemplate",
    "Conversation",
    "ConversationColumns",
    "ConversationDataset",
    "ConversationError",
    "DecodeError",
    "EncodedConversation",
    "GlobalOrderSampler",
    "LossCurve",
    "MediaBudget",
    "MediaFeatures",
    "Message",
    "MetadataError",
    "MultimodalCollator",
    "MultimodalPlugin",
    "PrecomputedLatentDataset",
    "Registry",
    "ResumableDataLoader",
    "SampleError",
    "SampleTimeout",
    "call_with_deadline",
    "check_samples",
    "require_regular_file",
    "VideoClip",
    "VideoInfo",
    "VideoTextDataset",
    "load_clip_tensors",
    "assign_bucket",
    "build_dataloader",
    "cache_dataset",
    "cache_file_name",
    "caption_direction",
    "caption_vocabulary",
    "check_frame_rule",
    "collate_video_text",
    "contact_sheet",
    "contact_sheet_size",
    "loss_plot_area",
    "decode_frames",
    "frame_index_from_colour",
    "frame_step",
    "index_colour_rgb",
    "load_image",
    "load_precomputed",
    "make_buckets",
    "make_synthetic_dataset",
    "moves_as_captioned",
    "parse_buckets",
    "probe_video",
    "psnr",
    "read_metadata",
    "register_template",
    "sample_frame_indices",
    "save_precomputed",
    "shape_centroids",
    "smooth_losses",
    "to_conversation",
    "to_video_frames",
    "to_video_tensor",
    "write_caption_tokenizer",
    "write_contact_sheet",
    "write_clip",
    "write_video",
]
