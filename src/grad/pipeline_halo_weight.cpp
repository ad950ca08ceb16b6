// Gathered 8-bit weights for the halo pipeline (grad/pipeline_halo_weight.h, Note [Gathered 8-bit weights]).
#include "hadatrain/grad/pipeline_halo_weight.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "hadatrain/core/error.h"
#include "hadatrain/tensor/allocator.h"

namespace ht::grad {
namespace {

struct Attachment {
  std::weak_ptr<StorageImpl> storage;
  int64_t offset = 0;
  std::weak_ptr<const GatheredWeight> weight;
};

struct Table {
  std::mutex mu;
  std::unordered_multimap<const StorageImpl*, Attachment> by_storage;
};

Table& table() {
  static Table t;
  return t;
}

std::atomic<int64_t>& uses() {
  static std::atomic<int64_t> n{0};
  return n;
}

}  // namespace

void attach_gathered_weight(const Tensor& w, const std::shared_ptr<const GatheredWeight>& g) {
  HT_CHECK(w.defined() && w.storage() != nullptr && g != nullptr,
           "attach_gathered_weight: expected a tensor with a storage and a gathered weight");
  Table& t = table();
  std::lock_guard lock(t.mu);
  // Drop what can no longer be found (a storage or weight that is gone) and this tensor's previous attachment.
  for (auto it = t.by_storage.begin(); it != t.by_storage.end();) {
    const Attachment& a = it->second;
    const bool same = it->first == w.storage().get() && a.offset == w.offset();
    if (same || a.storage.expired() || a.weight.expired()) it = t.by_storage.erase(it);
    else ++it;
  }
  t.by_storage.emplace(w.storage().get(), Attachment{w.storage(), w.offset(), g});
}

std::shared_ptr<const GatheredWeight> gathered_weight(const Tensor& w) {
  if (!w.defined() || w.storage() == nullptr || w.dim() < 1 || w.size(0) == 0) return nullptr;
  Table& t = table();
  std::lock_guard lock(t.mu);
  const auto [begin, end] = t.by_storage.equal_range(w.storage().get());
  for (auto it = begin; it != end; ++it) {
    const Attachment& a = it->second;
    if (a.offset != w.offset() || a.storage.lock() != w.storage()) continue;
    auto g = a.weight.lock();
    if (g == nullptr) return nullptr;
    if (g->codes.size(0) != w.size(0) || g->cols != w.numel() / w.size(0)) return nullptr;
    return g;
  }
  return nullptr;
}

int64_t gathered_weight_uses() { return uses().load(); }
void note_gathered_weight_use() { uses().fetch_add(1); }

}  // namespace ht::grad
