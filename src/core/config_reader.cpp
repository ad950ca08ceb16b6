// Strict YAML config reading: file loading, --set overrides, typed scalar parsing with ranges, unknown-key
// detection and the resolved-config record. See config_reader.h and Note [Config override sources].
#include "hadatrain/core/config_reader.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

namespace ht {
namespace {

struct Override {
  std::string key;   // "optim.lr"
  std::string text;  // "--set optim.lr=0.1"
};

struct Document {
  std::string source;               // the file name, or the name given to from_string
  std::vector<Override> overrides;  // in command-line order (later ones win)
  // Dotted keys a --set gave the value null (`--set key=null`): while the key still holds null, it reads as
  // absent (its default applies, a section reads as not given), but finish() still checks its name.
  std::vector<std::string> cleared;
  // A `--set key=null` whose path stops at a missing section (nothing to clear): the deepest section it reached
  // (dotted, "" for the top level) and the missing key there, which that section's finish() still checks.
  struct Dangling {
    std::string section, key, source;
  };
  std::vector<Dangling> dangling;
  // The file's tree before the overrides (a copy where there are some), which as_in_file() reads.
  YAML::Node file_root;
  // What finish() dropped (Note [A --set that switches a choice] in config_reader.h).
  std::vector<std::string> notes;
};

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// The length of the well-formed UTF-8 sequence at s[i] (RFC 3629: no overlong forms, no surrogates, at most
// U+10FFFF), or 0 when the byte there does not start one.
std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else return 0;
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  return n;
}

// A config may hold any bytes; messages quote its text with invalid UTF-8 and control characters (newline
// aside) written as \xNN, so an error never carries raw bytes to a terminal or a log.
std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = utf8_length(s, i);
    if (n == 0 || (c < 0x20 && c != '\n') || c == 0x7F) {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

// Every error of this file goes through here.
Error config_error(const std::string& msg) { return Error(printable(msg)); }

// YAML indents with spaces only. yaml-cpp reports a tab in the indentation as an "illegal map value" like any
// other misindented line; when parsing failed, the first tab in a line's leading whitespace is named instead.
std::optional<std::pair<std::size_t, std::size_t>> first_indentation_tab(const std::string& text) {
  std::size_t line = 1, col = 1;
  bool leading = true;
  for (const char c : text) {
    if (c == '\n') {
      ++line, col = 1, leading = true;
      continue;
    }
    if (leading && c == '\t') return std::make_pair(line, col);
    if (c != ' ') leading = false;
    ++col;
  }
  return std::nullopt;
}

// YAML allows no C0 control character but tab, line feed and carriage return, and no DEL (YAML 1.2, 5.1);
// yaml-cpp 0.7 does not reject them, so they are found before parsing. The first one's byte and 1-based line and
// column, if any.
struct ControlCharacter {
  unsigned char byte;
  std::size_t line, column;
};
std::optional<ControlCharacter> first_control_character(const std::string& text) {
  std::size_t line = 1, col = 1;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F) return ControlCharacter{c, line, col};
    if (c == '\n') ++line, col = 1;
    else ++col;
  }
  return std::nullopt;
}

// Whether a quote character starts a quoted scalar: only where a scalar can start (after the start of a line or
// one of ':', ',', '[', '{', '-', '?' and spaces); elsewhere ("ab\"c") it is part of a plain scalar.
bool opens_quote(char last_significant) {
  return last_significant == '\n' || last_significant == ':' || last_significant == ',' || last_significant == '[' ||
         last_significant == '{' || last_significant == '-' || last_significant == '?';
}

// yaml-cpp 0.7 takes time exponential in the nesting depth of flow collections ("{{{{{{{{{{{{{{{{{{{{" does
// not return in minutes), so a text whose [ ] / { } nest deeper than kMaxFlowDepth outside quotes is refused
// before parsing (a config needs two or three levels). The 1-based line and column of the first bracket past
// the limit, if any.
constexpr int kMaxFlowDepth = 8;
std::optional<std::pair<std::size_t, std::size_t>> first_too_deep_bracket(const std::string& text) {
  int depth = 0;
  char quote = 0, last = '\n';  // last: the last character outside quotes that is not a space
  std::size_t line = 1, col = 1;
  for (const char c : text) {
    if (quote) {
      if (c == quote) quote = 0;
    } else if ((c == '"' || c == '\'') && opens_quote(last)) {
      quote = c;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxFlowDepth) return std::make_pair(line, col);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
    if (c == '\n') ++line, col = 1;
    else ++col;
    if (!quote && c != ' ' && c != '\t' && c != '\r') last = c;
  }
  return std::nullopt;
}

