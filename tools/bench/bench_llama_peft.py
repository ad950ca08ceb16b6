#!/usr/bin/env python3
"""PyTorch side of the LLaMA LoRA step benchmark: transformers' LlamaForCausalLM (bench_llama_torch.py's presets,
random weights, no download) with peft LoRA adapters, against build-gpu/tools/bench_llama PRESET BATCH SEQ exact
--lora, in one of PyTorch's forms, one form per process.

LoRA as bench_llama's --lora: rank 16, alpha 32 (scaling 2), no dropout, on q_proj, k_proj, v_proj and o_proj of
every decoder layer; everything else frozen (embeddings, norms, the MLP, the head), as peft freezes it. The base
weights are bf16 (--base-dtype), as bench_llama --lora holds its frozen matrices (its norm scales stay f32);
--base-dtype fp32 is the f32-base form, cast to bf16 by autocast in each forward. peft keeps the adapters in f32
(autocast_adapter_dtype).
The step: bf16 autocast forward and backward, next-token cross-entropy in f32 over all positions against random
labels, backward, fused AdamW (lr 1e-5, weight decay 0.1) over the adapters. SDPA attention.
Forms:
  eager    the step as written;
  compile  the peft model through torch.compile (default mode); the optimiser step as is (fused);
  graph    the whole step (forward, backward, optimiser step) captured once into one CUDA graph with
           torch.cuda.graph and replayed (warm-up on a side stream, gradients set to None before capture,
           autocast without its weight cache, AdamW capturable).
Timing: the median of --reps timed steps after --warmup warm-up steps, each between two CUDA events on the step's
stream; peak allocated memory over the timed steps (graph: from the capture on). Model FLOPs utilisation uses
bench_llama's count (bench_llama_torch.model_flops_per_token: the full fine-tuning count, 6 x parameters per
token, although the frozen base needs no weight gradient), so the two sides' figures compare.
    python3 tools/bench/bench_llama_peft.py MODEL BATCH SEQ FORM [--rank 16] [--alpha 32]
        [--targets q_proj,k_proj,v_proj,o_proj] [--base-dtype bf16|fp32] [--checkpointing] [--jsonl FILE]
prints one line starting "torch-peft ", then the same record as one JSON object (peak_allocated_gib: peak
allocated memory), on stdout and, with --jsonl, appended to FILE. The shape of BENCHMARKS' LoRA row:
    python3 tools/bench/bench_llama_peft.py llama3_8b 4 2048 eager|compile|graph --jsonl peft.jsonl
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The same shapes, step timing and FLOPs count as the plain benchmark.
from bench_llama_torch import PRESETS, append_record, median_step_ms, model_flops_per_token  # noqa: E402

FORMS = ("eager", "compile", "graph")


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=sorted(PRESETS))
    ap.add_argument("batch", type=int)
    ap.add_argument("seq", type=int)
    ap.add_argument("form", choices=FORMS)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj", help="module names, comma-separated")
    ap.add_argument("--base-dtype", choices=("bf16", "fp32"), default="bf16", help="the frozen weights' dtype")
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing per decoder layer")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--jsonl", help="append the result as one JSON line to this file")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak for utilisation")
    return ap.parse_args()


def main():
    a = parse()
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**PRESETS[a.model], attn_implementation="sdpa")
    base_dtype = torch.bfloat16 if a.base_dtype == "bf16" else torch.float32
    default = torch.get_default_dtype()
    torch.set_default_dtype(base_dtype)  # build the weights in their dtype on the GPU (an 8B model in f32 then
    with torch.device("cuda"):           # cast would need 48 GB on the way)
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(default)
    model.train()
    if a.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0, target_modules=a.targets.split(","),
                      bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    n_params = sum(p.numel() for p in model.parameters())
    V = cfg.vocab_size
    ids = torch.randint(0, V, (a.batch, a.seq), device="cuda")
    labels = torch.randint(0, V, (a.batch, a.seq), device="cuda")
    opt = torch.optim.AdamW(trainable, lr=1e-5, weight_decay=0.1, fused=True, capturable=(a.form == "graph"))
    run = torch.compile(model) if a.form == "compile" else model

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=(a.form != "graph")):
            logits = run(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(logits.float().view(-1, V), labels.view(-1))
        loss.backward()
        opt.step()
        return loss

    ms = median_step_ms(step, opt, a.form, a.warmup, a.reps)
    tok_s = a.batch * a.seq / (ms / 1e3)
    mfu = tok_s * model_flops_per_token(cfg, a.seq) / (a.peak_tflops * 1e12)
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"torch-peft {a.model} batch {a.batch}x{a.seq} lora r{a.rank} base {a.base_dtype} {a.form}: {ms:.2f} ms/step, "
          f"{tok_s:.0f} tok/s, MFU {mfu:.3f}, peak allocated {peak:.2f} GiB "
          f"({n_params / 1e9:.3f} B parameters, {n_trainable / 1e6:.2f} M trainable)")
    rec = dict(model=a.model, batch=a.batch, seq=a.seq, form=a.form, lora_rank=a.rank, lora_alpha=a.alpha,
               targets=a.targets, base_dtype=a.base_dtype, checkpointing=a.checkpointing, ms_per_step=round(ms, 3),
               tok_per_s=round(tok_s), mfu=round(mfu, 4), peak_allocated_gib=round(peak, 3), parameters=n_params,
               trainable=n_trainable)
    sys.stdout.flush()  # the text line before the record appended through /dev/stdout
    for path in ["/dev/stdout"] + ([a.jsonl] if a.jsonl else []):
        append_record(path, rec)  # adds the torch version, the device and the date


if __name__ == "__main__":
    main()
