// Chat / instruction JSONL: parsing, tokenising through the chat template in parallel, and rows with the loss
// on assistant responses only (padded one example per row, or packed).
#include "hadatrain/data/text_chat.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "hadatrain/core/digest.h"
#include "hadatrain/core/error.h"
#include "hadatrain/core/logging.h"

namespace ht::data {

// Note [Chat rows]
// Example e has ids x[0..L) and flags r[0..L) (r = 1 on assistant response tokens, chat_template.h). A row's
// input is x[s .. s+T) and its label at t is x[s+t+1] where r[s+t+1] = 1, else kIgnoreIndex: the model is
// scored on predicting each response token (including the response's end-of-turn token, so it learns to stop)
// from everything before it, and never on the prompt. pad: s = 0 and the row is one example, padded with
// pad_id() after x[L-1] (labels kIgnoreIndex there; padding at the end cannot affect earlier positions under
// causal attention); an example longer than T + 1 tokens is truncated. pack: the examples are concatenated
// into one stream and window w starts at s = w*T, exactly like Note [Packing] in text_dataset.cpp; the rows are
// the windows with a response token among their labels, in order (a window inside prompts is left out).

namespace {

std::string string_field(const nlohmann::json& obj, const char* key, const std::string& where, bool required) {
  const auto it = obj.find(key);
  if (it == obj.end()) {
    HT_CHECK(!required, "{}: the example has no \"{}\"", where, key);
    return "";
  }
  HT_CHECK(it->is_string(), "{}: \"{}\" must be a string, got {}", where, key, it->type_name());
  return it->get<std::string>();
}

}  // namespace

std::vector<ChatMessage> parse_chat_line(std::string_view line, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::parse_error& e) {
    HT_FAIL("{}: not valid JSON ({})", where, e.what());
  }
  HT_CHECK(j.is_object(), "{}: expected a JSON object, got {}", where, j.type_name());
  std::vector<ChatMessage> out;
  if (j.contains("messages")) {
    const auto& m = j["messages"];
    HT_CHECK(m.is_array() && !m.empty(), "{}: \"messages\" must be a non-empty array", where);
    for (std::size_t i = 0; i < m.size(); ++i) {
      const std::string at = fmt::format("{}: messages[{}]", where, i);
      HT_CHECK(m[i].is_object(), "{}: expected an object with \"role\" and \"content\", got {}", at, m[i].type_name());
      out.push_back({string_field(m[i], "role", at, true), string_field(m[i], "content", at, true)});
    }
  } else if (j.contains("instruction") || j.contains("output")) {
    const std::string instruction = string_field(j, "instruction", where, true);
    const std::string input = string_field(j, "input", where, false);
    out.push_back({"user", input.empty() ? instruction : instruction + "\n\n" + input});
    out.push_back({"assistant", string_field(j, "output", where, true)});
  } else {
    HT_FAIL("{}: expected {{\"messages\": [...]}} or {{\"instruction\", \"input\", \"output\"}}", where);
  }
  HT_CHECK(std::any_of(out.begin(), out.end(), [](const ChatMessage& m) { return m.role == "assistant"; }),
           "{}: the conversation has no assistant message, so nothing to learn from", where);
  return out;
}

int32_t pad_id(const Tokenizer& tok) {
  if (auto p = tok.token_to_id("<pad>")) return *p;
  if (auto e = tok.eos_id()) return *e;
  return 0;
}

