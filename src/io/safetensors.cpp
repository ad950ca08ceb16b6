// safetensors reader and writer: [u64 LE header length N][N bytes JSON header][data], validated strictly on
// read (see read_safetensors_header). The sharded HF layout lives in safetensors_sharded.cpp.
#include "hadatrain/io/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/io/atomic_file.h"
#include "hadatrain/ops/copy.h"

namespace ht::io {
namespace fs = std::filesystem;
using nlohmann::json;

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; hadatrain's reader and writer copy bytes as they are");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's cap

struct DTypeName {
  DType dt;
  std::string_view name;
};
constexpr std::array<DTypeName, 11> kDTypeNames{{
    {DType::f64, "F64"},
    {DType::f32, "F32"},
    {DType::bf16, "BF16"},
    {DType::f16, "F16"},
    {DType::f8e4m3, "F8_E4M3"},
    {DType::f8e5m2, "F8_E5M2"},
    {DType::i8, "I8"},
    {DType::u8, "U8"},
    {DType::i32, "I32"},
    {DType::i64, "I64"},
    {DType::b8, "BOOL"},
}};
// safetensors dtypes that exist in the format but have no hadatrain dtype.
constexpr std::array<std::string_view, 9> kUnsupportedNames{"I16", "U16", "U32", "U64", "F8_E8M0",
                                                            "F4",  "F6_E2M3", "F6_E3M2", "C64"};

std::string supported_list() {
  std::string s;
  for (const auto& d : kDTypeNames) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

std::string prefix(const fs::path& path) { return fmt::format("safetensors file '{}'", path.string()); }

uint64_t read_u64_le(const unsigned char* b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
  return v;
}

// Parses JSON text and rejects duplicate keys in any object (nlohmann would keep the last one silently).
json parse_json_no_duplicates(std::string_view text, std::string& duplicate) {
  std::vector<std::set<std::string>> open_objects;
  auto cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) open_objects.emplace_back();
    else if (ev == json::parse_event_t::object_end && !open_objects.empty()) open_objects.pop_back();
    else if (ev == json::parse_event_t::key && !open_objects.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!open_objects.back().insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  return json::parse(text.begin(), text.end(), cb);
}

uint64_t checked_u64(const json& v, const std::string& what, const fs::path& path) {
  HT_CHECK(v.is_number_unsigned(), "{}: {} must be a non-negative integer, found {}", prefix(path), what, v.dump());
  return v.get<uint64_t>();
}

TensorInfo parse_entry(const std::string& name, const json& e, const fs::path& path) {
  const std::string where = fmt::format("{}: tensor '{}'", prefix(path), name);
  HT_CHECK(e.is_object(), "{}: header entry must be an object with dtype, shape and data_offsets, found {}", where,
           e.dump());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    HT_CHECK(e.contains(key), "{}: header entry lacks \"{}\"", where, key);
  TensorInfo info;
  info.name = name;

  const json& dt = e["dtype"];
  HT_CHECK(dt.is_string(), "{}: dtype must be a string, found {}", where, dt.dump());
  const std::string dts = dt.get<std::string>();
  const std::optional<DType> parsed = dtype_from_safetensors(dts);
  if (!parsed) {
    const bool known = std::find(kUnsupportedNames.begin(), kUnsupportedNames.end(), dts) != kUnsupportedNames.end();
    HT_FAIL("{}: {} dtype '{}' (hadatrain reads {})", where,
            known ? "unsupported safetensors" : "unknown", dts, supported_list());
  }
  info.dtype = *parsed;

  const json& sh = e["shape"];
  HT_CHECK(sh.is_array(), "{}: shape must be an array of sizes, found {}", where, sh.dump());
  HT_CHECK(sh.size() <= static_cast<std::size_t>(kMaxDims), "{}: shape {} has {} dimensions; hadatrain supports at most {}",
           where, sh.dump(), sh.size(), kMaxDims);
  uint64_t numel = 1;
  for (const json& d : sh) {
    const uint64_t size = checked_u64(d, fmt::format("tensor '{}': every shape entry", name), path);
    HT_CHECK(size <= static_cast<uint64_t>(INT64_MAX) && !__builtin_mul_overflow(numel, size, &numel),
             "{}: shape {} has too many elements", where, sh.dump());
    info.shape.push_back(static_cast<int64_t>(size));
  }
  uint64_t nbytes = 0;
  HT_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(itemsize(info.dtype)), &nbytes),
           "{}: shape {} has too many elements", where, sh.dump());

