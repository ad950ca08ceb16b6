#!/usr/bin/env python3
"""PyTorch side of the training-step benchmark: torchvision ResNet-18/34 with the CIFAR stem (3x3 stride-1
conv, no max-pool) on 32x32 inputs, torchvision ResNet-50 (ImageNet stem, 224x224, 1000 classes), or timm ViT-S/4 (32x32, 384 dim, 12 x 6 heads) / ViT-B/16 (224x224),
batch 256, 100 classes (ResNet-50: 1000), SGD momentum 0.9, cross-entropy; fp32, bf16 autocast, and bf16 autocast +
channels_last. Median step time of 20 timed steps after 5 warm-up steps (CUDA events), peak allocated memory.
    python3 tools/bench/bench_train_torch.py [resnet18|resnet34|resnet50|vit_s4|vit_b16] [batch] [variant]
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


image = 224 if name in ("vit_b16", "resnet50") else 32


def model():
    if name.startswith("vit"):
        import timm.models.vision_transformer as tv
        if name == "vit_s4":
            m = tv.VisionTransformer(img_size=32, patch_size=4, embed_dim=384, depth=12, num_heads=6, num_classes=100)
        else:
            m = tv.VisionTransformer(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12, num_classes=100)
        return m.cuda()
    if name == "resnet50":
        return torchvision.models.resnet50(num_classes=1000).cuda()
    m = getattr(torchvision.models, name)(num_classes=100)
    m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    m.maxpool = nn.Identity()
    return m.cuda()


def bench(amp, channels_last):
    m = model()
    if channels_last:
        m = m.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(batch, 3, image, image, device="cuda")
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000 if name == "resnet50" else 100, (batch,), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = nn.functional.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    ms = sorted(times)[len(times) // 2]
    return ms, batch / ms * 1000, torch.cuda.max_memory_allocated() / 2**30


variants = [("fp32", False, False), ("bf16", True, False)]
if not name.startswith("vit"):
    variants.append(("bf16 + channels_last", True, True))
if len(sys.argv) > 3:
    variants = [v for v in variants if v[0] == sys.argv[3]]
for label, amp, cl in variants:
    ms, ips, gib = bench(amp, cl)
    print(f"torch {name} batch {batch} {label:22s} {ms:8.2f} ms/step {ips:10.0f} img/s peak {gib:.2f} GiB")
