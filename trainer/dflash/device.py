"""The GPU seam: the only module that touches torch.cuda, the process-group backend, flex attention
availability and the fla kernels. Everything else asks this module, so the same code runs on CPU in tests.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Runtime:
    """Where this process computes: its rank, its drafter device and its target device."""

    device: torch.device
    target_device: torch.device
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    dtype: torch.dtype = torch.float32  # autocast dtype (float32 = no autocast)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def cuda_available() -> bool:
    return torch.cuda.is_available()


def resolve_runtime(device: str = "auto", dtype: str = "bfloat16", target_gpus: tuple[int, ...] = (),
                    drafter_gpus: tuple[int, ...] = ()) -> Runtime:
    """Pick devices from torchrun's env (RANK, LOCAL_RANK, WORLD_SIZE) and the placement config.

    Calls ``torch.cuda.set_device`` for the drafter's device first thing, so that Triton kernels launch
    on the right GPU in every rank, and `route_kernels_by_device` before any model is loaded, so that a
    CPU runtime computes with torch's reference kernels even where fla and triton are installed.
    """
    route_kernels_by_device()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    use_cuda = device == "cuda" or (device == "auto" and cuda_available())
    if device == "cuda" and not cuda_available():
        raise RuntimeError("train.device is 'cuda' but no CUDA device is visible")
    if not use_cuda:
        cpu = torch.device("cpu")
        return Runtime(cpu, cpu, rank, local_rank, world, torch.float32)
    gpu = drafter_gpus[local_rank] if drafter_gpus else local_rank
    if gpu >= torch.cuda.device_count():
        raise RuntimeError(f"train.placement.drafter_gpus: GPU {gpu} does not exist "
                           f"({torch.cuda.device_count()} visible)")
    torch.cuda.set_device(gpu)
    tgpu = target_gpus[local_rank % len(target_gpus)] if target_gpus else gpu
    if tgpu >= torch.cuda.device_count():
        raise RuntimeError(f"train.placement.target_gpus: GPU {tgpu} does not exist "
                           f"({torch.cuda.device_count()} visible)")
    return Runtime(torch.device("cuda", gpu), torch.device("cuda", tgpu), rank, local_rank, world,
                   torch.bfloat16 if dtype == "bfloat16" else torch.float32)


def autocast(rt: Runtime) -> contextlib.AbstractContextManager[Any]:
    """Autocast to `rt.dtype` (bf16 on GPU; fp32 master weights stay in the optimizer), nothing for float32.

    `resolve_runtime` gives a CPU runtime float32, so CPU training runs without autocast; the GPU checks'
    CPU mode (tests/dflash/test_gpu.py, bench/gpu_dflash.py) builds a bf16 CPU runtime to run the bf16
    path at tiny size: torch's CPU autocast has bf16 kernels for the same ops (matmul, linear, SDPA).
    """
    if rt.dtype != torch.float32:
        return torch.autocast(rt.device.type, dtype=rt.dtype)
    return contextlib.nullcontext()


def dist_backend(rt: Runtime) -> str:
    return "nccl" if rt.device.type == "cuda" else "gloo"


def init_distributed(rt: Runtime, timeout_min: float = 60.0) -> None:
    """Join torchrun's process group (c10d rendezvous env) when WORLD_SIZE > 1; a collective that waits
    longer than `timeout_min` for a rank fails the job (train.placement.timeout_min)."""
    if not rt.distributed or torch.distributed.is_initialized():
        return
    kwargs: dict[str, Any] = {"backend": dist_backend(rt), "timeout": datetime.timedelta(minutes=timeout_min)}
    if rt.device.type == "cuda":
        kwargs["device_id"] = rt.device
    torch.distributed.init_process_group(**kwargs)


def destroy_distributed(ok: bool) -> None:
    """Leave the process group at the end of `train` (`ok`: the run ended cleanly on this rank).

    After a clean run every rank meets at a barrier before the group is destroyed. Gloo's barrier waits
    for every collective queued before it, so its worker threads hold no tensor once it returns; a worker
    still dropping the last collective's tensors while the interpreter shuts down needs the GIL there and
    aborts the rank (SIGABRT, "terminate called without an active exception") after its work is done.
    After a failure nothing collective runs: a peer may be blocked in a collective that will never
    complete, and a barrier or NCCL's communicator teardown would wait on it; torchrun ends the other
    ranks once this one exits with its error.
    """
    if ok and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class HostCopy:
    """A tensor's copy on the host, queued behind the work that makes it without waiting for the device.

    On CUDA it lands in pinned memory, and `get` waits for that copy alone (an event recorded after it),
    not for the work queued since; elsewhere the copy is made at once.
    """

    def __init__(self, t: torch.Tensor) -> None:
        self.event: Any = None
        if t.device.type == "cuda":
            self.host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self.host.copy_(t.detach(), non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = t.detach().clone()

    def get(self) -> torch.Tensor:
        if self.event is not None:
            self.event.synchronize()
        return self.host


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return 0.0


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def cuda_rng_state() -> list[torch.Tensor] | None:
    return torch.cuda.get_rng_state_all() if cuda_available() else None


def set_cuda_rng_state(state: list[torch.Tensor] | None) -> None:
    if state is not None and cuda_available():
        torch.cuda.set_rng_state_all(state)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (identity without a process group)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(t)
    return t


def world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def flex_enabled(device: torch.device) -> bool:
    """Flex attention by default on GPU only (on CPU it runs unfused: correct but slow). A caller that
    wants one path names it: `dflash_forward(..., use_flex=...)`, `AttentionMasks(..., use_flex=...)`."""
    return device.type == "cuda" and flex_available()


# Compiling flex attention. flex_attention and create_block_mask are compiled with dynamic=False: one
# graph per (batch size, padded length, mask kind). The sampler pads every batch to its length bucket's
# bound and `sample_anchors` pads the blocks to a count that depends on that length only, so the shapes
# come from a small fixed set. Static shapes are what the fused kernel wants: inductor's flex lowering
# sets IS_DIVISIBLE (no bounds-checked loads) only when it can prove seq_len % 128 == 0
# (torch/_inductor/kernel/flex/flex_attention.py, `flex_attention`), which a symbolic length never is,
# and its FLASH backend rejects the symbolic scalars a dynamic mask_mod would capture.
#
# Each compiled function gets `recompile_limit` = the budget set by `configure_compile` and
# fullgraph=True. Past the limit dynamo would otherwise run the function eagerly without a word
# (torch/_dynamo/convert_frame.py, `_compile_inner`: it raises FailOnRecompileLimitHit only under
# config.fail_on_recompile_limit_hit or fullgraph, else marks the frame RUN_ONLY), and eager flex
# materialises the whole score matrix (about 13 GB per layer at 4096 tokens). fullgraph=True makes it
# raise for these two functions only, without the process-wide fail_on_recompile_limit_hit; it also
# turns any graph break, another silent eager path, into an error. isolate_recompiles=True gives each
# compiled function its own count (compile caches live on the code object, shared by every
# torch.compile of the same function).
DEFAULT_COMPILE_SHAPES = 64  # (batch size, padded length) pairs: 27 buckets at 4096 x a full and a last batch
_COMPILE_BACKEND: str | None = None  # None: inductor on GPU, nothing compiled on CPU
_compile_limit = 0  # recompile_limit of each compiled flex function (0: configure_compile not called yet)
_compiled: dict[tuple[str, str], Callable[..., Any]] = {}


def configure_compile(num_shapes: int = DEFAULT_COMPILE_SHAPES, mask_kinds: int = 2, margin: int = 8) -> int:
    """Size the recompile budget of the compiled flex functions and return it.

    `num_shapes`: the distinct (batch size, padded length) pairs the caller will feed (a forward under
    no_grad counts as its own shape); `mask_kinds`: the layer types with their own mask (full and
    sliding). Each compiled function may compile num_shapes x mask_kinds + margin graphs; one more
    raises ``torch._dynamo.exc.FailOnRecompileLimitHit`` instead of running eagerly. Call it before the
    first step; a changed budget drops the compiled functions (they recompile on next use).
    """
    global _compile_limit
    if num_shapes < 1 or mask_kinds < 1 or margin < 0:
        raise ValueError(f"configure_compile: num_shapes {num_shapes} and mask_kinds {mask_kinds} must be "
                         f">= 1, margin {margin} >= 0")
    limit = num_shapes * mask_kinds + margin
    cfg = torch._dynamo.config
    # the process-wide cap on graphs per code object must not cut in below our own limit
    cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, limit + 1)
    if limit != _compile_limit:
        _compiled.clear()
        _compile_limit = limit
    return limit


def set_compile_backend(backend: str | None) -> None:
    """Compile flex with `backend` on every device ("aot_eager": CPU tests compile for real without
    inductor), or back to the default (None: inductor on GPU, uncompiled on CPU). Drops compiled functions."""
    global _COMPILE_BACKEND
    _COMPILE_BACKEND = backend
    _compiled.clear()


def _compiled_fn(fn: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    """`fn` compiled for `device` under the recompile budget, or `fn` itself when nothing compiles there."""
    backend = _COMPILE_BACKEND or ("inductor" if device.type == "cuda" else None)
    if backend is None:
        return fn
    key = (fn.__name__, backend)
    if key not in _compiled:
        if not _compile_limit:
            configure_compile()
        _compiled[key] = torch.compile(fn, backend=backend, dynamic=False, fullgraph=True,
                                       recompile_limit=_compile_limit, isolate_recompiles=True)
    return _compiled[key]


def flex_compiled(device: torch.device) -> bool:
    """Whether a default forward on `device` runs compiled flex attention (one compile per batch shape)."""
    backend = _COMPILE_BACKEND or ("inductor" if device.type == "cuda" else None)
    return flex_enabled(device) and backend is not None


def flex_attention_fn(device: torch.device) -> Callable[..., Any]:
    """flex_attention, compiled on GPU (the fused kernel), eager on CPU (unless a backend is set)."""
    from torch.nn.attention.flex_attention import flex_attention

    return _compiled_fn(flex_attention, device)


def create_block_mask_fn(device: torch.device) -> Callable[..., Any]:
    """create_block_mask, compiled like flex_attention_fn (torch's own advice: torch.compile it, rather
    than its deprecated _compile flag), so the mask is not re-traced eagerly every step."""
    from torch.nn.attention.flex_attention import create_block_mask

    return _compiled_fn(create_block_mask, device)


@contextlib.contextmanager
def cpu_flex_compile() -> Iterator[None]:
    """Compiled flex attention with a backward on CPU, for the GPU checks' CPU mode (restored on exit).

    The same functions as on GPU (`flex_attention_fn`, `create_block_mask_fn`, fullgraph, the recompile
    budget) compiled with "aot_eager": dynamo and AOT autograd for real, flex's math kernels instead of
    inductor's fused ones. Inductor's CPU backend is not used here: torch 2.13 took 10-50 s per flex graph
    on two shared cores. Its lowering of `create_block_mask` with the DFlash mask predicate, which the GPU
    path runs, is covered on CPU by tests/dflash/test_masks.py (a clamp in the predicate once made it fail
    with "vr must not be None for symbol q1"). torch refuses flex backward on CPU (flex_attention.py
    `_validate_device`: its CPU kernel has none); under aot_eager the flex HOP's math backward runs, so the
    check is lifted here.
    """
    import torch.nn.attention.flex_attention as fa

    validate, backend = fa._validate_device, _COMPILE_BACKEND
    fa._validate_device = lambda q, k, v: None  # type: ignore[assignment]
    set_compile_backend("aot_eager")
    try:
        yield
    finally:
        fa._validate_device = validate  # type: ignore[assignment]
        set_compile_backend(backend)


def one_device_at_a_time(rt: Runtime, fn: Callable[[], None]) -> None:
    """Run `fn` on each rank in turn, rank 0 first (FLA's autotuner is not safe to run concurrently
    from several GPUs); every rank waits at a barrier per turn."""
    if not rt.distributed or not torch.distributed.is_initialized():
        fn()
        return
    for turn in range(rt.world_size):
        if turn == rt.rank:
            fn()
        torch.distributed.barrier()


def warm_up_target(rt: Runtime, target: Any, seq_lens: tuple[int, ...] = (128,)) -> None:
    """Run the target once per bucket length, one device at a time, before step 1 (fills the FLA
    autotune cache without the cross-GPU race). A no-op on CPU."""
    if rt.target_device.type != "cuda":
        return

    def warm() -> None:
        with torch.no_grad():
            for n in seq_lens:
                target.features(torch.zeros(1, n, dtype=torch.long, device=rt.target_device), need_last=True)
        synchronize(rt.target_device)

    one_device_at_a_time(rt, warm)
    log.info("target warm-up done on %s for lengths %s", rt.target_device, seq_lens)


# Dense (no sparsity) bf16 tensor-core peak per GPU in TFLOPS, from NVIDIA's datasheets, matched against
# torch.cuda.get_device_name in this order (more specific names first). MFU divides by these.
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2500.0), ("B200", 2250.0), ("B100", 1750.0),
    ("H200", 989.0), ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("H800", 989.0),
    ("GH200", 989.0), ("RTX PRO 6000", 503.8), ("L40S", 362.0), ("A100", 312.0), ("A800", 312.0),
)


def peak_tflops(device: torch.device) -> float | None:
    """The device's dense bf16 peak (PEAK_TFLOPS), None for the CPU or an unknown GPU."""
    if device.type != "cuda":
        return None
    name = device_name(device)
    return next((tf for key, tf in PEAK_TFLOPS if key in name), None)


