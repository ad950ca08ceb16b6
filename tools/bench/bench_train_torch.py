#!/usr/bin/env python3
"""PyTorch side of the training-step benchmark: torchvision ResNet-18/34 with the CIFAR stem (3x3 stride-1
conv, no max-pool) on 32x32 inputs, batch 256, SGD momentum 0.9, cross-entropy; fp32, bf16 autocast, and bf16
autocast + channels_last. Median step time of 20 timed steps after 5 warm-up steps (CUDA events).
    python3 tools/bench/bench_train_torch.py [resnet18|resnet34] [batch]
"""
import sys

import torch
import torch.nn as nn
import torchvision

name = sys.argv[1] if len(sys.argv) > 1 else "resnet18"
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 256
torch.backends.cudnn.benchmark = True
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def model():
    m = getattr(torchvision.models, name)(num_classes=100)
    m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    m.maxpool = nn.Identity()
    return m.cuda()


def bench(amp, channels_last):
    m = model()
    if channels_last:
        m = m.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(batch, 3, 32, 32, device="cuda")
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, 100, (batch,), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = nn.functional.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    ms = sorted(times)[len(times) // 2]
    return ms, batch / ms * 1000


for label, amp, cl in (("fp32", False, False), ("bf16", True, False), ("bf16 + channels_last", True, True)):
    ms, ips = bench(amp, cl)
    print(f"torch {name} batch {batch} {label:22s} {ms:8.2f} ms/step {ips:10.0f} img/s")
