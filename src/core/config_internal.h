// What the parts of the config reader share (its API is include/hadatrain/core/config_reader.h): the parsed
// document with its --set overrides (Document), a section being read (ConfigReader::Section) and the helpers that
// more than one part calls. Internal to src/core/; the parts are
//   config_reader.cpp    loading a file or a text, Range, the typed getters, sections, the resolved record
//   config_yaml.cpp      YAML text to a tree with its diagnostics, and the error messages' form and location
//   config_override.cpp  `--set KEY=VALUE`: checking one and writing it into the tree (`--set key=null` removes)
//   config_keys.cpp      finish()'s key check, and the choice-switch rule (Note [A --set that switches a choice])
#pragma once
#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "hadatrain/core/config_reader.h"
#include "hadatrain/core/error.h"

namespace ht::config_detail {

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

inline bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

inline std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// --- config_yaml.cpp ---

// Every error of the config reader goes through here: its text with control characters and invalid UTF-8
// written as \xNN.
Error config_error(const std::string& msg);

// The tree of the one YAML document in `yaml` (undefined or null when it holds none); an error names
// `source_name`, line and column and says what to do.
YAML::Node parse_yaml_text(const std::string& yaml, const std::string& source_name);

// The first C0 control character (tab, line feed and carriage return aside) or DEL in a text, if any.
struct ControlCharacter {
  unsigned char byte;
  std::size_t line, column;
};
std::optional<ControlCharacter> first_control_character(const std::string& text);

// The deepest nesting of [ ] / { } that a text may have, and where the first bracket past it is, if any.
inline constexpr int kMaxFlowDepth = 8;
std::optional<std::pair<std::size_t, std::size_t>> first_too_deep_bracket(const std::string& text);

// The token yaml-cpp 0.7 would stop at forever, if any, and what to say of it.
std::optional<YAML::Mark> first_stuck_token(const std::string& text);
std::string stuck_token_message(const std::string& text, const YAML::Mark& mark);

// Where the value at `dotted` (whose node has mark `m`) came from: the --set that wrote it or a section holding it,
// the --set that created it (nodes made by an override have no file position), or file:line:col.
std::string where(const Document& d, const YAML::Mark& m, const std::string& dotted);

// Throws the error "<where>: <dotted>: <msg>" for the value at `dotted` (whose node has mark `m`), <where> being
// file:line:col or the --set it came from (Note [Config override sources] in config_reader.h).
[[noreturn]] void throw_at(const Document& d, const YAML::Mark& m, const std::string& dotted, const std::string& msg);

// What a node holds, for "got ..." in messages.
std::string describe_found(const YAML::Node& n);

// --- config_reader.cpp ---

// The root section of `doc`, reading `root`.
std::shared_ptr<ConfigReader::Section> make_root(std::shared_ptr<Document> doc, YAML::Node root);

// --- config_override.cpp ---

// Writes the YAML value of `text` ("a.b=value") into `root`, creating sections on the way.
void apply_override(Document& doc, YAML::Node& root, const std::string& text);

}  // namespace ht::config_detail

namespace ht {

struct ConfigReader::Section {
  std::shared_ptr<config_detail::Document> doc;
  YAML::Node node;      // the section's map; undefined when the section is absent
  YAML::Mark mark;      // where the section starts (its key in the parent), null when unknown
  std::string path;     // dotted path, "" for the root
  std::vector<std::string> keys_from_root;  // the path as keys (a key may hold a '.': a layer pattern)
  std::vector<std::string> known;  // keys the schema asked for
  struct Rejection {
    std::string key, reason;
    std::string decided_by;  // the dotted key of another section that decided it, or ""
  };
  std::vector<Rejection> rejected;  // keys this reading does not take, and why (reject, reject_unless)
  std::vector<std::string> inert;   // rejected keys that hold the value reject_unless lets pass
  std::vector<std::pair<std::string, std::shared_ptr<Section>>> children;
  YAML::Node resolved;  // map of the values asked for
  // The same section read from the file alone (drop_keys_only_read_by); null when not given.
  std::shared_ptr<const Section> file_reading;

  bool knows(const std::string& key) const { return std::find(known.begin(), known.end(), key) != known.end(); }
  const Rejection* rejection(const std::string& key) const {
    for (const Rejection& r : rejected)
      if (r.key == key) return &r;
    return nullptr;
  }
  // Whether this reading takes `key`: asked for, and not rejected.
  bool accepts(const std::string& key) const { return knows(key) && rejection(key) == nullptr; }
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
        config_detail::throw_at(*doc, k.Mark(), path,
                                fmt::format("keys must be plain names, got {}", config_detail::describe_found(k)));
      for (const auto& [name, m] : seen)
        if (name == k.Scalar())
          config_detail::throw_at(*doc, k.Mark(), key_path(name),
                                  fmt::format("duplicate key (first given at line {})", m.line + 1));
      seen.emplace_back(k.Scalar(), k.Mark());
    }
  }
};

}  // namespace ht
