#!/usr/bin/env python3
"""PyTorch FSDP2 and DDP peer of tools/bench/multi_gpu.sh: the LLaMA full fine-tuning step of bench_llama_torch.py
(transformers' LlamaForCausalLM from its presets, random weights, SDPA attention, next-token cross-entropy in f32
over all positions, AdamW lr 1e-5 and weight decay 0.1) over the ranks of a torchrun launch, one rank per GPU,
sharded with torch.distributed.fsdp.fully_shard (--wrap fsdp2, the default) or replicated with
DistributedDataParallel (--wrap ddp).

Sharding: one FSDP unit per decoder layer, then the root (embeddings, final norm, head; tied embeddings share one
parameter). MixedPrecisionPolicy: bf16 parameters for the all-gather and the compute, f32 gradient reduce-scatter;
the sharded master weights and AdamW's state stay f32. reshard_after_forward: FSDP2's default (on: a unit's
gathered weights are freed after its forward and gathered again in backward); --no-reshard-after-forward keeps
them from the forward to the end of the step (one all-gather per unit and step), to match a hadatrain run with
dist.reshard_after_forward false.
DDP (--wrap ddp): f32 weights and AdamW state on every rank, the forward and backward under bf16 autocast (as
bench_llama_torch.py), gradients all-reduced in f32 by DDP's buckets during backward (bucket_cap_mb 25, its
default; gradient_as_bucket_view on), the peer of hadatrain's dist.mode ddp.
Forms: eager; compile (FSDP2: each decoder layer through torch.compile before sharding, as torchtitan does; DDP:
the wrapped model through torch.compile, whose DDP optimiser splits the graph at the buckets); graph (DDP only: the
whole step, forward, backward with DDP's all-reduces and the optimiser step, captured once into one CUDA graph
with torch.cuda.graph and replayed, as PyTorch documents for DDP: DDP made on a side stream, at least 11 eager
warm-up steps there, gradients set to None before the capture, autocast without its weight cache, AdamW
capturable). FSDP2 has no graph form: its collectives and their streams are not captured.
Every rank draws its own random token ids (batch per GPU x seq). Timing: REPS timed steps after WARMUP warm-up
steps, each between two CUDA events on the step's stream; the slowest rank's median is the step time. Peak
allocated memory: the largest over ranks (graph: from the capture on). Model FLOPs utilisation per GPU: tokens per second per GPU times
bench_llama_torch.py's model FLOPs per token over --peak-tflops.
    torchrun --standalone --nproc-per-node N tools/bench/fsdp_torch.py MODEL BATCH_PER_GPU SEQ [--form eager|compile|graph]
        [--wrap fsdp2|ddp] [--layers L] [--checkpointing] [--no-reshard-after-forward] [--warmup 4] [--reps 12] [--jsonl FILE]
        [--device cuda|cpu] [--adamw fused|foreach]
Rank 0 prints one line starting "torch-fsdp2 " (or "torch-ddp ") and, with --jsonl, appends one JSON object to FILE
(tools/bench/multi_gpu_records.py turns it into a results-page record).
"""
import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_llama_torch import PRESETS, model_flops_per_token  # noqa: E402  (the same model and FLOPs count)


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=sorted(PRESETS))
    ap.add_argument("batch", type=int, help="rows per GPU")
    ap.add_argument("seq", type=int)
    ap.add_argument("--form", choices=("eager", "compile", "graph"), default="eager")
    ap.add_argument("--wrap", choices=("fsdp2", "ddp"), default="fsdp2", help="shard (FSDP2) or replicate (DDP)")
    ap.add_argument("--layers", type=int, default=0, help="decoder layers (0: the preset's)")
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing per decoder layer")
    ap.add_argument("--no-reshard-after-forward", dest="reshard", action="store_false",
                    help="keep gathered weights from the forward to the end of the step (FSDP2 default: re-gather)")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--jsonl", help="rank 0 appends the result as one JSON line to this file")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak per GPU for utilisation")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: Gloo, for trying the script")
    ap.add_argument("--adamw", choices=("fused", "foreach"), default="fused", help="AdamW's implementation (cpu: foreach)")
    a = ap.parse_args()
    if a.form == "graph" and (a.wrap != "ddp" or a.device != "cuda"):
        ap.error("--form graph: DDP on CUDA only (FSDP2's collectives are not captured)")
    return a