# Optimized kernels on CUDA only. transformers binds an optional package's kernel at import time
# (transformers/integrations/hub_kernels.py, `use_kernel_func_from_hub_with_fallback`): when `fla` (or
# `causal_conv1d`) imports, the model calls that package's function for every tensor, and its Triton
# kernels cannot run on the CPU (triton: "0 active drivers ([]). There should only be one."). The package
# imports fine on a CPU machine, so its presence says nothing about where the model runs. The routing
# below keeps the package's kernel for CUDA tensors and calls the model file's own torch reference (the
# function transformers wrapped) for every other device: the same numbers, slower. It is per call, so a
# CPU runtime in a GPU venv and a GPU runtime in the same process both take the right path.
_WRAPPER_CELLS = ("implementation", "torch_function")  # the closure transformers' wrapper reads


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    return next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)


def _on_cuda_only(fast: Callable[..., Any], reference: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`fast` for CUDA tensors, `reference` (the torch path) for the others."""
    import inspect

    params = inspect.signature(reference).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    def routed(*args: Any, **kwargs: Any) -> Any:
        first = _first_tensor(args, kwargs)
        if first is None or first.device.type == "cuda":
            return fast(*args, **kwargs)
        if kwargs.get("cu_seqlens") is not None or kwargs.get("seq_idx") is not None:
            # the torch reference cannot keep packed sequences apart (transformers refuses the same)
            raise ValueError(f"{name}: packed sequences need its optimized kernel, which runs on CUDA only")
        return reference(*args, **(kwargs if takes_any else {k: v for k, v in kwargs.items() if k in params}))

    routed.cuda_only_of = fast  # type: ignore[attr-defined]  # marks a routed kernel (and what it routes)
    return routed


def _wrapper_cells(fn: Any) -> dict[str, Any] | None:
    """The closure cells of a function made by transformers' fallback wrapper (under other decorators'
    `__wrapped__` too), or None for any other callable."""
    for _ in range(4):
        code = getattr(fn, "__code__", None)
        if code is not None and fn.__closure__ and set(_WRAPPER_CELLS) <= set(code.co_freevars):
            return dict(zip(code.co_freevars, fn.__closure__, strict=True))
        fn = getattr(fn, "__wrapped__", None)
        if not callable(fn):
            return None
    return None


def _route(fn: Any) -> bool:
    """Route one function made by transformers' fallback wrapper; whether it was newly routed."""
    cells = _wrapper_cells(fn)
    if cells is None:
        return False
    fast, reference = (cells[c].cell_contents for c in _WRAPPER_CELLS)
    if fast is reference or hasattr(fast, "cuda_only_of"):
        return False  # the package is absent (torch path already) or routed before
    cells["implementation"].cell_contents = _on_cuda_only(fast, reference, fn.__name__)
    return True


