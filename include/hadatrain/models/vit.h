// Vision Transformer (Dosovitskiy et al. 2021) with timm's parameter names and default initialisation.
// ViT-S/4 for 32x32 inputs (dim 384, depth 12, heads 6, patch 4) and ViT-B/16 for 224x224 are presets.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "hadatrain/nn/layers.h"

namespace ht::models {

enum class VitPool { class_token, mean };

struct VitConfig {
  int64_t image_size = 32, patch_size = 4, in_channels = 3;
  int64_t dim = 384, depth = 12, heads = 6;
  double mlp_ratio = 4.0;
  int64_t num_classes = 100;
  VitPool pool = VitPool::class_token;
  double dropout = 0.0;  // after the position embedding, in attention proj and MLP
  // Stochastic depth: block i of n drops each residual branch per sample with probability drop_path * i / (n - 1)
  // (timm's linear rule; block 0 never drops). 0: no DropPath modules.
  double drop_path = 0.0;
  double ln_eps = 1e-6;

  static VitConfig vit_s4(int64_t num_classes);   // 32x32, patch 4, 384 dim, 12 x 6 heads
  static VitConfig vit_b16(int64_t num_classes);  // 224x224, patch 16, 768 dim, 12 x 12 heads
};

// The layer of parameter `name` for layer-wise learning-rate decay, as timm groups a VisionTransformer: the
// patch embedding, class token and position embedding 0, blocks.i i + 1, everything after the blocks (the final
// norm, the head) depth + 1.
int64_t vit_layer_id(const std::string& name, int64_t depth);

class VisionTransformer : public nn::Module {
 public:
  VisionTransformer(const VitConfig& cfg, Generator& init_gen, std::shared_ptr<Generator> dropout_gen);
  std::string type_name() const override { return "VisionTransformer"; }
  Tensor forward(const Tensor& x) override;  // (N, C, H, W) -> (N, num_classes)
  VitConfig config;
  Tensor cls_token, pos_embed;

 private:
  std::shared_ptr<nn::Conv2d> patch_proj_;
  std::shared_ptr<nn::Dropout> pos_drop_;
  std::vector<std::shared_ptr<nn::Module>> blocks_;
  std::shared_ptr<nn::LayerNorm> norm_;  // "norm" (class token) or "fc_norm" (mean pooling)
  std::shared_ptr<nn::Linear> head_;
};

}  // namespace ht::models