def main():
    a = parse()
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    cuda = a.device == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", local_rank) if cuda else torch.device("cpu")

    preset = dict(PRESETS[a.model])
    if a.layers:
        preset["num_hidden_layers"] = a.layers
    cfg = LlamaConfig(**preset, attn_implementation="sdpa")
    torch.manual_seed(0)  # the same initial weights on every rank; each keeps its shard of them
    with dev:
        model = LlamaForCausalLM(cfg)
    model = model.float().train()
    if a.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    n_params = sum(p.numel() for p in model.parameters())
    ddp, graph = a.wrap == "ddp", a.form == "graph"
    reshard = a.reshard and not ddp  # DDP keeps every weight on every rank
    side = torch.cuda.Stream() if graph else None  # the graph form's warm-up stream, where DDP is made
    if ddp:
        from torch.nn.parallel import DistributedDataParallel
        with torch.cuda.stream(side) if graph else contextlib.nullcontext():
            wrapped = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None,
                                              gradient_as_bucket_view=not graph)
        run = torch.compile(wrapped) if a.form == "compile" else wrapped
    else:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            if a.form == "compile":
                layer.compile()
            fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
        run = model
    fused = cuda and a.adamw == "fused"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1, fused=fused, foreach=not fused,
                            capturable=graph)

    V = cfg.vocab_size
    gen = torch.Generator(device=dev).manual_seed(1000 + rank)  # each rank its own rows
    ids = torch.randint(0, V, (a.batch, a.seq), device=dev, generator=gen)
    labels = torch.randint(0, V, (a.batch, a.seq), device=dev, generator=gen)

    def step():
        if not graph:  # the graph's gradients are set to None once, before the capture
            opt.zero_grad(set_to_none=not ddp)  # DDP: keep the gradients as views of its buckets
        # FSDP2 casts through its policy; a captured step cannot use autocast's weight cache
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=ddp, cache_enabled=not graph):
            logits = run(input_ids=ids, use_cache=False).logits
            loss = F.cross_entropy(logits.float().view(-1, V), labels.view(-1))
        loss.backward()
        opt.step()
        return loss.detach()

    if graph:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(max(a.warmup, 11)):  # DDP needs 11 eager iterations before its backward is captured
                opt.zero_grad(set_to_none=True)
                step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()  # the graph's memory is allocated by the capture
        opt.zero_grad(set_to_none=True)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_loss = step()

        def run_step():
            g.replay()
            return static_loss.clone()
    else:
        run_step = step
        for _ in range(a.warmup):
            step()
    if cuda and not graph:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    dist.barrier()
    times, losses = [], []
    stream = torch.cuda.current_stream() if cuda else None
    for _ in range(a.reps):
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(stream)
            losses.append(run_step())
            e1.record(stream)
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
        else:
            t0 = time.perf_counter()
            losses.append(run_step())
            times.append(1e3 * (time.perf_counter() - t0))
    mine = torch.tensor([statistics.median(times), torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0],
                        dtype=torch.float64, device=dev)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the slowest rank's median, the largest peak
    ms, peak = mine.tolist()
    tok_gpu = a.batch * a.seq / (ms / 1e3)
    mfu = tok_gpu * model_flops_per_token(cfg, a.seq) / (a.peak_tflops * 1e12)
    if rank == 0:
        name = a.model + (f"_L{a.layers}" if a.layers else "")
        print(f"torch-{a.wrap} {name} {world} rank(s) batch {a.batch}x{a.seq} per rank {a.form}"
              f"{'' if reshard or ddp else ' no-reshard'}: {ms:.2f} ms/step, {tok_gpu:.0f} tok/s per GPU, "
              f"{tok_gpu * world:.0f} tok/s, MFU {mfu:.3f}, peak allocated {peak:.2f} GiB", flush=True)
        if a.jsonl:
            rec = dict(model=name, gpus=world, batch_per_gpu=a.batch, seq=a.seq, form=a.form, wrap=a.wrap,
                       reshard_after_forward=reshard, checkpointing=a.checkpointing, adamw="fused" if fused else "foreach",
                       ms_per_step=round(ms, 3),
                       tok_per_s=round(tok_gpu * world), tok_per_s_per_gpu=round(tok_gpu), mfu_per_gpu=round(mfu, 4),
                       peak_allocated_gib=round(peak, 3), parameters=n_params, steps=a.reps,
                       losses=[round(float(l), 5) for l in losses], torch=torch.__version__,
                       device=torch.cuda.get_device_name() if cuda else "cpu",
                       date=datetime.date.today().isoformat())
            with open(a.jsonl, "a") as f:
                f.write(json.dumps(rec) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
