"""Compile and run a tiny Triton kernel on GPU 0 (role pyenv's check when a GPU is present)."""
import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


x = torch.arange(1000, device="cuda", dtype=torch.float32)
out = torch.empty_like(x)
add_kernel[(triton.cdiv(1000, 256),)](x, x, out, 1000, BLOCK=256)
torch.cuda.synchronize()
assert torch.equal(out, 2 * x), "triton kernel returned wrong values"
print(f"triton {triton.__version__} kernel ok on {torch.cuda.get_device_name(0)}")
