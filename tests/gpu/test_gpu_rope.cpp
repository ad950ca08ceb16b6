// The tiled rotary-embedding kernel against the CPU reference on every path (16-byte packs, the element path for
// odd half dims, interleaved pairs, unaligned or gapped strides), GQA-like head counts, positions that do not
// fill the last block, llama3 frequency scaling; outputs poisoned so unwritten elements fail; the layout of the
// input gradient.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include "hadatrain/autograd/engine.h"

using namespace ht;

namespace {

using test::leaf;

struct RopeCase {
  const char* what;
  int64_t B, H, T, D;
  int64_t pad;     // extra channels after D in the stored rows (a gapped last-dim view when > 0)
  int64_t start;   // first stored channel of the view (unaligned pointer when not a multiple of the pack)
  bool transposed; // stored (B, T, H, D + pad) and viewed (B, H, T, D), as the LLaMA projections
  RopeStyle style;
};

}  // namespace

TEST_CASE("the tiled rotary_embedding kernel matches the CPU on every path, forward and backward", "[gpu][rope]") {
  const std::vector<RopeCase> cases = {
      {"packs, GQA q-like, T not a block multiple", 2, 8, 37, 64, 0, 0, true, RopeStyle::rotate_half},
      {"packs, k-like (2 heads), many blocks", 1, 2, 300, 64, 0, 0, true, RopeStyle::rotate_half},
      {"packs, head dim 128, contiguous", 2, 3, 9, 128, 0, 0, false, RopeStyle::rotate_half},
      {"half dim 3: element path", 1, 5, 11, 6, 0, 0, true, RopeStyle::rotate_half},
      {"half dim 12: packs for f64 and f32, elements for 16-bit", 1, 3, 7, 24, 0, 0, true, RopeStyle::rotate_half},
      {"unaligned start: element path", 2, 2, 5, 64, 8, 1, true, RopeStyle::rotate_half},
      {"gapped rows, aligned", 1, 4, 13, 64, 8, 0, true, RopeStyle::rotate_half},
      {"interleaved", 2, 4, 19, 64, 0, 0, true, RopeStyle::interleaved},
      {"one position", 1, 1, 1, 2, 0, 0, false, RopeStyle::rotate_half},
  };
  uint64_t seed = 900;
  for (DType dt : test::kFloatDTypes)
    for (const RopeCase& c : cases)
      for (int64_t offset : {int64_t{0}, int64_t{29}}) {
        INFO(c.what << " " << dtype_name(dt) << " offset " << offset);
        RopeParams rp{500000.0, offset, c.style};
        if (offset > 0) rp.scaling = {RopeScalingType::llama3, 8.0, 1.0, 4.0, 64};
        const Shape stored = c.transposed ? Shape{c.B, c.T, c.H, c.D + c.pad} : Shape{c.B, c.H, c.T, c.D + c.pad};
        const Tensor x = test::random_input(stored, ++seed, dt);
        Tensor xc = leaf(x, Device::cpu()), xg = leaf(x, test::kCuda);
        auto view = [&](const Tensor& t) {
          const Tensor v = narrow(t, 3, c.start, c.D);
          return c.transposed ? transpose(v, 1, 2) : v;
        };
        const Tensor vc = view(xc);
        const Tensor yc = rotary_embedding(vc, rp);
        Tensor yg, vg;
        {
          test::PoisonGuard poison;
          vg = view(xg);
          yg = rotary_embedding(vg, rp);
        }
        CHECK(test::compare_to_cpu(yg, yc) == "");
        const Tensor gy = test::random_input(yc.shape(), ++seed, dt);
        const Tensor gxc = grad({yc}, {vc}, {gy})[0];
        Tensor gxg;
        {
          test::PoisonGuard poison;
          gxg = grad({yg}, {vg}, {gy.to(test::kCuda)})[0];
        }
        CHECK(test::compare_to_cpu(gxg, gxc) == "");
        // Dense permuted inputs get their gradient in their own layout (written through the kernel's strides).
        if (c.pad == 0) CHECK(gxg.strides() == vg.strides());
      }
}
