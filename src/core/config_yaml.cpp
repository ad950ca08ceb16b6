// The config reader's YAML diagnostics and error form. YAML text becomes a tree here, with what yaml-cpp 0.7 lets
// through or hangs on found first (control characters, [ ] / { } nested too deep, tokens it stalls on) and its
// errors said in a config's terms (a tab in the indentation, indentation hints, a second document), each at
// file:line:column. Every config error gets its form here too: where it points, a file position or the --set
// behind the value (Note [Config override sources] in config_reader.h), and its text made printable.
#include <cstddef>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>
#include <yaml-cpp/yaml.h>

#include "core/config_internal.h"

namespace ht::config_detail {

// --- the text of messages ---

namespace {

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

}  // namespace

// Every error of the config reader goes through here.
Error config_error(const std::string& msg) { return Error(printable(msg)); }

// --- what is found before parsing ---

// YAML allows no C0 control character but tab, line feed and carriage return, and no DEL (YAML 1.2, 5.1);
// yaml-cpp 0.7 does not reject them, so they are found before parsing. The first one's byte and 1-based line and
// column, if any.
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

namespace {

// Whether a quote character starts a quoted scalar: only where a scalar can start (after the start of a line or
// one of ':', ',', '[', '{', '-', '?' and spaces); elsewhere ("ab\"c") it is part of a plain scalar.
bool opens_quote(char last_significant) {
  return last_significant == '\n' || last_significant == ':' || last_significant == ',' || last_significant == '[' ||
         last_significant == '{' || last_significant == '-' || last_significant == '?';
}

}  // namespace

// yaml-cpp 0.7 takes time exponential in the nesting depth of flow collections ("{{{{{{{{{{{{{{{{{{{{" does
// not return in minutes), so a text whose [ ] / { } nest deeper than kMaxFlowDepth outside quotes is refused
// before parsing (a config needs two or three levels). The 1-based line and column of the first bracket past
// the limit, if any.
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

namespace {

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

}  // namespace

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

// --- parsing ---

namespace {

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

}  // namespace

// The one document of a config text: `yaml` parsed by yaml-cpp after the checks above, every error located.
YAML::Node parse_yaml_text(const std::string& yaml, const std::string& source_name) {
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
  return root;
}

// --- where an error points ---

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

}  // namespace ht::config_detail
