// LLaMA on CUDA against the CPU: logits and every parameter's gradient of a tiny GQA model with Llama-3 rope
// scaling in f32 (and a bf16 compute dtype close to them), KV-cache decoding equal to the full forward on the
// device, and greedy generation giving the CPU's tokens.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/models/llama.h"
#include "hadatrain/models/llama_generate.h"
#include "hadatrain/ops/ops.h"

using namespace ht;
using models::Llama;
using models::LlamaConfig;

namespace {

LlamaConfig config() {
  LlamaConfig c = LlamaConfig::tiny();
  c.rope_scaling = {RopeScalingType::llama3, 4.0, 1.0, 4.0, 32};
  return c;
}

std::shared_ptr<Llama> llama(Device dev) {
  Generator gen(17);
  auto m = std::make_shared<Llama>(config(), models::LlamaBuild{models::LlamaInit::normal, &gen, {}, DType::f32});
  m->to(dev);
  return m;
}

Tensor ids(Device dev) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < 2 * 16; ++i) v.push_back((i * 53 + 7) % 128);
  return from_vector(v, {2, 16}, {DType::i64, dev});
}

}  // namespace

TEST_CASE("LLaMA forward and backward on CUDA match the CPU", "[gpu][llama]") {
  auto cpu = llama(Device::cpu()), gpu = llama(test::kCuda);
  Tensor losses[2];
  int k = 0;
  for (auto* m : {cpu.get(), gpu.get()}) {
    const Device dev = m->embed_weight().device();
    const Tensor logits = m->forward(ids(dev));  // (2, 16, 128)
    losses[k++] = cross_entropy(reshape(narrow(logits, 1, 0, 15), {30, 128}), reshape(narrow(ids(dev), 1, 1, 15), {30}));
  }
  CHECK(losses[1].item() == Approx(losses[0].item()).epsilon(1e-5));
  losses[0].backward();
  losses[1].backward();
  auto cp = cpu->named_parameters(), gp = gpu->named_parameters();
  REQUIRE(cp.size() == gp.size());
  for (std::size_t i = 0; i < cp.size(); ++i) {
    INFO(cp[i].first);
    CHECK(test::rel_error(gp[i].second->grad(), cp[i].second->grad()) < 1e-4);
  }
  // bf16 compute on the device stays close to the f32 logits.
  NoGradGuard ng;
  gpu->compute_dtype = DType::bf16;
  const Tensor bf = gpu->forward(ids(test::kCuda));
  gpu->compute_dtype.reset();
  CHECK(bf.dtype() == DType::bf16);
  CHECK(test::rel_error(to_dtype(bf, DType::f32), gpu->forward(ids(test::kCuda))) < 0.03);
}

TEST_CASE("LLaMA KV-cache decoding and generation on CUDA", "[gpu][llama]") {
  auto cpu = llama(Device::cpu()), gpu = llama(test::kCuda);
  NoGradGuard ng;
  gpu->eval();
  const Tensor all = ids(test::kCuda);
  const Tensor full = gpu->forward(all);
  models::KvCache cache = gpu->make_kv_cache(2, 20);
  std::vector<Tensor> parts{gpu->forward(narrow(all, 1, 0, 5), &cache, 0)};
  for (int64_t t = 5; t < 16; ++t) parts.push_back(gpu->forward(narrow(all, 1, t, 1), &cache, t));
  CHECK(test::rel_error(cat(parts, 1), full) < 1e-5);
  models::GenerateOptions o;
  o.max_new_tokens = 8;
  o.stop_ids = {1000};
  CHECK(models::generate(*gpu, {1, 5, 9}, o).tokens == models::generate(*cpu, {1, 5, 9}, o).tokens);
}
