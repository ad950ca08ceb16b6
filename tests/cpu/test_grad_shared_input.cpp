// Note [Shared saved inputs] (autograd/saved_tensor.h): tensors kept for backward are counted on their storage,
// and HLQ keeps a reference to an input another op already keeps (acbp_share) instead of a compressed copy,
// compressing it in backward with the same bits. The ViT case (the packed attention keeps proj's input) is CUDA
// only: tests/gpu/test_gpu_grad_pipelines.cpp.
#include <memory>
#include <string>
#include <vector>

#include "hadatrain/autograd/saved_tensor.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/train/config_reader.h"
#include "hadatrain/train/pipeline_config.h"
#include "support/catch.h"
#include "support/testing.h"

using namespace ht;

TEST_CASE("SavedTensor counts itself on its storage while it keeps it", "[autograd][grad]") {
  const Tensor t = test::random_tensor({4, 6}, 1, DType::f32);
  const Tensor view = reshape(t, {24});
  CHECK_FALSE(kept_for_backward(t));
  {
    SavedTensor a(t);
    CHECK(kept_for_backward(t));
    CHECK(kept_for_backward(view));  // the same storage
    CHECK_FALSE(kept_for_backward(t.clone()));
    SavedTensor b(view);
    SavedTensor c = std::move(a);  // moving does not count twice
    CHECK(t.storage()->graph_saves.load() == 2);
    const Tensor back = b.release();
    CHECK(t.storage()->graph_saves.load() == 1);
    CHECK(back.storage() == t.storage());
  }
  CHECK(t.storage()->graph_saves.load() == 0);
  CHECK_FALSE(kept_for_backward(view));

  // Node::save counts while the graph keeps the tensor; the backward releases it.
  Tensor x = test::random_tensor({3, 5}, 2, DType::f32);
  x.set_requires_grad(true);
  Tensor e = exp(x);  // keeps x for its backward
  CHECK(kept_for_backward(x));
  sum(e).backward();
  CHECK_FALSE(kept_for_backward(x));
  e = exp(x);
  CHECK(kept_for_backward(x));
  e = Tensor();  // the graph dies with its last output
  CHECK_FALSE(kept_for_backward(x));
}

namespace {

struct Case {
  std::string label;
  grad::PipelineSpec spec;
};

std::vector<Case> hlq_cases() {
  grad::PipelineSpec base;
  base.name = "hlq";
  std::vector<Case> c{{"defaults", base}};
  grad::PipelineSpec t = base;
  t.hlq.acbp_bits = 4;
  t.hlq.gw_scale = grad::ScaleGranularity::sample;
  c.push_back({"acbp4 sample scales", t});
  t = base;
  t.hlq.fallback = grad::HlaFallback::split_extra;
  c.push_back({"split_extra", t});
  t = base;
  t.hlq.acbp_conv = grad::AcbpConv::input_map;
  c.push_back({"input_map", t});
  return c;
}

struct Run {
  Tensor y, gx, gw;
  int64_t bytes = -1;
};

// y = product(x, w) (or conv_product of the image x) under `spec`; when `keep`, exp(x) first, whose node keeps
// x for its own backward. The loss reads y only.
Run run(const grad::PipelineSpec& spec, bool share, bool keep, bool conv, DType dt) {
  grad::PipelineSpec s = spec;
  s.hlq.acbp_share = share;
  Tensor x = conv ? test::random_tensor({2, 3, 8, 8}, 5, DType::f32).to(dt)
                  : test::random_tensor({2, 17, 12}, 5, DType::f32).to(dt);  // 17 tokens: split_extra leaves 16
  Tensor w = mul(test::random_tensor({16, conv ? 27 : 12}, 6, DType::f32), 0.3).to(dt);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  Run r;
  const Tensor kept = keep ? exp(x) : Tensor();
  const grad::ProductCall call{grad::make_pipeline(s), {}, grad::NoiseKey{3, 1, 4}, &r.bytes};
  Unfold2dParams u;
  u.kernel_h = u.kernel_w = 3;
  u.pad_h = u.pad_w = 1;
  r.y = conv ? grad::conv_product(x, w, u, call) : grad::product(x, w, call);
  const Tensor g = test::random_tensor(r.y.shape(), 7, DType::f32).to(dt);
  sum(mul(r.y, g)).backward();
  r.gx = x.grad();
  r.gw = w.grad();
  return r;
}

}  // namespace

TEST_CASE("hlq acbp_share: an input another op keeps is not copied, and the gradients keep their bits",
          "[grad]") {
  for (const Case& c : hlq_cases()) {
    for (const bool conv : {false, true}) {
      for (const DType dt : {DType::f32, DType::bf16}) {
        INFO(c.label << (conv ? ", conv" : ", linear") << ", " << dtype_name(dt));
        const Run copied = run(c.spec, false, true, conv, dt);  // kept elsewhere, but compressed anyway
        const Run shared = run(c.spec, true, true, conv, dt);   // kept elsewhere: a reference
        const Run alone = run(c.spec, true, false, conv, dt);   // not kept elsewhere: compressed
        CHECK(copied.bytes > 0);
        CHECK(shared.bytes == 0);
        CHECK(alone.bytes == copied.bytes);
        for (const Run* r : {&shared, &alone}) {
          CHECK(test::compare(r->y, copied.y, 0.0, 0.0) == "");
          CHECK(test::compare(r->gx, copied.gx, 0.0, 0.0) == "");
          CHECK(test::compare(r->gw, copied.gw, 0.0, 0.0) == "");
        }
      }
    }
  }
}

TEST_CASE("hlq acbp_share config key", "[grad]") {
  auto parse = [](const std::string& yaml) {
    auto r = train::ConfigReader::from_string(yaml, "share.yaml");
    const grad::PipelineConfig c = train::read_grad_pipeline(r.child("grad_pipeline"), 0);
    r.finish();
    return c;
  };
  CHECK(parse("grad_pipeline: {default: {name: hlq}}").default_spec.hlq.acbp_share);
  const grad::PipelineConfig off = parse("grad_pipeline: {default: {name: hlq}, layers: {fc: {name: hlq, acbp_share: false}}}");
  CHECK(off.default_spec.hlq.acbp_share);
  REQUIRE(off.overrides.size() == 1);
  CHECK_FALSE(off.overrides[0].second.hlq.acbp_share);
  CHECK(grad::describe(off.overrides[0].second).find("never shared") != std::string::npos);
  CHECK(grad::describe(off.default_spec).find("shared") == std::string::npos);
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: hlq, acbp_share: sometimes}}"),
                    HasSubstr("grad_pipeline.default.acbp_share"));
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: luq, acbp_share: false}}"), HasSubstr("unknown key"));
}