def _model_functions() -> Iterator[tuple[str, Any]]:
    """(module.name, value) of every callable in the transformers model files imported so far."""
    import sys

    for mod_name, mod in list(sys.modules.items()):
        if mod is not None and mod_name.startswith("transformers.models."):
            yield from ((f"{mod_name}.{k}", v) for k, v in list(vars(mod).items()) if callable(v))


def unrouted_kernels() -> list[str]:
    """The functions of the imported model files that call an optional package's kernel on every device
    (none once `route_kernels_by_device` has run, unless transformers changed how it binds them)."""
    out = []
    for name, fn in _model_functions():
        cells = _wrapper_cells(fn)
        if cells is not None:
            fast, reference = (cells[c].cell_contents for c in _WRAPPER_CELLS)
            if fast is not reference and not hasattr(fast, "cuda_only_of"):
                out.append(name)
    return out


def route_kernels_by_device() -> list[str]:
    """Make transformers' optional-package kernels (fla's gated delta rule, causal-conv1d) run on CUDA
    tensors only, and the torch reference on every other device. Covers the model files imported so far
    and those imported later (the wrapper's factory is wrapped too). Idempotent; a no-op without
    transformers. Returns the functions newly routed."""
    import sys

    try:
        from transformers.integrations import hub_kernels
    except ImportError:
        return []
    factory = hub_kernels.use_kernel_func_from_hub_with_fallback
    if not hasattr(factory, "routes_by_device"):

        def routing_factory(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Any]:
            decorate = factory(*args, **kwargs)

            def decorator(fn: Callable[..., Any]) -> Any:
                out = decorate(fn)
                _route(out)
                return out

            return decorator

        routing_factory.routes_by_device = True  # type: ignore[attr-defined]
        routing_factory.__wrapped__ = factory  # type: ignore[attr-defined]
        hub_kernels.use_kernel_func_from_hub_with_fallback = routing_factory
        integrations = sys.modules.get("transformers.integrations")
        if integrations is not None:  # the lazy package's cached attribute, read by `from ... import`
            integrations.use_kernel_func_from_hub_with_fallback = routing_factory  # type: ignore[attr-defined]
    routed = [name for name, fn in _model_functions() if _route(fn)]
    if routed:
        log.debug("kernels on CUDA only, torch reference elsewhere: %s", routed)
    return routed
