// Test helpers: random tensors (Philox, never all zeros) and tolerant comparisons with useful messages.
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "hadatrain/ops/ops.h"

namespace ht::test {

// A fresh, uniquely named directory under the system temp dir ("ht_<tag>_XXXXXX", made by mkdtemp), removed
// with everything in it on destruction.
struct TempDir {
  explicit TempDir(const std::string& tag = "test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path path;
};

// spdlog's default logger replaced, for this object's lifetime, by one that writes into a string at `level` (spdlog's
// level numbers: 2 info, 3 warn); the previous logger and level come back on destruction. str(): what was logged.
// `on_message`, when given, is called with each message as it is logged: a seam where a test acts at the moment the
// code under test reports something (another process's write between two steps of it).
class LogCapture {
 public:
  explicit LogCapture(int level = 2, std::function<void(const std::string&)> on_message = {});
  ~LogCapture();
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::string str() const { return log_.str(); }

 private:
  std::ostringstream log_;
  std::shared_ptr<void> previous_;  // the spdlog::logger (kept opaque: spdlog stays out of this header)
  int previous_level_ = 2;
};

// A small MNIST-layout (IDX) dataset in `dir`: train-images/labels (n_train) and t10k-images/labels (n_test)
// of side x side u8 images, label = index % 10. Each class lights one row and one column of the image, and
// a hash adds noise, so no two images are equal and a model can learn the classes.
void write_idx_dataset(const std::filesystem::path& dir, int side, int n_train, int n_test);

// The trainer tests' shared fixtures. scratch_dir(): this test program's scratch folder, made on first use and
// removed when the program exits. idx8_dataset(): scratch_dir()/idx8, an 8x8 MNIST-layout dataset of
// kIdx8Train training and kIdx8Test test samples (write_idx_dataset), written on first use; batch 16 gives 4
// steps per epoch.
constexpr int kIdx8Train = 64, kIdx8Test = 32;
const std::filesystem::path& scratch_dir();
const std::filesystem::path& idx8_dataset();

// The bytes of the file at `p` (empty when it cannot be read).
std::string read_text(const std::filesystem::path& p);

// step -> loss of the `train` records of <out_dir>/metrics.jsonl. Throws ht::Error when the file cannot be
// read or a step is logged twice.
std::map<int64_t, double> train_losses(const std::filesystem::path& out_dir);

// Uniform values in [lo, hi) from a Philox generator seeded with `seed`.
Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype = DType::f64, double lo = -1.0, double hi = 1.0);

// Empty string when every element satisfies |a - e| <= atol + rtol * |e| (NaNs must match), otherwise a
// description of the first mismatches (index, values) and of shape differences.
std::string compare(const Tensor& actual, const Tensor& expected, double rtol, double atol);
std::string compare(const Tensor& actual, const std::vector<double>& expected, double rtol, double atol);

// The message of the ht::Error that f() throws, or "" when it throws none (for exact-message assertions).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ||actual - reference|| / ||reference|| over all elements, in double, tensors on any devices (the norm of
// the difference alone when the reference is all zeros); +infinity when the sizes differ or actual has a NaN.
double rel_error(const Tensor& actual, const Tensor& reference);

// Shorthand: shape, dtype and device checks fused with compare.
inline bool close(const Tensor& a, const Tensor& e, double rtol = 1e-6, double atol = 1e-8) {
  return compare(a, e, rtol, atol).empty();
}

}  // namespace ht::test
