"""The real ``torch_npu`` profiler and memory-snapshot functions ``mm_trainer.tools.profiling`` calls, pinned as data.

Read from github.com/Ascend/pytorch, master at 9e73e708ab9350d203475609f36f8a43f6a0c2ab (2026-12-02):
``torch_npu/profiler/profiler.py`` (``profile.__init__``, ``_KinetoProfile.export_chrome_trace``,
``__enter__`` / ``__exit__`` = ``start`` / ``stop``), ``torch_npu/csrc/profiler/init.cpp``
(``ProfilerActivity``: ``CPU``, ``NPU``) and ``torch_npu/npu/memory.py`` (``_record_memory_history`` ->
``_record_memory_history_impl``, ``_dump_snapshot``; the NPU memory snapshot doc,
``docs/zh/developer_notes/memory_management/memory_snapshot.md``, shows that pair). The stand-in of
``test_profiling.py`` binds every call through these signatures, so a call the real torch_npu would
refuse fails there.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

REQUIRED = inspect.Parameter.empty
POS = inspect.Parameter.POSITIONAL_OR_KEYWORD
KW = inspect.Parameter.KEYWORD_ONLY

PROFILER_ACTIVITIES = ("CPU", "NPU")

#: ``torch_npu.profiler.profile(*, activities=None, schedule=None, on_trace_ready=None, ...)``
PROFILE: dict[str, Any] = {
    "params": [
        ("activities", KW, None), ("schedule", KW, None), ("on_trace_ready", KW, None), ("record_shapes", KW, False),
        ("profile_memory", KW, False), ("with_stack", KW, False), ("with_flops", KW, False),
        ("with_modules", KW, False), ("experimental_config", KW, None), ("execution_trace_observer", KW, None),
        ("custom_trace_id_callback", KW, None), ("use_cuda", KW, None),
    ],
}  # fmt: skip

#: ``profile.export_chrome_trace(output_path: str)`` (without ``self``)
EXPORT_CHROME_TRACE: dict[str, Any] = {"params": [("output_path", POS, REQUIRED)]}

#: ``torch_npu.npu.memory._record_memory_history(enabled="all", *args, **kwargs)``, forwarding to
#: ``_record_memory_history_impl(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None)``
RECORD_MEMORY_HISTORY: dict[str, Any] = {
    "params": [
        ("enabled", POS, "all"), ("context", POS, "all"), ("stacks", POS, "all"), ("max_entries", POS, sys.maxsize),
        ("device", POS, None),
    ],
}  # fmt: skip

#: ``torch_npu.npu.memory._dump_snapshot(filename="dump_snapshot.pickle", augment_with_fx_traces=False)``
DUMP_SNAPSHOT: dict[str, Any] = {
    "params": [("filename", POS, "dump_snapshot.pickle"), ("augment_with_fx_traces", POS, False)],
}


def bind(api: dict[str, Any], args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every argument of a call to the pinned function, defaults filled in (TypeError for a call the real
    function would refuse)."""
    params = [inspect.Parameter(name, kind, default=default) for name, kind, default in api["params"]]
    bound = inspect.Signature(params).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)
