// Vision Transformer: patch embedding (conv with kernel = stride = patch), optional class token, learned
// position embedding, pre-norm transformer blocks (norm1 -> attn -> +, norm2 -> mlp -> +; with drop_path each
// branch through DropPath before its +), final norm and linear head. Linear weights trunc_normal(std 0.02) with
// zero bias, pos_embed trunc_normal(0.02), cls_token normal(1e-6): timm's default ("") weight init.
#include "hadatrain/models/vit.h"

#include "hadatrain/nn/init.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/reduce.h"
#include "hadatrain/ops/shape_ops.h"

namespace ht::models {
namespace {

class Block : public nn::Module {
 public:
  Block(const VitConfig& c, double drop_path, Generator& gen, const std::shared_ptr<Generator>& dgen) {
    norm1_ = register_module("norm1", std::make_shared<nn::LayerNorm>(c.dim, c.ln_eps));
    attn_ = register_module("attn", std::make_shared<nn::SelfAttention>(c.dim, c.heads, nn::Bias::yes, c.dropout, gen, dgen));
    norm2_ = register_module("norm2", std::make_shared<nn::LayerNorm>(c.dim, c.ln_eps));
    mlp_ = register_module("mlp", std::make_shared<nn::Mlp>(c.dim, static_cast<int64_t>(c.dim * c.mlp_ratio),
                                                            nn::ActivationKind::gelu, c.dropout, gen, dgen));
    if (c.drop_path > 0.0) {  // timm's drop_path1 / drop_path2 (no parameters: the state dict is the same)
      drop_path1_ = register_module("drop_path1", std::make_shared<nn::DropPath>(drop_path, dgen));
      drop_path2_ = register_module("drop_path2", std::make_shared<nn::DropPath>(drop_path, dgen));
    }
  }
  std::string type_name() const override { return "Block"; }
  Tensor forward(const Tensor& x) override {  // (B, N, D)
    Tensor y = add(x, drop(drop_path1_, attn_->forward(norm1_->forward(x))));
    return add(y, drop(drop_path2_, mlp_->forward(norm2_->forward(y))));
  }

 private:
  static Tensor drop(const std::shared_ptr<nn::DropPath>& d, const Tensor& branch) {
    return d ? d->forward(branch) : branch;
  }
  std::shared_ptr<nn::DropPath> drop_path1_, drop_path2_;
  std::shared_ptr<nn::LayerNorm> norm1_, norm2_;
  std::shared_ptr<nn::SelfAttention> attn_;
  std::shared_ptr<nn::Mlp> mlp_;
};

}  // namespace

int64_t vit_layer_id(const std::string& name, int64_t depth) {
  for (const char* stem : {"patch_embed.", "cls_token", "pos_embed"})
    if (name.rfind(stem, 0) == 0) return 0;
  if (name.rfind("blocks.", 0) == 0) {
    const std::size_t dot = name.find('.', 7);
    return std::stoll(name.substr(7, dot - 7)) + 1;
  }
  return depth + 1;
}

VitConfig VitConfig::vit_s4(int64_t num_classes) {
  VitConfig c;
  c.num_classes = num_classes;
  return c;
}

VitConfig VitConfig::vit_b16(int64_t num_classes) {
  VitConfig c;
  c.image_size = 224;
  c.patch_size = 16;
  c.dim = 768;
  c.heads = 12;
  c.num_classes = num_classes;
  return c;
}

VisionTransformer::VisionTransformer(const VitConfig& c, Generator& gen, std::shared_ptr<Generator> dgen) : config(c) {
  HT_CHECK(c.drop_path >= 0.0 && c.drop_path < 1.0, "ViT: drop_path must be in [0, 1), got {}", c.drop_path);
  HT_CHECK(c.image_size % c.patch_size == 0, "ViT: image_size {} must be a multiple of patch_size {}", c.image_size,
           c.patch_size);
  HT_CHECK(c.dim % c.heads == 0, "ViT: dim {} must be divisible by heads {}", c.dim, c.heads);
  const int64_t grid = c.image_size / c.patch_size, tokens = grid * grid + (c.pool == VitPool::class_token ? 1 : 0);
  nn::Conv2dOptions po;
  po.in_channels = c.in_channels;
  po.out_channels = c.dim;
  po.kernel = c.patch_size;
  po.stride = c.patch_size;
  patch_proj_ = std::make_shared<nn::Conv2d>(po, gen);
  if (c.pool == VitPool::class_token) {
    cls_token = empty({1, 1, c.dim});
    nn::init::normal_(cls_token, 0.0, 1e-6, gen);
    register_parameter("cls_token", &cls_token);
  }
  pos_embed = empty({1, tokens, c.dim});
  nn::init::trunc_normal_(pos_embed, 0.0, 0.02, -2.0, 2.0, gen);
  register_parameter("pos_embed", &pos_embed);
  struct PatchEmbed : nn::Module {
    explicit PatchEmbed(std::shared_ptr<nn::Conv2d> p) { register_module("proj", std::move(p)); }
    std::string type_name() const override { return "PatchEmbed"; }
  };
  register_module("patch_embed", std::make_shared<PatchEmbed>(patch_proj_));
  pos_drop_ = register_module("pos_drop", std::make_shared<nn::Dropout>(c.dropout, dgen));  // so eval() reaches it
  auto blocks = std::make_shared<nn::Sequential>();
  for (int64_t i = 0; i < c.depth; ++i) {
    const double rate = c.depth > 1 ? c.drop_path * static_cast<double>(i) / static_cast<double>(c.depth - 1) : 0.0;
    auto b = std::make_shared<Block>(c, rate, gen, dgen);
    blocks->push_back(b);
    blocks_.push_back(b);
  }
  register_module("blocks", blocks);
  norm_ = register_module(c.pool == VitPool::class_token ? "norm" : "fc_norm",
                          std::make_shared<nn::LayerNorm>(c.dim, c.ln_eps));
  head_ = register_module("head", std::make_shared<nn::Linear>(c.dim, c.num_classes, nn::Bias::yes, gen));
  // timm default init for every Linear: trunc_normal(std 0.02), zero bias.
  for (auto& [name, m] : named_modules()) {
    if (auto* lin = dynamic_cast<nn::Linear*>(m)) {
      nn::init::trunc_normal_(lin->weight, 0.0, 0.02, -2.0, 2.0, gen);
      if (lin->bias.defined()) nn::init::constant_(lin->bias, 0.0);
    }
  }
}

Tensor VisionTransformer::forward(const Tensor& x) {
  const auto& c = config;
  HT_CHECK(x.dim() == 4 && x.size(1) == c.in_channels && x.size(2) == c.image_size && x.size(3) == c.image_size,
           "ViT: expected (N, {}, {}, {}), got {}", c.in_channels, c.image_size, c.image_size, x.describe());
  const int64_t B = x.size(0);
  Tensor t = patch_proj_->forward(x).flatten(2).transpose(1, 2);  // (B, grid^2, D)
  // The class token and position embedding in the compute dtype (Note [Materialising parameters]), or
  // cat/add would promote a bf16 forward to f32 from here on.
  if (c.pool == VitPool::class_token) t = cat({materialise(cls_token, t.dtype()).expand({B, 1, c.dim}), t}, 1);
  t = pos_drop_->forward(add(t, materialise(pos_embed, t.dtype())));
  for (auto& b : blocks_) t = b->forward(t);
  Tensor pooled = c.pool == VitPool::class_token ? select(norm_->forward(t), 1, 0) : norm_->forward(mean(t, {1}));
  return head_->forward(pooled);  // (B, classes)
}

}  // namespace ht::models