// yaml-cpp 0.7's LoadAll never returns when a document ends at a token that cannot start a node (a ',' outside
// [ ] / { }: ",a", "&x,", "{a: 1}, b", "\"\","): the parser emits a null node without consuming the token, and
// every following document starts at that same token (fixed upstream after 0.7: yaml-cpp pull request 1319).
// So a text is first parsed into events by a handler that stops as soon as a document starts where the one
// before it did; only a text that passes is built into nodes, and that second parse takes the same steps, so it
// returns too. This one check covers every such input, where matching them one pattern at a time did not.
struct StuckToken {
  YAML::Mark mark;
};
class ProgressCheck final : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (started_ && mark.pos == last_start_) throw StuckToken{mark};
    started_ = true;
    last_start_ = mark.pos;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

 private:
  bool started_ = false;
  int last_start_ = 0;
};

// The token yaml-cpp 0.7 would stop at forever, if any (its mark: 0-based line and column); a parse error
// propagates as yaml-cpp's exception.
std::optional<YAML::Mark> first_stuck_token(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  ProgressCheck check;
  try {
    while (parser.HandleNextDocument(check)) {
    }
  } catch (const StuckToken& s) {
    return s.mark;
  }
  return std::nullopt;
}

// What to say of the stuck token at `mark` of `text`.
std::string stuck_token_message(const std::string& text, const YAML::Mark& mark) {
  const char c = mark.pos >= 0 && static_cast<std::size_t>(mark.pos) < text.size() ? text[mark.pos] : ' ';
  if (c == ',')
    return "unexpected ','; outside [ ] and { } a ',' separates nothing (a line cannot start with one, and none "
           "may follow a quoted value or a closing bracket at the top level); quote a value that holds a comma";
  return fmt::format("unexpected '{}' where a value should start", std::string(1, c));
}

// yaml-cpp's message, with what it usually means in a config file.
std::string explain_parse_error(const std::string& msg) {
  if (msg == "illegal map value")
    return "illegal map value: a 'key: value' where none can start; check this line's indentation against the "
           "lines above (the keys of one section start in the same column, deeper than their section's name), "
           "and quote values that hold ': '";
  if (msg == "end of map not found")
    return "end of map not found: check the indentation of this line against the keys above it";
  return msg;
}

// Whether an override wrote the key at `dotted`, a key below it or a section holding it.
bool overridden_at(const Document& d, const std::string& dotted) {
  for (const Override& o : d.overrides)
    if (o.key == dotted || starts_with(dotted, o.key + ".") || starts_with(o.key, dotted + ".")) return true;
  return false;
}

// Where the value at `dotted` (whose node has mark `m`) came from: the --set that wrote it or a section
// holding it, the --set that created it (nodes made by an override have no file position), or file:line:col.
std::string where(const Document& d, const YAML::Mark& m, const std::string& dotted) {
  const Override* best = nullptr;
  for (const Override& o : d.overrides) {
    const bool covers = dotted == o.key || starts_with(dotted, o.key + ".") || starts_with(dotted, o.key + "[");
    const bool created = m.is_null() && starts_with(o.key, dotted + ".");
    if (covers || created) best = &o;
  }
  if (best) return best->text;
  if (!m.is_null()) return fmt::format("{}:{}:{}", d.source, m.line + 1, m.column + 1);
  return d.source;
}

[[noreturn]] void throw_at(const Document& d, const YAML::Mark& m, const std::string& dotted, const std::string& msg) {
  if (dotted.empty()) throw config_error(fmt::format("{}: {}", where(d, m, dotted), msg));
  throw config_error(fmt::format("{}: {}: {}", where(d, m, dotted), dotted, msg));
}

