// Shape and strides: small inline vectors of int64 (at most kMaxDims dimensions), plus helpers.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "hadatrain/core/error.h"

namespace ht {

inline constexpr int kMaxDims = 8;

// A fixed-capacity vector of int64 used for shapes, strides and index lists.
class Dims {
 public:
  Dims() = default;
  Dims(std::initializer_list<int64_t> v) { assign(v.begin(), v.end()); }
  explicit Dims(const std::vector<int64_t>& v) { assign(v.begin(), v.end()); }
  template <class It>
  Dims(It first, It last) { assign(first, last); }

  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t& operator[](int i) { return d_[static_cast<std::size_t>(i)]; }
  int64_t operator[](int i) const { return d_[static_cast<std::size_t>(i)]; }
  int64_t* begin() { return d_.data(); }
  int64_t* end() { return d_.data() + n_; }
  const int64_t* begin() const { return d_.data(); }
  const int64_t* end() const { return d_.data() + n_; }
  int64_t back() const { return d_[static_cast<std::size_t>(n_ - 1)]; }
  void push_back(int64_t v) {
    HT_CHECK(n_ < kMaxDims, "tensors have at most {} dimensions", kMaxDims);
    d_[static_cast<std::size_t>(n_++)] = v;
  }
  void pop_back() { --n_; }
  void resize(int n, int64_t fill = 0) {
    HT_CHECK(n >= 0 && n <= kMaxDims, "tensors have at most {} dimensions, asked for {}", kMaxDims, n);
    for (int i = n_; i < n; ++i) d_[static_cast<std::size_t>(i)] = fill;
    n_ = n;
  }
  void insert(int pos, int64_t v) {
    push_back(0);
    for (int i = n_ - 1; i > pos; --i) d_[static_cast<std::size_t>(i)] = d_[static_cast<std::size_t>(i - 1)];
    d_[static_cast<std::size_t>(pos)] = v;
  }
  void erase(int pos) {
    for (int i = pos; i + 1 < n_; ++i) d_[static_cast<std::size_t>(i)] = d_[static_cast<std::size_t>(i + 1)];
    --n_;
  }
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  friend bool operator==(const Dims& a, const Dims& b) { return std::equal(a.begin(), a.end(), b.begin(), b.end()); }

 private:
  template <class It>
  void assign(It first, It last) {
    n_ = 0;
    for (; first != last; ++first) push_back(static_cast<int64_t>(*first));
  }
  std::array<int64_t, kMaxDims> d_{};
  int n_ = 0;
};

using Shape = Dims;
using Strides = Dims;

int64_t numel_of(const Shape& s);
Strides contiguous_strides(const Shape& s);
std::string to_string(const Dims& d);  // "(2, 3, 4)"
// Wraps a possibly negative dim index into [0, ndim); throws naming the op when out of range.
int wrap_dim(int64_t dim, int ndim, const char* op);
// The broadcast of two shapes (numpy rules); throws naming both shapes and the op when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace ht

template <>
struct fmt::formatter<ht::Dims> : fmt::formatter<std::string> {
  auto format(const ht::Dims& d, fmt::format_context& ctx) const {
    return fmt::formatter<std::string>::format(ht::to_string(d), ctx);
  }
};
