#!/usr/bin/env python3
"""PyTorch side of the training-step benchmark: the models, shapes and optimiser of build-gpu/tools/bench_train, in
one of PyTorch's three forms, one form per process (a form's time depends on what ran before it in a process).

Models as bench_train builds them: torchvision ResNet-18/34 with the CIFAR stem (3x3 stride-1 conv, no max pool)
on 32x32 inputs and 100 classes; torchvision ResNet-50 (ImageNet stem: 7x7 stride-2 conv, max pool) on 224x224
and 1000 classes; timm ViT-S/4 (32x32, 384 wide, 12 blocks of 6 heads) and ViT-B/16 (224x224), 100 classes.
`--stem` overrides a ResNet's stem (and with it the image size and class count) for when bench_train gains it.
The step: bf16 autocast forward (f32 master weights), channels-last ResNets, cross-entropy, backward, SGD with
momentum 0.9 (lr 0.1). Forms:
  eager    the step as written;
  compile  the model through torch.compile and the optimiser step through torch.compile;
  graph    the whole step (forward, backward, optimiser step) captured once into one CUDA graph with
           torch.cuda.graph and replayed (PyTorch's recipe for whole-network capture: warm-up steps on a side
           stream, then capture with gradients set to None; autocast without its weight cache, as capture needs).
Timing as bench_train: the median of 20 timed steps after 5 warm-up steps (compile: the warm-up compiles), each
between two CUDA events on the stream the step runs on; peak allocated memory over the timed steps (graph: from
the capture on, so the graph's own pool counts).
    python3 tools/bench/bench_train_torch.py MODEL BATCH FORM [--stem cifar|imagenet] [--jsonl FILE]
prints one line starting "torch " and, with --jsonl, appends one JSON object (model, batch, form, ms_per_step,
img_per_s, peak_allocated_gib, torch version, device, date) to FILE.
"""
import argparse
import datetime
import json
import sys

import torch
import torch.nn as nn
import torchvision

MODELS = ("resnet18", "resnet34", "resnet50", "vit_s4", "vit_b16")
FORMS = ("eager", "compile", "graph")
WARMUP, REPS = 5, 20


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("batch", type=int)
    ap.add_argument("form", choices=FORMS)
    ap.add_argument("--stem", choices=("cifar", "imagenet"), help="ResNets only; default as bench_train")
    ap.add_argument("--jsonl", help="append the result as one JSON line to this file")
    a = ap.parse_args()
    if a.stem and a.model.startswith("vit"):
        ap.error("--stem applies to the ResNets only")
    if a.stem is None and not a.model.startswith("vit"):
        a.stem = "imagenet" if a.model == "resnet50" else "cifar"
    return a


def build(name, stem):
    """The model on the GPU, its input image size and its class count."""
    if name.startswith("vit"):
        import timm.models.vision_transformer as tv
        if name == "vit_s4":
            m = tv.VisionTransformer(img_size=32, patch_size=4, embed_dim=384, depth=12, num_heads=6, num_classes=100)
            return m.cuda(), 32, 100
        m = tv.VisionTransformer(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12, num_classes=100)
        return m.cuda(), 224, 100
    if stem == "imagenet":
        return getattr(torchvision.models, name)(num_classes=1000).cuda(), 224, 1000
    m = getattr(torchvision.models, name)(num_classes=100)
    m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    m.maxpool = nn.Identity()
    return m.cuda(), 32, 100


def timed(fn, stream):
    """Median ms of REPS calls of fn, each between two events recorded on `stream`."""
    times = []
    for _ in range(REPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(stream)
        fn()
        b.record(stream)
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def main():
    args = parse()
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model, image, classes = build(args.model, args.stem)
    channels_last = not args.model.startswith("vit")
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(args.batch, 3, image, image, device="cuda")
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, classes, (args.batch,), device="cuda")

    if args.form == "eager":
        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    elif args.form == "compile":
        cmodel = torch.compile(model)

        @torch.compile(fullgraph=False)
        def opt_step():  # PyTorch's recipe for a compiled optimiser step
            opt.step()

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(cmodel(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt_step()
    else:
        def body():
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
            for _ in range(WARMUP):
                opt.zero_grad(set_to_none=True)
                body()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)  # the captured backward allocates the gradients from the graph's pool
        with torch.cuda.graph(graph):
            body()
        step = graph.replay

    if args.form != "graph":
        for _ in range(WARMUP):
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    ms = timed(step, torch.cuda.current_stream())
    peak = torch.cuda.max_memory_allocated() / 2**30
    rec = {
        "model": args.model,
        "batch": args.batch,
        "form": args.form,
        "stem": args.stem,
        "image": image,
        "dtype": "bf16 autocast",
        "channels_last": channels_last,
        "ms_per_step": round(ms, 3),
        "img_per_s": round(args.batch / ms * 1000.0),
        "peak_allocated_gib": round(peak, 3),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    print(f"torch {args.model} batch {args.batch} {args.form:8s} {ms:8.2f} ms/step {rec['img_per_s']:8d} img/s "
          f"peak {peak:.2f} GiB (torch {torch.__version__})")
    if args.jsonl:
        with open(args.jsonl, "a") as f:
            f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