// What a node holds, for "got ..." in messages.
std::string describe_found(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "nothing (null)";
  if (n.IsSequence()) return fmt::format("a list of {} items", n.size());
  if (n.IsMap()) return "a map (a section of keys)";
  if (n.Tag() == "!") return fmt::format("the quoted string \"{}\"", n.Scalar());
  return n.Scalar();
}

bool is_plain_scalar(const YAML::Node& n) { return n.IsDefined() && n.IsScalar() && n.Tag() != "!"; }

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// "a", "a and b", "a, b and c".
std::string join_words(const std::vector<std::string>& v) {
  if (v.size() < 2) return join(v, "");
  return join(std::vector<std::string>(v.begin(), v.end() - 1), ", ") + " and " + v.back();
}

// The overrides that changed the section at `keys` (its path from the root), for a note: those that wrote in it,
// else those that wrote in the nearest section above it that some wrote in.
std::string overrides_behind(const Document& d, const std::vector<std::string>& keys) {
  for (std::size_t n = keys.size(); n > 0; --n) {
    const std::string prefix = join(std::vector<std::string>(keys.begin(), keys.begin() + n), ".") + ".";
    std::vector<std::string> sets;
    for (const Override& o : d.overrides)
      if (starts_with(o.key, prefix)) sets.push_back(o.text);
    if (!sets.empty()) return join(sets, ", ");
  }
  return "--set";
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// --- typed scalar parsing: returns the value, or sets `err` to "expected ..., got ..." ---

template <class T>
const char* type_words();
template <> const char* type_words<bool>() { return "a boolean (true or false)"; }
template <> const char* type_words<int>() { return "an integer"; }
template <> const char* type_words<int64_t>() { return "an integer"; }
template <> const char* type_words<uint64_t>() { return "a non-negative integer"; }
template <> const char* type_words<double>() { return "a number"; }
template <> const char* type_words<std::string>() { return "a string"; }

template <class T>
const char* list_words();
template <> const char* list_words<bool>() { return "booleans"; }
template <> const char* list_words<int>() { return "integers"; }
template <> const char* list_words<int64_t>() { return "integers"; }
template <> const char* list_words<uint64_t>() { return "non-negative integers"; }
template <> const char* list_words<double>() { return "numbers"; }
template <> const char* list_words<std::string>() { return "strings"; }

template <class Int>
std::optional<Int> parse_integer(std::string s) {
  if (!s.empty() && s[0] == '+') s.erase(0, 1);
  Int v{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_number(std::string s) {
  if (!s.empty() && s[0] == '+') s.erase(0, 1);
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

template <class T>
std::optional<T> parse_value(const YAML::Node& n, const Range& range, std::string& err) {
  const std::string expected = fmt::format("expected {}{}", type_words<T>(), range.describe());
  auto fail = [&]() -> std::optional<T> {
    err = fmt::format("{}, got {}", expected, describe_found(n));
    return std::nullopt;
  };
  if constexpr (std::is_same_v<T, std::string>) {
    if (!n.IsDefined() || !n.IsScalar()) return fail();
    return n.Scalar();
  } else {
    if (!is_plain_scalar(n)) return fail();
    const std::string& s = n.Scalar();
    std::optional<T> v;
    if constexpr (std::is_same_v<T, bool>) {
      if (s == "true" || s == "True" || s == "TRUE") v = true;
      if (s == "false" || s == "False" || s == "FALSE") v = false;
    } else if constexpr (std::is_same_v<T, double>) {
      v = parse_number(s);
    } else if constexpr (std::is_same_v<T, int>) {
      const auto wide = parse_integer<int64_t>(s);
      if (wide && *wide >= std::numeric_limits<int>::min() && *wide <= std::numeric_limits<int>::max())
        v = static_cast<int>(*wide);
    } else {
      v = parse_integer<T>(s);
    }
    if (!v) return fail();
    if constexpr (!std::is_same_v<T, bool>) {
      if (!range.contains(static_cast<double>(*v))) return fail();
    }
    return v;
  }
}

template <class T>
std::string format_value(const T& v) {
  if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
  else if constexpr (std::is_same_v<T, std::string>) return v;
  else return fmt::format("{}", v);
}

}  // namespace

// --- Range ---

bool Range::contains(double v) const {
  if (std::isnan(v)) return !has_lo_ && !has_hi_;
  if (has_lo_ && (lo_closed_ ? v < lo_ : v <= lo_)) return false;
  if (has_hi_ && (hi_closed_ ? v > hi_ : v >= hi_)) return false;
  return true;
}

std::string Range::describe() const {
  if (has_lo_ && has_hi_)
    return fmt::format(" in {}{}, {}{}", lo_closed_ ? "[" : "(", lo_, hi_, hi_closed_ ? "]" : ")");
  if (has_lo_) return fmt::format(" {} {}", lo_closed_ ? ">=" : ">", lo_);
  return "";
}

// --- sections ---

struct ConfigReader::Section {
  std::shared_ptr<Document> doc;
  YAML::Node node;      // the section's map; undefined when the section is absent
  YAML::Mark mark;      // where the section starts (its key in the parent), null when unknown
  std::string path;     // dotted path, "" for the root
  std::vector<std::string> keys_from_root;  // the path as keys (a key may hold a '.': a layer pattern)
  std::vector<std::string> known;  // keys the schema asked for
  std::vector<std::pair<std::string, std::string>> rejected;  // key -> why this reading does not take it (reject)
  std::vector<std::pair<std::string, std::shared_ptr<Section>>> children;
  YAML::Node resolved;  // map of the values asked for
  // The same section read from the file alone (drop_keys_only_read_by); null when not given.
  std::shared_ptr<const Section> file_reading;

  bool knows(const std::string& key) const { return std::find(known.begin(), known.end(), key) != known.end(); }
  std::shared_ptr<const Section> child_named(const std::string& key) const {
    for (const auto& [name, c] : children)
      if (name == key) return c;
    return nullptr;
  }

  std::string key_path(const std::string& key) const { return path.empty() ? key : path + "." + key; }

  // The (key, value) pair of `key`, or undefined nodes (also for a key that `--set key=null` cleared).
  std::pair<YAML::Node, YAML::Node> find(const std::string& key) const {
    if (node.IsDefined() && node.IsMap())
      for (auto it = node.begin(); it != node.end(); ++it)
        if (it->first.IsScalar() && it->first.Scalar() == key) {
          if (it->second.IsNull() &&
              std::find(doc->cleared.begin(), doc->cleared.end(), key_path(key)) != doc->cleared.end())
            break;
          return {it->first, it->second};
        }
    return {YAML::Node(YAML::NodeType::Undefined), YAML::Node(YAML::NodeType::Undefined)};
  }

  // The mark to report for `key`: its value, or its key when the value is null, or the section.
  YAML::Mark mark_of(const std::string& key) const {
    const auto [k, v] = find(key);
    if (v.IsDefined() && !v.IsNull() && !v.Mark().is_null()) return v.Mark();
    if (k.IsDefined()) return k.Mark();
    return mark;
  }

  void remember(const std::string& key) {
    if (std::find(known.begin(), known.end(), key) == known.end()) known.push_back(key);
  }

  // Keys must be non-empty plain scalars and appear once.
  void check_keys() const {
    if (!node.IsDefined() || !node.IsMap()) return;
    std::vector<std::pair<std::string, YAML::Mark>> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const YAML::Node k = it->first;  // a copy: it-> returns a proxy that dies with the full expression
      if (!k.IsScalar() || k.Scalar().empty())
        throw_at(*doc, k.Mark(), path, fmt::format("keys must be plain names, got {}", describe_found(k)));
      for (const auto& [name, m] : seen)
        if (name == k.Scalar())
          throw_at(*doc, k.Mark(), key_path(name),
                   fmt::format("duplicate key (first given at line {})", m.line + 1));
      seen.emplace_back(k.Scalar(), k.Mark());
    }
  }
};

namespace {

std::shared_ptr<ConfigReader::Section> make_root(std::shared_ptr<Document> doc, YAML::Node root) {
  auto s = std::make_shared<ConfigReader::Section>();
  s->doc = std::move(doc);
  s->node = root;
  s->mark = root.Mark();
  s->resolved = YAML::Node(YAML::NodeType::Map);
  s->check_keys();
  return s;
}

// Writes the YAML value of `text` ("a.b=value") into `root`, creating sections on the way.
void apply_override(Document& doc, YAML::Node& root, const std::string& text) {
  const std::string source = "--set " + text;
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw config_error(fmt::format("{}: expected key=value, for example --set optim.lr=0.05", source));
  const std::string key = text.substr(0, eq), value = text.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  if (key.back() == '.' || std::any_of(parts.begin(), parts.end(), [](const std::string& p) {
        return p.empty() || p.find_first_of(" \t[]{}:,") != std::string::npos;
      }))
    throw config_error(fmt::format("{}: bad key '{}': expected dotted names such as optim.lr", source, key));

  if (const auto bad = first_control_character(value))
    throw config_error(fmt::format("{}: the value holds the control character \\x{:02x}, which YAML does not allow",
                                   source, bad->byte));
  if (const auto deep = first_too_deep_bracket(value))
    throw config_error(fmt::format("{}: the value nests [ ] / {{ }} deeper than {} levels (column {}), which is not "
                                   "supported",
                                   source, kMaxFlowDepth, deep->second));
  YAML::Node v;
  if (value.empty()) {
    v = YAML::Node(std::string());
  } else {
    try {
      if (const auto stuck = first_stuck_token(value))
        throw config_error(fmt::format("{}: the value is not valid YAML at column {}: {}", source, stuck->column + 1,
                                       stuck_token_message(value, *stuck)));
      v = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      throw config_error(fmt::format("{}: the value is not valid YAML: {}", source, e.msg));
    }
  }

  // `--set key=null` (or ~) clears the key: its default applies. A key that was given (by the file or an earlier
  // --set) is removed, whatever its name, so one the section does not accept can be taken out (an SGD key after
  // --set optim.name=adamw). A key nothing gave is left holding null, which reads as absent while finish() still
  // checks its name (a misspelt key is reported). It creates no section on the way, since a section made to hold it
  // would be given where none was (a key in an absent section is at its default already).
  const bool clear = v.IsNull();
  YAML::Node cur = root;
  std::string walked;  // the sections passed so far, dotted
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    const std::string parent = walked;
    walked += (i ? "." : "") + parts[i];
    YAML::Node next = cur[parts[i]];
    if (clear && (!next.IsDefined() || next.IsNull())) {
      doc.overrides.push_back({key, source});
      doc.dangling.push_back({parent, parts[i], source});
      return;
    }
    if (!next.IsDefined() || next.IsNull()) {
      cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next.reset(cur[parts[i]]);
    } else if (!next.IsMap()) {
      throw config_error(fmt::format("{}: {} is not a section (it holds {}), so it has no key '{}'", source, walked,
                              describe_found(next), parts[i + 1]));
    }
    cur.reset(next);
  }
  doc.overrides.push_back({key, source});
  if (clear) {
    const YAML::Node given = cur[parts.back()];
    const bool placeholder = given.IsDefined() && given.IsNull() &&
                             std::find(doc.cleared.begin(), doc.cleared.end(), key) != doc.cleared.end();
    if (given.IsDefined() && !placeholder) {
      cur.remove(parts.back());
      return;
    }
    doc.cleared.push_back(key);
  }
  cur[parts.back()] = v;
}

}  // namespace

ConfigReader ConfigReader::from_string(const std::string& yaml, const std::string& source_name,
                                       const std::vector<std::string>& overrides) {
  auto doc = std::make_shared<Document>();
  doc->source = source_name;
  YAML::Node root;
  try {
    // LoadAll, not Load: Load reads the first document and ignores everything after a `---` separator.
    if (const auto bad = first_control_character(yaml))
      throw config_error(fmt::format("{}:{}:{}: the control character \\x{:02x} is not allowed in YAML; remove it",
                                     source_name, bad->line, bad->column, bad->byte));
    if (const auto deep = first_too_deep_bracket(yaml))
      throw config_error(fmt::format("{}:{}:{}: [ ] / {{ }} nest deeper than {} levels here, which is not supported",
                                     source_name, deep->first, deep->second, kMaxFlowDepth));
    if (const auto stuck = first_stuck_token(yaml))
      throw config_error(fmt::format("{}:{}:{}: invalid YAML: {}", source_name, stuck->line + 1, stuck->column + 1,
                                     stuck_token_message(yaml, *stuck)));
    const std::vector<YAML::Node> documents = YAML::LoadAll(yaml);
    for (std::size_t i = 1; i < documents.size(); ++i) {
      const YAML::Node& extra = documents[i];
      if (!extra.IsDefined() || extra.IsNull()) continue;  // a trailing `---` with nothing after it
      throw config_error(fmt::format("{}:{}: a second YAML document starts here (after a '---' separator); a config "
                              "file holds one document: merge its keys into the first or remove it",
                              source_name, extra.Mark().line + 1));
    }
    if (!documents.empty()) root = documents.front();
  } catch (const YAML::ParserException& e) {
    if (const auto tab = first_indentation_tab(yaml))
      throw config_error(fmt::format("{}:{}:{}: a tab in the indentation: YAML indents with spaces only; replace the "
                                     "tab with spaces",
                                     source_name, tab->first, tab->second));
    throw config_error(fmt::format("{}:{}:{}: invalid YAML: {}", source_name, e.mark.line + 1, e.mark.column + 1,
                                   explain_parse_error(e.msg)));
  } catch (const YAML::Exception& e) {
    throw config_error(fmt::format("{}: invalid YAML: {}", source_name, e.msg));
  }
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);  // empty file: all defaults
  if (!root.IsMap())
    throw_at(*doc, root.Mark(), "",
             fmt::format("expected a map of sections at the top level (run:, data:, ...), got {}",
                         describe_found(root)));
  doc->file_root = overrides.empty() ? root : YAML::Clone(root);
  for (const std::string& o : overrides) apply_override(*doc, root, o);
  return ConfigReader(make_root(doc, root));
}