  const json& off = e["data_offsets"];
  HT_CHECK(off.is_array() && off.size() == 2, "{}: data_offsets must be [begin, end], found {}", where, off.dump());
  info.begin = checked_u64(off[0], fmt::format("tensor '{}': data_offsets[0]", name), path);
  info.end = checked_u64(off[1], fmt::format("tensor '{}': data_offsets[1]", name), path);
  HT_CHECK(info.begin <= info.end, "{}: data_offsets [{}, {}] end before they begin", where, info.begin, info.end);
  HT_CHECK(info.end - info.begin == nbytes,
           "{}: data_offsets [{}, {}] hold {} bytes, but shape {} of {} needs {} ({} elements x {} bytes)", where,
           info.begin, info.end, info.end - info.begin, info.shape, dts, nbytes, numel, itemsize(info.dtype));
  return info;
}

SafetensorsHeader read_header(std::FILE* f, const fs::path& path) {
  struct stat st {};
  HT_CHECK(::fstat(::fileno(f), &st) == 0, "{}: cannot stat: {}", prefix(path), std::strerror(errno));
  const auto file_size = static_cast<uint64_t>(st.st_size);
  HT_CHECK(file_size >= 8, "{}: file too small ({} bytes): a safetensors file starts with an 8-byte header length",
           prefix(path), file_size);
  unsigned char len_bytes[8];
  HT_CHECK(std::fread(len_bytes, 1, 8, f) == 8, "{}: cannot read the header length: {}", prefix(path),
           std::strerror(errno));
  const uint64_t n = read_u64_le(len_bytes);
  HT_CHECK(n <= file_size - 8, "{}: header length {} goes beyond the end of the file ({} bytes); the file is "
           "truncated or not a safetensors file", prefix(path), n, file_size);
  HT_CHECK(n <= kMaxHeaderBytes, "{}: header length {} exceeds the {}-byte limit", prefix(path), n, kMaxHeaderBytes);
  std::string text(n, '\0');
  HT_CHECK(std::fread(text.data(), 1, n, f) == n, "{}: cannot read the {}-byte header: {}", prefix(path), n,
           std::strerror(errno));
  HT_CHECK(n > 0 && text[0] == '{', "{}: header does not start with '{{': not a safetensors file", prefix(path));

  json header;
  std::string duplicate;
  try {
    header = parse_json_no_duplicates(text, duplicate);
  } catch (const json::exception& e) {
    HT_FAIL("{}: invalid JSON header: {}", prefix(path), e.what());
  }
  HT_CHECK(duplicate.empty(), "{}: header names '{}' twice", prefix(path), duplicate);
  HT_CHECK(header.is_object(), "{}: header must be a JSON object", prefix(path));

  SafetensorsHeader out;
  out.data_start = 8 + n;
  const uint64_t data_size = file_size - out.data_start;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      HT_CHECK(entry.is_object(), "{}: __metadata__ must be an object of strings, found {}", prefix(path),
               entry.dump());
      for (const auto& [k, v] : entry.items()) {
        HT_CHECK(v.is_string(), "{}: __metadata__ value of '{}' must be a string, found {}", prefix(path), k,
                 v.dump());
        out.metadata.emplace(k, v.get<std::string>());
      }
      continue;
    }
    TensorInfo info = parse_entry(name, entry, path);
    HT_CHECK(info.end <= data_size,
             "{}: tensor '{}': data_offsets [{}, {}] out of range: the data section holds {} bytes (file truncated?)",
             prefix(path), name, info.begin, info.end, data_size);
    out.tensors.push_back(std::move(info));
  }

  // Tensors must tile the data section exactly: in offset order, each starts where the previous ended.
  std::sort(out.tensors.begin(), out.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : out.tensors) {
    HT_CHECK(t.begin >= expected, "{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' at [{}, {}]",
             prefix(path), t.name, t.begin, t.end, prev ? prev->name : "", prev ? prev->begin : 0,
             prev ? prev->end : 0);
    HT_CHECK(t.begin == expected, "{}: tensor '{}': data_offsets [{}, {}] leave bytes [{}, {}) that belong to no "
             "tensor", prefix(path), t.name, t.begin, t.end, expected, t.begin);
    expected = t.end;
    prev = &t;
  }
  HT_CHECK(expected == data_size, "{}: {} bytes of trailing garbage after the last tensor{} (data section {} bytes)",
           prefix(path), data_size - expected, prev ? fmt::format(" '{}'", prev->name) : std::string(), data_size);
  return out;
}

FilePtr open_for_reading(const fs::path& path) {
  FilePtr f(std::fopen(path.c_str(), "rb"));
  HT_CHECK(f != nullptr, "{}: cannot open: {}", prefix(path), std::strerror(errno));
  return f;
}

// One tensor converted for writing: host, contiguous, detached.
Tensor host_contiguous(const Tensor& t) {
  NoGradGuard no_grad;
  Tensor h = t.detach();
  if (!h.is_contiguous()) h = h.contiguous();
  if (!h.is_cpu()) h = h.to(Device::cpu());
  return h;
}

}  // namespace