ChatDataset::ChatDataset(const std::vector<std::filesystem::path>& files, const Tokenizer& tok, ChatDataOptions opts)
    : opts_(opts), pad_(pad_id(tok)) {
  HT_CHECK(opts_.seq_len >= 1, "chat data: seq_len must be >= 1, got {}", opts_.seq_len);
  HT_CHECK(!files.empty(), "chat data: no JSONL files");
  std::vector<std::vector<ChatMessage>> chats;
  for (const auto& f : files) {
    std::ifstream in(f);
    HT_CHECK(in.good(), "chat data: cannot open {}", f.string());
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      where_.push_back(fmt::format("{}:{}", f.string(), n));
      chats.push_back(parse_chat_line(line, where_.back()));
    }
    HT_CHECK(!in.bad(), "chat data: error reading {}", f.string());
  }
  HT_CHECK(!chats.empty(), "chat data: the JSONL files ({} first) hold no example", files.front().string());

  ChatTemplateOptions t;
  t.format = opts_.format ? *opts_.format : default_chat_format(tok);
  std::vector<ChatTokens> toks(chats.size());
  std::vector<std::exception_ptr> errors(chats.size());
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next++; i < chats.size(); i = next++) {
      try {
        toks[i] = apply_chat_template(tok, chats[i], t);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const int hw = static_cast<int>(std::min(16u, std::max(1u, std::thread::hardware_concurrency())));
  const int threads = static_cast<int>(std::min<std::size_t>(opts_.num_threads > 0 ? opts_.num_threads : hw, chats.size()));
  std::vector<std::thread> pool;
  for (int k = 1; k < threads; ++k) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();

  const int64_t T = opts_.seq_len;
  starts_.push_back(0);
  int64_t no_loss = 0;
  for (std::size_t e = 0; e < chats.size(); ++e) {
    if (errors[e]) {
      try {
        std::rethrow_exception(errors[e]);
      } catch (const std::exception& ex) {
        HT_FAIL("{}: {}", where_[e], ex.what());
      }
    }
    const ChatTokens& c = toks[e];
    HT_ASSERT(c.ids.size() == c.is_response.size(), "{}: chat template gave {} ids and {} flags", where_[e],
              c.ids.size(), c.is_response.size());
    for (int32_t id : c.ids)
      HT_CHECK(id >= 0 && id < tok.vocab_size(), "{}: token id {} is outside the tokenizer's vocabulary of size {}",
               where_[e], id, tok.vocab_size());
    ids_.insert(ids_.end(), c.ids.begin(), c.ids.end());
    response_.insert(response_.end(), c.is_response.begin(), c.is_response.end());
    starts_.push_back(static_cast<int64_t>(ids_.size()));
    if (opts_.layout == ChatLayout::pad) {
      const auto L = static_cast<int64_t>(c.ids.size());
      if (L > T + 1) ++truncated_;
      // A row has a loss when some response flag lies in x[1 .. min(L, T+1)) (Note [Chat rows]).
      const auto end = c.is_response.begin() + std::min(L, T + 1);
      if (L > 1 && std::find(c.is_response.begin() + 1, end, uint8_t{1}) != end)
        row_example_.push_back(static_cast<int64_t>(e));
      else
        ++no_loss;
    }
  }
  if (opts_.layout == ChatLayout::pad) {
    rows_ = static_cast<int64_t>(row_example_.size());
    if (truncated_ > 0)
      logging::warn("chat data: {} of {} examples are longer than seq_len + 1 = {} tokens and are truncated", truncated_,
                    chats.size(), T + 1);
    if (no_loss > 0)
      logging::warn("chat data: {} of {} examples have no response token within seq_len + 1 = {} tokens and are left "
                    "out",
                    no_loss, chats.size(), T + 1);
    HT_CHECK(rows_ > 0, "chat data: no example of {} has a response token within seq_len + 1 = {} tokens",
             files.front().string(), T + 1);
  } else {
    const auto total = static_cast<int64_t>(ids_.size());
    const int64_t windows = total > T ? (total - 1) / T : 0;
    HT_CHECK(windows > 0, "chat data: the examples hold {} tokens, fewer than one window of seq_len + 1 = {}", total,
             T + 1);
    // Window w's labels are the stream positions w*T + 1 ... w*T + T (all inside the stream: w*T + T <= total - 1).
    for (int64_t w = 0; w < windows; ++w) {
      const auto first = response_.begin() + w * T + 1;
      if (std::find(first, first + T, uint8_t{1}) != first + T) row_window_.push_back(w);
    }
    rows_ = static_cast<int64_t>(row_window_.size());
    if (rows_ < windows)
      logging::warn("chat data: {} of {} packed windows of seq_len = {} tokens lie inside prompts (no response token) "
                    "and are left out",
                    windows - rows_, windows, T);
    HT_CHECK(rows_ > 0, "chat data: no packed window of {} holds a response token", files.front().string());
  }
}

std::size_t ChatDataset::example_at(int64_t pos) const {
  return static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin()) - 1;
}

void ChatDataset::get(int64_t i, int64_t* input_ids, int64_t* labels) const {
  HT_CHECK(i >= 0 && i < rows_, "chat data: row {} is outside [0, {})", i, rows_);
  const int64_t T = opts_.seq_len;
  int64_t s, L;  // first stream position of the row, and how many stream tokens it may read
  if (opts_.layout == ChatLayout::pad) {
    const auto e = static_cast<std::size_t>(row_example_[static_cast<std::size_t>(i)]);
    s = starts_[e];
    L = starts_[e + 1] - s;
  } else {
    s = row_window_[static_cast<std::size_t>(i)] * T;
    L = static_cast<int64_t>(ids_.size()) - s;
  }
  for (int64_t t = 0; t < T; ++t) {
    input_ids[t] = t < L ? ids_[static_cast<std::size_t>(s + t)] : pad_;
    labels[t] = t + 1 < L && response_[static_cast<std::size_t>(s + t + 1)] ? ids_[static_cast<std::size_t>(s + t + 1)]
                                                                            : kIgnoreIndex;
  }
}

std::string ChatDataset::describe(int64_t i) const {
  if (i < 0 || i >= rows_) return fmt::format("row {} (out of range)", i);
  if (opts_.layout == ChatLayout::pad) return fmt::format("example {}", where_[static_cast<std::size_t>(row_example_[static_cast<std::size_t>(i)])]);
  const int64_t w = row_window_[static_cast<std::size_t>(i)];
  return fmt::format("window {} (starting in example {})", w, where_[example_at(w * opts_.seq_len)]);
}

uint64_t ChatDataset::digest() const {
  Fnv1a h;
  h.add("chat\n").add_value(opts_.seq_len).add_value(opts_.layout).add_value(pad_);
  h.add_values(ids_).add_values(response_).add_values(starts_).add_values(row_example_).add_values(row_window_);
  return h.value();
}

void ChatDataset::check_vocab(int64_t vocab_size, const std::string& whose) const {
  HT_CHECK(pad_ < vocab_size, "chat data: the pad id {} is >= {} {}", pad_, whose, vocab_size);
  for (std::size_t k = 0; k < ids_.size(); ++k)
    HT_CHECK(ids_[k] < vocab_size, "{}: token id {} is >= {} {}: the model's vocabulary is smaller than the tokenizer's",
             where_[example_at(static_cast<int64_t>(k))], ids_[k], whose, vocab_size);
}

}  // namespace ht::data
