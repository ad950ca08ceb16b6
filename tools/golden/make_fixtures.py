#!/usr/bin/env python3
"""Golden fixtures for tests/cpu/test_golden.cpp, made with torchvision/timm (run on the GPU machine).

Weights are not stored: every parameter is filled by a closed formula of its name and element index
(formula_values below, mirrored in the C++ test), so the fixture only holds the input, the labels, the
logits, the loss, and for every parameter its gradient norm and 32 sampled gradient elements. Everything is
computed in float64 on the CPU, so the C++ side can compare at ~1e-9. Usage:
    python3 tools/golden/make_fixtures.py OUT_DIR [SET ...]
SET: small (ResNet-18 CIFAR stem, a tiny ViT; tests/cpu/test_golden.cpp) or imagenet (ResNet-34 and ResNet-50
with the ImageNet stem, a ViT-B/16-shaped ViT; tests/cpu/test_golden_imagenet.cpp); default both.

The imagenet set keeps every fixture small (tens to a few hundred KiB) while the models keep their real structure:
the input is a 4 x 3 x 32 x 32 batch (the ImageNet stem and four stages bring it to 1 x 1), and the ViT has
ViT-B/16's width (768, 12 heads, MLP 3072, patch 16, class token) with 2 of its 12 blocks, so the float64 CPU test
holds about 15 M parameters instead of 86 M (the fixture's size does not depend on the depth).
"""
import math
import sys

import torch
import torch.nn as nn
from safetensors.torch import save_file


def phase(name: str) -> float:
    return (sum((k + 1) * ord(c) for k, c in enumerate(name)) % 1000) / 100.0


def formula_values(name: str, shape) -> torch.Tensor:
    n = math.prod(shape)
    i = torch.arange(n, dtype=torch.float64)
    s = torch.sin(0.7071 * i + phase(name))
    if len(shape) >= 2 and name.endswith("weight"):
        v = s / math.sqrt(n / shape[0])
    elif len(shape) >= 2:  # cls_token, pos_embed
        v = 0.02 * s
    elif name.endswith("weight"):
        v = 1.0 + 0.2 * s
    else:
        v = 0.1 * s
    return v.reshape(shape)


def fill(model: nn.Module):
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(formula_values(name, tuple(p.shape)))


def fixture(model: nn.Module, x: torch.Tensor, labels: torch.Tensor, label_smoothing: float):
    fill(model)
    model.train()
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, labels, label_smoothing=label_smoothing)
    loss.backward()
    out = {"x": x.contiguous(), "labels": labels, "logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1)}
    for name, p in model.named_parameters():
        g = p.grad.reshape(-1)
        idx = torch.tensor([k * g.numel() // 32 for k in range(32)])
        out["grad_norm." + name] = g.norm().reshape(1)
        out["grad_sample." + name] = g[idx].contiguous()
    for name, b in model.named_buffers():
        if name.endswith("running_mean") or name.endswith("running_var"):
            out["buffer." + name] = b.detach().contiguous()
    return out


def small_set(out_dir, x, labels):
    import torchvision
    import timm

    r = torchvision.models.resnet18(num_classes=10)
    r.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    r.maxpool = nn.Identity()
    r = r.double()
    save_file(fixture(r, x, labels, 0.0), f"{out_dir}/golden_resnet18_cifar.safetensors",
              metadata={"model": "torchvision resnet18, 3x3 stride-1 stem, no max-pool, 10 classes",
                        "torch": torch.__version__, "torchvision": torchvision.__version__})

    v = timm.models.vision_transformer.VisionTransformer(
        img_size=16, patch_size=4, in_chans=3, num_classes=10, embed_dim=32, depth=2, num_heads=4,
        mlp_ratio=4.0, qkv_bias=True, class_token=True, global_pool="token").double()
    save_file(fixture(v, x, labels, 0.1), f"{out_dir}/golden_vit_tiny.safetensors",
              metadata={"model": "timm VisionTransformer img 16 patch 4 dim 32 depth 2 heads 4, token pool",
                        "torch": torch.__version__, "timm": timm.__version__})


def imagenet_set(out_dir, labels):
    import torchvision
    import timm

    x = torch.sin(0.37 * torch.arange(4 * 3 * 32 * 32, dtype=torch.float64)).reshape(4, 3, 32, 32)
    for depth, ctor in (("34", torchvision.models.resnet34), ("50", torchvision.models.resnet50)):
        r = ctor(num_classes=10).double()  # torchvision's ImageNet stem: 7x7 stride-2 conv, 3x3 stride-2 max-pool
        save_file(fixture(r, x, labels, 0.0), f"{out_dir}/golden_resnet{depth}_imagenet.safetensors",
                  metadata={"model": f"torchvision resnet{depth}, ImageNet stem, 10 classes, 32x32 input",
                            "torch": torch.__version__, "torchvision": torchvision.__version__})

    v = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=16, in_chans=3, num_classes=10, embed_dim=768, depth=2, num_heads=12,
        mlp_ratio=4.0, qkv_bias=True, class_token=True, global_pool="token").double()
    save_file(fixture(v, x, labels, 0.1), f"{out_dir}/golden_vit_b16_shape.safetensors",
              metadata={"model": "timm VisionTransformer with ViT-B/16's blocks (dim 768, 12 heads, MLP 3072, patch 16), "
                                 "depth 2, img 32, token pool",
                        "torch": torch.__version__, "timm": timm.__version__})


def main():
    out_dir = sys.argv[1]
    sets = sys.argv[2:] or ["small", "imagenet"]
    unknown = [s for s in sets if s not in ("small", "imagenet")]
    if unknown:
        sys.exit(f"make_fixtures.py: unknown set(s) {unknown}: expected small and/or imagenet")
    torch.manual_seed(0)
    x = torch.sin(0.37 * torch.arange(4 * 3 * 16 * 16, dtype=torch.float64)).reshape(4, 3, 16, 16)
    labels = torch.tensor([1, 3, 5, 7])
    if "small" in sets:
        small_set(out_dir, x, labels)
    if "imagenet" in sets:
        imagenet_set(out_dir, labels)
    print("fixtures written to", out_dir)


if __name__ == "__main__":
    main()