std::string_view safetensors_dtype(DType dt) {
  for (const auto& d : kDTypeNames)
    if (d.dt == dt) return d.name;
  HT_CHECK(dt != DType::i4x2, "safetensors has no packed int4 dtype: store the packed bytes explicitly as a U8 "
           "tensor (e.g. a u8 view of the storage) and record the logical shape in the metadata");
  HT_FAIL("safetensors: no dtype string for {}", dtype_name(dt));
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const auto& d : kDTypeNames)
    if (d.name == name) return d.dt;
  return std::nullopt;
}

const Tensor& SafetensorsContents::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it != tensors.end()) return it->second;
  std::string some;
  int shown = 0;
  for (const auto& [k, v] : tensors) {
    if (shown++ == 5) { some += ", ..."; break; }
    some += (some.empty() ? "'" : ", '") + k + "'";
  }
  HT_FAIL("no tensor named '{}' (the file holds {} tensors: {})", name, tensors.size(), some);
}

void save_safetensors(const fs::path& path, const TensorList& tensors, const Metadata& metadata) {
  struct Entry {
    const std::string* name;
    const Tensor* tensor;
    uint64_t nbytes;
  };
  std::vector<Entry> entries;
  std::set<std::string_view> seen;
  for (const auto& [name, t] : tensors) {
    HT_CHECK(!name.empty(), "{}: a tensor has an empty name", prefix(path));
    HT_CHECK(name != "__metadata__", "{}: '__metadata__' is reserved and cannot name a tensor", prefix(path));
    HT_CHECK(seen.insert(name).second, "{}: tensor name '{}' appears twice", prefix(path), name);
    HT_CHECK(t.defined(), "{}: tensor '{}' is undefined", prefix(path), name);
    HT_CHECK(t.dtype() != DType::i4x2, "{}: tensor '{}' is packed int4 ({}), which safetensors cannot store: save "
             "the packed bytes explicitly as a U8 tensor and record the logical shape in the metadata", prefix(path),
             name, t.describe());
    try {
      (void)json(name).dump();
    } catch (const json::exception&) {
      HT_FAIL("{}: tensor name '{}' is not valid UTF-8", prefix(path), name);
    }
    entries.push_back({&name, &t, static_cast<uint64_t>(t.nbytes())});
  }
  // Larger elements first, then by name: every tensor starts at a multiple of its itemsize (header is padded
  // to 8), as the Python writer lays it out.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    const auto ia = itemsize(a.tensor->dtype()), ib = itemsize(b.tensor->dtype());
    return ia != ib ? ia > ib : *a.name < *b.name;
  });

  json header = json::object();
  if (!metadata.empty()) {
    json meta = json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const Entry& e : entries) {
    json shape = json::array();
    for (int64_t d : e.tensor->shape()) shape.push_back(static_cast<uint64_t>(d));
    header[*e.name] = {{"dtype", safetensors_dtype(e.tensor->dtype())},
                       {"shape", std::move(shape)},
                       {"data_offsets", {offset, offset + e.nbytes}}};
    offset += e.nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& ex) {
    HT_FAIL("{}: cannot encode the header (metadata must be valid UTF-8): {}", prefix(path), ex.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  AtomicFile out(path);
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  out.write(len_bytes, 8);
  out.write(text.data(), text.size());
  for (const Entry& e : entries) {  // one tensor at a time on the host, so a GPU model is never copied whole
    if (e.nbytes == 0) continue;
    const Tensor h = host_contiguous(*e.tensor);
    out.write(h.data_ptr(), e.nbytes);
  }
  out.commit();
}

SafetensorsHeader read_safetensors_header(const fs::path& path) {
  FilePtr f = open_for_reading(path);
  return read_header(f.get(), path);
}

SafetensorsContents load_safetensors(const fs::path& path) {
  FilePtr f = open_for_reading(path);
  SafetensorsHeader header = read_header(f.get(), path);
  SafetensorsContents out;
  out.metadata = std::move(header.metadata);
  // The data section is read front to back (tensors are sorted by offset and tile it exactly).
  for (const TensorInfo& info : header.tensors) {
    Tensor t = empty(info.shape, {info.dtype});
    const uint64_t nbytes = info.end - info.begin;
    if (nbytes > 0) {
      HT_CHECK(std::fread(t.data_ptr(), 1, nbytes, f.get()) == nbytes,
               "{}: tensor '{}': short read of {} bytes at data offset {} (file changed while reading?): {}",
               prefix(path), info.name, nbytes, info.begin, std::ferror(f.get()) ? std::strerror(errno) : "end of file");
    }
    if (info.dtype == DType::b8) {
      const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
      for (uint64_t i = 0; i < nbytes; ++i)
        HT_CHECK(bytes[i] <= 1, "{}: tensor '{}': BOOL element {} holds byte value {}; expected 0 or 1", prefix(path),
                 info.name, i, bytes[i]);
    }
    out.tensors.emplace(info.name, std::move(t));
  }
  return out;
}

}  // namespace ht::io
