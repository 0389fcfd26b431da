"""The planner's tracker: torch's ``FSDPMemTracker`` over a container, plus time, views and modules.

``FSDPMemTracker`` (``torch.distributed._tools``) tags every storage the traced step allocates
(sharded / gathered parameters, gradients, optimizer states, activations, temporaries, FSDP's
all-gather and reduce-scatter buffers) and keeps the peak. :class:`PlanTracker` extends it for a
trainer's run:

- the root is a ``ModelContainer``, never FSDP-wrapped itself (torch's class wants an FSDP root:
  its ``__init__`` is replaced, its instrumentation walks ``modules()`` the same way);
- parameters outside FSDP (an ignored VAE, replicated ones), the EMA and the buffers of other
  collectives (all-to-all, ring send / receive) get their own tags (:mod:`.categories`);
- the target's attention kernel stands in for torch's CPU kernel (:mod:`.attention_standin`);
- every op is timed (:mod:`.cost_model`) into the current part of the step, recomputation apart;
  the asynchronous all-to-alls on a timeline of their own, waited for at the first read of their
  result, their send buffers held until then (:mod:`.overlap`);
- :class:`View` s read other layouts off the same trace: per tag, the factor its bytes take on the
  device and on the host (another shard degree, CPU offload), each with its own running peak;
- per module: parameter bytes per rank, the activations its forward leaves for backward, time;
- a value read from a fake tensor (``.item()``, ``bool(t)``: data the trace does not have) is
  answered with a placeholder (True / 1) and counted.

DTensor sharding propagation runs its shape inference in the active fake mode; under the planner's
``FakeTensorMode`` those global-shape tensors would be counted as allocations (torch's tracker
assumes eager mode): :func:`mm_trainer.planner.fake_world.fake_world` gives propagation a fake mode
of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor, unset_fake_temporarily
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPModState, _FSDPState
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from mm_trainer.planner.attention_standin import attention_call
from mm_trainer.planner.categories import HOST_TAGS, Tag
from mm_trainer.planner.cost_model import BACKWARD_GATHER, CostModel, StepCost, is_collective
from mm_trainer.planner.device_specs import DeviceSpec
from mm_trainer.planner.overlap import ASYNC_COLLECTIVES, AsyncTimeline

aten = torch.ops.aten
c10d = torch.ops.c10d
_COMM_OUTPUT = {c10d.alltoall_base_.default: (0, 1), c10d.recv_.default: (0,), c10d.broadcast_.default: (0,)}
_COMM_RESULT = {torch.ops._c10d_functional.all_to_all_single.default: (0,)}
"""Functional collectives: the arguments (by index) that are communication buffers; their result is one too."""
SMALL_VALUES = 1 << 16
"""Tensors made from no tensor up to this many elements are made for real too (``PlanTracker._small_factory``)."""
MODULE_DEPTH = 4
"""Modules up to this many path segments (the container's sub-model counts as one) get statistics."""


@dataclass(frozen=True)
class View:
    """A layout read off one trace: per tag, the factor of its traced bytes on the device and on the
    host (tags absent: all on the device, as traced)."""

    name: str
    device: dict[Tag, float] = field(default_factory=dict)
    host: dict[Tag, float] = field(default_factory=dict)
    shard: int = 0
    """The layout's FSDP shard group size (0: the traced one)."""
    offload: bool | None = None
    """The layout's plan-level CPU offload (None: as traced)."""
    keep_gathered: bool = False
    """``reshard_after_forward: false``: every unit that resharded after its forward in the trace
    keeps its gathered parameters until its backward (until the end for frozen units)."""

    def device_bytes(self, snapshot: dict[Any, int]) -> float:
        return sum(
            v * self.device.get(k, 1.0) for k, v in snapshot.items() if k != _TOTAL_KEY and k not in HOST_TAGS
        )

    def host_bytes(self, snapshot: dict[Any, int]) -> float:
        return sum(
            v * self.host.get(k, 1.0 if k in HOST_TAGS else 0.0)
            for k, v in snapshot.items()
            if k != _TOTAL_KEY
        )


@dataclass
class ViewPeak:
    """The running peak of one view: device bytes, the snapshot then, and the host bytes' maximum."""

    device: float = 0.0
    snapshot: dict[Any, int] = field(default_factory=dict)
    host: float = 0.0
    part: str = ""
    by_part: dict[str, float] = field(default_factory=dict)
    """The device peak within each traced part of the step (encoding, micro-steps, optimizer)."""


@dataclass
class ModuleStats:
    """One module of the traced step (per rank)."""

    path: str
    param_bytes: int = 0
    kept_bytes: int = 0
    """Activations its first forward under autograd left allocated: what it saved for backward, its
    output, and the copies FSDP cast its inputs into."""
    seconds: float = 0.0
    """Forward time, all calls (recomputation in backward apart)."""
    calls: int = 0


class PlanTracker(FSDPMemTracker):
    """``FSDPMemTracker`` over a container, with time, views and module statistics (module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        *,
        device: DeviceSpec,
        cost: CostModel,
        views: Iterable[View],
        ema: Any = None,
        extra_modules: Iterable[torch.nn.Module] = (),
    ) -> None:
        MemTracker.__init__(self)  # FSDPMemTracker.__init__ refuses a root that is not an FSDP module
        self._root_mod = model
        self._optm = optimizer
        self._fsdp_mod_to_saved_methods = WeakIdKeyDictionary()
        self._fsdp_state = _FSDPState.PRE_FW
        self._ref_class = Tag
        self.device, self.cost, self.ema = device, cost, ema
        self.extra_modules = list(extra_modules)
        """Modules outside the container that the step runs (a rollout's rewards' models): their parameters
        and buffers are tagged as the container's frozen ones are."""
        self.views = {view.name: view for view in views}
        self.view_peaks = {name: ViewPeak() for name in self.views}
        self.parts: dict[str, StepCost] = {}
        self.timeline = AsyncTimeline()
        self.part = "setup"
        self.placeholders = 0
        self.kernels: dict[str, int] = {}
        self.modules: dict[str, ModuleStats] = {}
        self._entered: dict[str, int] = {}
        self._hook_handles: list[Any] = []
        self._dirty = True
        self.kept_gathered = 0
        """Bytes of gathered units a ``reshard_after_forward: false`` layout would still hold now."""
        self._kept_units: dict[int, int] = {}
        self.on_unit: Callable[[], None] | None = None
        """Called as each FSDP unit ends its forward (outside backward) or its backward: progress."""
        for name, param in model.named_parameters():
            self._count_module_param(name, param)

    # ------------------------------------------------------------------ setup
    def __enter__(self) -> PlanTracker:
        super().__enter__()
        if self._depth == 1:
            self._tag_static_state()
            self._name_modules()
            self._mod_tracker.register_user_hooks(self._pre_fw, self._post_fw, None, None)
        return self

    def __exit__(self, *args: Any) -> None:
        if self._depth == 1:
            self._mod_tracker.clear_user_hooks()
            for handle in self._hook_handles:
                handle.remove()
            self._hook_handles.clear()
        super().__exit__(*args)

    def _tag_static_state(self) -> None:
        """Parameters outside FSDP (and their future gradients), every buffer, the EMA, the extra modules'
        parameters and buffers."""
        for module in self.extra_modules:
            for param in module.parameters():
                self._update_and_maybe_create_winfos(param, Tag.PARAM)
            for buffer in module.buffers():
                self._update_and_maybe_create_winfos(buffer, Tag.BUFFER)
        for param in self._root_mod.parameters():
            if isinstance(param, DTensor):
                continue
            self._update_and_maybe_create_winfos(param, Tag.PARAM)
            if param.requires_grad:
                self._hook_handles.append(
                    param.register_post_accumulate_grad_hook(
                        lambda p: self._update_and_maybe_create_winfos(p.grad, Tag.GRAD)
                    )
                )
        for buffer in self._root_mod.buffers():
            self._update_and_maybe_create_winfos(buffer, Tag.BUFFER)
        if self.ema is not None:
            for average in self.ema.state_dict().values():
                local = average.to_local() if isinstance(average, DTensor) else average
                self._update_and_maybe_create_winfos(local, Tag.EMA)

    def _name_modules(self) -> None:
        """Every module under its path in the container (torch's tracker names a module by the
        first call it sees: a VAE's encoder called through ``encode`` would lose its prefix)."""
        root = type(self._root_mod).__name__
        known = self._mod_tracker._known_modules
        for name, module in self._root_mod.named_modules():
            known[module] = f"{root}.{name}" if name else root

    def _count_module_param(self, name: str, param: torch.Tensor) -> None:
        """Add ``param``'s per-rank bytes to the statistics of the modules that hold it."""
        local = param.to_local() if isinstance(param, DTensor) else param
        nbytes = local.numel() * local.element_size()
        parts = name.split(".")[:-1]
        for depth in range(1, min(len(parts), MODULE_DEPTH) + 1):
            path = ".".join(parts[:depth])
            self.modules.setdefault(path, ModuleStats(path)).param_bytes += nbytes

    # -------------------------------------------------------------- modules
    def _fqn(self, module: torch.nn.Module) -> str | None:
        name = self._mod_tracker.get_known_fqn(module)
        if name is None or "." not in name:
            return None
        path = name.split(".", 1)[1]
        return path if path.count(".") < MODULE_DEPTH else None

    def _pre_fw(self, module: torch.nn.Module, inputs: Any) -> None:
        if self._mod_tracker.is_bw:  # recomputation (activation checkpointing) in backward
            if self._ac_mod is None:
                self._ac_mod = _weak(module)
                self._in_ac = True
            return
        path = self._fqn(module)
        if path is not None and path not in self._entered and torch.is_grad_enabled():
            self._entered[path] = self._activations()  # what it keeps for backward: under autograd only
        if path is not None:
            self.modules.setdefault(path, ModuleStats(path)).calls += 1

    def _post_fw(self, module: torch.nn.Module, inputs: Any, outputs: Any) -> None:
        if self._mod_tracker.is_bw:
            if self._ac_mod is not None and self._ac_mod() is module:
                self._ac_mod = None
                self._in_ac = False
            return
        path = self._fqn(module)
        if path is not None and path in self._entered:
            stats = self.modules.setdefault(path, ModuleStats(path))
            if not stats.kept_bytes:
                stats.kept_bytes = self._activations() - self._entered[path]

    def _activations(self) -> int:
        """Activation bytes now (what forwards allocate and keep; FSDP's gathered units apart)."""
        return sum(snap.get(Tag.ACT, 0) + snap.get(Tag.INP, 0) for snap in self._curr_mem_snap.values())

    # ------------------------------------------------------------ dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]  # noqa: ANN001
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default and isinstance(args[0], FakeTensor):
            try:
                return super().__torch_dispatch__(func, types, args, kwargs)
            except DataDependentOutputException:  # a value the trace does not have
                self.placeholders += 1
                return _placeholder(args[0].dtype)
        made = self._small_factory(func, args, kwargs)
        if made is not None:
            self._track(Tag.TEMP if self._mod_tracker.is_bw and not self._in_ac else Tag.ACT, made)
            self._update_peak_stats(None)
            return made
        part = self.parts.setdefault(self.part, StepCost())
        for kind, hidden in self.timeline.before(func, (args, kwargs)):
            part.overlapped_s[kind] = part.overlapped_s.get(kind, 0.0) + hidden
        res = super().__torch_dispatch__(func, types, args, kwargs)
        if res is NotImplemented:
            return res
        self.timeline.after(func, (args, kwargs), res)
        if is_collective(func):
            self._collective(func, args, kwargs, res, part)
            return res
        call = attention_call(func, args, kwargs, self.device)
        if call is not None:
            self.kernels[call.kernel] = self.kernels.get(call.kernel, 0) + 1
            self._workspace(call.workspace)
            flops = call.flops
        else:
            flops = self.cost.op_flops(func, args, kwargs, res)
        seconds = self.cost.op_seconds(func, flops, args, kwargs, res)
        self.timeline.compute(seconds)
        part.compute_s += seconds
        part.flops += flops
        if call is not None:
            part.attention_s += seconds
        if self._in_ac:
            part.recompute_flops += flops
        if not self._mod_tracker.is_bw:  # backward nesting is not tracked reliably (torch's ModTracker)
            for name in self._mod_tracker.parents:
                path = name.split(".", 1)[1] if "." in name else None
                if path is not None and path in self.modules:
                    self.modules[path].seconds += seconds
        return res

    def _small_factory(self, func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
        """A small tensor made from no tensor (a grid index or a per-sample coin drawn from its
        generator, a ``zeros`` / ``arange`` of a few thousand elements), or from small real tensors only
        (a sampler's sigma schedule, computed before the trace), made for real as well and kept as a fake
        tensor with its value: code that reads it (an index check, an expert switch, ``mask.any()``, a
        sampler step's sigma) then sees what a run would, through fake tensors' constant propagation.
        Large ones (noise, activations) stay fake: their shape is asked of the fake mode first."""
        if func._schema.is_mutable:
            return None
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if tensors and not all(_small_real(t) for t in tensors):
            return None
        shape = func(*args, **kwargs)  # the fake mode's answer: shape only, nothing drawn
        if not isinstance(shape, torch.Tensor) or shape.numel() > SMALL_VALUES:
            return None
        with unset_fake_temporarily():
            real = func(*args, **kwargs)
        fake_mode = self._fake_mode_on_entry
        return fake_mode.fake_tensor_converter.from_real_tensor(fake_mode, real, make_constant=True)

    def _collective(self, func: Any, args: tuple, kwargs: dict, res: Any, part: StepCost) -> None:
        for index in _COMM_OUTPUT.get(func, ()):
            for t in args[index] if isinstance(args[index], (list, tuple)) else (args[index],):
                self._update_and_maybe_create_winfos(t, Tag.COMM)
        if func in _COMM_RESULT:
            for t in [args[i] for i in _COMM_RESULT[func]] + [res]:
                self._update_and_maybe_create_winfos(t, Tag.COMM)
        moved = self.cost.collective(func, args, kwargs, res)
        if moved is not None:
            kind, nbytes, seconds = moved
            if kind == "all-gather" and self._mod_tracker.is_bw:
                kind = BACKWARD_GATHER  # what reshard_after_forward: false saves
            part.add_comm(kind, nbytes, seconds)
            if func in ASYNC_COLLECTIVES:  # in flight until its result is read (.overlap)
                self.timeline.start(kind, seconds, args[0], res)

    def _workspace(self, nbytes: int) -> None:
        """Allocate and free the target kernel's workspace, so that the peak sees it beside the outputs."""
        if nbytes <= 0:
            return
        workspace = torch.empty(nbytes, dtype=torch.uint8)
        self._update_and_maybe_create_winfos(workspace, Tag.ATTENTION)
        self._update_peak_stats(_FSDPModState.PEAK_BW if self._mod_tracker.is_bw else _FSDPModState.PEAK_FW)
        del workspace

    # ------------------------------------------------- FSDP units (gathered or not)
    def _fsdp_state_post_forward(self, fsdp_mod: Any, orig: Any) -> Any:
        inner = super()._fsdp_state_post_forward(fsdp_mod, orig)

        def post_forward(*args: Any, **kwargs: Any) -> Any:
            group = fsdp_mod._get_fsdp_state()._fsdp_param_group
            keep = (
                not self._mod_tracker.is_bw and group is not None and group.post_forward_mesh_info is not None
            )
            gathered = _gathered_bytes(group) if keep else 0
            out = inner(*args, **kwargs)
            if keep and id(fsdp_mod) not in self._kept_units:
                self._kept_units[id(fsdp_mod)] = gathered
                self.kept_gathered += gathered
            if self.on_unit is not None and not self._mod_tracker.is_bw:
                self.on_unit()
            return out

        return post_forward

    def _fsdp_param_group_post_backward(self, fsdp_mod: Any, orig: Any) -> Any:
        inner = super()._fsdp_param_group_post_backward(fsdp_mod, orig)

        def post_backward(*args: Any, **kwargs: Any) -> Any:
            out = inner(*args, **kwargs)
            group = fsdp_mod._get_fsdp_state()._fsdp_param_group
            for fsdp_param in group.fsdp_params if group is not None else ():
                # without gradient sync (accumulation) FSDP keeps the whole unsharded gradient, in reduce_dtype
                kept = getattr(fsdp_param, "unsharded_accumulated_grad", None)
                for grad in (kept, fsdp_param._unsharded_param.grad):
                    if grad is not None:
                        self._update_and_maybe_create_winfos(grad, Tag.UNSHARDED_GRAD)
            if self.on_unit is not None:
                self.on_unit()
            return out

        return post_backward

    def _instrument_fsdp_module(self) -> None:
        """torch's instrumentation, and each unit's ``unshard``: where backward (or its prefetch)
        gathers a unit again, a layout that kept it gathered holds it once, not twice."""
        super()._instrument_fsdp_module()
        self._unshards: list[tuple[Any, Any]] = []
        for module in self._root_mod.modules():
            group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
            if group is None:
                continue
            orig = group.unshard

            def unshard(*args: Any, _orig: Any = orig, _key: int = id(module), **kwargs: Any) -> Any:
                if self._mod_tracker.is_bw:
                    self.kept_gathered -= self._kept_units.pop(_key, 0)
                return _orig(*args, **kwargs)

            group.unshard = unshard
            self._unshards.append((group, orig))

    def _deregister_module_and_optimizer_hooks(self) -> None:
        super()._deregister_module_and_optimizer_hooks()
        for group, orig in getattr(self, "_unshards", []):
            group.unshard = orig
        self._unshards = []

    # ---------------------------------------------------------------- peaks
    def _update_snap(
        self, u_type: Any, winfo: Any, old_mem_consumed: Any = None, old_reftype: Any = None
    ) -> None:
        super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
        self._dirty = True

    def _update_peak_stats(self, peak_state: Any) -> None:
        """The overall peak and each view's (torch's per-module peaks are not kept: unused, and a
        loop over every unit per op)."""
        if not self._dirty:
            return
        self._dirty = False
        for dev, dev_snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap[_TOTAL_KEY]:
                self._peak_mem[dev] = dev_snap[_TOTAL_KEY]
                self._peak_mem_snap[dev] = dict(dev_snap)
        snapshot = self._merged_snapshot()
        for name, view in self.views.items():
            peak = self.view_peaks[name]
            kept = self.kept_gathered if view.keep_gathered else 0
            device = view.device_bytes(snapshot) + kept
            if device > peak.by_part.get(self.part, 0.0):
                peak.by_part[self.part] = device
            if device > peak.device:
                peak.device, peak.snapshot, peak.part = device, dict(snapshot), self.part
                if kept:
                    peak.snapshot[Tag.UNSHARDED_PARAM] = peak.snapshot.get(Tag.UNSHARDED_PARAM, 0) + kept
            peak.host = max(peak.host, view.host_bytes(snapshot))

    def _merged_snapshot(self) -> dict[Any, int]:
        """The current bytes per tag, summed over devices (the trace has one: the fake CPU)."""
        merged: dict[Any, int] = {}
        for snap in self._curr_mem_snap.values():
            for key, value in snap.items():
                merged[key] = merged.get(key, 0) + value
        return merged

    def current(self) -> dict[Any, int]:
        """The current bytes per tag (for tests and progress lines)."""
        return self._merged_snapshot()


def _gathered_bytes(group: Any) -> int:
    """Bytes of one FSDP unit's gathered (unsharded) parameters, while they are gathered."""
    return sum(fp.unsharded_param.untyped_storage().nbytes() for fp in group.fsdp_params)


def _small_real(tensor: torch.Tensor) -> bool:
    """A plain tensor with values (not fake, not meta, no subclass) of at most :data:`SMALL_VALUES` elements."""
    return type(tensor) is torch.Tensor and not tensor.is_meta and tensor.numel() <= SMALL_VALUES


def _placeholder(dtype: torch.dtype) -> bool | int | float:
    if dtype == torch.bool:
        return True
    return 1.0 if dtype.is_floating_point or dtype.is_complex else 1


def _weak(module: torch.nn.Module) -> Any:
    import weakref

    return weakref.ref(module)
