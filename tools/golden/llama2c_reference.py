#!/usr/bin/env python3
"""Reference logits of a llama2.c checkpoint, computed the way llama2.c's run.c computes them, in float64 numpy:
the weights are read straight from the .bin (legacy v0 layout) and RoPE rotates adjacent pairs (2j, 2j+1) of the
unpermuted q and k, one token at a time with a key/value cache. Nothing here shares code with hadatrain, so the
C++ import (q/k row permutation to HF's rotate-half layout) and forward are checked against an independent
implementation.

    python3 tools/golden/llama2c_reference.py ../shared/data/stories260K.bin \
        tests/fixtures/llama_stories260k_logits.safetensors

Writes `ids` (T, i64) and `logits` (T, vocab, f64): logits[t] is the output at position t for ids[:t+1].
"""
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_safetensors  # noqa: E402

# A fixed token sequence: BOS then ids spread over the 512-token vocabulary.
IDS = [1, 403, 261, 303, 425, 269, 17, 385, 510, 2, 60, 322, 511, 300, 7, 128, 256, 44, 99, 481]


def read_v0(path):
    raw = Path(path).read_bytes()
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack("<7i", raw[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    f = np.frombuffer(raw[28:], dtype="<f4").astype(np.float64)
    hs = dim // heads
    pos = 0

    def take(*shape):
        nonlocal pos
        n = int(np.prod(shape))
        a = f[pos:pos + n].reshape(shape)
        pos += n
        return a

    w = {"emb": take(vocab, dim), "rms_att": take(layers, dim), "wq": take(layers, heads * hs, dim),
         "wk": take(layers, kv_heads * hs, dim), "wv": take(layers, kv_heads * hs, dim),
         "wo": take(layers, dim, heads * hs), "rms_ffn": take(layers, dim), "w1": take(layers, hidden, dim),
         "w2": take(layers, dim, hidden), "w3": take(layers, hidden, dim), "rms_final": take(dim)}
    take(seq_len, hs // 2)  # freq_cis_real (unused by run.c)
    take(seq_len, hs // 2)  # freq_cis_imag
    w["wcls"] = w["emb"] if shared else take(vocab, dim)
    assert pos == f.size, f"{path}: {f.size - pos} floats left over"
    cfg = dict(dim=dim, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, vocab=vocab, seq_len=seq_len)
    return cfg, w


def rmsnorm(x, weight):
    return weight * (x / np.sqrt(np.mean(x * x) + 1e-5))


def forward(cfg, w, ids):
    dim, heads, kv_heads = cfg["dim"], cfg["heads"], cfg["kv_heads"]
    hs = dim // heads
    kv_dim = kv_heads * hs
    kv_mul = heads // kv_heads
    k_cache = np.zeros((cfg["layers"], len(ids), kv_dim))
    v_cache = np.zeros_like(k_cache)
    out = []
    for pos, token in enumerate(ids):
        x = w["emb"][token].copy()
        for layer in range(cfg["layers"]):
            xb = rmsnorm(x, w["rms_att"][layer])
            q = w["wq"][layer] @ xb
            k = w["wk"][layer] @ xb
            v = w["wv"][layer] @ xb
            for i in range(0, dim, 2):  # run.c: rotate pairs (i, i+1) of q, and of k while i < kv_dim
                freq = 1.0 / 10000.0 ** ((i % hs) / hs)
                c, s = np.cos(pos * freq), np.sin(pos * freq)
                for vec in ((q, k) if i < kv_dim else (q,)):
                    v0, v1 = vec[i], vec[i + 1]
                    vec[i], vec[i + 1] = v0 * c - v1 * s, v0 * s + v1 * c
            k_cache[layer, pos] = k
            v_cache[layer, pos] = v
            att_out = np.zeros(heads * hs)
            for h in range(heads):
                kvh = h // kv_mul
                qh = q[h * hs:(h + 1) * hs]
                keys = k_cache[layer, :pos + 1, kvh * hs:(kvh + 1) * hs]
                scores = keys @ qh / np.sqrt(hs)
                p = np.exp(scores - scores.max())
                p /= p.sum()
                att_out[h * hs:(h + 1) * hs] = p @ v_cache[layer, :pos + 1, kvh * hs:(kvh + 1) * hs]
            x = x + w["wo"][layer] @ att_out
            xb = rmsnorm(x, w["rms_ffn"][layer])
            h1 = w["w1"][layer] @ xb
            h3 = w["w3"][layer] @ xb
            x = x + w["w2"][layer] @ ((h1 / (1.0 + np.exp(-h1))) * h3)
        out.append(w["wcls"] @ rmsnorm(x, w["rms_final"]))
    return np.stack(out)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    cfg, w = read_v0(sys.argv[1])
    logits = forward(cfg, w, IDS)
    llama_safetensors.save(sys.argv[2], {"ids": np.array(IDS, dtype=np.int64), "logits": logits},
                           {"source": Path(sys.argv[1]).name, "maths": "llama2.c run.c, float64"})
    print(f"wrote {sys.argv[2]}: {len(IDS)} positions, vocab {cfg['vocab']}, "
          f"argmax {logits.argmax(-1).tolist()}")


if __name__ == "__main__":
    main()
