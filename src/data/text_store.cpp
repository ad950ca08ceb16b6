// The token store: listing the source files, the cache key, tokenising into the cache file in parallel,
// and validating and mapping the cache.
#include "hadatrain/data/text_store.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "data/file_walk.h"
#include "hadatrain/core/digest.h"
#include "hadatrain/core/error.h"
#include "hadatrain/core/logging.h"
#include "hadatrain/io/atomic_file.h"

namespace ht::data {

namespace fs = std::filesystem;

// Note [Token cache]
// One cache file per (source file list, tokenizer): tokens-<h>.bin, h a 64-bit FNV-1a digest of the tokenizer's
// kind, fingerprint and vocabulary size and the absolute paths of the source files in order. The header holds
// a second digest, the key: the same plus every file's size, modification time (ns) and CRC-32 of its bytes.
// A cache whose key differs is stale and is re-tokenised under the same name, so editing, touching or
// replacing a source, or changing the tokenizer, rebuilds it, and the folder keeps one file per corpus.
// Layout (host byte order, little-endian on every supported machine):
//   [0, 64)  Header (below)
//   tokens   num_tokens ids, u16 when every id of the vocabulary fits in 16 bits, else u32
//   padding  zero bytes up to a multiple of 8
//   offsets  u64[num_documents + 1]: document d is tokens [offsets[d], offsets[d+1])
//   max_ids  u32[num_documents]: the largest id of each document (0xffffffff when empty)
// The file is written through io::AtomicFile (temporary file, fsync, rename), so a killed tokenisation leaves
// the previous cache or none, never a partial one. Opening checks the magic, the key, the size implied by the
// header, a CRC-32 of everything after the header and the offsets; a cache failing any check is rebuilt.

namespace {

constexpr char kMagic[8] = {'H', 'T', 'T', 'O', 'K', 'S', '1', '\n'};
constexpr uint32_t kEmptyMax = 0xffffffffu;

struct Header {
  char magic[8];
  uint32_t token_bytes;
  uint32_t payload_crc;  // CRC-32 of every byte after the header
  uint64_t num_documents;
  uint64_t num_tokens;
  uint64_t vocab_size;
  uint64_t key;
  uint64_t reserved[2];
};
static_assert(sizeof(Header) == 64, "the token cache header is 64 bytes");

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  HT_CHECK(in.good(), "cannot open text file {}: {}", path.string(), std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  HT_CHECK(!in.bad(), "error reading text file {}", path.string());
  return std::move(ss).str();
}

struct SourceInfo {
  fs::path path;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint32_t crc = 0;
};

SourceInfo describe_source(const fs::path& path) {
  struct stat st {};
  HT_CHECK(::stat(path.c_str(), &st) == 0, "cannot stat text file {}: {}", path.string(), std::strerror(errno));
  SourceInfo s;
  s.path = path;
  s.size = static_cast<uint64_t>(st.st_size);
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  const std::string text = read_file(path);
  s.crc = crc32_update(0, text.data(), text.size());
  return s;
}

std::string normalised_extension(const std::string& e) { return e.empty() || e[0] == '.' ? e : "." + e; }

void add_folder(const fs::path& dir, const std::vector<std::string>& extensions, std::vector<fs::path>& out) {
  std::vector<fs::path> found;
  for (const fs::path& path : files_under(dir, "text source " + dir.string())) {
    const std::string ext = path.extension().string();
    if (extensions.empty() ||
        std::any_of(extensions.begin(), extensions.end(), [&](const std::string& e) { return normalised_extension(e) == ext; }))
      found.push_back(path);
  }
  std::string exts;
  for (const auto& e : extensions) exts += (exts.empty() ? "" : ", ") + normalised_extension(e);
  HT_CHECK(!found.empty(), "text source {}: the folder holds no file with extension {}", dir.string(), exts);
  std::sort(found.begin(), found.end());
  out.insert(out.end(), found.begin(), found.end());
}

std::vector<fs::path> glob_matches(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<fs::path> out;
  if (rc == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  HT_CHECK(rc == 0 || rc == GLOB_NOMATCH, "text source {}: the pattern could not be expanded (glob error {})", pattern, rc);
  HT_CHECK(!out.empty(), "text source {}: the pattern matches no file", pattern);
  std::sort(out.begin(), out.end());
  return out;
}

// The digest of the tokenizer and the file list (the cache file's name) and, with `with_contents`, of every
// file's size, modification time and CRC (the key in the header).
uint64_t cache_digest(const Tokenizer& tok, const std::vector<SourceInfo>& files, bool with_contents) {
  std::string k = fmt::format("hadatrain token cache 1\ntokenizer {} {} {}\n", tok.kind(), tok.fingerprint(), tok.vocab_size());
  for (const auto& f : files) {
    k += f.path.string();
    if (with_contents) k += fmt::format(" {} {} {:08x}", f.size, f.mtime_ns, f.crc);
    k += '\n';
  }
  return Fnv1a().add(k).value();
}

uint64_t padded(uint64_t n) { return (n + 7) / 8 * 8; }

uint64_t expected_size(const Header& h) {
  return sizeof(Header) + padded(h.num_tokens * h.token_bytes) + 8 * (h.num_documents + 1) + 4 * h.num_documents;
}

int default_threads(int requested, std::size_t work) {
  int n = requested > 0 ? requested : static_cast<int>(std::min(16u, std::max(1u, std::thread::hardware_concurrency())));
  return static_cast<int>(std::max<std::size_t>(1, std::min<std::size_t>(static_cast<std::size_t>(n), work)));
}

// Tokenises `files` into `path` (Note [Token cache]). Files are tokenised in parallel, in groups, and written in
// order; the first failing file (in file order) is the error reported.
void build_cache(const fs::path& path, const std::vector<SourceInfo>& files, const Tokenizer& tok, uint64_t key,
                 int num_threads) {
  const int64_t vocab = tok.vocab_size();
  HT_CHECK(vocab > 0 && vocab <= (int64_t{1} << 32), "the {} tokenizer reports a vocabulary size of {}", tok.kind(), vocab);
  const uint32_t token_bytes = vocab <= 65536 ? 2 : 4;
  const int threads = default_threads(num_threads, files.size());
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t total_bytes = 0;
  for (const auto& f : files) total_bytes += f.size;
  logging::info("tokenising {} text file(s), {:.1f} MB, with the {} tokenizer on {} thread(s) into {}", files.size(),
                static_cast<double>(total_bytes) / 1e6, tok.kind(), threads, path.string());

  io::AtomicFile out(path);
  Header h{};
  out.write(&h, sizeof h);  // placeholder, rewritten once the counts and the CRC are known
  uint32_t crc = 0;
  std::vector<uint64_t> offsets{0};
  std::vector<uint32_t> max_ids;
  std::vector<unsigned char> buf;

  const std::size_t group = static_cast<std::size_t>(threads) * 8;
  for (std::size_t g0 = 0; g0 < files.size(); g0 += group) {
    const std::size_t g1 = std::min(files.size(), g0 + group);
    std::vector<std::vector<int32_t>> ids(g1 - g0);
    std::vector<std::exception_ptr> errors(g1 - g0);
    std::atomic<std::size_t> next{g0};
    auto work = [&] {
      for (std::size_t i = next++; i < g1; i = next++) {
        try {
          const std::string text = read_file(files[i].path);
          HT_CHECK(crc32_update(0, text.data(), text.size()) == files[i].crc,
                   "text file {} changed while it was being tokenised; run again", files[i].path.string());
          try {
            ids[i - g0] = tok.encode(text);
          } catch (const Error& e) {  // the tokenizer's errors (invalid UTF-8 at byte N) do not know the file
            throw Error(fmt::format("tokenising {}: {}", files[i].path.string(), e.what()));
          }
        } catch (const Error&) {
          errors[i - g0] = std::current_exception();  // names the file
        } catch (const std::exception& e) {
          errors[i - g0] = std::make_exception_ptr(Error(fmt::format("tokenising {}: {}", files[i].path.string(), e.what())));
        }
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    for (std::size_t i = g0; i < g1; ++i) {
      if (errors[i - g0]) std::rethrow_exception(errors[i - g0]);
      const std::vector<int32_t>& doc = ids[i - g0];
      uint32_t mx = kEmptyMax;
      buf.resize(doc.size() * token_bytes);
      for (std::size_t k = 0; k < doc.size(); ++k) {
        const int32_t id = doc[k];
        HT_CHECK(id >= 0 && id < vocab, "{}: the {} tokenizer produced token id {}, outside its vocabulary of size {}",
                 files[i].path.string(), tok.kind(), id, vocab);
        const auto u = static_cast<uint32_t>(id);
        mx = mx == kEmptyMax ? u : std::max(mx, u);
        if (token_bytes == 2) {
          const auto v = static_cast<uint16_t>(u);
          std::memcpy(buf.data() + 2 * k, &v, 2);
        } else {
          std::memcpy(buf.data() + 4 * k, &u, 4);
        }
      }
      crc = crc32_update(crc, buf.data(), buf.size());
      out.write(buf.data(), buf.size());
      offsets.push_back(offsets.back() + doc.size());
      max_ids.push_back(mx);
    }
  }
  const uint64_t tok_bytes = offsets.back() * token_bytes;
  const std::vector<unsigned char> pad(padded(tok_bytes) - tok_bytes, 0);
  crc = crc32_update(crc, pad.data(), pad.size());
  out.write(pad.data(), pad.size());
  crc = crc32_update(crc, offsets.data(), offsets.size() * 8);
  out.write(offsets.data(), offsets.size() * 8);
  crc = crc32_update(crc, max_ids.data(), max_ids.size() * 4);
  out.write(max_ids.data(), max_ids.size() * 4);

  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.token_bytes = token_bytes;
  h.payload_crc = crc;
  h.num_documents = files.size();
  h.num_tokens = offsets.back();
  h.vocab_size = static_cast<uint64_t>(vocab);
  h.key = key;
  HT_CHECK(std::fseek(out.file(), 0, SEEK_SET) == 0, "cannot rewind {}: {}", out.temp_path().string(), std::strerror(errno));
  out.write(&h, sizeof h);
  out.commit();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  logging::info("tokenised {} tokens in {:.2f} s ({} bytes per token)", h.num_tokens, secs, token_bytes);
}

}  // namespace

struct TokenStore::Mapping {
  void* addr = nullptr;
  std::size_t size = 0;
  ~Mapping() {
    if (addr != nullptr) ::munmap(addr, size);
  }
};

namespace {

// Maps `path` read-only; nullptr when it does not exist.
std::unique_ptr<TokenStore::Mapping> map_file(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    HT_CHECK(errno == ENOENT, "cannot open token cache {}: {}", path.string(), std::strerror(errno));
    return nullptr;
  }
  auto m = std::make_unique<TokenStore::Mapping>();
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    HT_FAIL("cannot stat token cache {}: {}", path.string(), std::strerror(e));
  }
  m->size = static_cast<std::size_t>(st.st_size);
  if (m->size > 0) {
    void* a = ::mmap(nullptr, m->size, PROT_READ, MAP_SHARED, fd, 0);
    if (a == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      HT_FAIL("cannot map token cache {}: {}", path.string(), std::strerror(e));
    }
    m->addr = a;
  }
  ::close(fd);
  return m;
}

// Why the mapped cache cannot be used for (files, key, vocab), or "" when it can.
std::string check_cache(const TokenStore::Mapping& m, std::size_t num_files, uint64_t key, int64_t vocab) {
  if (m.size < sizeof(Header)) return fmt::format("{} bytes, shorter than its header", m.size);
  Header h;
  std::memcpy(&h, m.addr, sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return "not a hadatrain token cache (bad magic)";
  if (h.key != key) return "made from other source files or another tokenizer";
  if (h.token_bytes != 2 && h.token_bytes != 4) return fmt::format("bad token width {}", h.token_bytes);
  if (h.num_documents != num_files) return fmt::format("{} documents for {} files", h.num_documents, num_files);
  if (h.vocab_size != static_cast<uint64_t>(vocab)) return fmt::format("vocabulary size {}, expected {}", h.vocab_size, vocab);
  if (h.num_tokens > (uint64_t{1} << 40)) return fmt::format("implausible token count {}", h.num_tokens);
  if (m.size != expected_size(h)) return fmt::format("{} bytes where the header implies {} (truncated?)", m.size, expected_size(h));
  const auto* base = static_cast<const unsigned char*>(m.addr);
  if (crc32_update(0, base + sizeof h, m.size - sizeof h) != h.payload_crc) return "CRC mismatch (corrupt)";
  const auto* offsets = reinterpret_cast<const uint64_t*>(base + sizeof h + padded(h.num_tokens * h.token_bytes));
  if (offsets[0] != 0 || offsets[h.num_documents] != h.num_tokens) return "document index does not span the tokens";
  for (uint64_t d = 0; d < h.num_documents; ++d)
    if (offsets[d + 1] < offsets[d]) return fmt::format("document index decreases at document {}", d);
  return "";
}

}  // namespace

fs::path default_token_cache_dir() {
  const char* cache = std::getenv("HADATRAIN_CACHE");
  if (cache != nullptr && *cache != '\0') return fs::path(cache) / "tokens";
  const char* home = std::getenv("HOME");
  HT_CHECK(home != nullptr && *home != '\0',
           "neither HADATRAIN_CACHE nor HOME is set: set one, or give the token cache folder explicitly");
  return fs::path(home) / ".cache" / "hadatrain" / "tokens";
}

std::vector<fs::path> list_text_files(const std::vector<std::string>& sources, const std::vector<std::string>& extensions) {
  HT_CHECK(!sources.empty(), "no text sources given: name at least one file, folder or glob pattern");
  std::vector<fs::path> out;
  std::set<fs::path> seen;
  for (const std::string& src : sources) {
    std::vector<fs::path> found;
    const bool pattern = src.find_first_of("*?[") != std::string::npos && !fs::exists(src);
    std::vector<fs::path> candidates = pattern ? glob_matches(src) : std::vector<fs::path>{fs::path(src)};
    for (const fs::path& p : candidates) {
      std::error_code ec;
      const auto st = fs::status(p, ec);
      HT_CHECK(fs::exists(st), "text source {} does not exist", p.string());
      if (fs::is_directory(st))
        add_folder(p, extensions, found);
      else
        found.push_back(p);
    }
    for (const fs::path& p : found) {
      const fs::path c = fs::canonical(p);
      if (seen.insert(c).second) out.push_back(c);
    }
  }
  return out;
}

std::shared_ptr<const TokenStore> TokenStore::open(const TokenStoreOptions& opts, const Tokenizer& tok) {
  const std::vector<fs::path> paths = list_text_files(opts.sources, opts.extensions);
  std::vector<SourceInfo> files;
  files.reserve(paths.size());
  for (const auto& p : paths) files.push_back(describe_source(p));
  const fs::path dir = opts.cache_dir.empty() ? default_token_cache_dir() : opts.cache_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  HT_CHECK(!ec, "cannot create the token cache folder {}: {}", dir.string(), ec.message());
  const fs::path file = dir / fmt::format("tokens-{:016x}.bin", cache_digest(tok, files, false));
  const uint64_t key = cache_digest(tok, files, true);

  std::shared_ptr<TokenStore> store(new TokenStore());
  store->cache_file_ = file;
  store->map_ = map_file(file);
  std::string why = store->map_ ? check_cache(*store->map_, files.size(), key, tok.vocab_size()) : "absent";
  if (!why.empty()) {
    if (store->map_) logging::info("token cache {} is not usable ({}): re-tokenising", file.string(), why);
    store->map_.reset();
    build_cache(file, files, tok, key, opts.num_threads);
    store->cache_use_ = CacheUse::built;
    store->map_ = map_file(file);
    HT_CHECK(store->map_ != nullptr, "the token cache {} vanished right after it was written", file.string());
    why = check_cache(*store->map_, files.size(), key, tok.vocab_size());
    HT_CHECK(why.empty(), "the token cache {} just written does not read back ({})", file.string(), why);
  }
  Header h;
  const auto* base = static_cast<const unsigned char*>(store->map_->addr);
  std::memcpy(&h, base, sizeof h);
  store->num_tokens_ = static_cast<int64_t>(h.num_tokens);
  store->vocab_size_ = static_cast<int64_t>(h.vocab_size);
  store->token_bytes_ = static_cast<int>(h.token_bytes);
  store->tokens_ = base + sizeof h;
  store->offsets_ = reinterpret_cast<const uint64_t*>(base + sizeof h + padded(h.num_tokens * h.token_bytes));
  store->max_ids_ = reinterpret_cast<const uint32_t*>(store->offsets_ + h.num_documents + 1);
  store->files_ = paths;
  Fnv1a content;
  content.add(fmt::format("{} {} {}\n", tok.kind(), tok.fingerprint(), tok.vocab_size()));
  for (const auto& f : files) content.add_value(f.size).add_value(f.crc);
  store->content_digest_ = content.value();
  return store;
}

TokenStore::~TokenStore() = default;

int64_t TokenStore::document_begin(int64_t d) const {
  HT_CHECK(d >= 0 && d < num_documents(), "token store: document {} is outside [0, {})", d, num_documents());
  return static_cast<int64_t>(offsets_[d]);
}

int64_t TokenStore::document_size(int64_t d) const {
  return static_cast<int64_t>(offsets_[d + 1]) - document_begin(d);
}

int64_t TokenStore::document_max_id(int64_t d) const {
  document_begin(d);  // range check
  return max_ids_[d] == kEmptyMax ? -1 : static_cast<int64_t>(max_ids_[d]);
}

const fs::path& TokenStore::document_file(int64_t d) const {
  document_begin(d);
  return files_[static_cast<std::size_t>(d)];
}

int64_t TokenStore::token(int64_t i) const {
  HT_CHECK(i >= 0 && i < num_tokens_, "token store: token {} is outside [0, {})", i, num_tokens_);
  if (token_bytes_ == 2) {
    uint16_t v;
    std::memcpy(&v, tokens_ + 2 * i, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, tokens_ + 4 * i, 4);
  return v;
}

void TokenStore::copy_tokens(int64_t begin, int64_t n, int64_t* out) const {
  HT_CHECK(begin >= 0 && n >= 0 && begin + n <= num_tokens_, "token store: tokens [{}, {}) are outside [0, {})", begin,
           begin + n, num_tokens_);
  if (token_bytes_ == 2) {
    const auto* p = reinterpret_cast<const uint16_t*>(tokens_) + begin;
    for (int64_t k = 0; k < n; ++k) out[k] = p[k];
  } else {
    const auto* p = reinterpret_cast<const uint32_t*>(tokens_) + begin;
    for (int64_t k = 0; k < n; ++k) out[k] = p[k];
  }
}

}  // namespace ht::data
