// Low-precision communication over NCCL on one GPU (world size 1, in this process; dist/comm_quant.h):
//   - quantized_reduce_scatter of CUDA tensors (codes moved as bytes, the CUDA dequantise-and-sum) equals the
//     CPU codec on the same input bit for bit, and measures its error;
//   - FSDP with dist.gather_dtype int8 / fp8: a weight materialised through the policy (absmax on the device,
//     the max all-reduce, the 8-bit all-gather, the dequantise on arrival) equals the CPU codec's reconstruction
//     of the same weight bit for bit; one training step with reduce_quant int8 runs and moves the 8-bit bytes;
//   - the gathered codes feed a halo layer directly (grad/pipeline_halo_weight.h): int8 level 2 gives the output and
//     input gradient of the same layer given the dequantised weight bit for bit, fp8 level 1 the output of the
//     level-1 product of the weight's rotated rows quantised once, and halo's own Q(W·H) does not run.
#include <cmath>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/dist/comm_quant.h"
#include "hadatrain/dist/fsdp.h"
#include "hadatrain/dist/rendezvous.h"
#include "hadatrain/grad/pipeline_halo_weight.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/tensor/factory.h"
#include "support/catch.h"
#include "support/testing.h"

using namespace ht;

namespace {
const Device kGpu = Device::cuda(0);

dist::ProcessGroup one_rank() {
  return dist::init_process_group({.master_port = 0}, {.engine = "nccl", .device = kGpu,
                                                       .timeout = std::chrono::seconds(60)});
}

std::string same_bits(const Tensor& gpu, const Tensor& cpu) {
  return test::compare(gpu.to(Device::cpu()).to(DType::f64), cpu.to(DType::f64), 0, 0);
}
}  // namespace

TEST_CASE("quantised reduce-scatter over NCCL equals the CPU codec", "[dist][comm_quant]") {
  auto pg = one_rank();
  for (const int bits : {8, 4}) {
    const Tensor x = test::random_tensor({5000}, 17, DType::f32, -1, 1);
    const dist::QuantReduceSpec spec{.bits = bits, .block = 128, .measure_error = true};
    const auto r = dist::quantized_reduce_scatter(*pg.comm, x.to(kGpu), spec);
    const Tensor cpu = dist::dequantize_sum(dist::quantize_blocks(x, 1, spec), 1, 5000, 0, spec);
    REQUIRE(r.chunk.is_cuda());
    CHECK(same_bits(r.chunk, cpu).empty());
    CHECK(r.rel_error == Approx(test::rel_error(cpu, x)).epsilon(1e-6));
    CHECK(r.rel_error > 0);
  }
}

TEST_CASE("fsdp over NCCL gathers 8-bit weights as the CPU codec reconstructs them", "[dist][comm_quant]") {
  auto pg = one_rank();
  for (const auto carrier : {dist::GatherDType::int8, dist::GatherDType::fp8}) {
    Generator gen(21);
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(256, 96, nn::Bias::yes, gen));
    m->push_back(std::make_shared<nn::Activation>(nn::ActivationKind::relu));
    m->push_back(std::make_shared<nn::Linear>(96, 10, nn::Bias::yes, gen));
    const Tensor w0 = m->state_dict().at("0.weight").clone();  // (96, 256) on the CPU
    m->to(kGpu);
    auto store = nn::ParameterStore::attach(*m);
    dist::FullyShardedModel fsdp(*pg.comm, store,
                                 {.units = {"0.", "2."},
                                  .reshard_after_forward = false,  // one gather per unit: the byte count below
                                  .gather_dtype = carrier,
                                  .reduce_quant = dist::ReduceQuant::int8,
                                  .reduce_quant_block = 64,
                                  .reduce_quant_error_every = 0});
    REQUIRE(fsdp.row_quantized_params() == 2);
    // The CPU codec on the same weight: absmax (one rank: the max over ranks is its own), codes, reconstruction.
    const dist::RowCodec c = dist::make_row_codec(carrier, 256, "0.weight");
    const Tensor expected = dist::dequantize_rows(c, dist::quantize_rows(c, w0, dist::rows_absmax(c, w0)));
    {
      NoGradGuard no_grad;
      const Tensor got = store->materialise(*store->params()[store->index_of("0.weight")].param, DType::f32);
      REQUIRE(got.is_cuda());
      CHECK(same_bits(got, expected).empty());
    }
    fsdp.end_step();
    // One training step: the loss is finite, the bytes are the 8-bit ones (codes of 96 rows of 256 and 10 of
    // 96, two absmaxes, f32 biases) plus the int8 block codes of every gradient.
    auto opt = optim::make_sgd(fsdp.shard_store(), {.momentum = 0.9});
    const Tensor x = test::random_tensor({8, 256}, 5, DType::f32).to(kGpu);
    const Tensor labels = from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8}, {DType::i64}).to(kGpu);
    const Tensor loss = cross_entropy(m->forward(x), labels);
    loss.backward();
    opt->step(0.1);
    CHECK(std::isfinite(loss.item()));
    const int64_t gather = 96 * 256 + 10 * 96 + 2 * 4 + (96 + 10) * 4;
    // chunks padded to blocks of 64: 24576, 96 -> 128, 960, 10 -> 64 values; one byte each, a scale per 64
    const int64_t reduce = (24576 + 128 + 960 + 64) + (24576 / 64 + 2 + 960 / 64 + 1) * 4;
    CHECK(fsdp.bytes_on_wire() == gather + reduce);
    fsdp.end_step();
  }
}

