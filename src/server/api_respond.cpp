// Respond (api_internal.h): Api::Generation, a generation request's answer filled from the engine's token
// callbacks, streamed (server-sent events) or answered whole.
#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "server/api_internal.h"

namespace kiln::server {

namespace api_detail {

std::string finish_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "abort";
    default: return "error";
  }
}

json usage_json(int64_t prompt, int64_t completion, int64_t cached) {
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

std::vector<int> token_bytes(const std::string& s) {
  std::vector<int> b;
  for (const char c : s) b.push_back(static_cast<unsigned char>(c));
  return b;
}

// Characters (code points) of UTF-8 text, as text_offset counts them: every byte but continuation bytes.
int64_t utf8_chars(const std::string& s) {
  return std::count_if(s.begin(), s.end(),
                       [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

std::string tool_call_id(ToolCallFormat format) {
  static constexpr std::string_view kAlnum = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  thread_local std::mt19937_64 rng(std::random_device{}());
  // Mistral's template takes ids of exactly 9 letters and digits.
  const bool mistral = format == ToolCallFormat::mistral;
  std::string id = mistral ? "" : "call_";
  for (int k = 0; k < (mistral ? 9 : 24); ++k) id += kAlnum[rng() % kAlnum.size()];
  return id;
}

}  // namespace api_detail

using api_detail::dump;
using api_detail::error_response;
using api_detail::finish_name;
using api_detail::json_response;
using api_detail::token_bytes;
using api_detail::usage_json;
using api_detail::utf8_chars;

json Api::Generation::chunk_base() const {
  return {{"id", id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model}};
}

void Api::Generation::emit(std::string chunk) {  // under mu
  if (started) {
    ex->send(std::move(chunk));
  } else {
    pending.push_back(std::move(chunk));
  }
}

void Api::Generation::emit_json(json j) {
  if (include_usage) j["usage"] = nullptr;
  emit("data: " + dump(j) + "\n\n");
}

void Api::Generation::leave_queue(size_t i) {
  if (choices[i].queued > 0) queue_counter->fetch_sub(std::exchange(choices[i].queued, 0));
}

void Api::Generation::on_event(size_t i, const TokenEvent& ev) {
  std::lock_guard<std::mutex> lock(mu);
  leave_queue(i);  // admitted before its first event, or ended unadmitted
  if (failed) return;
  Choice& c = choices[i];
  const auto now = Clock::now();
  if (echo_logprobs && !c.echoed) {  // the first event (a one-token prompt has no scored tokens)
    c.echoed = true;
    json echoed = prompt_logprobs(ev, c);
    if (stream) {
      json j = chunk_base();
      j["choices"] =
          json::array({{{"index", i}, {"text", c.text}, {"logprobs", echoed}, {"finish_reason", nullptr}}});
      emit_json(std::move(j));
    }
  }
  json lp_entry;
  if (ev.token >= 0) {
    const std::chrono::duration<double> since = now - (c.first ? t0 : c.last);
    (c.first ? metrics->ttft : metrics->itl).observe(since.count());
    c.first = false;
    c.last = now;
    if (logprobs) lp_entry = logprob_entry(ev, c);
  }
  // The output as content and tool calls: all content unless the request's output is read for calls.
  std::vector<ToolCallEvent> events;
  if (c.tool_parser) {
    c.tool_parser->feed(ev.text, events);
    if (ev.done) c.tool_parser->finish(events);
  } else if (!ev.text.empty()) {
    events.push_back({ToolCallEvent::Kind::content, ev.text});
  }
  for (const ToolCallEvent& e : events) {
    switch (e.kind) {
      case ToolCallEvent::Kind::content: c.text += e.text; break;
      case ToolCallEvent::Kind::call:
        c.tool_calls.push_back({{"id", api_detail::tool_call_id(tool_format)},
                                {"type", "function"},
                                {"function", {{"name", e.text}, {"arguments", ""}}}});
        break;
      case ToolCallEvent::Kind::arguments:  // always after its call
        if (!c.tool_calls.empty()) {
          c.tool_calls.back()["function"]["arguments"] =
              c.tool_calls.back()["function"]["arguments"].get<std::string>() + e.text;
        }
        break;
    }
  }
  if (stream && chat) {
    stream_chat(i, c, events, std::move(lp_entry));
  } else if (stream && (!ev.text.empty() || !lp_entry.is_null())) {
    json j = chunk_base();
    json choice = {{"index", i}, {"text", ev.text}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (!lp_entry.is_null()) choice["logprobs"] = lp_entry;
    j["choices"] = json::array({choice});
    emit_json(std::move(j));
  }
  if (!ev.done) return;
  c.finish = finish_name(ev.finish);
  c.error = ev.error;
  c.stats = ev.stats;
  metrics->count_finished(c.finish);  // the engine's reason, as vLLM counts them
  if (ev.finish == FinishReason::stop && !c.tool_calls.empty()) c.finish = "tool_calls";
  metrics->queue.observe(ev.stats.queue_ms / 1000.0);
  if (ev.stats.n_generated > 0) {
    metrics->prefill.observe(ev.stats.prefill_ms / 1000.0);
    metrics->decode.observe(ev.stats.decode_ms / 1000.0);
  }
  if (ev.finish == FinishReason::stop || ev.finish == FinishReason::length) {
    metrics->e2e.observe(std::chrono::duration<double>(now - t0).count());
  }
  if (stream && ev.finish != FinishReason::error) {
    json j = chunk_base();
    json choice = {{"index", i}, {"logprobs", nullptr}, {"finish_reason", c.finish}};
    choice[chat ? "delta" : "text"] = chat ? json::object() : json("");
    j["choices"] = json::array({choice});
    emit_json(std::move(j));
  }
  if (--remaining == 0) finish_all();
}

void Api::Generation::stream_chat(size_t i, Choice& c, const std::vector<ToolCallEvent>& events,
                                  json lp_entry) {
  // The events' calls are in c.tool_calls already: the first of them at index `call`.
  auto call = static_cast<int64_t>(c.tool_calls.size()) -
              std::count_if(events.begin(), events.end(),
                            [](const ToolCallEvent& e) { return e.kind == ToolCallEvent::Kind::call; });
  std::vector<json> deltas;
  for (const ToolCallEvent& e : events) {
    switch (e.kind) {
      case ToolCallEvent::Kind::content: deltas.push_back({{"content", e.text}}); break;
      case ToolCallEvent::Kind::call: {
        const json& call_id = c.tool_calls[static_cast<size_t>(call)]["id"];
        deltas.push_back(
            {{"tool_calls", json::array({{{"index", call},
                                          {"id", call_id},
                                          {"type", "function"},
                                          {"function", {{"name", e.text}, {"arguments", ""}}}}})}});
        ++call;
        break;
      }
      case ToolCallEvent::Kind::arguments:
        deltas.push_back(
            {{"tool_calls", json::array({{{"index", call - 1}, {"function", {{"arguments", e.text}}}}})}});
        break;
    }
  }
  if (deltas.empty() && (!lp_entry.is_null() || !c.role_sent)) deltas.push_back({{"content", ""}});
  for (json& delta : deltas) {
    if (!c.role_sent) delta["role"] = "assistant";
    c.role_sent = true;
    json j = chunk_base();
    json choice = {
        {"index", i}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (!lp_entry.is_null()) choice["logprobs"] = {{"content", json::array({std::move(lp_entry)})}};
    lp_entry = nullptr;
    j["choices"] = json::array({std::move(choice)});
    emit_json(std::move(j));
  }
}

json Api::Generation::logprob_entry(const TokenEvent& ev, Choice& c) const {
  const auto piece = [&](int32_t t) {
    auto s = engine->detokenize({t});
    return s.ok() ? *s : std::string();
  };
  const std::string tok = piece(ev.token);
  if (chat) {
    json top = json::array();
    for (const TokenLogprob& t : ev.top) {
      const std::string s = piece(t.token);
      top.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", token_bytes(s)}});
    }
    json e = {{"token", tok}, {"logprob", ev.logprob}, {"bytes", token_bytes(tok)}, {"top_logprobs", top}};
    c.lp.push_back(e);
    return e;
  }
  json top = json::object();
  for (const TokenLogprob& t : ev.top) top[piece(t.token)] = t.logprob;
  const int64_t offset = c.n_chars;
  c.n_chars += utf8_chars(tok);
  c.lp_tokens.push_back(tok);
  c.lp_values.push_back(ev.logprob);
  c.lp_top.push_back(top);
  c.lp_offsets.push_back(offset);
  return {{"tokens", {tok}},
          {"token_logprobs", {ev.logprob}},
          {"top_logprobs", {top}},
          {"text_offset", {offset}}};
}

// echo with logprobs: the prompt's tokens lead the choice's logprobs, the first one unscored (null), as
// OpenAI's legacy completions give them. Returns them as one logprobs object (a stream's echo chunk).
json Api::Generation::prompt_logprobs(const TokenEvent& ev, Choice& c) const {
  const auto piece = [&](int32_t t) {
    auto s = engine->detokenize({t});
    return s.ok() ? *s : std::string();
  };
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  const auto add = [&](const std::string& tok, json value, json top) {
    offsets.push_back(c.n_chars);
    c.n_chars += utf8_chars(tok);
    tokens.push_back(tok);
    values.push_back(std::move(value));
    tops.push_back(std::move(top));
  };
  add(piece(prompts[c.prompt].front()), nullptr, nullptr);
  for (const PromptLogprob& lp : ev.prompt_logprobs) {
    json top = json::object();
    for (const TokenLogprob& t : lp.top) top[piece(t.token)] = t.logprob;
    add(piece(lp.token), lp.logprob, std::move(top));
  }
  for (size_t k = 0; k < tokens.size(); ++k) {
    c.lp_tokens.push_back(tokens[k]);
    c.lp_values.push_back(values[k]);
    c.lp_top.push_back(tops[k]);
    c.lp_offsets.push_back(offsets[k]);
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json Api::Generation::usage() const {
  int64_t prompt = 0, cached = 0, completion = 0;
  std::vector<bool> seen;
  for (const Choice& c : choices) {
    completion += c.stats.n_generated;
    if (seen.size() <= c.prompt) seen.resize(c.prompt + 1);
    if (!seen[c.prompt]) {  // n choices of one prompt count it once
      seen[c.prompt] = true;
      prompt += c.stats.n_prompt;
      cached += c.stats.n_cached;
    }
  }
  return usage_json(prompt, completion, cached);
}

void Api::Generation::finish_all() {  // under mu
  in_flight->fetch_sub(1);
  const Choice* err = nullptr;
  for (const Choice& c : choices) {
    if (c.finish == "error") err = &c;
  }
  if (stream) {
    if (err != nullptr) {
      emit(
          "data: " +
          dump(json{
              {"error",
               {{"message", err->error}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}}) +
          "\n\n");
    } else if (include_usage) {
      json j = chunk_base();
      j["choices"] = json::array();
      j["usage"] = usage();
      emit("data: " + dump(j) + "\n\n");
    }
    emit("data: [DONE]\n\n");
    if (started) ex->end_stream();
    return;
  }
  if (err != nullptr) {
    // A request that waited past --queue-timeout: the server was too busy (503, Retry-After), not broken.
    ex->respond(error_response(
        err->stats.timed_out ? api_detail::ApiError{503, err->error, "unavailable_error", "", "queue_timeout"}
                             : api_detail::ApiError{500, err->error, "server_error", "", ""}));
    return;
  }
  json out = {{"id", id},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"created", created},
              {"model", model}};
  json cs = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const Choice& c = choices[i];
    json choice = {{"index", i}, {"finish_reason", c.finish}, {"logprobs", nullptr}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      if (!c.tool_calls.empty()) {
        if (c.text.empty()) choice["message"]["content"] = nullptr;
        choice["message"]["tool_calls"] = c.tool_calls;
      }
      if (logprobs) choice["logprobs"] = {{"content", c.lp}};
    } else {
      choice["text"] = c.text;
      if (logprobs) {
        choice["logprobs"] = {{"tokens", c.lp_tokens},
                              {"token_logprobs", c.lp_values},
                              {"top_logprobs", c.lp_top},
                              {"text_offset", c.lp_offsets}};
      }
    }
    cs.push_back(choice);
  }
  out["choices"] = cs;
  out["usage"] = usage();
  ex->respond(json_response(out));
}

}  // namespace kiln::server