ConfigReader ConfigReader::load_file(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw config_error(fmt::format("{}: config file not found (or not a regular file)", path));
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) throw config_error(fmt::format("{}: cannot read config file: {}", path, std::strerror(errno)));
  return from_string(text.str(), path, overrides);
}

template <class T>
T ConfigReader::get(const std::string& key, const T& def, const Range& range) {
  Section& s = *s_;
  s.remember(key);
  const auto [k, v] = s.find(key);
  T out = def;
  if (k.IsDefined()) {
    std::string err;
    auto parsed = parse_value<T>(v, range, err);
    if (!parsed) throw_at(*s.doc, s.mark_of(key), s.key_path(key), err);
    out = *parsed;
  }
  s.resolved[key] = format_value(out);
  return out;
}

template <class T>
T ConfigReader::require(const std::string& key, const Range& range) {
  if (!has(key)) fail(key, fmt::format("required key is missing: expected {}{}", type_words<T>(), range.describe()));
  return get<T>(key, T{}, range);
}

template <class T>
std::vector<T> ConfigReader::get_list(const std::string& key, const std::vector<T>& def, const Range& range) {
  Section& s = *s_;
  s.remember(key);
  const auto [k, v] = s.find(key);
  std::vector<T> out = def;
  if (k.IsDefined()) {
    if (!v.IsSequence())
      throw_at(*s.doc, s.mark_of(key), s.key_path(key),
               fmt::format("expected a list of {}{} such as [1, 2], got {}", list_words<T>(), range.describe(),
                           describe_found(v)));
    out.clear();
    for (std::size_t i = 0; i < v.size(); ++i) {
      std::string err;
      const YAML::Node e = v[i];
      auto parsed = parse_value<T>(e, range, err);
      if (!parsed)
        throw_at(*s.doc, e.Mark().is_null() ? s.mark_of(key) : e.Mark(), fmt::format("{}[{}]", s.key_path(key), i),
                 err);
      out.push_back(*parsed);
    }
  }
  YAML::Node seq(YAML::NodeType::Sequence);
  for (const T& e : out) seq.push_back(format_value(e));
  seq.SetStyle(YAML::EmitterStyle::Flow);
  s.resolved[key] = seq;
  return out;
}

