"""`ConversationDataset`: local ShareGPT / OpenAI-messages / Alpaca JSON(L) -> token ids, labels and media
inputs for a (vision-)language model.

Per sample: row -> :class:`~mm_data.Conversation` (``columns``) -> placeholders checked and media read
(``plugin``) -> rendered by the chat template with labels (``template``, ``train_on``) -> media tokens
expanded to the processor's counts. A sample that fails (bad row, placeholders that do not match its
media, a missing, unreadable or non-regular file, longer than ``cutoff_len``, not read within
``decode_timeout_s``: :mod:`mm_data.deadline`) is a bad sample: logged with its file, row and reason,
counted against ``max_bad_fraction`` and replaced by the next row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from .bad_samples import BadSample, BadSampleTracker
from .chat_template import IGNORE_INDEX, ChatTemplate, TrainOn
from .conversation import ConversationColumns, ConversationError, to_conversation
from .deadline import SampleTimeout, call_with_deadline
from .metadata import MetadataError, _read_rows
from .mm_plugin import MultimodalPlugin, SampleError
from .multimodal_collate import MultimodalCollator

__all__ = ["ConversationDataset"]


class ConversationDataset(Dataset):
    """Items: ``input_ids``, ``labels`` (``-100`` off the trained turns and at position 0),
    ``mm_token_type_ids`` (with a multimodal plugin), ``media`` (processor tensors), ``index`` and
    ``skipped``.

    ``collate_fn`` is a :class:`~mm_data.MultimodalCollator` (padding, or packing with ``packing``);
    ``tracker.bad_samples`` lists the bad samples this process skipped.
    """

    def __init__(
        self,
        data_path: str | Path,
        *,
        template: ChatTemplate,
        plugin: MultimodalPlugin,
        columns: ConversationColumns | None = None,
        data_root: str | Path | None = None,
        train_on: TrainOn = "assistant",
        cutoff_len: int | None = None,
        packing: bool = False,
        max_bad_fraction: float = 0.05,
        decode_timeout_s: float | None = 120.0,
    ) -> None:
        if decode_timeout_s is not None and not decode_timeout_s > 0:
            raise ValueError(f"decode_timeout_s must be > 0 (or None: no deadline), got {decode_timeout_s}")
        self.decode_timeout_s = decode_timeout_s
        self.data_path = Path(data_path)
        if not self.data_path.is_file():
            raise MetadataError(f"conversation file not found: {self.data_path}")
        self.rows = _read_rows(self.data_path)
        if not self.rows:
            raise MetadataError(f"{self.data_path}: no samples")
        self.root = Path(data_root) if data_root is not None else self.data_path.parent
        self.columns = columns or ConversationColumns()
        self.template, self.plugin = template, plugin
        self.train_on, self.cutoff_len = train_on, cutoff_len
        pad = template.tokenizer.pad_token_id
        if pad is None:
            raise ValueError(f"{type(template.tokenizer).__name__} has no pad token; set one")
        self.collate_fn = MultimodalCollator(pad, packing=packing)
        self.tracker = BadSampleTracker(len(self.rows), max_bad_fraction)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        candidates = ((int(index) + offset) % len(self) for offset in range(len(self)))
        describe = lambda i, e: BadSample(i, self.sample_name(i), str(e))  # noqa: E731
        errors = (SampleError, ConversationError, SampleTimeout)
        return self.tracker.first_good(candidates, self._timed_encode, describe, errors)

    def _timed_encode(self, index: int) -> dict[str, Any]:
        """:meth:`encode` under ``decode_timeout_s``."""
        return call_with_deadline(lambda: self.encode(index), self.decode_timeout_s, self.sample_name(index))

    def sample_name(self, index: int) -> str:
        """``<file>[<row>]`` plus the row's ``id`` when it has one."""
        row = self.rows[index]
        rid = row.get("id") if isinstance(row, dict) else None
        return f"{self.data_path}[{index}]" + (f" (id {rid})" if rid is not None else "")

    def encode(self, index: int) -> dict[str, Any]:
        """One sample without replacement; raises :class:`~mm_data.SampleError` for a bad one."""
        conversation = to_conversation(self.rows[index], self.columns, self.root)
        plugin = self.plugin
        plugin.check(conversation)
        images = [plugin.load_image(p) for p in conversation.images]
        videos = [plugin.load_video(p) for p in conversation.videos]
        features = plugin.process(images, videos)
        encoded = self.template.encode(plugin.template_messages(conversation), self.train_on)
        input_ids, labels = plugin.expand(encoded.input_ids, encoded.labels, features)
        if self.cutoff_len is not None and len(input_ids) > self.cutoff_len:
            raise SampleError(f"{len(input_ids)} tokens, more than cutoff_len={self.cutoff_len}")
        labels[0] = IGNORE_INDEX  # nothing predicts the first token (also a packed row's sample boundary)
        if all(label == IGNORE_INDEX for label in labels):
            raise SampleError(f"no token to train on (train_on={self.train_on!r})")
        item: dict[str, Any] = {
            "input_ids": input_ids,
            "labels": labels,
            "media": features.tensors,
            "index": index,
        }
        if plugin.image_token_id is not None or plugin.video_token_id is not None:
            item["mm_token_type_ids"] = plugin.token_type_ids(input_ids)
        return item
