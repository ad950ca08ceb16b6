// llama2.c checkpoints (reference/data-formats.md §7) into HF names and layout: v0 (seven int32s, then the
// f32 arrays with frequency tables; a negative vocab_size marks a separate classifier at the end) and v1
// (magic "ak42", version, the seven int32s, a shared-classifier byte, padded to 256 bytes; no frequency
// tables). llama2.c rotates adjacent pairs (2j, 2j + 1), so q and k rows are permuted to HF's rotate-half
// pairing (interleaved_to_rotate_half, with the kv head count for k).
#include <cstring>
#include <fstream>
#include <limits>

#include "hadatrain/models/hf_checkpoint.h"
#include "hadatrain/tensor/factory.h"

namespace ht::models {
namespace fs = std::filesystem;

namespace {

// Permutes rows within each head: out row h*hd + dst(r) = in row h*hd + r, for (out, in) row maps of one head.
Tensor permute_head_rows(const Tensor& w, int64_t heads, bool to_half) {
  HT_CHECK(w.dim() == 2 && heads > 0 && w.size(0) % heads == 0 && (w.size(0) / heads) % 2 == 0,
           "q/k permutation: expected a weight (heads * head_dim, in) with an even head_dim for {} heads, got {}",
           heads, w.describe());
  const int64_t hd = w.size(0) / heads, half = hd / 2, cols = w.size(1);
  const Tensor src = w.contiguous();
  Tensor out = empty(w.shape(), {w.dtype(), Device::cpu()});
  HT_CHECK(w.is_cpu(), "q/k permutation: expected a CPU tensor, got {}", w.describe());
  const std::size_t row_bytes = static_cast<std::size_t>(cols) * itemsize(w.dtype());
  const auto* in = static_cast<const unsigned char*>(src.data_ptr());
  auto* o = static_cast<unsigned char*>(out.data_ptr());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < half; ++j)
      for (int64_t c = 0; c < 2; ++c) {
        const int64_t half_row = h * hd + c * half + j, meta_row = h * hd + 2 * j + c;
        const int64_t dst = to_half ? half_row : meta_row, from = to_half ? meta_row : half_row;
        std::memcpy(o + static_cast<std::size_t>(dst) * row_bytes, in + static_cast<std::size_t>(from) * row_bytes,
                    row_bytes);
      }
  return out;
}

struct Header {
  int32_t dim, hidden, layers, heads, kv_heads, vocab, seq_len;
};

}  // namespace

Tensor interleaved_to_rotate_half(const Tensor& w, int64_t heads) { return permute_head_rows(w, heads, true); }
Tensor rotate_half_to_interleaved(const Tensor& w, int64_t heads) { return permute_head_rows(w, heads, false); }

