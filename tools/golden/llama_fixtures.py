#!/usr/bin/env python3
"""Golden fixtures for the LLaMA model from Hugging Face transformers' LlamaForCausalLM in float64 on the CPU
(tests/cpu/test_llama_golden.cpp compares against them): tiny configs with GQA, tied and untied embeddings and
Llama-3 rope scaling; random weights; fixed ids and labels (some -100); the logits, the shifted next-token
cross-entropy loss and every parameter's gradient.

Needs torch and transformers (4.4x or 5.x). Run from the repository root:

    python3 tools/golden/llama_fixtures.py            # writes tests/fixtures/llama_golden_<case>.safetensors

A second mode checks that transformers loads a folder hadatrain wrote, unchanged, and computes stories260K's
reference logits with it (tests/fixtures/llama_stories260k_logits.safetensors, from llama2.c's maths):

    hadatrain convert --input ../shared/data/stories260K.bin --output /tmp/stories260k_hf --dtype fp32
    python3 tools/golden/llama_fixtures.py --check-hf /tmp/stories260k_hf

Each file holds: `config` (in __metadata__, the config.json text transformers was built from: hadatrain's
LlamaConfig reads the same text), `ids` and `labels` (B, T) int64, `logits` (B, T, V), `loss` (1,), and for
every parameter name N of model.named_parameters(): `param.N` and `grad.N`, all float64.

Three places where transformers does not compute in float64 are replaced, each checked against the original:
- the rotary cos/sin: transformers computes inv_freq and the angles in float32 whatever the model dtype; the
  script computes the same formula in float64 (checked against the model's own inv_freq to 1e-6 relative, and
  the logits against the unpatched model's to 1e-5);
- RMSNorm: transformers' LlamaRMSNorm casts its input to float32 for the statistics; the script keeps float64
  (the same formula: x * rsqrt(mean(x^2) + eps), times the weight);
- the loss: transformers' loss casts the logits to float32; the script takes
  cross_entropy(logits[:, :-1], labels[:, 1:], ignore_index=-100) in float64 (checked against
  model(..., labels=...).loss to 1e-5).
"""
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

OUT = Path("tests/fixtures")

BASE = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=96, hidden_size=32,
            intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
            hidden_act="silu", attention_bias=False, attention_dropout=0.0, mlp_bias=False, pretraining_tp=1,
            tie_word_embeddings=False, initializer_range=0.02, use_cache=False, bos_token_id=1, eos_token_id=2,
            torch_dtype="float64")

