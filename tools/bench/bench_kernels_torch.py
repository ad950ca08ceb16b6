#!/usr/bin/env python3
"""The PyTorch side of bench_kernels: the same ops and sizes, timed the same way (CUDA events, median)."""
import sys

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 28
torch.manual_seed(1)
x = torch.rand(n, device="cuda")
y = torch.rand(n, device="cuda")
xb, yb = x.bfloat16(), y.bfloat16()
m = torch.rand(n // 4096, 4096, device="cuda")
mb = m.bfloat16()
lw = torch.rand(4096, device="cuda").bfloat16()
lb = torch.rand(4096, device="cuda").bfloat16()


def time_ms(fn, iters=10, reps=7):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / iters)
    return sorted(out)[len(out) // 2]


f4, f2 = 4.0 * n, 2.0 * n
rows = [
    ("copy f32 (clone)", 2 * f4, lambda: x.clone()),
    ("add f32", 3 * f4, lambda: x + y),
    ("mul f32 by scalar", 2 * f4, lambda: x * 1.5),
    ("add bf16", 3 * f2, lambda: xb + yb),
    ("relu f32", 2 * f4, lambda: torch.relu(x)),
    ("gelu (erf) bf16", 2 * f2, lambda: torch.nn.functional.gelu(xb)),
    ("convert f32->bf16", f4 + f2, lambda: x.bfloat16()),
    ("convert f32->f8e4m3", f4 + n, lambda: x.to(torch.float8_e4m3fn)),
    ("sum f32 (all)", f4, lambda: x.sum()),
    ("sum f32 rows (.., 4096)", f4, lambda: m.sum(1)),
    ("sum f32 cols (4096 of ..)", f4, lambda: m.sum(0)),
    ("transpose copy f32 (.., 4096)^T", 2 * f4, lambda: m.t().contiguous()),
    ("softmax bf16 (.., 4096)", 2 * f2, lambda: torch.softmax(mb, 1)),
    ("layer_norm bf16 (.., 4096)", 2 * f2, lambda: torch.nn.functional.layer_norm(mb, (4096,), lw, lb)),
]
print(f"{'kernel':34s} {'torch ms':>10s} {'GB/s':>10s}")
for name, nbytes, fn in rows:
    ms = time_ms(fn)
    print(f"{name:34s} {ms:10.4f} {nbytes / ms * 1e-6:10.1f}")

# Matrix products (the GEMM rows of bench_kernels): torch.matmul, TF32 off for f32.
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
print(f"\n{'gemm (M x K @ K x N)':34s} {'torch ms':>10s} {'TFLOP/s':>10s}")
for dt, gm, gk, gn in [(torch.bfloat16, 8192, 4096, 11008), (torch.bfloat16, 8192, 4096, 4096), (torch.float32, 4096, 4096, 4096)]:
    ga = torch.rand(gm, gk, device="cuda").to(dt)
    gb = torch.rand(gk, gn, device="cuda").to(dt)
    ms = time_ms(lambda: torch.matmul(ga, gb))
    name = f"matmul {'bf16' if dt == torch.bfloat16 else 'f32'} {gm}x{gk} @ {gk}x{gn}"
    print(f"{name:34s} {ms:10.4f} {2.0 * gm * gn * gk / ms * 1e-9:10.1f}")

# ---- lowp gemm (helper lowp; bench_lowp_gemm of bench_kernels) ----
# out (M, N) = a (M, K) · b (N, K)ᵀ: bf16 matmul with the same layout, torch._int_mm (int8 -> int32) and
# torch._scaled_mm (fp8 e4m3 -> bf16, per-tensor f32 scales on the device, use_fast_accum False, then True).
print(f"\n{'lowp gemm (M x K . (N x K)^T)':44s} {'torch ms':>10s} {'T(FL)OP/s':>10s} {'vs bf16':>8s}")
for lm, lk, ln in [(8192, 4096, 11008), (8192, 4096, 4096), (8192, 11008, 4096)]:
    laf = torch.rand(lm, lk, device="cuda") * 2 - 1
    lbf = torch.rand(ln, lk, device="cuda") * 2 - 1
    la16, lb16 = laf.bfloat16(), lbf.bfloat16()
    la8, lb8 = (laf * 127).to(torch.int8), (lbf * 127).to(torch.int8)
    laf8, lbf8 = (laf * 4).to(torch.float8_e4m3fn), (lbf * 4).to(torch.float8_e4m3fn)
    lsa = torch.tensor(0.25, device="cuda")
    lsb = torch.tensor(0.25, device="cuda")
    lops = 2.0 * lm * ln * lk
    dims = f"{lm}x{lk}x{ln}"
    bf16_ms = time_ms(lambda: torch.matmul(la16, lb16.t()))
    lrows = [
        (f"bf16 matmul(a, b^T) {dims}", bf16_ms),
        (f"int8 -> i32 {dims}", time_ms(lambda: torch._int_mm(la8, lb8.t()))),
        (f"fp8 e4m3 -> bf16 {dims}",
         time_ms(lambda: torch._scaled_mm(laf8, lbf8.t(), scale_a=lsa, scale_b=lsb, out_dtype=torch.bfloat16))),
        (f"fp8 e4m3 -> bf16 fast-accum {dims}",
         time_ms(lambda: torch._scaled_mm(laf8, lbf8.t(), scale_a=lsa, scale_b=lsb, out_dtype=torch.bfloat16,
                                          use_fast_accum=True))),
    ]
    for name, ms in lrows:
        print(f"{name:44s} {ms:10.4f} {lops / ms * 1e-9:10.1f} {bf16_ms / ms:8.3f}")
    del laf, lbf, la16, lb16, la8, lb8, laf8, lbf8
# ---- end lowp gemm ----

# conv2d and batch norm of a ResNet-18 CIFAR layer in bf16 (bench_conv_bn): cuDNN conv (TF32 off, as
# above; bf16 uses tensor cores either way), forward alone and forward + backward; batch norm in train
# mode with f32 weight, bias and running stats, forward + backward.
cn, cc, ch, cw = 256, 128, 16, 16
cx = torch.rand(cn, cc, ch, cw, device="cuda").bfloat16().requires_grad_()
cwt = (torch.rand(cc, cc, 3, 3, device="cuda") * 0.05).bfloat16().requires_grad_()
cg = torch.rand(cn, cc, ch, cw, device="cuda").bfloat16()
bw = torch.rand(cc, device="cuda").requires_grad_()
bb = torch.rand(cc, device="cuda").requires_grad_()
rm, rv = torch.zeros(cc, device="cuda"), torch.ones(cc, device="cuda")
conv_flops = 2.0 * cn * cc * ch * cw * cc * 9


def conv_fwd():
    with torch.no_grad():
        torch.nn.functional.conv2d(cx, cwt, padding=1)


def conv_fwd_bwd():
    cx.grad = None
    cwt.grad = None
    torch.nn.functional.conv2d(cx, cwt, padding=1).backward(cg)


def bn_fwd_bwd():
    cx.grad = None
    bw.grad = None
    bb.grad = None
    torch.nn.functional.batch_norm(cx, rm, rv, bw, bb, training=True).backward(cg)


print(f"\n{'layer (ResNet-18 CIFAR, bf16)':42s} {'torch ms':>10s} {'TFLOP/s':>10s}")
ms = time_ms(conv_fwd)
print(f"{'conv2d fwd 256x128x16x16 3x3':42s} {ms:10.4f} {conv_flops / ms * 1e-9:10.1f}")
ms = time_ms(conv_fwd_bwd)
print(f"{'conv2d fwd+bwd 256x128x16x16 3x3':42s} {ms:10.4f} {3 * conv_flops / ms * 1e-9:10.1f}")
print(f"{'':42s} {'torch ms':>10s} {'GB/s':>10s}")
ms = time_ms(bn_fwd_bwd)
print(f"{'batch_norm fwd+bwd 256x128x16x16':42s} {ms:10.4f} {5 * 2.0 * cn * cc * ch * cw / ms * 1e-6:10.1f}")

# ---- grad quant (helper quant; bench_grad_quant of bench_kernels) ----
# The same quantisation in eager PyTorch (what the HLQ reference does): 16-point Hadamard per block as a
# matmul with H16, absmax per row / sample, stochastic rounding with torch.rand, int8 output. GB/s counts the
# same minimum traffic as bench_grad_quant (bf16 read once, int8 written once, f32 scales).
qh = torch.ones(1, 1, device="cuda")
while qh.shape[0] < 16:
    qh = torch.cat([torch.cat([qh, qh], 1), torch.cat([qh, -qh], 1)], 0)


def torch_quant(g):  # one scale per row of the 2-D view: per token for (12608, 3072), per sample for (64, ..)
    r = (g.float().view(g.shape[0], -1, 16) @ qh).view(g.shape[0], -1)
    m = r.abs().amax(1, keepdim=True)
    s = m / 7
    v = r / s.clamp_min(1e-30)
    q = torch.floor(v.abs() + torch.rand_like(v)).clamp_max(7) * v.sign()
    return q.to(torch.int8), s


print(f"\n{'grad quant':46s} {'torch ms':>10s} {'GB/s':>10s}")
for qname, qr, qc in [("quantize bf16 (12608, 3072) row T16 SR4", 12608, 3072),
                      ("quantize bf16 (64, 197*3072) sample T16 SR4", 64, 197 * 3072)]:
    qx = torch.rand(qr, qc, device="cuda").bfloat16()
    ms = time_ms(lambda: torch_quant(qx))
    print(f"{qname:46s} {ms:10.4f} {(3.0 * qr * qc + 4.0 * qr) / ms * 1e-6:10.1f}")
# ---- end grad quant ----

# ---- attention (bench_attention of bench_kernels) ----
# torch SDPA with the flash backend, bf16, causal, B = 4, H = 16, D 64 / 128, T = S in {1024, 2048, 4096}:
# forward alone (no grad) and forward + backward; FLOPs 4·B·H·T²·D / 2 forward, 3.5x that forward + backward.
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

print(f"\n{'attention bf16 causal (B=4, H=16)':42s} {'torch fwd':>10s} {'TFLOP/s':>10s} {'fwd+bwd ms':>12s} "
      f"{'TFLOP/s':>10s}")
for ad in (64, 128):
    for at in (1024, 2048, 4096):
        aq, ak, av = (torch.empty(4, 16, at, ad, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
                      .requires_grad_() for _ in range(3))
        ag = torch.empty(4, 16, at, ad, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)

        def attn_fwd():
            with torch.no_grad():
                torch.nn.functional.scaled_dot_product_attention(aq, ak, av, is_causal=True)

        def attn_fwd_bwd():
            aq.grad = ak.grad = av.grad = None
            torch.nn.functional.scaled_dot_product_attention(aq, ak, av, is_causal=True).backward(ag)

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fms, bms = time_ms(attn_fwd), time_ms(attn_fwd_bwd)
        aflops = 4.0 * 4 * 16 * at * at * ad * 0.5
        print(f"{f'T=S={at} D={ad}':42s} {fms:10.4f} {aflops / fms * 1e-9:10.1f} {bms:12.4f} "
              f"{3.5 * aflops / bms * 1e-9:10.1f}")
# ---- end attention ----

# ---- hla (helper hla; bench_hla of bench_kernels) ----
# The HLA projection as the HLQ reference computes it: the kept rows P_r (r x n) of the sequency-ordered
# Walsh matrix (percentile 50) times each block of n positions, in f32 (B, L/n, n, C) -> (B, R, C). Same
# shapes and the same minimum traffic as bench_hla (bf16 read once, f32 projection written once).
def hla_rows(n):
    m = n.bit_length() - 1
    s = 1 << (m // 2)
    seq = [i * s + (j if i % 2 == 0 else s - 1 - j) for i in range(s) for j in range(s - i)]
    return sorted(int(format(j ^ (j >> 1), f"0{m}b")[::-1], 2) if m else 0 for j in seq)


def hadamard(n):
    h = torch.ones(1, 1, device="cuda")
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


print(f"\n{'hla':36s} {'torch ms':>10s} {'GB/s':>10s}")
for hname, hb, hl, hc in [("hla_project bf16 (64, 1024, 256)", 64, 1024, 256),
                          ("hla_project bf16 (64, 3136, 64)", 64, 3136, 64)]:
    hn = hl & -hl
    pr = hadamard(hn)[hla_rows(hn)]  # (r, n)
    hx = torch.rand(hb, hl, hc, device="cuda").bfloat16()
    ms = time_ms(lambda: (pr @ hx.float().view(hb, hl // hn, hn, hc)).view(hb, -1, hc))
    out_elems = hb * (hl // hn) * pr.shape[0] * hc
    print(f"{hname:36s} {ms:10.4f} {(2.0 * hb * hl * hc + 4.0 * out_elems) / ms * 1e-6:10.1f}")
# ---- end hla ----

# ---- pool (bench_pool of bench_kernels: same cases and names) ----
# Forward under no_grad, and forward + backward through autograd, bf16, NCHW and channels_last.
print(f"\n{'pool (bf16)':34s} {'layout':8s} {'fwd ms':>10s} {'fwd+bwd ms':>12s} {'fwd GB/s':>10s}")
for pname, pn, pc, ph, pw, pmax in [("max_pool 3x3 s2 64x64x112x112", 64, 64, 112, 112, True),
                                    ("avg_pool global 64x2048x7x7", 64, 2048, 7, 7, False),
                                    ("avg_pool global 256x512x4x4", 256, 512, 4, 4, False)]:
    for layout in ("nchw", "nhwc"):
        px = torch.rand(pn, pc, ph, pw, device="cuda").bfloat16()
        if layout == "nhwc":
            px = px.contiguous(memory_format=torch.channels_last)
        px.requires_grad_()

        def pool(t=px, m=pmax):
            if m:
                return torch.nn.functional.max_pool2d(t, 3, 2, 1)
            return torch.nn.functional.adaptive_avg_pool2d(t, 1)

        with torch.no_grad():
            py = pool()
        pg = torch.rand_like(py)

        def fwd():
            with torch.no_grad():
                pool()

        def fwd_bwd():
            px.grad = None
            pool().backward(pg)

        fms = time_ms(fwd)
        bms = time_ms(fwd_bwd)
        print(f"{pname:34s} {layout:8s} {fms:10.4f} {bms:12.4f} {2.0 * (px.numel() + py.numel()) / fms * 1e-6:10.1f}")
# ---- end pool ----
