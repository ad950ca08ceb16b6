// `--set KEY=VALUE` overrides (Note [Config override sources] in config_reader.h): checking the key and the value
// of one, parsing the value as YAML, and writing it into the config's tree, creating sections on the way, or, for
// `--set key=null`, removing the key. The document records each override, for the messages that name it as a
// value's source and for the choice-switch rule (config_keys.cpp).
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "core/config_internal.h"

namespace ht::config_detail {

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

}  // namespace ht::config_detail
