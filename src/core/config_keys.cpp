// The end of reading a config: finish() checks every key a section holds against the keys its reading asked for
// (an unknown key is an error that lists what the section accepts and suggests a near spelling; a key the reading
// rejected gets its reason, unless it holds the value reject_unless lets pass), and applies the choice-switch rule:
// the file's keys of a choice that a --set replaced are dropped with a note (Note [A --set that switches a choice]
// in config_reader.h), which needs the config as the file alone gives it (as_in_file()).
#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "core/config_internal.h"

namespace ht {
using namespace config_detail;

namespace {

// Whether the override `o` wrote the key at `dotted`, a key below it or a section holding it.
bool touches(const Override& o, const std::string& dotted) {
  return o.key == dotted || starts_with(dotted, o.key + ".") || starts_with(o.key, dotted + ".");
}

bool overridden_at(const Document& d, const std::string& dotted) {
  for (const Override& o : d.overrides)
    if (touches(o, dotted)) return true;
  return false;
}

// "a", "a and b", "a, b and c".
std::string join_words(const std::vector<std::string>& v) {
  if (v.size() < 2) return join(v, "");
  return join(std::vector<std::string>(v.begin(), v.end() - 1), ", ") + " and " + v.back();
}

// The overrides that changed the section at `keys` (its path from the root), for a note: those that wrote in it,
// else those that wrote in the nearest section above it that some wrote in; and those of the keys of other sections
// that decided a dropped key (`deciders`).
std::string overrides_behind(const Document& d, const std::vector<std::string>& keys,
                             const std::vector<std::string>& deciders) {
  std::vector<std::string> sets;
  for (std::size_t n = keys.size(); n > 0 && sets.empty(); --n) {
    const std::string prefix = join(std::vector<std::string>(keys.begin(), keys.begin() + n), ".") + ".";
    for (const Override& o : d.overrides)
      if (starts_with(o.key, prefix)) sets.push_back(o.text);
  }
  for (const Override& o : d.overrides)
    if (std::any_of(deciders.begin(), deciders.end(), [&](const std::string& k) { return touches(o, k); }) &&
        std::find(sets.begin(), sets.end(), o.text) == sets.end())
      sets.push_back(o.text);
  return sets.empty() ? "--set" : join(sets, ", ");
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

}  // namespace

void ConfigReader::finish() {
  Section& s = *s_;
  for (const Document::Dangling& d : s.doc->dangling)
    if (d.section == s.path && !s.knows(d.key))
      throw config_error(fmt::format("{}: {}: unknown key ({} accepts: {})", d.source, s.key_path(d.key),
                                     s.path.empty() ? "the top level" : s.path, join(s.known, ", ")));
  // Note [A --set that switches a choice]: the file's keys that only the file's own reading takes are dropped.
  std::vector<std::string> dropped, kept, deciders;
  bool all_decided_elsewhere = true;  // every dropped key was rejected for a value of another section
  if (s.node.IsDefined() && s.node.IsMap()) {
    for (auto it = s.node.begin(); it != s.node.end(); ++it) {
      const std::string name = it->first.Scalar();
      const bool file_choice = s.file_reading && s.file_reading->accepts(name) &&
                               !overridden_at(*s.doc, s.key_path(name));
      if (s.accepts(name)) {
        if (file_choice) kept.push_back(s.key_path(name));
        continue;
      }
      const Section::Rejection* rejection = s.rejection(name);
      if (file_choice) {
        const YAML::Mark m = it->first.Mark();
        dropped.push_back(fmt::format("{} ({}:{}:{})", s.key_path(name), s.doc->source, m.line + 1, m.column + 1));
        s.resolved.remove(name);
        if (rejection && !rejection->decided_by.empty()) {
          if (std::find(deciders.begin(), deciders.end(), rejection->decided_by) == deciders.end())
            deciders.push_back(rejection->decided_by);
        } else {
          all_decided_elsewhere = false;
        }
        continue;
      }
      if (std::find(s.inert.begin(), s.inert.end(), name) != s.inert.end()) continue;
      if (rejection) throw_at(*s.doc, s.mark_of(name), s.key_path(name), rejection->reason);
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
  // A section whose keys went for the value of another section's key names that key, and not the keys it keeps:
  // they have nothing to do with the switch.
  if (!dropped.empty() && all_decided_elsewhere) kept.clear();
  if (!dropped.empty())
    s.doc->notes.push_back(fmt::format("{}: dropped the file's {}: {} to the file's own {} settings only{}",
                                       overrides_behind(*s.doc, s.keys_from_root, deciders), join_words(dropped),
                                       dropped.size() == 1 ? "it applies" : "they apply",
                                       all_decided_elsewhere ? join_words(deciders) : s.path,
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

}  // namespace ht
