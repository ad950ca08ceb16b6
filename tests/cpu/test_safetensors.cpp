// safetensors: bit-exact round trips of every dtype and layout, metadata, the byte layout against hand-built
// files, every documented corruption case, HF sharded directories, and atomic replacement.
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <fstream>
#include <random>

#include "hadatrain/io/atomic_file.h"
#include "hadatrain/io/safetensors.h"
#include "support/catch.h"
#include "support/testing.h"

using namespace ht;
namespace fs = std::filesystem;

using ht::test::TempDir;

namespace {

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<uint8_t> out(c.nbytes());
  if (!out.empty()) std::memcpy(out.data(), c.data_ptr(), out.size());
  return out;
}

// A contiguous tensor whose bytes are random (every bit pattern: NaN payloads, infinities, -0, subnormals);
// bool tensors hold random 0/1 bytes.
Tensor random_bits(const Shape& shape, DType dt, uint32_t seed) {
  Tensor t = empty(shape, {dt});
  std::mt19937 rng(seed);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (std::size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(dt == DType::b8 ? rng() & 1u : rng());
  return t;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_raw(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// [u64 LE length][header][data], as the format specifies.
std::string st_file(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

std::string f32_bytes(std::initializer_list<float> v) {
  std::string s;
  for (float f : v) s.append(reinterpret_cast<const char*>(&f), 4);
  return s;
}

std::vector<std::string> entries_of(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

const std::vector<DType> kAllDTypes{DType::f64, DType::f32,  DType::bf16, DType::f16, DType::f8e4m3, DType::f8e5m2,
                                    DType::i8,  DType::u8,   DType::i32,  DType::i64, DType::b8};

}  // namespace

TEST_CASE("safetensors dtype names follow the format", "[safetensors]") {
  CHECK(io::safetensors_dtype(DType::f64) == "F64");
  CHECK(io::safetensors_dtype(DType::f32) == "F32");
  CHECK(io::safetensors_dtype(DType::bf16) == "BF16");
  CHECK(io::safetensors_dtype(DType::f16) == "F16");
  CHECK(io::safetensors_dtype(DType::f8e4m3) == "F8_E4M3");
  CHECK(io::safetensors_dtype(DType::f8e5m2) == "F8_E5M2");
  CHECK(io::safetensors_dtype(DType::i8) == "I8");
  CHECK(io::safetensors_dtype(DType::u8) == "U8");
  CHECK(io::safetensors_dtype(DType::i32) == "I32");
  CHECK(io::safetensors_dtype(DType::i64) == "I64");
  CHECK(io::safetensors_dtype(DType::b8) == "BOOL");
  for (DType dt : kAllDTypes) CHECK(io::dtype_from_safetensors(io::safetensors_dtype(dt)) == dt);
  CHECK_THROWS_WITH(io::safetensors_dtype(DType::i4x2), HasSubstr("U8"));
  CHECK_FALSE(io::dtype_from_safetensors("U16").has_value());
  CHECK_FALSE(io::dtype_from_safetensors("f32").has_value());
}

TEST_CASE("every dtype round-trips bit-exactly, including views, scalars and empty tensors", "[safetensors]") {
  TempDir dir("st_roundtrip");
  io::TensorList tensors;
  std::map<std::string, std::vector<uint8_t>> expected;
  std::map<std::string, Shape> shapes;
  uint32_t seed = 1;
  for (DType dt : kAllDTypes) {
    const std::string n(io::safetensors_dtype(dt));
    auto add = [&](const std::string& name, const Tensor& t) {
      tensors.emplace_back(name, t);
      expected[name] = bytes_of(t);
      shapes[name] = t.shape();
    };
    const Tensor base = random_bits({5, 7, 3}, dt, seed++);
    add(n + ".dense", base);
    add(n + ".permuted", base.permute({2, 0, 1}));                     // (3, 5, 7) non-contiguous
    add(n + ".strided", slice(base, 1, 1, 7, 2));                      // (5, 3, 3) every other column
    add(n + ".expanded", random_bits({4, 1}, dt, seed++).expand({4, 6}));  // stride 0
    add(n + ".offset", select(base, 0, 3));                            // starts mid-storage
    add(n + ".scalar", random_bits({}, dt, seed++));
    add(n + ".empty", empty({0, 4}, {dt}));
    add(n + ".empty2", empty({3, 0, 2}, {dt}));
  }
  REQUIRE_FALSE(tensors[1].second.is_contiguous());
  const fs::path file = dir.path / "all.safetensors";
  io::save_safetensors(file, tensors);
  const io::SafetensorsContents loaded = io::load_safetensors(file);
  REQUIRE(loaded.tensors.size() == tensors.size());
  CHECK(loaded.metadata.empty());
  for (const auto& [name, t] : tensors) {
    INFO(name);
    const Tensor& got = loaded.at(name);
    CHECK(got.dtype() == t.dtype());
    CHECK(got.shape() == shapes[name]);
    CHECK(got.is_cpu());
    CHECK((got.numel() == 0 || got.is_contiguous()));  // see the report: empty tensors with a 0 in a middle dim
    CHECK(bytes_of(got) == expected[name]);
  }
  // Values, not only bytes: a transposed f64 matrix reads back as its transpose.
  const Tensor m = arange(6, {DType::f64}).reshape({2, 3});
  io::save_safetensors(file, {{"mt", m.transpose(0, 1)}});
  CHECK(io::load_safetensors(file).at("mt").to_vector<double>() == std::vector<double>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("tensors that require grad are saved without recording history", "[safetensors]") {
  TempDir dir("st_grad");
  Tensor w = test::random_tensor({3, 4}, 3, DType::f32).set_requires_grad(true);
  io::save_safetensors(dir.path / "w.safetensors", {{"w", w.transpose(0, 1)}});
  const Tensor got = io::load_safetensors(dir.path / "w.safetensors").at("w");
  CHECK_FALSE(got.requires_grad());
  CHECK(test::compare(got, w.detach().transpose(0, 1), 0, 0) == "");
}

TEST_CASE("metadata round-trips; a missing tensor name is reported", "[safetensors]") {
  TempDir dir("st_meta");
  const io::Metadata meta{{"format", "pt"}, {"empty", ""}, {"unicode", "héllo → wörld"}, {"quote", "a \"b\" \\c\n"}};
  const fs::path file = dir.path / "m.safetensors";
  io::save_safetensors(file, {{"x", ones({2})}}, meta);
  const auto loaded = io::load_safetensors(file);
  CHECK(loaded.metadata == meta);
  CHECK(loaded.contains("x"));
  CHECK_FALSE(loaded.contains("y"));
  CHECK_THROWS_WITH(loaded.at("y"), HasSubstr("no tensor named 'y'") && HasSubstr("'x'"));
  // Only metadata, no tensors: a valid file too.
  io::save_safetensors(file, {}, meta);
  CHECK(io::load_safetensors(file).tensors.empty());
  CHECK(io::load_safetensors(file).metadata == meta);
}

TEST_CASE("the writer's byte layout matches the specification exactly", "[safetensors]") {
  TempDir dir("st_layout");
  const fs::path file = dir.path / "layout.safetensors";
  // i8 first in the caller's order; the writer places larger elements first (f64, then bf16, then i8).
  const Tensor a = from_vector(std::vector<int64_t>{-1, 2, 3}, {3}, {DType::i8});
  const Tensor b = from_vector(std::vector<double>{1.0, -0.5}, {1, 2}, {DType::bf16});
  const Tensor c = scalar_tensor(2.0, {DType::f64});
  io::save_safetensors(file, {{"a", a}, {"b", b}, {"c", c}}, {{"k", "v"}});
  const std::string bytes = read_file(file);

  std::string header =
      R"({"__metadata__":{"k":"v"},"a":{"data_offsets":[12,15],"dtype":"I8","shape":[3]},)"
      R"("b":{"data_offsets":[8,12],"dtype":"BF16","shape":[1,2]},"c":{"data_offsets":[0,8],"dtype":"F64","shape":[]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  double two = 2.0;
  std::string data(reinterpret_cast<const char*>(&two), 8);
  data += std::string("\x80\x3f\x00\xbf", 4);  // bf16 1.0 = 0x3F80, -0.5 = 0xBF00, little-endian
  data += std::string("\xff\x02\x03", 3);
  CHECK(read_file(file) == st_file(header, data));
  CHECK(header.size() % 8 == 0);
}

TEST_CASE("a hand-built file loads correctly, independent of the writer", "[safetensors]") {
  TempDir dir("st_hand");
  const fs::path file = dir.path / "hand.safetensors";
  // Key order, spacing and an unpadded header as another writer might produce them; tensors out of name order.
  const std::string header =
      R"({ "weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},)"
      R"( "__metadata__": {"format": "pt"},)"
      R"( "flags": {"dtype": "BOOL", "shape": [3], "data_offsets": [24, 27]},)"
      R"( "half": {"shape": [2], "dtype": "F16", "data_offsets": [20, 24]},)"
      R"( "idx": {"data_offsets": [16, 20], "dtype": "I32", "shape": [1]}})";
  std::string data = f32_bytes({1.5f, -2.0f, 0.25f, 1e30f});
  data += std::string("\x07\x00\x00\x80", 4);  // i32 -2147483641
  data += std::string("\x00\x3c\x00\xc0", 4);  // f16 1.0, -2.0
  data += std::string("\x01\x00\x01", 3);
  write_raw(file, st_file(header, data));
  const auto loaded = io::load_safetensors(file);
  CHECK(loaded.metadata == io::Metadata{{"format", "pt"}});
  REQUIRE(loaded.tensors.size() == 4);
  CHECK(loaded.at("weight").shape() == Shape{2, 2});
  CHECK(loaded.at("weight").to_vector<double>() == std::vector<double>{1.5, -2.0, 0.25, double(1e30f)});
  CHECK(loaded.at("idx").dtype() == DType::i32);
  CHECK(loaded.at("idx").to_vector<int64_t>() == std::vector<int64_t>{-2147483641});
  CHECK(loaded.at("half").to_vector<double>() == std::vector<double>{1.0, -2.0});
  CHECK(loaded.at("flags").dtype() == DType::b8);
  CHECK(loaded.at("flags").to_vector<int64_t>() == std::vector<int64_t>{1, 0, 1});

  const io::SafetensorsHeader h = io::read_safetensors_header(file);
  CHECK(h.data_start == 8 + header.size());
  REQUIRE(h.tensors.size() == 4);
  CHECK(h.tensors[0].name == "weight");  // by data offset
  CHECK(h.tensors[3].name == "flags");
  CHECK(h.tensors[3].begin == 24);
  CHECK(h.tensors[3].end == 27);

  // The smallest valid file: an empty header object and no data.
  write_raw(file, st_file("{}", ""));
  CHECK(io::load_safetensors(file).tensors.empty());
}

TEST_CASE("corrupt files are rejected with messages naming the file and the tensor", "[safetensors]") {
  TempDir dir("st_corrupt");
  const fs::path file = dir.path / "bad.safetensors";
  auto expect = [&](const std::string& bytes, const std::string& what, const std::string& tensor = "") {
    write_raw(file, bytes);
    INFO(what);
    try {
      io::load_safetensors(file);
      FAIL("no error for: " << what);
    } catch (const Error& e) {
      const std::string msg = e.what();
      CHECK_THAT(msg, HasSubstr(what));
      CHECK_THAT(msg, HasSubstr(file.string()));
      if (!tensor.empty()) CHECK_THAT(msg, HasSubstr("'" + tensor + "'"));
    }
  };
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string w_data = f32_bytes({1, 2});

  expect("abc", "file too small (3 bytes)");
  expect(le64(1000) + "{}", "header length 1000 goes beyond the end of the file");
  expect(le64(200'000'000) + std::string(16, ' '), "goes beyond the end of the file");
  {  // a header length above the 100 MB cap, in a (sparse) file large enough to hold it
    write_raw(file, le64(100'000'001) + "{}");
    fs::resize_file(file, 100'000'100);
    CHECK_THROWS_WITH(io::load_safetensors(file),
                      HasSubstr("header length 100000001 exceeds the 100000000-byte limit") && HasSubstr(file.string()));
  }
  expect(st_file("[1,2,3]", ""), "does not start with '{'");
  expect(st_file("  {}", ""), "does not start with '{'");
  expect(st_file(R"({"w": {"dtype": "F32", )", ""), "invalid JSON header");
  expect(st_file("{" + ok_entry + "," + ok_entry + "}", w_data), "names 'w' twice");
  expect(st_file(R"({"w":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", w_data), "unknown dtype 'Q7'", "w");
  expect(st_file(R"({"w":{"dtype":"U16","shape":[4],"data_offsets":[0,8]}})", w_data),
         "unsupported safetensors dtype 'U16'", "w");
  expect(st_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", w_data), "non-negative integer", "w");
  expect(st_file(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", w_data), "non-negative integer", "w");
  expect(st_file(R"({"w":{"dtype":"F32","shape":[2]}})", w_data), "lacks \"data_offsets\"", "w");
  expect(st_file(R"({"w":[1,2]})", w_data), "header entry must be an object", "w");
  expect(st_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", w_data), "data_offsets must be [begin, end]",
         "w");
  expect(st_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", w_data), "end before they begin", "w");
  expect(st_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", w_data),
         "hold 8 bytes, but shape (3) of F32 needs 12", "w");
  expect(st_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", w_data), "out of range", "w");
  expect(st_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("v":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                 w_data),
         "overlap tensor 'w'", "v");
  expect(st_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", w_data), "belong to no tensor", "w");
  expect(st_file("{" + ok_entry + "}", w_data + "XYZ"), "3 bytes of trailing garbage after the last tensor 'w'");
  expect(st_file("{}", "junk"), "4 bytes of trailing garbage");
  expect(st_file(R"({"__metadata__":{"k":1}})", ""), "__metadata__ value of 'k' must be a string");
  expect(st_file(R"({"w":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", std::string("\x01\x02", 2)),
         "holds byte value 2", "w");
  expect(st_file(R"({"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", f32_bytes({1})),
         "at most 8", "w");
  expect(st_file(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", w_data),
         "too many elements", "w");

  CHECK_THROWS_WITH(io::load_safetensors(dir.path / "missing.safetensors"),
                    HasSubstr("missing.safetensors") && HasSubstr("No such file"));
}

TEST_CASE("the writer refuses what safetensors cannot hold", "[safetensors]") {
  TempDir dir("st_refuse");
  const fs::path file = dir.path / "x.safetensors";
  const Tensor packed = empty({4}, {DType::i4x2});
  CHECK_THROWS_WITH(io::save_safetensors(file, {{"q", packed}}), HasSubstr("'q'") && HasSubstr("packed int4") &&
                                                                     HasSubstr("U8"));
  CHECK_THROWS_WITH(io::save_safetensors(file, {{"a", ones({1})}, {"a", ones({2})}}), HasSubstr("'a' appears twice"));
  CHECK_THROWS_WITH(io::save_safetensors(file, {{"__metadata__", ones({1})}}), HasSubstr("reserved"));
  CHECK_THROWS_WITH(io::save_safetensors(file, {{"", ones({1})}}), HasSubstr("empty name"));
  CHECK_THROWS_WITH(io::save_safetensors(file, {{"u", Tensor()}}), HasSubstr("'u' is undefined"));
  CHECK_THROWS_WITH(io::save_safetensors(file, {{std::string("bad\xff"), ones({1})}}), HasSubstr("UTF-8"));
  CHECK_FALSE(fs::exists(file));
  CHECK(entries_of(dir.path).empty());
}

TEST_CASE("sharded checkpoints load through model.safetensors.index.json", "[safetensors]") {
  TempDir dir("st_sharded");
  const Tensor emb = test::random_tensor({6, 4}, 11, DType::bf16);
  const Tensor q = test::random_tensor({4, 4}, 12, DType::f32);
  const Tensor norm = test::random_tensor({4}, 13, DType::f32);
  io::save_safetensors(dir.path / "model-00001-of-00002.safetensors", {{"model.embed_tokens.weight", emb},
                                                                       {"model.layers.0.self_attn.q_proj.weight", q}},
                       {{"format", "pt"}});
  // The second shard also holds a tensor the index does not list: it is not returned.
  io::save_safetensors(dir.path / "model-00002-of-00002.safetensors",
                       {{"model.norm.weight", norm}, {"rotary_emb.inv_freq", ones({2})}});
  const std::string index = R"({"metadata": {"total_size": 152, "note": "x"}, "weight_map": {
      "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
      "model.layers.0.self_attn.q_proj.weight": "model-00001-of-00002.safetensors",
      "model.norm.weight": "model-00002-of-00002.safetensors"}})";
  write_raw(dir.path / "model.safetensors.index.json", index);

  for (const fs::path& p : {dir.path, dir.path / "model.safetensors.index.json"}) {
    const auto loaded = io::load_sharded_safetensors(p);
    REQUIRE(loaded.tensors.size() == 3);
    CHECK(bytes_of(loaded.at("model.embed_tokens.weight")) == bytes_of(emb));
    CHECK(bytes_of(loaded.at("model.layers.0.self_attn.q_proj.weight")) == bytes_of(q));
    CHECK(bytes_of(loaded.at("model.norm.weight")) == bytes_of(norm));
    CHECK_FALSE(loaded.contains("rotary_emb.inv_freq"));
    CHECK(loaded.metadata == io::Metadata{{"total_size", "152"}, {"note", "x"}});
  }

  SECTION("an index naming a tensor its shard lacks") {
    write_raw(dir.path / "model.safetensors.index.json",
              R"({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}})");
    CHECK_THROWS_WITH(io::load_sharded_safetensors(dir.path),
                      HasSubstr("tensor 'model.norm.weight' is mapped to shard 'model-00001-of-00002.safetensors', but "
                               "that shard lacks it") && HasSubstr("model.safetensors.index.json"));
  }
  SECTION("a missing shard") {
    fs::remove(dir.path / "model-00002-of-00002.safetensors");
    CHECK_THROWS_WITH(io::load_sharded_safetensors(dir.path),
                      HasSubstr("shard 'model-00002-of-00002.safetensors'") && HasSubstr("is missing") &&
                          HasSubstr("model.norm.weight"));
  }
  SECTION("shard names may not leave the directory") {
    write_raw(dir.path / "model.safetensors.index.json", R"({"weight_map": {"w": "../other.safetensors"}})");
    CHECK_THROWS_WITH(io::load_sharded_safetensors(dir.path), HasSubstr("leaves the index's directory"));
    write_raw(dir.path / "model.safetensors.index.json", R"({"weight_map": {"w": "/etc/passwd"}})");
    CHECK_THROWS_WITH(io::load_sharded_safetensors(dir.path), HasSubstr("relative"));
  }
  SECTION("malformed indexes") {
    write_raw(dir.path / "model.safetensors.index.json", R"({"weight_map": )");
    CHECK_THROWS_WITH(io::load_sharded_safetensors(dir.path), HasSubstr("invalid JSON"));
    write_raw(dir.path / "model.safetensors.index.json", R"({"metadata": {}})");
    CHECK_THROWS_WITH(io::load_sharded_safetensors(dir.path), HasSubstr("\"weight_map\""));
    write_raw(dir.path / "model.safetensors.index.json", R"({"weight_map": {"w": 3}})");
    CHECK_THROWS_WITH(io::load_sharded_safetensors(dir.path), HasSubstr("'w' must name a shard file"));
  }
  SECTION("a corrupt shard is reported by its path") {
    write_raw(dir.path / "model-00002-of-00002.safetensors", "xx");
    CHECK_THROWS_WITH(io::load_sharded_safetensors(dir.path),
                      HasSubstr("model-00002-of-00002.safetensors") && HasSubstr("file too small"));
  }
  SECTION("a directory with a single model.safetensors and no index") {
    TempDir single("st_single");
    io::save_safetensors(single.path / "model.safetensors", {{"w", q}});
    CHECK(bytes_of(io::load_sharded_safetensors(single.path).at("w")) == bytes_of(q));
    TempDir none("st_none");
    CHECK_THROWS_WITH(io::load_sharded_safetensors(none.path), HasSubstr("holds neither"));
  }
}

TEST_CASE("a failed atomic write leaves the previous file intact and no temporary file", "[safetensors][atomic]") {
  TempDir dir("st_atomic");
  const fs::path file = dir.path / "data.bin";
  io::write_file_atomic(file, std::string_view("previous contents"));
  CHECK(read_file(file) == "previous contents");
  CHECK(entries_of(dir.path) == std::vector<std::string>{"data.bin"});

  SECTION("FILE* callback throws midway") {
    CHECK_THROWS_WITH(io::write_file_atomic_stdio(file,
                                                  [](std::FILE* f) {
                                                    std::fputs("half of the new", f);
                                                    throw std::runtime_error("writer gave up");
                                                  }),
                      HasSubstr("writer gave up"));
  }
  SECTION("ostream callback throws midway") {
    CHECK_THROWS_WITH(io::write_file_atomic_stream(file,
                                                   [](std::ostream& os) {
                                                     os << "half of the new";
                                                     throw Error("stream writer gave up");
                                                   }),
                      HasSubstr("stream writer gave up"));
  }
  SECTION("ostream callback sets failbit") {
    CHECK_THROWS_WITH(io::write_file_atomic_stream(file, [](std::ostream& os) { os.setstate(std::ios::failbit); }),
                      HasSubstr(file.string()) && HasSubstr("output stream failed"));
  }
  SECTION("safetensors writer refuses a tensor it cannot store (checked before anything is written)") {
    CHECK_THROWS(io::save_safetensors(file, {{"a", ones({1000})}, {"b", empty({2}, {DType::i4x2})}}));
  }
  SECTION("the file system refuses the data (file size limit, EFBIG)") {
    struct rlimit old {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    auto* prev_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old;
    small.rlim_cur = 4096;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    std::string msg;
    try {
      io::save_safetensors(file, {{"big", zeros({100000})}});
    } catch (const Error& e) {
      msg = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, prev_handler);
    CHECK_THAT(msg, HasSubstr(file.string()) && HasSubstr(std::strerror(EFBIG)) && HasSubstr("previous file is unchanged"));
  }
  CHECK(read_file(file) == "previous contents");
  CHECK(entries_of(dir.path) == std::vector<std::string>{"data.bin"});
}

TEST_CASE("atomic writes replace the file and report unwritable paths", "[safetensors][atomic]") {
  TempDir dir("st_atomic2");
  const fs::path file = dir.path / "out.txt";
  io::write_file_atomic_stream(file, [](std::ostream& os) { os << "first " << 1; });
  CHECK(read_file(file) == "first 1");
  io::write_file_atomic_stdio(file, [](std::FILE* f) { std::fputs("second", f); });
  CHECK(read_file(file) == "second");
  const std::byte raw[3] = {std::byte{0}, std::byte{0xff}, std::byte{7}};
  io::write_file_atomic(file, std::span<const std::byte>(raw));
  CHECK(read_file(file) == std::string("\x00\xff\x07", 3));
  CHECK(entries_of(dir.path) == std::vector<std::string>{"out.txt"});
  // Through a link: the file it names is replaced and the link stays a link.
  fs::create_directory(dir.path / "sub");
  fs::create_symlink(fs::path("..") / "out.txt", dir.path / "sub" / "link.txt");
  io::write_file_atomic(dir.path / "sub" / "link.txt", std::string_view("through the link"));
  CHECK(fs::is_symlink(dir.path / "sub" / "link.txt"));
  CHECK(read_file(file) == "through the link");
  CHECK(entries_of(dir.path / "sub") == std::vector<std::string>{"link.txt"});
  fs::remove_all(dir.path / "sub");
  const fs::path nowhere = dir.path / "no_such_dir" / "f.txt";
  CHECK_THROWS_WITH(io::write_file_atomic(nowhere, std::string_view("x")),
                    HasSubstr(nowhere.string()) && HasSubstr("No such file or directory"));
  CHECK_THROWS_WITH(io::write_file_atomic(dir.path / "", std::string_view("x")), HasSubstr("names a directory"));
}
