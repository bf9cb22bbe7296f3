// kiln bench serve: a load generator for an OpenAI-compatible server (kiln serve, or any other), after
// `vllm bench serve`. Requests arrive as a Poisson process (or a gamma one, --burstiness), at most
// --max-concurrency at once, each streaming a completion; every streamed event is timestamped. It reports
// request and token throughput, TTFT, TPOT, ITL and end-to-end latency (mean, median, p99), goodput under
// --goodput SLOs, and failures.
#include <fmt/format.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <semaphore>
#include <string>
#include <thread>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "kiln/status.h"

namespace kiln::cli {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BenchServeOptions {
  std::string base_url = "http://127.0.0.1:8080";
  std::string endpoint = "/v1/completions";
  std::string model;  // default: the first of /v1/models
  std::string api_key;
  int32_t num_prompts = 100;
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  int32_t max_concurrency = 0;
  std::string dataset = "random";
  std::string dataset_path;
  int32_t input_len = 256, output_len = 128;
  double range_ratio = 0.0;
  uint64_t seed = 0;
  std::vector<std::string> goodput;
  std::string output = "md";
  bool random_words = false;  // random prompts as English words (servers that take no token ids)
  std::string extra_body;     // a JSON object merged into every request
};

// Common English words: prompts any tokenizer reads as about one token a word.
constexpr const char* kWords[] = {
    "the",    "of",    "and",   "to",    "in",     "is",    "you",   "that",   "it",   "he",    "was",
    "for",    "on",    "are",   "as",    "with",   "his",   "they",  "at",     "be",   "this",  "have",
    "from",   "or",    "one",   "had",   "by",     "word",  "but",   "not",    "what", "all",   "were",
    "we",     "when",  "your",  "can",   "said",   "there", "use",   "an",     "each", "which", "she",
    "do",     "how",   "their", "if",    "will",   "up",    "other", "about",  "out",  "many",  "then",
    "them",   "these", "so",    "some",  "her",    "would", "make",  "like",   "him",  "into",  "time",
    "has",    "look",  "two",   "more",  "write",  "go",    "see",   "number", "no",   "way",   "could",
    "people", "my",    "than",  "first", "water",  "been",  "call",  "who",    "oil",  "its",   "now",
    "find",   "long",  "down",  "day",   "did",    "get",   "come",  "made",   "may",  "part",  "over",
    "new",    "sound", "take",  "only",  "little", "work",  "know",  "place",  "year"};

struct Url {
  std::string host, port;
};

Result<Url> parse_url(const std::string& url) {
  const std::string prefix = "http://";
  if (url.rfind(prefix, 0) != 0)
    return invalid_argument("--base-url {}: only http://HOST:PORT is supported", url);
  std::string rest = url.substr(prefix.size());
  if (const size_t slash = rest.find('/'); slash != std::string::npos) rest.resize(slash);
  const size_t colon = rest.rfind(':');
  if (rest.empty()) return invalid_argument("--base-url {}: no host", url);
  return colon == std::string::npos ? Url{rest, "80"} : Url{rest.substr(0, colon), rest.substr(colon + 1)};
}

// One HTTP/1.1 exchange on its own connection. For a stream, on_data gets the body's bytes as they arrive
// (de-chunked); the status and the whole body otherwise.
struct HttpResult {
  int status = 0;
  std::string body;
  std::string error;  // a connection failure
};

HttpResult http_call(const Url& url, const std::string& method, const std::string& path,
                     const std::string& body, const std::string& api_key,
                     const std::function<void(std::string_view)>& on_data = nullptr) {
  HttpResult r;
  try {
    asio::io_context ioc;
    tcp::resolver resolver(ioc);
    tcp::socket sock(ioc);
    asio::connect(sock, resolver.resolve(url.host, url.port));
    std::string req = method + " " + path + " HTTP/1.1\r\nHost: " + url.host + "\r\nConnection: close\r\n";
    if (!api_key.empty()) req += "Authorization: Bearer " + api_key + "\r\n";
    if (!body.empty()) {
      req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    }
    req += "\r\n" + body;
    asio::write(sock, asio::buffer(req));
    std::string in;
    size_t head_end = std::string::npos;
    bool chunked = false;
    size_t at = 0;  // the next unread byte of a chunked body
    char buf[16384];
    boost::system::error_code ec;
    for (;;) {
      const size_t n = sock.read_some(asio::buffer(buf), ec);
      if (n > 0) in.append(buf, n);
      if (head_end == std::string::npos) {
        head_end = in.find("\r\n\r\n");
        if (head_end != std::string::npos) {
          r.status = std::atoi(in.c_str() + in.find(' ') + 1);
          std::string head = in.substr(0, head_end);
          std::transform(head.begin(), head.end(), head.begin(),
                         [](unsigned char c) { return std::tolower(c); });
          chunked = head.find("transfer-encoding: chunked") != std::string::npos;
          at = head_end + 4;
        }
      }
      if (head_end != std::string::npos && chunked) {
        for (;;) {  // every complete chunk so far
          const size_t eol = in.find("\r\n", at);
          if (eol == std::string::npos) break;
          const size_t len = std::strtoul(in.c_str() + at, nullptr, 16);
          if (in.size() < eol + 2 + len + 2) break;
          const std::string_view data(in.data() + eol + 2, len);
          if (on_data) on_data(data);
          r.body.append(data);
          at = eol + 2 + len + 2;
          if (len == 0) return r;
        }
      }
      if (ec) break;
    }
    if (head_end == std::string::npos) {
      r.error = ec ? ec.message() : "no HTTP response";
    } else if (!chunked) {
      r.body = in.substr(head_end + 4);
      if (on_data) on_data(r.body);
    }
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

// The server's speculative-decoding counters from /metrics (kiln's or vLLM's names), zero where it has none.
struct SpecCounters {
  uint64_t drafts = 0, draft_tokens = 0, accepted = 0;
};
SpecCounters spec_counters(const Url& url, const std::string& api_key) {
  SpecCounters c;
  const HttpResult r = http_call(url, "GET", "/metrics", "", api_key);
  if (!r.error.empty() || r.status != 200) return c;
  size_t at = 0;
  while (at < r.body.size()) {
    const size_t end = std::min(r.body.find('\n', at), r.body.size());
    const std::string_view line(r.body.data() + at, end - at);
    at = end + 1;
    const size_t space = line.rfind(' ');
    if (line.empty() || line[0] == '#' || space == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, line.find_first_of("{ "));
    const auto value =
        static_cast<uint64_t>(std::strtod(std::string(line.substr(space + 1)).c_str(), nullptr));
    if (name.ends_with(":spec_decode_num_drafts_total")) c.drafts += value;
    if (name.ends_with(":spec_decode_num_draft_tokens_total")) c.draft_tokens += value;
    if (name.ends_with(":spec_decode_num_accepted_tokens_total")) c.accepted += value;
  }
  return c;
}

struct Prompt {
  json prompt;  // a string or token ids
  int32_t input_len = 0, output_len = 0;
};

struct Outcome {
  bool ok = false;
  std::string error;
  int32_t input_tokens = 0, output_tokens = 0;
  double ttft = 0, e2e = 0;  // seconds
  std::vector<double> itl;   // seconds between streamed events
};

Result<std::vector<Prompt>> make_prompts(const BenchServeOptions& o, const Url& url, std::mt19937_64& rng) {
  std::vector<Prompt> prompts;
  if (o.dataset == "random") {
    // Random token ids (from a range every common vocabulary holds) give exact input lengths, as vLLM does.
    std::uniform_int_distribution<int32_t> id(1000, 20000);
    const auto len = [&](int32_t n) {
      const auto lo = static_cast<int32_t>(std::floor(n * (1.0 - o.range_ratio)));
      const auto hi = static_cast<int32_t>(std::ceil(n * (1.0 + o.range_ratio)));
      return std::max(1, std::uniform_int_distribution<int32_t>(lo, hi)(rng));
    };
    for (int32_t i = 0; i < o.num_prompts; ++i) {
      Prompt p;
      p.input_len = len(o.input_len);
      p.output_len = len(o.output_len);
      p.prompt = json::array();
      for (int32_t t = 0; t < p.input_len; ++t) p.prompt.push_back(id(rng));
      if (o.random_words) {
        std::string text;
        std::uniform_int_distribution<size_t> word(0, std::size(kWords) - 1);
        for (int32_t t = 0; t < p.input_len; ++t) text += (t > 0 ? " " : "") + std::string(kWords[word(rng)]);
        p.prompt = text;
      } else if (o.endpoint == "/v1/chat/completions") {  // a message is text: the ids' text (/detokenize)
        const HttpResult r =
            http_call(url, "POST", "/detokenize", json{{"tokens", p.prompt}}.dump(), o.api_key);
        const json j = json::parse(r.body, nullptr, false);
        if (r.status != 200 || !j.is_object() || !j.contains("prompt")) {
          return make_status(StatusCode::io_error, "{}/detokenize answered {}: {}", o.base_url, r.status,
                             r.body);
        }
        p.prompt = j["prompt"];
      }
      prompts.push_back(std::move(p));
    }
    return prompts;
  }
  // ShareGPT: [{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}, ...]},
  // ...]; the first human turn is the prompt, the reply's length (by the server's /tokenize) the output
  // length.
  std::ifstream f(o.dataset_path);
  if (!f) return not_found("--dataset-path {}: cannot open it", o.dataset_path);
  const json data = json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!data.is_array())
    return invalid_argument("--dataset-path {}: not a JSON list of conversations", o.dataset_path);
  std::vector<size_t> order(data.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (const size_t i : order) {
    if (static_cast<int32_t>(prompts.size()) == o.num_prompts) break;
    const json& c = data[i].is_object() ? data[i].value("conversations", json()) : json();
    if (!c.is_array() || c.size() < 2 || !c[0].is_object() || !c[1].is_object()) continue;
    const json &q = c[0].value("value", json()), &a = c[1].value("value", json());
    if (!q.is_string() || !a.is_string()) continue;
    const auto count = [&](const std::string& text) -> int32_t {
      const HttpResult r = http_call(url, "POST", "/tokenize", json{{"prompt", text}}.dump(), o.api_key);
      const json j = json::parse(r.body, nullptr, false);
      return r.status == 200 && j.contains("count") ? j["count"].get<int32_t>() : -1;
    };
    Prompt p;
    p.prompt = q;
    p.input_len = count(q.get<std::string>());
    p.output_len = count(a.get<std::string>());
    if (p.input_len < 4 || p.output_len < 4)
      continue;  // too short to time, or /tokenize failed (vLLM's rule)
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) return invalid_argument("--dataset-path {}: no usable conversation", o.dataset_path);
  return prompts;
}

Outcome run_one(const BenchServeOptions& o, const json& extra, const Url& url, const std::string& model,
                const Prompt& p) {
  json body = {{"model", model},
               {"prompt", p.prompt},
               {"max_tokens", p.output_len},
               {"ignore_eos", true},
               {"temperature", 0.0},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (o.endpoint == "/v1/chat/completions") {
    body.erase("prompt");
    body["messages"] = json::array({{{"role", "user"}, {"content", p.prompt}}});
  }
  body.update(extra);
  Outcome out;
  const auto t0 = Clock::now();
  Clock::time_point last;
  bool any = false;
  std::string pending;
  const HttpResult r = http_call(url, "POST", o.endpoint, body.dump(), o.api_key, [&](std::string_view data) {
    pending.append(data);
    size_t end;
    while ((end = pending.find("\n\n")) != std::string::npos) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
      const json j = json::parse(event.substr(6), nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) out.error = j["error"].value("message", "error event");
      if (j.contains("usage") && j["usage"].is_object()) {
        out.input_tokens = j["usage"].value("prompt_tokens", 0);
        out.output_tokens = j["usage"].value("completion_tokens", 0);
      }
      bool has_text = false;
      for (const json& c : j.value("choices", json::array())) {
        const json text = c.contains("delta") ? c["delta"].value("content", json()) : c.value("text", json());
        has_text = has_text || (text.is_string() && !text.get<std::string>().empty());
      }
      if (!has_text) continue;
      const auto now = Clock::now();
      if (!any) {
        out.ttft = std::chrono::duration<double>(now - t0).count();
      } else {
        out.itl.push_back(std::chrono::duration<double>(now - last).count());
      }
      any = true;
      last = now;
    }
  });
  out.e2e = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!r.error.empty()) {
    out.error = r.error;
  } else if (r.status != 200) {
    const json j = json::parse(r.body, nullptr, false);
    out.error =
        fmt::format("HTTP {}: {}", r.status,
                    j.is_object() && j.contains("error") ? j["error"].value("message", r.body) : r.body);
  } else if (out.error.empty()) {
    out.ok = true;
    if (out.output_tokens == 0) out.output_tokens = static_cast<int32_t>(out.itl.size()) + (any ? 1 : 0);
    if (out.input_tokens == 0) out.input_tokens = p.input_len;
  }
  return out;
}

struct Stats {
  double mean = 0, median = 0, p99 = 0;
};
Stats stats_of(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  const auto pct = [&](double q) {
    const double pos = q * static_cast<double>(v.size() - 1);
    const auto lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
  };
  s.median = pct(0.5);
  s.p99 = pct(0.99);
  return s;
}

Status run_bench_serve(const BenchServeOptions& o) {
  KILN_ASSIGN_OR_RETURN(const Url url, parse_url(o.base_url));
  const json extra = o.extra_body.empty() ? json::object() : json::parse(o.extra_body, nullptr, false);
  if (!extra.is_object()) return invalid_argument("--extra-body {}: not a JSON object", o.extra_body);
  // SLOs: "ttft:MS", "tpot:MS", "e2el:MS".
  double slo_ttft = 0, slo_tpot = 0, slo_e2el = 0;
  for (const std::string& g : o.goodput) {
    const size_t colon = g.find(':');
    char* end = nullptr;
    const double ms = colon == std::string::npos ? -1 : std::strtod(g.c_str() + colon + 1, &end);
    const std::string key = g.substr(0, colon);
    if (ms <= 0 || *end != '\0' || (key != "ttft" && key != "tpot" && key != "e2el")) {
      return invalid_argument("--goodput {}: expected ttft:MS, tpot:MS or e2el:MS with MS > 0", g);
    }
    (key == "ttft" ? slo_ttft : key == "tpot" ? slo_tpot : slo_e2el) = ms / 1000.0;
  }
  std::string model = o.model;
  if (model.empty()) {
    const HttpResult r = http_call(url, "GET", "/v1/models", "", o.api_key);
    if (!r.error.empty()) return make_status(StatusCode::io_error, "{}: {}", o.base_url, r.error);
    const json j = json::parse(r.body, nullptr, false);
    if (r.status != 200 || !j.is_object() || !j.contains("data") || j["data"].empty()) {
      return make_status(StatusCode::io_error, "{}/v1/models answered {}: {}", o.base_url, r.status, r.body);
    }
    model = j["data"][0].value("id", "");
  }
  std::mt19937_64 rng(o.seed);
  KILN_ASSIGN_OR_RETURN(const std::vector<Prompt> prompts, make_prompts(o, url, rng));
  const SpecCounters spec_before = spec_counters(url, o.api_key);
  std::fprintf(stderr,
               "kiln bench serve: %zu requests to %s%s (%s), rate %s, burstiness %g, concurrency %s\n",
               prompts.size(), o.base_url.c_str(), o.endpoint.c_str(), model.c_str(),
               std::isinf(o.request_rate) ? "inf" : fmt::format("{}/s", o.request_rate).c_str(), o.burstiness,
               o.max_concurrency > 0 ? std::to_string(o.max_concurrency).c_str() : "unlimited");
  std::vector<Outcome> outcomes(prompts.size());
  std::counting_semaphore<> slots(o.max_concurrency > 0 ? o.max_concurrency
                                                        : static_cast<int32_t>(prompts.size()));
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  auto next = start;
  // Gamma inter-arrival times with shape = burstiness and mean 1 / rate (burstiness 1: Poisson).
  std::gamma_distribution<double> gap(o.burstiness, 1.0 / (o.request_rate * o.burstiness));
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::this_thread::sleep_until(next);
    slots.acquire();
    threads.emplace_back([&, i] {
      outcomes[i] = run_one(o, extra, url, model, prompts[i]);
      slots.release();
    });
    if (!std::isinf(o.request_rate)) {
      next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
    }
  }
  for (auto& t : threads) t.join();
  const double duration = std::chrono::duration<double>(Clock::now() - start).count();

  int64_t completed = 0, failed = 0, in_tokens = 0, out_tokens = 0, good = 0;
  std::vector<double> ttft, tpot, itl, e2el;
  std::string first_error;
  for (const Outcome& r : outcomes) {
    if (!r.ok) {
      ++failed;
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    ++completed;
    in_tokens += r.input_tokens;
    out_tokens += r.output_tokens;
    ttft.push_back(r.ttft);
    e2el.push_back(r.e2e);
    const double t = r.output_tokens > 1 ? (r.e2e - r.ttft) / (r.output_tokens - 1) : 0.0;
    if (r.output_tokens > 1) tpot.push_back(t);
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
    if ((slo_ttft == 0 || r.ttft <= slo_ttft) && (slo_tpot == 0 || t <= slo_tpot) &&
        (slo_e2el == 0 || r.e2e <= slo_e2el)) {
      ++good;
    }
  }
  const Stats s_ttft = stats_of(ttft), s_tpot = stats_of(tpot), s_itl = stats_of(itl),
              s_e2el = stats_of(e2el);
  json j = {{"base_url", o.base_url},
            {"endpoint", o.endpoint},
            {"model", model},
            {"num_prompts", prompts.size()},
            {"request_rate", std::isinf(o.request_rate) ? json("inf") : json(o.request_rate)},
            {"burstiness", o.burstiness},
            {"max_concurrency", o.max_concurrency > 0 ? json(o.max_concurrency) : json(nullptr)},
            {"completed", completed},
            {"failed", failed},
            {"duration", duration},
            {"total_input_tokens", in_tokens},
            {"total_output_tokens", out_tokens},
            {"request_throughput", completed / duration},
            {"output_throughput", static_cast<double>(out_tokens) / duration},
            {"total_token_throughput", static_cast<double>(in_tokens + out_tokens) / duration}};
  if (!o.goodput.empty()) j["request_goodput"] = static_cast<double>(good) / duration;
  for (const auto& [name, st] :
       {std::pair{"ttft", s_ttft}, {"tpot", s_tpot}, {"itl", s_itl}, {"e2el", s_e2el}}) {
    j[fmt::format("mean_{}_ms", name)] = st.mean * 1000;
    j[fmt::format("median_{}_ms", name)] = st.median * 1000;
    j[fmt::format("p99_{}_ms", name)] = st.p99 * 1000;
  }
  if (!first_error.empty()) j["first_error"] = first_error;
  SpecCounters spec = spec_counters(url, o.api_key);
  spec.drafts -= std::min(spec.drafts, spec_before.drafts);
  spec.draft_tokens -= std::min(spec.draft_tokens, spec_before.draft_tokens);
  spec.accepted -= std::min(spec.accepted, spec_before.accepted);
  if (spec.drafts > 0) {
    j["spec_draft_tokens"] = spec.draft_tokens;
    j["spec_accepted_tokens"] = spec.accepted;
    j["spec_acceptance_rate"] = static_cast<double>(spec.accepted) / static_cast<double>(spec.draft_tokens);
    j["spec_mean_acceptance_length"] =
        1.0 + static_cast<double>(spec.accepted) / static_cast<double>(spec.drafts);
  }
  if (o.output == "json") {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("| metric | value |\n| --- | ---: |\n");
    std::printf("| successful requests | %lld |\n| failed requests | %lld |\n",
                static_cast<long long>(completed), static_cast<long long>(failed));
    std::printf("| duration (s) | %.2f |\n| input tokens | %lld |\n| generated tokens | %lld |\n", duration,
                static_cast<long long>(in_tokens), static_cast<long long>(out_tokens));
    std::printf("| request throughput (req/s) | %.2f |\n", completed / duration);
    if (!o.goodput.empty()) std::printf("| request goodput (req/s) | %.2f |\n", good / duration);
    std::printf("| output token throughput (tok/s) | %.2f |\n| total token throughput (tok/s) | %.2f |\n",
                out_tokens / duration, (in_tokens + out_tokens) / duration);
    for (const auto& [name, st] :
         {std::pair{"TTFT", s_ttft}, {"TPOT", s_tpot}, {"ITL", s_itl}, {"E2E latency", s_e2el}}) {
      std::printf("| %s mean / median / p99 (ms) | %.2f / %.2f / %.2f |\n", name, st.mean * 1000,
                  st.median * 1000, st.p99 * 1000);
    }
    if (spec.drafts > 0) {
      std::printf("| draft tokens kept (speculative decoding) | %llu of %llu (%.1f%%) |\n",
                  static_cast<unsigned long long>(spec.accepted),
                  static_cast<unsigned long long>(spec.draft_tokens),
                  100.0 * j["spec_acceptance_rate"].get<double>());
      std::printf("| tokens a verifying step | %.2f |\n", j["spec_mean_acceptance_length"].get<double>());
    }
    if (!first_error.empty())
      std::fprintf(stderr, "kiln bench serve: first failure: %s\n", first_error.c_str());
  }
  return Status::ok_status();
}

}  // namespace

void register_bench_serve(CLI::App& bench, int& rc) {
  auto o = std::make_shared<BenchServeOptions>();
  CLI::App* cmd =
      bench.add_subcommand("serve", "Load-test an OpenAI-compatible server (vllm bench serve style)");
  cmd->add_option("--base-url", o->base_url, "The server, http://HOST:PORT")->capture_default_str();
  cmd->add_option("--endpoint", o->endpoint, "/v1/completions or /v1/chat/completions")
      ->check(CLI::IsMember({"/v1/completions", "/v1/chat/completions"}))
      ->capture_default_str();
  cmd->add_option("--model", o->model, "Model name to send (default: the server's first)");
  cmd->add_option("--api-key", o->api_key, "Bearer key");
  cmd->add_option("--num-prompts", o->num_prompts, "Requests to send")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--request-rate", o->request_rate, "Requests per second (inf: all at once)")
      ->check(CLI::Validator(
          [](std::string& v) {
            const double r = std::strtod(v.c_str(), nullptr);
            return r > 0 ? std::string() : "must be > 0 or inf, not " + v;
          },
          "RATE"))
      ->capture_default_str();
  cmd->add_option("--burstiness", o->burstiness, "Gamma shape of the arrivals (1: Poisson; < 1 burstier)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--max-concurrency", o->max_concurrency, "Requests in flight at most (0: no limit)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--dataset", o->dataset, "random or sharegpt")
      ->check(CLI::IsMember({"random", "sharegpt"}))
      ->capture_default_str();
  cmd->add_option("--dataset-path", o->dataset_path, "A ShareGPT-shaped JSON file (--dataset sharegpt)");
  cmd->add_option("--random-input-len", o->input_len, "Prompt tokens (random dataset)")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--random-output-len", o->output_len, "Tokens to generate (random dataset)")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--random-range-ratio", o->range_ratio, "Lengths vary by up to this fraction either way")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_flag("--random-words", o->random_words,
                "Random prompts as English words instead of token ids (for servers that take only text)");
  cmd->add_option("--extra-body", o->extra_body, "A JSON object merged into every request");
  cmd->add_option("--seed", o->seed, "Seed of the prompts and the arrivals")->capture_default_str();
  cmd->add_option("--goodput", o->goodput,
                  "SLOs a request must meet to count as good: ttft:MS tpot:MS e2el:MS");
  cmd->add_option("-o,--output", o->output, "md or json")
      ->check(CLI::IsMember({"md", "json"}))
      ->capture_default_str();
  cmd->callback([o, &rc] {
    if (o->dataset == "sharegpt" && o->dataset_path.empty()) {
      rc = report_error("bench serve", invalid_argument("--dataset sharegpt needs --dataset-path"));
      return;
    }
    Status s = run_bench_serve(*o);
    if (!s.ok()) rc = report_error("bench serve", s);
  });
}

}  // namespace kiln::cli