std::string ConfigReader::get_enum(const std::string& key, const std::string& def,
                                   const std::vector<std::string>& allowed) {
  Section& s = *s_;
  s.remember(key);
  const auto [k, v] = s.find(key);
  std::string out = def;
  if (k.IsDefined()) {
    if (!v.IsScalar() || std::find(allowed.begin(), allowed.end(), v.Scalar()) == allowed.end())
      throw_at(*s.doc, s.mark_of(key), s.key_path(key),
               fmt::format("expected one of {}, got {}", join(allowed, ", "), describe_found(v)));
    out = v.Scalar();
  }
  s.resolved[key] = out;
  return out;
}

ConfigReader ConfigReader::child(const std::string& key) {
  Section& s = *s_;
  s.remember(key);
  for (const auto& [name, c] : s.children)
    if (name == key) return ConfigReader(c);
  const auto [k, v] = s.find(key);
  if (k.IsDefined() && !v.IsNull() && !v.IsMap())
    throw_at(*s.doc, s.mark_of(key), s.key_path(key),
             fmt::format("expected a section (a map of keys), got {}", describe_found(v)));
  auto c = std::make_shared<Section>();
  c->doc = s.doc;
  c->node = (k.IsDefined() && v.IsMap()) ? v : YAML::Node(YAML::NodeType::Undefined);
  c->mark = k.IsDefined() ? k.Mark() : s.mark;
  c->path = s.key_path(key);
  c->keys_from_root = s.keys_from_root;
  c->keys_from_root.push_back(key);
  s.resolved[key] = YAML::Node(YAML::NodeType::Map);
  c->resolved.reset(s.resolved[key]);
  c->check_keys();
  s.children.emplace_back(key, c);
  return ConfigReader(c);
}

