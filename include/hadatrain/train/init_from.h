// Starting a model from pretrained weights (`model.init_from`): a timm or torchvision state dict saved as
// safetensors (what the model hubs ship), or one of our own checkpoints. Our ResNet and ViT use torchvision's
// and timm's parameter names (models/resnet.h, models/vit.h), so names map one to one once a wrapper prefix
// ("module." from DistributedDataParallel, "_orig_mod." from torch.compile, "model.") shared by every key is
// removed. What does not fit is handled the way timm's fine-tuning does it:
//   - the classifier (the module holding the model's last parameters: fc, head) with another class count
//     keeps its fresh initialisation and is reported;
//   - a ViT position embedding for another patch grid is resampled (resample_pos_embed, timm's
//     resample_abs_pos_embed: bicubic with antialiasing, prefix tokens such as the class token kept as they are);
//   - tensors the model has and the file lacks (missing) or the file has and the model lacks (unexpected)
//     are listed in the report;
//   - any other shape difference is an error naming the tensor and both shapes;
//   - tensors matching a `reset` pattern (model.init_from_reset, e.g. "fc.*" for a fresh head of the same
//     size) are not loaded and are reported as re-initialised.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hadatrain/nn/module.h"
#include "hadatrain/tensor/tensor.h"
#include "hadatrain/train/lm_source.h"

namespace ht::train {

// The tensors of a pretrained model. `path` is a .safetensors file; a folder holding model.safetensors (one
// checkpoint of ours, a hub download) or model.safetensors.index.json (a sharded hub download); a run's
// checkpoint folder (its latest checkpoint); or that folder's `latest` / `best` pointer file.
// Errors name the path and say what was expected there.
std::map<std::string, Tensor> read_pretrained(const std::filesystem::path& path);
// What read_pretrained(path) reads: the file, or the folder holding model.safetensors or its index; for a run's
// checkpoint folder or its `latest` / `best` file, the step_<N> folder named now. read_pretrained of the result reads
// the same tensors however the pointers move afterwards. Errors as read_pretrained's.
std::filesystem::path resolve_pretrained(const std::filesystem::path& path);

// model.init_from as a run reads it, resolved once (Note [model.init_from resolved once] in trainer_setup.cpp): the
// model's weights are read from `path`, and a new run's checkpoints record that same `path` (init_from_record in
// train/provenance.h), so the record names the weights loaded even when another run moves a checkpoint root's
// `latest` in between.
struct InitFromSource {
  std::string value;                 // the config's model.init_from, as written
  std::filesystem::path path;        // what is read: resolve_pretrained(value), or the LLaMA source's folder
  std::optional<LlamaSource> llama;  // model.name llama: find_llama_source(value), read once
};

// The source's names with a wrapper prefix that every key shares ("module.", "_orig_mod.", "model.",
// repeatedly) removed.
std::map<std::string, Tensor> strip_wrapper_prefix(std::map<std::string, Tensor> source);

struct InitFromReport {
  std::string source;
  std::vector<std::string> loaded;         // copied into the model
  std::vector<std::string> missing;        // the model's, absent from the source: fresh initialisation kept
  std::vector<std::string> unexpected;     // the source's, absent from the model: ignored
  std::vector<std::string> reinitialised;  // classifier tensors with another class count: fresh init kept
  std::vector<std::string> resampled;      // "pos_embed (1, 197, 768) -> (1, 65, 768)"
  // The lines `hadatrain train` logs: counts, then each non-empty list.
  std::vector<std::string> lines() const;
};

struct InitFromOptions {
  std::vector<std::string> reset;  // glob patterns (grad::glob_match) of tensors that keep their fresh init
};

// Copies `source` (already through strip_wrapper_prefix) into `model` as described above. `source_name`
// names the file in messages. Values are converted to each slot's dtype and device. A reset pattern that
// matches no tensor of the model is an error.
InitFromReport init_from(nn::Module& model, const std::map<std::string, Tensor>& source, const std::string& source_name,
                         const InitFromOptions& options = {});
// read_pretrained, strip_wrapper_prefix and init_from.
InitFromReport init_from_path(nn::Module& model, const std::filesystem::path& path, const InitFromOptions& options = {});

// A position embedding (1, prefix + gh*gw, D) for a gh x gw patch grid resampled to new_h x new_w: the
// first `prefix` tokens (class token) are kept, the grid is resized with PyTorch's antialiased bicubic
// interpolation (F.interpolate(mode="bicubic", antialias=True, align_corners=False), which timm's
// resample_abs_pos_embed uses: the cubic kernel with a = -0.5, its support widened by the scale when
// shrinking, taps outside the grid dropped and the weights renormalised). Computed in f64 on the CPU; the
// result has the input's dtype.
Tensor resample_pos_embed(const Tensor& pos_embed, int64_t prefix, int64_t gh, int64_t gw, int64_t new_h, int64_t new_w);

}  // namespace ht::train