CASES = {
    # grouped-query attention (4 query heads over 2 kv heads), separate lm_head
    "gqa_untied": dict(),
    # multi-head attention, tied embeddings, another theta and eps
    "tied_mha": dict(num_key_value_heads=4, tie_word_embeddings=True, rope_theta=500.0, rms_norm_eps=1e-6),
    # one kv head, head_dim 16 (not hidden / heads), Llama-3 rope scaling whose three frequency bands all occur
    # at head_dim 16 (wavelengths 6.3 kept, 19.9 and 62.8 blended, 199 and up divided by the factor)
    "llama3_rope": dict(hidden_size=48, intermediate_size=32, num_key_value_heads=1, head_dim=16, rope_theta=10000.0,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
}

B, T = 2, 12


def inv_freq_f64(cfg):
    hd = cfg["head_dim"]
    inv = [cfg["rope_theta"] ** (-2.0 * j / hd) for j in range(hd // 2)]
    rs = cfg["rope_scaling"]
    if rs:
        orig, lo, hi, factor = (rs["original_max_position_embeddings"], rs["low_freq_factor"],
                                rs["high_freq_factor"], rs["factor"])
        out = []
        for f in inv:
            wavelen = 2.0 * math.pi / f
            if wavelen < orig / hi:
                out.append(f)
            elif wavelen > orig / lo:
                out.append(f / factor)
            else:
                s = (orig / wavelen - lo) / (hi - lo)
                out.append((1.0 - s) * f / factor + s * f)
        inv = out
    return torch.tensor(inv, dtype=torch.float64)


def patch_rotary(model, inv):
    rotary = model.model.rotary_emb

    def forward(x, position_ids):
        freqs = position_ids[:, :, None].to(torch.float64) * inv[None, None, :]  # (B, T, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = getattr(rotary, "attention_scaling", 1.0)
        return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)

    rotary.forward = forward


def patch_rmsnorm(model):
    for m in model.modules():
        if type(m).__name__ == "LlamaRMSNorm":
            def forward(x, m=m):
                var = x.pow(2).mean(-1, keepdim=True)
                return m.weight * (x * torch.rsqrt(var + m.variance_epsilon))
            m.forward = forward


def make_case(name, overrides, seed):
    cfg = dict(BASE, **overrides)
    torch.manual_seed(seed)
    config = LlamaConfig.from_dict(dict(cfg))  # as from_pretrained reads a config.json of these keys
    try:
        # sdpa (on the CPU in float64 throughout); the eager path takes its softmax in float32
        config._attn_implementation = "sdpa"
    except (AttributeError, ValueError):
        pass
    model = LlamaForCausalLM(config).to(torch.float64).eval()
    with torch.no_grad():  # weights well away from zero so every path matters; norm scales around 1
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    inv = inv_freq_f64(cfg)
    own = model.model.rotary_emb.inv_freq.to(torch.float64)
    assert torch.allclose(own, inv, rtol=1e-6, atol=0), f"{name}: inv_freq {own.tolist()} vs {inv.tolist()}"

    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, cfg["vocab_size"], (B, T), generator=gen)
    labels = ids.clone()
    labels[0, 3] = -100
    labels[1, 7:9] = -100
    with torch.no_grad():
        unpatched_logits = model(input_ids=ids).logits
        hf_loss = model(input_ids=ids, labels=labels).loss

    patch_rotary(model, inv)
    patch_rmsnorm(model)
    model.zero_grad()
    logits = model(input_ids=ids).logits  # (B, T, V) float64
    assert logits.dtype == torch.float64
    assert torch.allclose(logits, unpatched_logits, rtol=1e-5, atol=1e-5), f"{name}: rotary/RMSNorm patches changed logits"
    V = cfg["vocab_size"]
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), ignore_index=-100)
    assert abs(loss.item() - hf_loss.item()) < 1e-5, f"{name}: loss {loss.item()} vs transformers {hf_loss.item()}"
    loss.backward()

    tensors = {"ids": ids.to(torch.int64), "labels": labels.to(torch.int64), "logits": logits.detach(),
               "loss": loss.detach().reshape(1)}
    for n, p in model.named_parameters():
        tensors["param." + n] = p.detach().clone()
        tensors["grad." + n] = p.grad.detach().clone()
    meta = {"config": json.dumps(cfg), "transformers_version": transformers.__version__,
            "torch_version": torch.__version__}
    path = OUT / f"llama_golden_{name}.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=meta)
    print(f"{path}: {path.stat().st_size} bytes, loss {loss.item():.12f}, "
          f"{sum(1 for k in tensors if k.startswith('grad.'))} gradients")


def check_hf(folder):
    """Loads `folder` with from_pretrained and compares its logits with the stories260K reference."""
    from safetensors.torch import load_file
    model = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float64).eval()
    ref = load_file(str(OUT / "llama_stories260k_logits.safetensors"))
    with torch.no_grad():
        logits = model(input_ids=ref["ids"].reshape(1, -1)).logits[0]
    err = (logits - ref["logits"]).abs().max().item()
    # transformers computes the rotary angles in float32: agreement to about 1e-5, not float64's 1e-12.
    print(f"{folder}: loaded by transformers {transformers.__version__}; max |logits - run.c reference| = {err:.3g}")
    if err > 1e-3:
        sys.exit("MISMATCH: the folder hadatrain wrote does not compute the llama2.c reference logits")
    print("OK")


def main():
    if not OUT.is_dir():
        sys.exit("run from the repository root (tests/fixtures/ must exist)")
    if len(sys.argv) == 3 and sys.argv[1] == "--check-hf":
        check_hf(sys.argv[2])
        return
    for i, (name, overrides) in enumerate(CASES.items()):
        make_case(name, overrides, seed=100 + i)


if __name__ == "__main__":
    main()