std::vector<std::string> ConfigReader::keys() const {
  std::vector<std::string> out;
  const Section& s = *s_;
  if (s.node.IsDefined() && s.node.IsMap())
    for (auto it = s.node.begin(); it != s.node.end(); ++it)
      if (it->first.IsScalar()) out.push_back(it->first.Scalar());
  return out;
}

bool ConfigReader::has(const std::string& key) {
  s_->remember(key);
  const auto [k, v] = s_->find(key);
  return k.IsDefined() && !v.IsNull();
}

bool ConfigReader::holds_section(const std::string& key) const {
  const auto [k, v] = s_->find(key);
  return k.IsDefined() && v.IsMap();
}

void ConfigReader::reject(const std::string& key, const std::string& reason) {
  s_->rejected.emplace_back(key, reason);
}

void ConfigReader::finish() {
  Section& s = *s_;
  for (const Document::Dangling& d : s.doc->dangling)
    if (d.section == s.path && !s.knows(d.key))
      throw config_error(fmt::format("{}: {}: unknown key ({} accepts: {})", d.source, s.key_path(d.key),
                                     s.path.empty() ? "the top level" : s.path, join(s.known, ", ")));
  // Note [A --set that switches a choice]: the file's keys that only the file's own reading takes are dropped.
  std::vector<std::string> dropped, kept;
  if (s.node.IsDefined() && s.node.IsMap()) {
    for (auto it = s.node.begin(); it != s.node.end(); ++it) {
      const std::string name = it->first.Scalar();
      const bool file_choice = s.file_reading && s.file_reading->knows(name) &&
                               !overridden_at(*s.doc, s.key_path(name));
      if (s.knows(name)) {
        if (file_choice) kept.push_back(s.key_path(name));
        continue;
      }
      if (file_choice) {
        const YAML::Mark m = it->first.Mark();
        dropped.push_back(fmt::format("{} ({}:{}:{})", s.key_path(name), s.doc->source, m.line + 1, m.column + 1));
        continue;
      }
      for (const auto& [key, reason] : s.rejected)
        if (key == name) throw_at(*s.doc, s.mark_of(name), s.key_path(name), reason);
      // Suggest the closest known key when it is a plausible typo (1-2 edits, fewer than the name's length).
      std::string hint;
      std::size_t best = 3;
      for (const std::string& k : s.known) {
        const std::size_t d = edit_distance(name, k);
        if (d < best && d < std::min(name.size(), k.size())) {
          best = d;
          hint = fmt::format("; did you mean '{}'?", k);
        }
      }
      const std::string section = s.path.empty() ? "the top level" : s.path;
      throw_at(*s.doc, it->first.Mark(), s.key_path(name),
               fmt::format("unknown key ({} accepts: {}{})", section, join(s.known, ", "), hint));
    }
  }
  if (!dropped.empty())
    s.doc->notes.push_back(fmt::format("{}: dropped the file's {}: {} to the file's own {} settings only{}",
                                       overrides_behind(*s.doc, s.keys_from_root), join_words(dropped),
                                       dropped.size() == 1 ? "it applies" : "they apply", s.path,
                                       kept.empty() ? "" : fmt::format("; {} keep{} the file's value{}",
                                                                       join_words(kept), kept.size() == 1 ? "s" : "",
                                                                       kept.size() == 1 ? "" : "s")));
  for (const auto& [name, c] : s.children) {
    if (!c->file_reading && s.file_reading) c->file_reading = s.file_reading->child_named(name);
    ConfigReader(c).finish();
  }
}

