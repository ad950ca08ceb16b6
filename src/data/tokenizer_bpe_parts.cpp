// The pieces of the byte-level BPE engine: the PCRE2 split regex, the GPT-2 byte <-> unicode alphabet and
// the merge loop (src/data/tokenizer_bpe.h).
#include "data/tokenizer_bpe.h"

#include <array>
#include <queue>

#include "data/tokenizer_engines.h"

#ifdef HADATRAIN_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

namespace ht::data::detail {

// ---- the split regex -----------------------------------------------------------------------------------

#ifdef HADATRAIN_HAVE_PCRE2

namespace {
std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buf{};
  pcre2_get_error_message(code, buf.data(), buf.size());
  return reinterpret_cast<const char*>(buf.data());
}
size_t utf8_length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}
}  // namespace

struct SplitRegex::Impl {
  pcre2_code* code = nullptr;
  std::string where;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

SplitRegex::SplitRegex(const std::string& pattern, bool literal, const std::string& where)
    : impl_(std::make_unique<Impl>()) {
  impl_->where = where;
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0u);
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err,
                              &err_offset, nullptr);
  HT_CHECK(impl_->code != nullptr, "{}: PCRE2 cannot compile the pattern at offset {}: {} (pattern: {})",
           where, err_offset, pcre2_message(err), pattern);
  // JIT makes matching several times faster; without it (unsupported platform) the interpreter is used.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

SplitRegex::~SplitRegex() = default;

void SplitRegex::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  // Per call: the match data and a JIT stack larger than the 32 KiB default, so that long runs of
  // whitespace (the `\s+(?!\S)` alternative backtracks) do not exhaust it.
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  pcre2_match_context* mctx = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
  HT_ASSERT(md && mctx && stack, "PCRE2 could not allocate its match data");
  pcre2_jit_stack_assign(mctx, nullptr, stack);
  struct Release {
    pcre2_match_data* md;
    pcre2_match_context* mctx;
    pcre2_jit_stack* stack;
    ~Release() {
      pcre2_jit_stack_free(stack);
      pcre2_match_context_free(mctx);
      pcre2_match_data_free(md);
    }
  } release{md, mctx, stack};

  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0, gap = 0;
  uint32_t opts = 0;  // the first call checks the whole subject for valid UTF-8; later calls skip that
  while (pos < n) {
    const int rc = pcre2_match(impl_->code, subject, n, pos, opts, md, mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21)
      HT_FAIL("tokenizer: the text is not valid UTF-8 at byte {} ({})", pcre2_get_startchar(md),
              pcre2_message(rc));
    HT_CHECK(rc >= 0, "{}: PCRE2 matching failed at byte {}: {}", impl_->where, pos, pcre2_message(rc));
    opts = PCRE2_NO_UTF_CHECK;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    if (e == s) {  // an empty match: the next character joins the unmatched stretch
      pos = s + utf8_length(static_cast<unsigned char>(text[s]));
      continue;
    }
    if (s > gap) out.push_back(text.substr(gap, s - gap));
    out.push_back(text.substr(s, e - s));
    pos = gap = e;
  }
  if (gap < n) out.push_back(text.substr(gap));
}

#else

struct SplitRegex::Impl {};
SplitRegex::SplitRegex(const std::string&, bool, const std::string& where) {
  throw UnsupportedTokenizer(fmt::format(
      "{}: hadatrain was built without PCRE2, which tokenizer.json pre-tokenisation needs (install "
      "libpcre2-dev, e.g. through tools/setup.sh, and re-run cmake)", where));
}
SplitRegex::~SplitRegex() = default;
void SplitRegex::split(std::string_view, std::vector<std::string_view>&) const {}

#endif

// ---- the byte-level alphabet ---------------------------------------------------------------------------

namespace {

struct ByteAlphabet {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 512> to_byte;  // code point -> byte, -1 when not in the alphabet (all are < 512)
  ByteAlphabet() {
    to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const int cp = printable ? b : 256 + extra++;
      to_byte[cp] = static_cast<int16_t>(b);
      std::string& s = to_unicode[b];
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {  // every code point here is below 0x800: two UTF-8 bytes
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

}  // namespace

const std::string& byte_to_unicode(uint8_t b) { return alphabet().to_unicode[b]; }

int unicode_to_byte(std::string_view s) {
  int cp = -1;
  if (s.size() == 1 && static_cast<unsigned char>(s[0]) < 0x80) {
    cp = static_cast<unsigned char>(s[0]);
  } else if (s.size() == 2 && (static_cast<unsigned char>(s[0]) & 0xE0) == 0xC0) {
    cp = ((static_cast<unsigned char>(s[0]) & 0x1F) << 6) | (static_cast<unsigned char>(s[1]) & 0x3F);
  }
  return cp >= 0 && cp < 512 ? alphabet().to_byte[cp] : -1;
}

// ---- merges --------------------------------------------------------------------------------------------

void MergeTable::add(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  // A pair listed twice keeps its first (lowest) rank.
  table_.try_emplace(key(left, right), Entry{rank, merged});
}

void MergeTable::apply(std::vector<int32_t>& symbols) const {
  const int32_t n = static_cast<int32_t>(symbols.size());
  if (n < 2) return;
  // A doubly linked list over the symbols; a merge writes the merged id into the left node and unlinks
  // the right one (id -1). Candidates are kept in a min-heap by (rank, position of the left symbol): the
  // lowest rank merges first, the leftmost among equal ranks. A candidate whose nodes changed since it
  // was pushed is stale and skipped.
  std::vector<int32_t> prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank, pos, right, left_id, right_id, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t l) {
    if (l < 0) return;
    const int32_t r = next[l];
    if (r < 0) return;
    if (const Entry* e = find(symbols[l], symbols[r]))
      heap.push(Candidate{e->rank, l, r, symbols[l], symbols[r], e->merged});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (symbols[c.pos] != c.left_id || next[c.pos] != c.right || symbols[c.right] != c.right_id) continue;
    symbols[c.pos] = c.merged;
    symbols[c.right] = -1;
    next[c.pos] = next[c.right];
    if (next[c.pos] >= 0) prev[next[c.pos]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  int32_t w = 0;
  for (int32_t i = 0; i < n; ++i)
    if (symbols[i] >= 0) symbols[w++] = symbols[i];
  symbols.resize(w);
}

}  // namespace ht::data::detail