namespace {
struct HaloLayer {
  std::shared_ptr<nn::Sequential> model;
  std::shared_ptr<nn::Linear> linear;
};
HaloLayer halo_layer(const grad::HaloOptions& o) {
  Generator gen(33);
  HaloLayer l{std::make_shared<nn::Sequential>(), std::make_shared<nn::Linear>(256, 96, nn::Bias::no, gen)};
  l.model->push_back(l.linear);
  grad::PipelineConfig config;
  config.default_spec.name = "halo";
  config.default_spec.options = o;
  nn::bind_pipelines(*l.model, config, std::make_shared<grad::StepClock>());
  l.model->to(kGpu);
  return l;
}
}  // namespace

TEST_CASE("fsdp over NCCL feeds the 8-bit gathered codes to halo's GEMMs", "[dist][comm_quant][halo]") {
  auto pg = one_rank();
  for (const auto carrier : {dist::GatherDType::int8, dist::GatherDType::fp8}) {
    const bool int8 = carrier == dist::GatherDType::int8;
    const grad::HaloOptions o{.level = int8 ? 2 : 1, .carrier = int8 ? grad::Carrier::int8 : grad::Carrier::fp8};
    INFO(dist::gather_dtype_name(carrier));
    const HaloLayer l = halo_layer(o);
    const Tensor w = l.linear->weight.detach().clone();  // (96, 256) on the GPU
    auto store = nn::ParameterStore::attach(*l.model);
    dist::FullyShardedModel fsdp(*pg.comm, store, {.units = {"0."}, .gather_dtype = carrier});
    Tensor x = test::random_tensor({2, 64, 256}, 8, DType::f32, -2, 2).to(kGpu);
    x.set_requires_grad(true);
    const Tensor gy = test::random_tensor({2, 64, 96}, 9, DType::f32, -1, 1).to(kGpu);
    int own = 0;
    grad::set_halo_phase_hook([&own](const char* phase) { own += std::string(phase) == "fwd Q(W·H)"; });
    const int64_t uses = grad::gathered_weight_uses();
    const Tensor y = l.model->forward(x);
    sum(mul(y, gy)).backward();
    grad::set_halo_phase_hook({});
    CHECK(own == 0);
    CHECK(grad::gathered_weight_uses() == uses + 1);
    const dist::RowCodec c = dist::make_row_codec(carrier, 256, "0.weight");
    const grad::HaloQuantized q = dist::quantize_rows(c, w, dist::rows_absmax(c, w));
    if (int8) {  // the same layer given the dequantised weight: halo quantises it back to the same codes
      const HaloLayer ref = halo_layer(o);
      {
        NoGradGuard no_grad;
        copy_(ref.linear->weight, dist::dequantize_rows(c, q));
      }
      Tensor xr = x.detach().clone();
      xr.set_requires_grad(true);
      const Tensor yr = ref.model->forward(xr);
      sum(mul(yr, gy)).backward();
      CHECK(test::compare(y.detach().to(Device::cpu()), yr.detach().to(Device::cpu()), 0, 0).empty());
      CHECK(test::compare(x.grad().to(Device::cpu()), xr.grad().to(Device::cpu()), 0, 0).empty());
    } else {  // level 1: y = [Q(x·H)·Q(W·H)ᵀ] / n with the weight's rotated rows quantised once
      const grad::HaloRotation rot = grad::halo_rotation_size(256);
      const grad::HaloQuantized qx = grad::halo_quantize(x.detach().reshape({128, 256}), grad::Carrier::fp8, rot);
      const Tensor want = grad::halo_product(qx.codes, q.codes, qx.scale, q.scale,
                                             {1.0f / static_cast<float>(rot.n), DType::f32, o.fp8_accumulation});
      CHECK(test::compare(y.detach().reshape({128, 96}).to(Device::cpu()), want.to(Device::cpu()), 0, 0).empty());
    }
    fsdp.end_step();
  }
}