bool ConfigReader::overridden() const {
  for (const Override& o : s_->doc->overrides)
    if (s_->path.empty() || starts_with(o.key, s_->path + ".")) return true;
  return false;
}

ConfigReader ConfigReader::as_in_file() const {
  auto doc = std::make_shared<Document>();
  doc->source = s_->doc->source;
  doc->file_root = s_->doc->file_root;
  ConfigReader r(make_root(doc, doc->file_root));
  for (const std::string& key : s_->keys_from_root) r = r.child(key);
  return r;
}

void ConfigReader::drop_keys_only_read_by(const ConfigReader& file_reading) { s_->file_reading = file_reading.s_; }

const std::vector<std::string>& ConfigReader::notes() const { return s_->doc->notes; }

void ConfigReader::fail(const std::string& key, const std::string& message) const {
  throw_at(*s_->doc, s_->mark_of(key), s_->key_path(key), message);
}

const std::string& ConfigReader::path() const { return s_->path; }
std::string ConfigReader::key_path(const std::string& key) const { return s_->key_path(key); }
const std::string& ConfigReader::source() const { return s_->doc->source; }
YAML::Node ConfigReader::resolved() const { return s_->resolved; }

std::string ConfigReader::resolved_yaml() const {
  YAML::Emitter out;
  out << s_->resolved;
  return std::string(out.c_str()) + "\n";
}

