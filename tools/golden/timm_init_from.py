#!/usr/bin/env python3
"""Fixtures for tests/cpu/test_golden_init_from.cpp: model.init_from against timm and torchvision, and Mixup/CutMix
against timm's Mixup. Run on the GPU machine (it has torch, timm, torchvision, safetensors):

    python3 tools/golden/timm_init_from.py tests/fixtures

It writes (each well under 1 MB):
  init_from_timm_vit.safetensors        a tiny timm ViT's state dict exactly as timm names it (random weights)
  init_from_timm_vit_io.safetensors     an input, that model's eval logits, the position embedding resampled by
                                        timm.layers.resample_abs_pos_embed for half the image size, and the logits
                                        of timm's ViT at that size with the resampled state dict
  init_from_torchvision_resnet18.safetensors
                                        torchvision resnet18 (10 classes): its state dict's names, dtypes and
                                        shapes (metadata "state_dict"), an input and the eval logits with every
                                        tensor filled by the closed formula below (mirrored in the C++ test), so
                                        the 45 MB of weights need not be stored
  mix_timm.safetensors                  timm Mixup cases: input, labels, what was drawn, mixed input and targets
"""
import json
import math
import sys

import numpy as np
import torch
from safetensors.torch import save_file


def formula(name, shape, index_offset=0):
    """sin(0.37 k + phase(name)) scaled by the kind of tensor (as test_golden_init_from.cpp computes it)."""
    n = math.prod(shape)
    phase = (sum((k + 1) * ord(c) for k, c in enumerate(name)) % 1000) / 100.0
    s = torch.sin(0.37 * torch.arange(n, dtype=torch.float64) + phase)
    if name.endswith("running_var"):
        v = 1.0 + 0.5 * s.abs()
    elif name.endswith("running_mean") or name.endswith("bias"):
        v = 0.1 * s
    elif len(shape) >= 2:
        v = s / math.sqrt(n / shape[0])
    else:  # norm weights
        v = 1.0 + 0.2 * s
    return v.reshape(shape)


def vit_fixtures(out):
    import timm
    from timm.layers import resample_abs_pos_embed
    kw = dict(patch_size=4, embed_dim=32, depth=2, num_heads=4, num_classes=10)
    torch.manual_seed(0)
    m16 = timm.models.vision_transformer.VisionTransformer(img_size=16, **kw).eval()
    with torch.no_grad():  # timm's init leaves biases at zero and cls_token tiny: make every tensor matter
        for p in m16.parameters():
            p.add_(0.05 * torch.randn_like(p))
    sd = {k: v.contiguous() for k, v in m16.state_dict().items()}
    save_file(sd, f"{out}/init_from_timm_vit.safetensors", metadata={"timm": timm.__version__})
    x16 = torch.randn(2, 3, 16, 16)
    x8 = torch.randn(2, 3, 8, 8)
    m8 = timm.models.vision_transformer.VisionTransformer(img_size=8, **kw).eval()
    sd8 = dict(sd)
    sd8["pos_embed"] = resample_abs_pos_embed(sd["pos_embed"], new_size=(2, 2), num_prefix_tokens=1)
    m8.load_state_dict(sd8)
    with torch.no_grad():
        io = {"x16": x16, "logits16": m16(x16), "x8": x8, "logits8": m8(x8), "pos_embed8": sd8["pos_embed"]}
    save_file({k: v.contiguous() for k, v in io.items()}, f"{out}/init_from_timm_vit_io.safetensors",
              metadata={"model": "timm VisionTransformer patch 4, dim 32, depth 2, 4 heads, 10 classes",
                        "timm": timm.__version__, "torch": torch.__version__})


def resnet_fixture(out):
    import torchvision
    m = torchvision.models.resnet18(num_classes=10).eval()
    sd = m.state_dict()
    with torch.no_grad():
        for name, t in sd.items():
            if t.is_floating_point():
                t.copy_(formula(name, tuple(t.shape)).to(t.dtype))
    m = m.double()
    x = torch.sin(0.3 * torch.arange(2 * 3 * 32 * 32, dtype=torch.float64)).reshape(2, 3, 32, 32)
    with torch.no_grad():
        logits = m(x)
    names = [[k, str(v.dtype).replace("torch.", ""), list(v.shape)] for k, v in sd.items()]
    save_file({"x": x, "logits": logits.contiguous()}, f"{out}/init_from_torchvision_resnet18.safetensors",
              metadata={"state_dict": json.dumps(names), "torchvision": torchvision.__version__,
                        "note": "float32 weights by the formula of tools/golden/timm_init_from.py, logits in float64"})


def mix_fixture(out):
    from timm.data.mixup import Mixup, cutmix_bbox_and_lam
    torch.manual_seed(1)
    x = torch.randn(4, 3, 8, 8)
    y = torch.tensor([0, 3, 1, 4])
    cases = [dict(mixup_alpha=0.8, cutmix_alpha=0.0, label_smoothing=0.1),
             dict(mixup_alpha=0.0, cutmix_alpha=1.0, label_smoothing=0.1),
             dict(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.0, switch_prob=0.5),
             dict(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, switch_prob=0.5)]
    tensors = {"x": x, "y": y}
    for k, c in enumerate(cases):
        m = Mixup(num_classes=5, mode="batch", **c)
        seed = 10 + k
        np.random.seed(seed)  # replay the draws timm's call makes, to record them
        lam, use_cutmix = m._params_per_batch()
        box = (0, 0, 0, 0)
        if use_cutmix and lam != 1.0:
            box, lam = cutmix_bbox_and_lam(x.shape, lam, ratio_minmax=m.cutmix_minmax, correct_lam=m.correct_lam)
        np.random.seed(seed)
        xo, to = m(x.clone(), y.clone())
        tensors[f"case{k}.draw"] = torch.tensor([float(lam), float(use_cutmix), *map(float, box)], dtype=torch.float64)
        tensors[f"case{k}.x"] = xo.contiguous()
        tensors[f"case{k}.target"] = to.float().contiguous()
        tensors[f"case{k}.smoothing"] = torch.tensor([c["label_smoothing"]], dtype=torch.float64)
    import timm
    save_file(tensors, f"{out}/mix_timm.safetensors", metadata={"timm": timm.__version__, "classes": "5"})


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    vit_fixtures(out)
    resnet_fixture(out)
    mix_fixture(out)
    print(f"wrote the init_from and mix fixtures to {out}")


if __name__ == "__main__":
    main()
