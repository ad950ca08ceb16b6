// Chat templates on the real Llama tokenizers: hand-checked id sequences and response flags for both
// formats, the ids of transformers.js's apply_chat_template with the Llama-3 tokenizer_config.json template
// (tests/fixtures/tokenizer_ids.json), equality with encoding the rendered text in one piece, and errors for
// conversations a format cannot hold.
#include "hadatrain/data/chat_template.h"
#include "test_tokenizer_support.h"

using namespace ht::data;
using tk_test::llama2;
using tk_test::llama3;
using V = std::vector<int32_t>;
using F = std::vector<uint8_t>;

TEST_CASE("chat llama3: a hand-checked conversation", "[tokenizer][chat]") {
  if (!tk_test::engines_built()) return;
  const std::vector<ChatMessage> chat{{"user", "Hi"}, {"assistant", " Hello!\n"}};
  const ChatTokens t = apply_chat_template(llama3(), chat, {.format = ChatFormat::llama3});
  // <|begin_of_text|> <|start_header_id|> "user" <|end_header_id|> "\n\n" "Hi" <|eot_id|>
  // <|start_header_id|> "assistant" <|end_header_id|> "\n\n" "Hello" "!" <|eot_id|>   (content trimmed)
  CHECK(t.ids == V{128000, 128006, 882, 128007, 271, 13347, 128009, 128006, 78191, 128007, 271, 9906, 0, 128009});
  CHECK(t.is_response == F{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1});
  CHECK(llama3().decode(t.ids) ==
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>");

  const ChatTokens g = apply_chat_template(llama3(), std::span(chat).first(1),
                                           {.format = ChatFormat::llama3, .add_bos = false, .add_generation_prompt = true});
  CHECK(g.ids == V{128006, 882, 128007, 271, 13347, 128009, 128006, 78191, 128007, 271});
  CHECK(g.is_response == F(10, 0));
}

TEST_CASE("chat llama3: ids equal transformers.js apply_chat_template and one-piece encoding", "[tokenizer][chat]") {
  if (!tk_test::engines_built()) return;
  const auto& chats = tk_test::reference().at("chats");
  REQUIRE(chats.size() >= 2);
  for (const auto& c : chats) {
    std::vector<ChatMessage> messages;
    std::string rendered = "<|begin_of_text|>";
    for (const auto& m : c.at("messages")) {
      messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
      std::string content = messages.back().content;
      content.erase(0, content.find_first_not_of(" \n"));
      content.erase(content.find_last_not_of(" \n") + 1);
      rendered += "<|start_header_id|>" + messages.back().role + "<|end_header_id|>\n\n" + content + "<|eot_id|>";
    }
    rendered += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    const ChatTokens t = apply_chat_template(llama3(), messages, {.format = ChatFormat::llama3, .add_generation_prompt = true});
    CHECK(t.ids == c.at("llama3").get<V>());
    CHECK(t.ids == llama3().encode(rendered, true));
    REQUIRE(t.is_response.size() == t.ids.size());
    // The flagged tokens decode to the assistant contents, each followed by <|eot_id|>.
    std::string flagged;
    for (size_t i = 0; i < t.ids.size(); ++i)
      if (t.is_response[i]) flagged += llama3().decode(std::span(&t.ids[i], 1));
    std::string want;
    for (const auto& m : messages) {
      if (m.role != "assistant") continue;
      std::string content = m.content;
      content.erase(0, content.find_first_not_of(" \n"));
      content.erase(content.find_last_not_of(" \n") + 1);
      want += content + "<|eot_id|>";
    }
    CHECK(flagged == want);
  }
}

TEST_CASE("chat llama2: a hand-checked conversation and one-piece encoding", "[tokenizer][chat]") {
  if (!tk_test::engines_built()) return;
  const std::vector<ChatMessage> chat{{"user", "Hi"}, {"assistant", "Hello!"}};
  const ChatTokens t = apply_chat_template(llama2(), chat, {.format = ChatFormat::llama2});
  // <s> "▁[" "INST" "]" "▁Hi" "▁[" "/" "INST" "]" "▁Hello" "!" "▁" </s>   (spm_encode gives the same pieces)
  CHECK(t.ids == V{1, 518, 25580, 29962, 6324, 518, 29914, 25580, 29962, 15043, 29991, 29871, 2});
  CHECK(t.is_response == F{0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1});

  // A system prompt and two turns: the ids equal encoding Meta's layout per turn in one piece.
  const std::vector<ChatMessage> longer{{"system", "Be brief."},
                                        {"user", "Name a whale."},
                                        {"assistant", "The sperm whale, Moby Dick."},
                                        {"user", "And a ship?"},
                                        {"assistant", "The Pequod."}};
  const ChatTokens l = apply_chat_template(llama2(), longer, {.format = ChatFormat::llama2});
  V want{1};
  for (int32_t id : llama2().encode("[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nName a whale. [/INST] The sperm whale, Moby Dick. "))
    want.push_back(id);
  want.push_back(2);
  want.push_back(1);
  for (int32_t id : llama2().encode("[INST] And a ship? [/INST] The Pequod. ")) want.push_back(id);
  want.push_back(2);
  CHECK(l.ids == want);
  CHECK(l.ids == llama2().encode("<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nName a whale. [/INST] The sperm whale, "
                                 "Moby Dick. </s><s>[INST] And a ship? [/INST] The Pequod. </s>", true));
  V flagged;  // the answers' tokens and their </s>
  for (size_t i = 0; i < l.ids.size(); ++i)
    if (l.is_response[i]) flagged.push_back(l.ids[i]);
  V answers = llama2().encode("The sperm whale, Moby Dick. ");
  answers.push_back(2);
  for (int32_t id : llama2().encode("The Pequod. ")) answers.push_back(id);
  answers.push_back(2);
  CHECK(flagged == answers);
}

TEST_CASE("chat: formats, defaults and conversations a format cannot hold", "[tokenizer][chat]") {
  if (!tk_test::engines_built()) return;
  CHECK(default_chat_format(llama3()) == ChatFormat::llama3);
  CHECK(default_chat_format(llama2()) == ChatFormat::llama2);
  CHECK(parse_chat_format("llama2") == ChatFormat::llama2);
  CHECK_THROWS_WITH(parse_chat_format("chatml"), HasSubstr("unknown chat format 'chatml'"));
  const std::vector<ChatMessage> wrong{{"assistant", "Hi"}};
  CHECK_THROWS_WITH(apply_chat_template(llama2(), wrong, {.format = ChatFormat::llama2}),
                    HasSubstr("message 0 has role 'assistant', expected 'user'"));
  const std::vector<ChatMessage> done{{"user", "Hi"}, {"assistant", "Hello"}};
  CHECK_THROWS_WITH(apply_chat_template(llama2(), done, {.format = ChatFormat::llama2, .add_generation_prompt = true}),
                    HasSubstr("ends with a user message"));
  CHECK_THROWS_WITH(apply_chat_template(llama2(), done, {.format = ChatFormat::llama3}),
                    HasSubstr("has no <|start_header_id|> token"));
  CHECK_THROWS_WITH(apply_chat_template(llama3(), std::vector<ChatMessage>{}, {}), HasSubstr("no messages"));
}

TEST_CASE("chat: the tokens that end an assistant turn (generate --chat stops there)", "[tokenizer][chat]") {
  if (!tk_test::engines_built()) return;
  CHECK(chat_stop_ids(llama3(), ChatFormat::llama3) == V{128009});  // <|eot_id|>, not <|end_of_text|> (128001)
  CHECK(chat_stop_ids(llama2(), ChatFormat::llama2) == V{2});       // </s>
  CHECK_THROWS_WITH(chat_stop_ids(llama2(), ChatFormat::llama3), HasSubstr("has no <|eot_id|> token"));
}