// The value types a config may hold (config_reader.h).
template bool ConfigReader::get<bool>(const std::string&, const bool&, const Range&);
template bool ConfigReader::require<bool>(const std::string&, const Range&);
template std::vector<bool> ConfigReader::get_list<bool>(const std::string&,
    const std::vector<bool>&, const Range&);
template int ConfigReader::get<int>(const std::string&, const int&, const Range&);
template int ConfigReader::require<int>(const std::string&, const Range&);
template std::vector<int> ConfigReader::get_list<int>(const std::string&,
    const std::vector<int>&, const Range&);
template int64_t ConfigReader::get<int64_t>(const std::string&, const int64_t&, const Range&);
template int64_t ConfigReader::require<int64_t>(const std::string&, const Range&);
template std::vector<int64_t> ConfigReader::get_list<int64_t>(const std::string&,
    const std::vector<int64_t>&, const Range&);
template uint64_t ConfigReader::get<uint64_t>(const std::string&, const uint64_t&, const Range&);
template uint64_t ConfigReader::require<uint64_t>(const std::string&, const Range&);
template std::vector<uint64_t> ConfigReader::get_list<uint64_t>(const std::string&,
    const std::vector<uint64_t>&, const Range&);
template double ConfigReader::get<double>(const std::string&, const double&, const Range&);
template double ConfigReader::require<double>(const std::string&, const Range&);
template std::vector<double> ConfigReader::get_list<double>(const std::string&,
    const std::vector<double>&, const Range&);
template std::string ConfigReader::get<std::string>(const std::string&, const std::string&, const Range&);
template std::string ConfigReader::require<std::string>(const std::string&, const Range&);
template std::vector<std::string> ConfigReader::get_list<std::string>(const std::string&,
    const std::vector<std::string>&, const Range&);

}  // namespace ht
