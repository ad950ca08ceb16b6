// Strict YAML config reading (config_reader.h): loading a file or a text, Range, the typed getters (values parsed
// and checked against their ranges), sections, and the record of the resolved config. The text is parsed in
// config_yaml.cpp, --set overrides are applied in config_override.cpp and finish()'s key check is in
// config_keys.cpp; config_internal.h holds what these parts share.
#include "hadatrain/core/config_reader.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "core/config_internal.h"

namespace ht {
using namespace config_detail;

namespace {

// --- typed scalar parsing: returns the value, or sets `err` to "expected ..., got ..." ---

bool is_plain_scalar(const YAML::Node& n) { return n.IsDefined() && n.IsScalar() && n.Tag() != "!"; }

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

// --- loading ---

namespace config_detail {

std::shared_ptr<ConfigReader::Section> make_root(std::shared_ptr<Document> doc, YAML::Node root) {
  auto s = std::make_shared<ConfigReader::Section>();
  s->doc = std::move(doc);
  s->node = root;
  s->mark = root.Mark();
  s->resolved = YAML::Node(YAML::NodeType::Map);
  s->check_keys();
  return s;
}

}  // namespace config_detail

ConfigReader ConfigReader::from_string(const std::string& yaml, const std::string& source_name,
                                       const std::vector<std::string>& overrides) {
  auto doc = std::make_shared<Document>();
  doc->source = source_name;
  YAML::Node root = parse_yaml_text(yaml, source_name);
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

// --- reading a section ---

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
                                   const std::vector<std::string>& allowed, const Spellings& spellings) {
  Section& s = *s_;
  s.remember(key);
  const auto [k, v] = s.find(key);
  std::string out = def;
  if (k.IsDefined()) {
    const std::string given = v.IsScalar() ? canonical_spelling(v.Scalar(), spellings) : "";
    if (!v.IsScalar() || std::find(allowed.begin(), allowed.end(), given) == allowed.end()) {
      std::vector<std::string> names;
      for (const std::string& a : allowed) names.push_back(with_aliases(a, spellings));
      throw_at(*s.doc, s.mark_of(key), s.key_path(key),
               fmt::format("expected one of {}, got {}", join(names, ", "), describe_found(v)));
    }
    out = given;
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

void ConfigReader::reject(const std::string& key, const std::string& reason, const std::string& decided_by) {
  s_->rejected.push_back({key, reason, decided_by});
}

namespace {

// Whether `n` holds `v` (read as a value of type T).
template <class T>
bool holds(const YAML::Node& n, const T& v) {
  std::string err;
  const std::optional<T> parsed = parse_value<T>(n, Range::any(), err);
  return parsed && *parsed == v;
}
bool holds(const YAML::Node& n, const std::vector<std::string>& v) {
  if (!n.IsSequence() || n.size() != v.size()) return false;
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!holds<std::string>(n[i], v[i])) return false;
  return true;
}

}  // namespace

template <class T>
void ConfigReader::reject_unless(const std::string& key, const T& inert, const std::string& reason,
                                 const std::string& decided_by) {
  reject(key, reason, decided_by);
  const auto [k, v] = s_->find(key);
  if (k.IsDefined() && holds(v, inert)) s_->inert.push_back(key);
}

void ConfigReader::reject_unless(const std::string& key, const std::string& inert, const Spellings& spellings,
                                 const std::string& reason, const std::string& decided_by) {
  reject(key, reason, decided_by);
  const auto [k, v] = s_->find(key);
  if (k.IsDefined() && v.IsScalar() && canonical_spelling(v.Scalar(), spellings) == inert) s_->inert.push_back(key);
}

void ConfigReader::fail(const std::string& key, const std::string& message) const {
  throw_at(*s_->doc, s_->mark_of(key), s_->key_path(key), message);
}

std::string ConfigReader::location(const std::string& key) const {
  const auto [k, v] = s_->find(key);
  return k.IsDefined() ? where(*s_->doc, s_->mark_of(key), s_->key_path(key)) : "";
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
template void ConfigReader::reject_unless<bool>(const std::string&, const bool&, const std::string&, const std::string&);
template void ConfigReader::reject_unless<int>(const std::string&, const int&, const std::string&, const std::string&);
template void ConfigReader::reject_unless<int64_t>(const std::string&, const int64_t&, const std::string&,
                                                   const std::string&);
template void ConfigReader::reject_unless<double>(const std::string&, const double&, const std::string&,
                                                  const std::string&);
template void ConfigReader::reject_unless<std::string>(const std::string&, const std::string&, const std::string&,
                                                       const std::string&);
template void ConfigReader::reject_unless<std::vector<std::string>>(const std::string&, const std::vector<std::string>&,
                                                                    const std::string&, const std::string&);
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
