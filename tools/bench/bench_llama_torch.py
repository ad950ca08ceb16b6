#!/usr/bin/env python3
"""PyTorch side of the LLaMA training-step benchmark: transformers' LlamaForCausalLM with the shapes of
build-gpu/tools/bench_llama, in one of PyTorch's forms, one form per process.

Model: a LlamaConfig preset with random weights (llama32_1b: Llama-3.2-1B's shape, hidden 2048, 16 layers,
32 heads, 8 KV heads, MLP 8192, vocabulary 128256, tied embeddings, rope theta 500000 with Llama-3 scaling;
llama3_8b: Llama-3.1-8B's shape, hidden 4096, 32 layers, MLP 14336, untied, as bench_llama's preset; tiny: a small
shape for trying the script). Attention through SDPA. The step: fp32 master weights, bf16
autocast forward and backward, next-token cross-entropy in fp32 over all positions, backward, fused AdamW
(lr 1e-5, weight decay 0.1). Full fine-tuning: every parameter trains.
Forms:
  eager    the step as written;
  compile  the model through torch.compile (default mode); the optimiser step as is (fused);
  graph    the whole step (forward, backward, optimiser step) captured once into one CUDA graph with
           torch.cuda.graph and replayed (warm-up on a side stream, gradients set to None before capture,
           autocast without its weight cache, AdamW capturable).
Timing: the median of REPS timed steps after WARMUP warm-up steps, each between two CUDA events on the step's
stream; peak allocated memory over the timed steps (graph: from the capture on).
Model FLOPs per token (the PaLM count): 6 * (parameters outside the embedding, lm_head included)
+ 12 * layers * heads * head_dim * sequence; utilisation divides the achieved FLOP/s by --peak-tflops.
    python3 tools/bench/bench_llama_torch.py MODEL BATCH SEQ FORM [--jsonl FILE] [--peak-tflops 989]
prints one line starting "torch " and, with --jsonl, appends one JSON object to FILE.
"""
import argparse
import datetime
import json
import statistics

import torch
import torch.nn.functional as F

FORMS = ("eager", "compile", "graph")
WARMUP, REPS = 4, 12

PRESETS = {
    "llama32_1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
                       rope_theta=500000.0, max_position_embeddings=131072,
                       rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                       rms_norm_eps=1e-5),
    "llama3_8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False,
                      rope_theta=500000.0, max_position_embeddings=131072,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                      rms_norm_eps=1e-5),
    "tiny": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=4, head_dim=32, vocab_size=32000, tie_word_embeddings=False,
                 rope_theta=10000.0, max_position_embeddings=4096, rms_norm_eps=1e-5),
}


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=sorted(PRESETS))
    ap.add_argument("batch", type=int)
    ap.add_argument("seq", type=int)
    ap.add_argument("form", choices=FORMS)
    ap.add_argument("--jsonl", help="append the result as one JSON line to this file")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak for utilisation")
    return ap.parse_args()


def model_flops_per_token(cfg, seq):
    hd = cfg.head_dim
    attn = cfg.hidden_size * hd * (cfg.num_attention_heads * 2 + cfg.num_key_value_heads * 2)
    mlp = 3 * cfg.hidden_size * cfg.intermediate_size
    n = cfg.num_hidden_layers * (attn + mlp) + cfg.vocab_size * cfg.hidden_size  # lm_head counts, embedding not
    return 6 * n + 12 * cfg.num_hidden_layers * cfg.num_attention_heads * hd * seq


def median_step_ms(step, opt, form, warmup, reps):
    """The median of `reps` timed training steps after `warmup` untimed ones, in ms, each between two CUDA events
    on the current stream; the peak-memory counter is reset before the timed steps (graph: before the capture).
    form "graph": step() captured once into a CUDA graph (warm-up on a side stream, gradients set to None before
    the capture) and replayed; otherwise opt.zero_grad(set_to_none=True) and step() each time."""
    stream = torch.cuda.current_stream()
    if form == "graph":
        side = torch.cuda.Stream()
        side.wait_stream(stream)
        with torch.cuda.stream(side):
            for _ in range(warmup):
                opt.zero_grad(set_to_none=True)
                step()
        stream.wait_stream(side)
        torch.cuda.synchronize()
        opt.zero_grad(set_to_none=True)
        torch.cuda.reset_peak_memory_stats()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        run_once = g.replay
    else:
        def run_once():
            opt.zero_grad(set_to_none=True)
            step()
        for _ in range(warmup):
            run_once()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(stream)
        run_once()
        e1.record(stream)
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def main():
    a = parse()
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(**PRESETS[a.model], attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).cuda().float().train()
    V = cfg.vocab_size
    ids = torch.randint(0, V, (a.batch, a.seq), device="cuda")
    labels = torch.randint(0, V, (a.batch, a.seq), device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1, fused=True,
                            capturable=(a.form == "graph"))
    run = torch.compile(model) if a.form == "compile" else model

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=(a.form != "graph")):
            logits = run(input_ids=ids).logits
        loss = F.cross_entropy(logits.float().view(-1, V), labels.view(-1))
        loss.backward()
        opt.step()
        return loss

    ms = median_step_ms(step, opt, a.form, WARMUP, REPS)
    tokens = a.batch * a.seq
    tok_s = tokens / (ms / 1e3)
    mfu = tok_s * model_flops_per_token(cfg, a.seq) / (a.peak_tflops * 1e12)
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"torch {a.model} batch {a.batch}x{a.seq} {a.form}: {ms:.2f} ms/step, {tok_s:.0f} tok/s, MFU {mfu:.3f}, "
          f"peak allocated {peak:.2f} GiB")
    if a.jsonl:
        append_record(a.jsonl, dict(model=a.model, batch=a.batch, seq=a.seq, form=a.form, ms_per_step=round(ms, 3),
                                    tok_per_s=round(tok_s), mfu=round(mfu, 4), peak_allocated_gib=round(peak, 3)))


def append_record(path, rec):
    """Appends rec, with the torch version, the device and today's date, as one JSON line to path."""
    rec.update(torch=torch.__version__, device=torch.cuda.get_device_name(), date=datetime.date.today().isoformat())
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
