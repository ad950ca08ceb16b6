// View ops: new shape/strides/offset over the same storage, with their backward.
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/reduce.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/factory.h"

#include <algorithm>
#include <optional>

namespace ht {
namespace {

Shape infer_shape(const Shape& requested, int64_t numel, const Tensor& x, const char* op) {
  Shape s = requested;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      HT_CHECK(infer < 0, "{}: only one dimension can be -1 in {}", op, to_string(requested));
      infer = i;
    } else {
      HT_CHECK(s[i] >= 0, "{}: invalid size {} in {}", op, s[i], to_string(requested));
      known *= s[i];
    }
  }
  if (infer >= 0) {
    HT_CHECK(known != 0 && numel % known == 0, "{}: cannot infer -1 in {} for {}", op, to_string(requested),
             x.describe());
    s[infer] = numel / known;
  }
  HT_CHECK(numel_of(s) == numel, "{}: shape {} is invalid for {} ({} elements)", op, to_string(requested),
           x.describe(), numel);
  return s;
}

// Strides that let `new_shape` view memory laid out as (old_shape, old_strides), if any (groups of
// dims that are contiguous among themselves can be split or merged).
std::optional<Strides> view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& new_shape) {
  Strides out;
  out.resize(new_shape.size());
  if (numel_of(old_shape) == 0 || old_shape.empty()) return contiguous_strides(new_shape);
  int view_d = new_shape.size() - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int d = old_shape.size() - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

// reshape / view: the gradient reshaped back to the input's shape. The output can be rebuilt when the input's node
// can rebuild the input (Note [Rebuilt inputs]): the same view of the rebuilt input, e.g. a channels-last batch
// norm's (N·H·W, C) output seen as (N, H, W, C) by the next convolution.
class ReshapeBackward final : public Node {
 public:
  ReshapeBackward(const char* op, Shape in_shape, Shape out_shape)
      : op_(op), in_shape_(std::move(in_shape)), out_shape_(std::move(out_shape)) {}
  std::string name() const override { return op_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {reshape(g[0], in_shape_)}; }
  bool can_recompute_output() const override { return source() != nullptr; }
  bool offers_rebuild() const override {  // a reshape of a product's output (Note [Recomputed outputs])
    const Node* src = source();
    return src != nullptr && src->offers_rebuild();
  }
  Tensor recompute_output() const override {
    const Node* src = source();
    return src ? reshape(src->recompute_output(), out_shape_) : Tensor();
  }

 private:
  // The input's node, when the input is its only output and it can rebuild it.
  const Node* source() const {
    if (next_edges_.size() != 1) return nullptr;
    const Edge& e = next_edges_[0];
    return e.fn && e.fn->rebuilds_output(e.input_nr) ? e.fn.get() : nullptr;
  }
  std::string op_;
  Shape in_shape_, out_shape_;
};

Tensor reshape_impl(const Tensor& x, const Shape& requested, bool allow_copy, const char* op) {
  const Shape s = infer_shape(requested, x.numel(), x, op);
  auto st = view_strides(x.shape(), x.strides(), s);
  if (!st) {
    HT_CHECK(allow_copy, "view: {} cannot be viewed as {} without a copy; use reshape or contiguous()",
             x.describe(), to_string(s));
    return reshape_impl(contiguous(x), s, false, op);
  }
  Tensor out = make_view(x, s, *st, x.offset());
  if (needs_grad({&x})) connect(std::make_shared<ReshapeBackward>(op, x.shape(), s), {&x}, {&out});
  return out;
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) { return reshape_impl(x, shape, true, "reshape"); }
Tensor view(const Tensor& x, const Shape& shape) { return reshape_impl(x, shape, false, "view"); }

bool is_channels_last(const Tensor& x) {
  if (x.dim() != 4 || x.is_contiguous()) return false;
  const Shape& s = x.shape();
  const Strides& st = x.strides();
  int64_t expected = 1;
  for (int d : {1, 3, 2, 0}) {
    if (s[d] == 1) continue;
    if (st[d] != expected) return false;
    expected *= s[d];
  }
  return true;
}

Tensor permute(const Tensor& x, const Dims& order) {
  HT_CHECK(order.size() == x.dim(), "permute: order {} has {} entries for {}", to_string(order), order.size(),
           x.describe());
  Shape s;
  Strides st;
  Dims inverse;
  inverse.resize(x.dim(), -1);
  for (int i = 0; i < order.size(); ++i) {
    const int d = wrap_dim(order[i], x.dim(), "permute");
    HT_CHECK(inverse[d] == -1, "permute: dim {} repeated in {}", d, to_string(order));
    inverse[d] = i;
    s.push_back(x.shape()[d]);
    st.push_back(x.strides()[d]);
  }
  Tensor out = make_view(x, s, st, x.offset());
  record("permute", {&x}, out, [inverse](FunctionNode&, std::vector<Tensor>&& g) {
    return std::vector<Tensor>{permute(g[0], inverse)};
  });
  return out;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  Dims order;
  for (int i = 0; i < x.dim(); ++i) order.push_back(i);
  std::swap(order[wrap_dim(d0, x.dim(), "transpose")], order[wrap_dim(d1, x.dim(), "transpose")]);
  return permute(x, order);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  const int d = wrap_dim(dim, x.dim(), "slice");
  HT_CHECK(x.dim() > 0, "slice: cannot slice a 0-dim tensor");
  HT_CHECK(step >= 1, "slice: step must be positive, got {}", step);
  const int64_t n = x.shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape s = x.shape();
  Strides st = x.strides();
  s[d] = (end - start + step - 1) / step;
  st[d] = x.strides()[d] * step;
  Tensor out = make_view(x, s, st, x.offset() + start * x.strides()[d]);
  const Shape in_shape = x.shape();
  const DType dt = x.dtype();
  const Device dev = x.device();
  record("slice", {&x}, out, [=](FunctionNode&, std::vector<Tensor>&& g) {
    Tensor gx = zeros(in_shape, {dt, dev});
    copy_(slice(gx, d, start, end, step), g[0]);
    return std::vector<Tensor>{gx};
  });
  return out;
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  const int d = wrap_dim(dim, x.dim(), "narrow");
  const int64_t n = x.shape()[d];
  HT_CHECK(start >= 0 && length >= 0 && start + length <= n,
           "narrow: [{}, {}) is out of range for dim {} of size {} in {}", start, start + length, d, n, x.describe());
  return slice(x, d, start, start + length, 1);
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  const int d = wrap_dim(dim, x.dim(), "select");
  const int64_t n = x.shape()[d];
  HT_CHECK(index >= -n && index < n, "select: index {} is out of range for dim {} of size {}", index, d, n);
  if (index < 0) index += n;
  return squeeze(narrow(x, d, index, 1), d);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  const int d = wrap_dim(dim, x.dim() + 1, "unsqueeze");
  Shape s = x.shape();
  s.insert(d, 1);
  return reshape(x, s);
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  const int d = wrap_dim(dim, x.dim(), "squeeze");
  if (x.dim() == 0 || x.shape()[d] != 1) return x;
  Shape s = x.shape();
  s.erase(d);
  Strides st = x.strides();
  st.erase(d);
  Tensor out = make_view(x, s, st, x.offset());
  const Shape in_shape = x.shape();
  record("squeeze", {&x}, out, [in_shape](FunctionNode&, std::vector<Tensor>&& g) {
    return std::vector<Tensor>{reshape(g[0], in_shape)};
  });
  return out;
}

Tensor expand(const Tensor& x, const Shape& shape) {
  HT_CHECK(shape.size() >= x.dim(), "expand: target {} has fewer dims than {}", to_string(shape), x.describe());
  Shape s = shape;
  Strides st;
  st.resize(shape.size());
  const int lead = shape.size() - x.dim();
  for (int i = 0; i < shape.size(); ++i) {
    const int j = i - lead;
    if (j < 0) {
      HT_CHECK(shape[i] >= 0, "expand: new leading dims need explicit sizes, got {}", to_string(shape));
      st[i] = 0;
      continue;
    }
    if (shape[i] == -1) s[i] = x.shape()[j];
    HT_CHECK(x.shape()[j] == s[i] || x.shape()[j] == 1, "expand: cannot expand {} to {} (dim {})", x.describe(),
             to_string(shape), i);
    st[i] = x.shape()[j] == s[i] ? x.strides()[j] : 0;
  }
  if (s == x.shape()) return x;
  Tensor out = make_view(x, s, st, x.offset());
  const Shape in_shape = x.shape();
  record("expand", {&x}, out, [in_shape](FunctionNode&, std::vector<Tensor>&& g) {
    return std::vector<Tensor>{sum_to(g[0], in_shape)};
  });
  return out;
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.dim() == 0) return reshape(x, {1});
  const int a = wrap_dim(start_dim, x.dim(), "flatten"), b = wrap_dim(end_dim, x.dim(), "flatten");
  HT_CHECK(a <= b, "flatten: start_dim {} is after end_dim {}", start_dim, end_dim);
  Shape s;
  for (int i = 0; i < a; ++i) s.push_back(x.shape()[i]);
  int64_t m = 1;
  for (int i = a; i <= b; ++i) m *= x.shape()[i];
  s.push_back(m);
  for (int i = b + 1; i < x.dim(); ++i) s.push_back(x.shape()[i]);
  return reshape(x, s);
}

Tensor Tensor::reshape(const Shape& s) const { return ht::reshape(*this, s); }
Tensor Tensor::view(const Shape& s) const { return ht::view(*this, s); }
Tensor Tensor::permute(const Dims& order) const { return ht::permute(*this, order); }
Tensor Tensor::transpose(int64_t d0, int64_t d1) const { return ht::transpose(*this, d0, d1); }
Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const { return ht::narrow(*this, dim, start, length); }
Tensor Tensor::unsqueeze(int64_t dim) const { return ht::unsqueeze(*this, dim); }
Tensor Tensor::squeeze(int64_t dim) const { return ht::squeeze(*this, dim); }
Tensor Tensor::expand(const Shape& s) const { return ht::expand(*this, s); }
Tensor Tensor::flatten(int64_t a, int64_t b) const { return ht::flatten(*this, a, b); }

}  // namespace ht
