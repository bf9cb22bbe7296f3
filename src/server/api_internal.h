// What the parts of the OpenAI-compatible API (api.cpp) share: its error shape and JSON helpers, a parsed
// generation request, and the generation a request becomes. A request goes parse (api_parse.cpp: the body
// field by field into a Parsed, prompts tokenized) -> validate (the context) -> submit (api.cpp: one engine
// request a choice) -> respond (api_respond.cpp: Api::Generation, from the engine's token callbacks).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/api.h"
#include "server/tool_calls.h"

namespace kiln::server {

namespace api_detail {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// An answer that is not a success: OpenAI's error shape, with the HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the request field at fault, if one is
  std::string code;
};

// The JSON text of `j` (invalid UTF-8 replaced).
std::string dump(const json& j);
// `e` as an HTTP response: OpenAI's error shape (503 with Retry-After, 401 with WWW-Authenticate).
HttpResponse error_response(const ApiError& e);
// A 400 naming the request field `param`.
ApiError bad(const std::string& param, std::string message);
HttpResponse json_response(const json& j);
// body[key], or null when absent or null.
const json* field(const json& body, const char* key);
// Readers of optional fields: nothing when absent or null; an error naming the field when present and wrong.
std::optional<ApiError> read_bool(const json& body, const char* key, bool& out);
std::optional<ApiError> read_messages(const json& body, std::vector<ChatMessage>& out);
// A message's name, an assistant's tool_calls (arguments checked to be JSON objects), a tool's tool_call_id
// (api_tools.cpp).
std::optional<ApiError> read_message_tool_fields(const json& m, size_t i, ChatMessage& cm);
// The request body as a JSON object.
std::optional<ApiError> parse_body(const std::string& body, json& out);

// A parsed generation request: everything but the engine's answer.
struct Parsed {
  Request base;                               // sampling; the prompt is set per prompt below
  std::vector<std::vector<int32_t>> prompts;  // tokenized, one choice group each
  std::vector<std::string> prompt_texts;      // for echo
  int64_t n = 1;
  bool stream = false, include_usage = false, logprobs = false, echo = false;
  int64_t top_logprobs = 0;
  bool seeded = false;
  int64_t max_tokens = -1;  // the completion's length limit; -1: the rest of the context
  // Tool calling (chat): the functions the template shows, and how the output is read for calls (format
  // none: it is not; tool_choice "none" and requests without tools).
  std::vector<ToolDefinition> tools;
  ToolCallFormat tool_format = ToolCallFormat::none;
  std::vector<std::string> tool_names;
  int32_t max_tool_calls = 0;
  std::string prompt_suffix;  // a forced call's opening control token (forced_call_prefix), after the chat
};

// The structured-output fields of `body` (response_format; llama.cpp's grammar, json_schema; vLLM's
// structured_outputs, guided_json, guided_regex, guided_choice, guided_grammar) into p.base.constraint,
// compiled through the engine's cache. At most one may be given; any error is a 400 naming its field
// (api_structured.cpp).
std::optional<ApiError> read_constraint(const json& body, Engine& engine, Parsed& p);

// tools, tool_choice and parallel_tool_calls of a chat request `body` (its text: `body_text`) into `p`: the
// tools; for auto, required or a function, the format its output is parsed in; for required or a function, a
// grammar (p.base.constraint) that makes the model call. Call after the constraint of response_format is
// read.
// tools alone (what /tokenize renders).
std::optional<ApiError> read_tool_definitions(const std::string& body_text, const json& body,
                                              std::vector<ToolDefinition>& out);
std::optional<ApiError> read_tools(const std::string& body_text, const json& body,
                                   const ModelDescription& model, Parsed& p);

// Parse: a /v1/chat/completions (chat) or /v1/completions body into `p`, field by field, its prompts rendered
// and tokenized by `engine`; the first error, naming its field.
std::optional<ApiError> parse_completion(const std::string& body, bool chat, Engine& engine,
                                         const std::string& model_name, Parsed& p);
// Validate: every prompt and its completion fit the model's context.
std::optional<ApiError> validate_completion(const Parsed& p, const ModelDescription& model, bool chat);

// OpenAI's name of a finish reason.
std::string finish_name(FinishReason r);
json usage_json(int64_t prompt, int64_t completion, int64_t cached);
std::vector<int> token_bytes(const std::string& s);
// Characters (code points) of UTF-8 text, as text_offset counts them: every byte but continuation bytes.
int64_t utf8_chars(const std::string& s);
// A new tool call's id: "call_" and 24 letters and digits (Mistral's format: 9 letters and digits).
std::string tool_call_id(ToolCallFormat format);

}  // namespace api_detail

