"""The device seam keeps optional-package kernels (fla's Triton gated delta rule) off the CPU.

transformers binds such a kernel when its package imports (transformers/integrations/hub_kernels.py,
`use_kernel_func_from_hub_with_fallback`), and fla imports on a machine without a GPU; its Triton kernels
then fail at launch. The stand-in package below is bound the same way, by transformers' own decorator, and
fails as Triton does without a GPU driver (triton/runtime/driver.py, `_create_driver`: "0 active drivers
([]). There should only be one."), so a CPU call that reaches it fails here as it would with fla.
"""
from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from trainer.dflash import device as dev

STANDIN = "fla_standin"  # the optional package, as transformers imports it


def _standin_kernel(x: torch.Tensor, scale: float = 1.0, cu_seqlens: Any = None) -> torch.Tensor:
    if x.device.type != "cuda":
        raise RuntimeError("0 active drivers ([]). There should only be one.")
    return x * scale + 1000  # tells the caller the package's kernel ran


def _reference(x: torch.Tensor, scale: float = 1.0, **kwargs: Any) -> torch.Tensor:
    return x * scale


@pytest.fixture
def model_file() -> Iterator[Callable[[Callable[..., Any]], Any]]:
    """make(factory): a model module under transformers.models whose `seam_rule` is `_reference`
    decorated by `factory` with the stand-in package importable, as a model file does at its import."""
    pytest.importorskip("transformers")
    made: list[str] = []
    sys.modules[STANDIN] = types.ModuleType(STANDIN)
    sys.modules[STANDIN].seam_rule = _standin_kernel  # type: ignore[attr-defined]

    def make(factory: Callable[..., Any]) -> Any:
        mod = types.ModuleType(f"transformers.models.seam_test_{len(made)}")
        mod.seam_rule = factory("seam_rule", STANDIN)(_reference)  # type: ignore[attr-defined]
        sys.modules[mod.__name__] = mod
        made.append(mod.__name__)
        return mod.seam_rule  # type: ignore[attr-defined]

    yield make
    for name in [*made, STANDIN]:
        sys.modules.pop(name, None)


def _unrouted_factory() -> Callable[..., Any]:
    from transformers.integrations import hub_kernels

    f = hub_kernels.use_kernel_func_from_hub_with_fallback
    return getattr(f, "__wrapped__", f)


def test_a_model_file_imported_before_the_seam_is_routed(model_file: Callable[..., Any]) -> None:
    rule = model_file(_unrouted_factory())
    x = torch.ones(2, 3)
    with pytest.raises(RuntimeError, match="0 active drivers"):  # the package's kernel is what it calls
        rule(x, scale=2.0)
    assert any(r.endswith(".seam_rule") for r in dev.unrouted_kernels())
    routed = dev.route_kernels_by_device()
    assert any(r.endswith(".seam_rule") for r in routed), routed
    assert torch.equal(rule(x, scale=2.0), x * 2)
    assert dev.route_kernels_by_device() == []  # idempotent
    assert not any(r.endswith(".seam_rule") for r in dev.unrouted_kernels())


def test_a_model_file_imported_after_the_seam_is_routed(model_file: Callable[..., Any]) -> None:
    dev.route_kernels_by_device()
    from transformers.integrations import use_kernel_func_from_hub_with_fallback  # as model files import it

    rule = model_file(use_kernel_func_from_hub_with_fallback)
    assert torch.equal(rule(torch.ones(3), scale=3.0), torch.full((3,), 3.0))


def test_resolve_runtime_routes_before_the_model_loads(model_file: Callable[..., Any]) -> None:
    rule = model_file(_unrouted_factory())
    rt = dev.resolve_runtime("cpu")
    assert rt.device.type == "cpu"
    assert torch.equal(rule(torch.ones(1)), torch.ones(1))


class _CudaLooking(torch.Tensor):
    """A CPU tensor that reports a CUDA device: what the routing reads to pick the package's kernel."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


def test_cuda_tensors_still_get_the_package_kernel() -> None:
    calls: list[str] = []

    def fast(x: torch.Tensor, scale: float = 1.0) -> str:
        calls.append("fast")
        return "fast"

    routed = dev._on_cuda_only(fast, _reference, "seam_rule")
    assert routed(torch.ones(1).as_subclass(_CudaLooking), scale=2.0) == "fast"
    assert torch.equal(routed(torch.ones(1), scale=2.0), torch.full((1,), 2.0))
    assert calls == ["fast"]


def test_packed_sequences_on_the_cpu_are_refused() -> None:
    routed = dev._on_cuda_only(_standin_kernel, _reference, "seam_rule")
    with pytest.raises(ValueError, match="seam_rule: packed sequences need its optimized kernel"):
        routed(torch.ones(4), cu_seqlens=torch.tensor([0, 2, 4]))


def test_the_real_model_file_is_routed_when_fla_is_installed() -> None:
    """With the `gpu` extra (fla, triton) on a CPU machine: the Qwen3.5 model file's kernels route."""
    pytest.importorskip("fla")
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    dev.route_kernels_by_device()
    q = torch.randn(1, 4, 2, 8)
    out, _ = m.torch_chunk_gated_delta_rule(q, q, q, g=torch.zeros(1, 4, 2), beta=torch.ones(1, 4, 2),
                                            use_qk_l2norm_in_kernel=True)
    assert out.shape == q.shape