Llama2cModel read_llama2c(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  HT_CHECK(in.good(), "llama2.c checkpoint '{}' cannot be opened", path.string());
  const uint64_t file_size = fs::file_size(path);
  HT_CHECK(file_size >= 28, "llama2.c checkpoint '{}': {} bytes is too small for a header", path.string(), file_size);
  Llama2cModel m;
  Header h{};
  uint32_t magic = 0;
  in.read(reinterpret_cast<char*>(&magic), 4);
  bool shared = true;
  uint64_t offset = 0;
  if (magic == 0x616b3432u) {  // "ak42"
    int32_t version = 0;
    in.read(reinterpret_cast<char*>(&version), 4);
    HT_CHECK(version == 1, "llama2.c checkpoint '{}': version {} is not supported (only 0 and 1; version 2 is the "
             "int8 Q8_0 export)", path.string(), version);
    in.read(reinterpret_cast<char*>(&h), sizeof(Header));
    uint8_t shared_byte = 0;
    in.read(reinterpret_cast<char*>(&shared_byte), 1);
    shared = shared_byte != 0;
    m.version = 1;
    offset = 256;
  } else {
    in.seekg(0);
    in.read(reinterpret_cast<char*>(&h), sizeof(Header));
    shared = h.vocab > 0;
    if (h.vocab < 0 && h.vocab != std::numeric_limits<int32_t>::min()) h.vocab = -h.vocab;  // -2^31 stays negative
    m.version = 0;
    offset = 28;
  }
  HT_CHECK(in.good(), "llama2.c checkpoint '{}': the header is truncated", path.string());
  HT_CHECK(h.dim > 0 && h.hidden > 0 && h.layers > 0 && h.heads > 0 && h.kv_heads > 0 && h.vocab > 0 &&
               h.seq_len > 0 && h.dim % h.heads == 0 && h.heads % h.kv_heads == 0 && (h.dim / h.heads) % 2 == 0,
           "llama2.c checkpoint '{}': implausible header dim {}, hidden_dim {}, n_layers {}, n_heads {}, n_kv_heads {}, "
           "vocab_size {}, seq_len {} (is it a llama2.c .bin?)",
           path.string(), h.dim, h.hidden, h.layers, h.heads, h.kv_heads, h.vocab, h.seq_len);
  const int64_t D = h.dim, F = h.hidden, L = h.layers, V = h.vocab, hs = D / h.heads;
  const int64_t q = h.heads * hs, kv = h.kv_heads * hs;
  // In 128 bits: every size is below 2^31, so no term of the count can overflow, and a header whose sizes
  // multiply past 2^64 cannot wrap around to the file's size.
  using u128 = unsigned __int128;
  const u128 per_layer = u128(2 * D) + u128(D) * q + u128(2 * D) * kv + u128(q) * D + u128(3 * D) * F;
  const u128 freq = m.version == 0 ? u128(2 * static_cast<int64_t>(h.seq_len)) * (hs / 2) : 0;
  const u128 floats = u128(V) * D + u128(L) * per_layer + D + freq + (shared ? 0 : u128(V) * D);
  const u128 expected_bytes = offset + 4 * floats;
  const uint64_t expected =
      expected_bytes > std::numeric_limits<uint64_t>::max() ? std::numeric_limits<uint64_t>::max()
                                                            : static_cast<uint64_t>(expected_bytes);
  HT_CHECK(file_size == expected,
           "llama2.c checkpoint '{}' (v{}): the header (dim {}, hidden_dim {}, {} layers, {} heads, {} kv heads, vocab "
           "{}, seq_len {}, {} classifier) implies {} bytes, the file has {}",
           path.string(), m.version, D, F, L, h.heads, h.kv_heads, V, h.seq_len, shared ? "shared" : "separate",
           expected, file_size);

  LlamaConfig& c = m.config;
  c.vocab_size = V;
  c.hidden_size = D;
  c.intermediate_size = F;
  c.num_hidden_layers = L;
  c.num_attention_heads = h.heads;
  c.num_key_value_heads = h.kv_heads;
  c.head_dim = hs;
  c.max_position_embeddings = h.seq_len;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = shared;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.dtype = DType::f32;
  c.validate(path.string());

  in.seekg(static_cast<std::streamoff>(offset));
  auto read = [&](const Shape& shape) {  // the next f32 array
    Tensor t = empty(shape, {DType::f32});
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    HT_CHECK(in.good(), "llama2.c checkpoint '{}': read failed", path.string());
    return t;
  };
  // Per-layer arrays are stored all layers together: (L, ...) -> "model.layers.{i}.<name>".
  auto layered = [&](const std::string& name, const Shape& shape, int64_t permute_heads = 0) {
    Shape full{L};
    for (int d = 0; d < shape.size(); ++d) full.push_back(shape[d]);
    const Tensor all = read(full);
    const int64_t each = all.numel() / L;
    for (int64_t i = 0; i < L; ++i) {
      Tensor t = empty(shape, {DType::f32});
      std::memcpy(t.data_ptr(), all.data<float>() + i * each, static_cast<std::size_t>(each) * 4);
      if (permute_heads > 0) t = interleaved_to_rotate_half(t, permute_heads);
      m.tensors["model.layers." + std::to_string(i) + "." + name] = t;
    }
  };
  auto& T = m.tensors;
  if (m.version == 0) {
    T["model.embed_tokens.weight"] = read({V, D});
    layered("input_layernorm.weight", {D});
    layered("self_attn.q_proj.weight", {q, D}, h.heads);
    layered("self_attn.k_proj.weight", {kv, D}, h.kv_heads);
    layered("self_attn.v_proj.weight", {kv, D});
    layered("self_attn.o_proj.weight", {D, q});
    layered("post_attention_layernorm.weight", {D});
    layered("mlp.gate_proj.weight", {F, D});
    layered("mlp.down_proj.weight", {D, F});
    layered("mlp.up_proj.weight", {F, D});
    T["model.norm.weight"] = read({D});
    if (freq > 0) in.seekg(static_cast<std::streamoff>(4 * freq), std::ios::cur);  // freq_cis tables: unused
  } else {
    layered("input_layernorm.weight", {D});
    layered("post_attention_layernorm.weight", {D});
    T["model.norm.weight"] = read({D});
    T["model.embed_tokens.weight"] = read({V, D});
    layered("self_attn.q_proj.weight", {q, D}, h.heads);
    layered("self_attn.k_proj.weight", {kv, D}, h.kv_heads);
    layered("self_attn.v_proj.weight", {kv, D});
    layered("self_attn.o_proj.weight", {D, q});
    layered("mlp.gate_proj.weight", {F, D});
    layered("mlp.down_proj.weight", {D, F});
    layered("mlp.up_proj.weight", {F, D});
  }
  if (!shared) T["lm_head.weight"] = read({V, D});
  return m;
}

}  // namespace ht::models