using api_detail::Clock;
using api_detail::json;

// One generation request's answer: its choices as the engine's callbacks fill them (on its delivery thread),
// streamed or answered whole. Every call on the exchange is made under mu, so they reach it in order.
struct Api::Generation {
  struct Choice {
    size_t prompt = 0;  // which prompt
    std::string text;
    json lp = json::array();  // chat: logprobs.content entries
    json lp_tokens = json::array(), lp_values = json::array(), lp_top = json::array();  // completions
    json lp_offsets = json::array();  // completions: each token's offset in the text, in characters
    int64_t n_chars = 0;              // characters of the text that the logprobs cover so far
    std::string finish;
    std::string error;
    int64_t queued = 0;  // its part of the Generation's queue charge, until admitted or ended
    RequestStats stats;
    bool first = true, role_sent = false, echoed = false;
    Clock::time_point last;
    std::optional<ToolCallParser> tool_parser;  // chat with tools: the output read for calls
    json tool_calls = json::array();            // [{id, type, function: {name, arguments}}] so far
  };
  std::shared_ptr<Exchange> ex;
  std::shared_ptr<ServerMetrics> metrics;
  std::shared_ptr<std::atomic<int64_t>> in_flight;
  // The server's queue charge (Api's queued_tokens_, queued_charge), to which each choice adds its part
  // (Choice::queued) until the engine admits it or it ends unadmitted.
  std::shared_ptr<std::atomic<int64_t>> queue_counter;
  Engine* engine = nullptr;
  bool chat = false, stream = false, include_usage = false, logprobs = false;
  bool echo_logprobs = false;  // completions with echo and logprobs: the prompt comes scored, first event
  ToolCallFormat tool_format = ToolCallFormat::none;  // Parsed's: each choice's tool_parser
  std::vector<std::vector<int32_t>> prompts;
  int64_t top_logprobs = 0;
  std::string id, model;
  int64_t created = 0;
  Clock::time_point t0;
  std::mutex mu;
  std::vector<Choice> choices;
  std::vector<uint64_t> ids;
  size_t remaining = 0;
  bool started = false;              // stream: the head is sent; before that, chunks wait in `pending`
  bool failed = false;               // answered with an error already: events are dropped
  std::vector<std::string> pending;  // stream chunks made before `started`

  json chunk_base() const;
  void emit(std::string chunk);  // under mu
  void emit_json(json j);
  void on_event(size_t i, const TokenEvent& ev);
  void leave_queue(size_t i);  // under mu: choice i's charge off queue_counter
  // A chat choice's stream chunks for one event: its content and tool call deltas (the first with the role,
  // and the token's logprobs entry when there is one).
  void stream_chat(size_t i, Choice& c, const std::vector<ToolCallEvent>& events, json lp_entry);
  json logprob_entry(const TokenEvent& ev, Choice& c) const;
  // echo with logprobs: the prompt's tokens lead the choice's logprobs, the first one unscored (null), as
  // OpenAI's legacy completions give them. Returns them as one logprobs object (a stream's echo chunk).
  json prompt_logprobs(const TokenEvent& ev, Choice& c) const;
  json usage() const;
  void finish_all();  // under mu
};

}  // namespace kiln::server
