// Tool calls in a model's output: the call syntax a chat template teaches its model, a parser that splits the
// output into content and OpenAI tool calls (whole, or piece by piece as it streams), and the grammar that
// forces a call (tool_choice "required" or a named function).
//
// The syntaxes (whitespace between the parts is free; "parameters" and "arguments" are both accepted as the
// arguments' key, and a `"type": "function"` pair may come before the name):
// - hermes (Qwen2.5, Qwen3, Hermes): <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>, repeated;
//   also in a ```json (or ```) fenced block, or bare at the start of the output, as small Qwen models write
//   it.
// - llama3 (Llama 3.1, 3.2): {"name": "f", "parameters": {...}} at the start of the output, after an optional
//   <|python_tag|>; several separated by ';' (as vLLM's llama3_json parser reads them, "; ").
// - mistral (Mistral v3, Nemo): [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]; the marker is a control
//   token that the output text leaves out, so a list at the start of the output counts too.
// Extra keys after the arguments (Mistral's "id"), with a string, object or list value, are read and ignored.
//
// How text is decided, byte by byte (the same whatever the split of the output into pieces):
// - Text that may begin a call (a marker, or a prefix of one) is held back until it is decided. A call is
//   taken once its name, one of the request's functions, and the '{' of its arguments have been read. Text
//   that turns out not to be a call (malformed, or an unknown name) is content, as it was written.
// - The arguments stream as the model writes them while they stay valid JSON; where they stop being valid
//   (or the output ends, cut by max_tokens), the call ends with the arguments so far, and what follows is
//   content. The closing markup after the arguments is dropped; if it is malformed, it is content.
// - Whitespace next to a call is not content; output with no call is content exactly as written.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/kiln.h"
#include "server/json_scan.h"

namespace kiln::server {

enum class ToolCallFormat { none, hermes, llama3, mistral };

// The syntax a chat template's source teaches; none when it shows no syntax kiln knows.
ToolCallFormat tool_call_format(std::string_view chat_template);
const char* tool_call_format_name(ToolCallFormat format);  // "hermes", "llama3", "mistral", "none"

// One piece of parsed output, in order.
struct ToolCallEvent {
  enum class Kind {
    content,    // text: content
    call,       // text: the function's name; a new call begins (its arguments are empty so far)
    arguments,  // text: the next piece of the current call's arguments (JSON text)
  };
  Kind kind = Kind::content;
  std::string text;
};

class ToolCallParser {
 public:
  // names: the request's functions (a call of another name is content). max_calls: calls reported; later
  // ones are parsed and dropped (parallel_tool_calls false: 1).
  ToolCallParser(ToolCallFormat format, std::vector<std::string> names,
                 int32_t max_calls = std::numeric_limits<int32_t>::max());

  // Appends the events `text` completes (adjacent pieces of one kind merged).
  void feed(std::string_view text, std::vector<ToolCallEvent>& out);
  // The end of the output: text still held back is decided (content, or a call's dropped closing markup).
  void finish(std::vector<ToolCallEvent>& out);
  int32_t n_calls() const { return n_reported_; }

 private:
  enum class State { text, header, arguments, trailer, between };

  void step(char c, std::vector<ToolCallEvent>& out);
  void step_text(char c, std::vector<ToolCallEvent>& out);
  void step_header(char c, std::vector<ToolCallEvent>& out);
  void step_trailer(char c);
  void step_between(char c);
  // Gives `held` back: its first byte is content, the rest is read again as text.
  void reject(std::string& held, std::vector<ToolCallEvent>& out);
  void emit(ToolCallEvent::Kind kind, std::string_view text, std::vector<ToolCallEvent>& out);
  bool known(const std::string& name) const;

  ToolCallFormat format_;
  std::vector<std::string> names_;
  int32_t max_calls_;
  State state_ = State::text;
  std::string input_;         // the bytes being read: the fed text, and text given back by reject()
  size_t pos_ = 0;            // next byte of input_
  std::string held_;          // text: whitespace and a marker's prefix; header and trailer: their text so far
  size_t header_from_ = 0;    // header: where the call object's syntax starts in held_ (after a marker)
  bool list_open_ = false;    // mistral header: the '[' of the list is still to come
  std::string_view closing_;  // hermes: the markup that closes the current call (a static string)
  bool any_content_ = false;  // content was emitted (llama3 / mistral calls only come first)
  bool after_call_ = false;   // no content since the last call began (its whitespace is dropped)
  int32_t n_seen_ = 0, n_reported_ = 0;  // calls taken, and those reported (at most max_calls_)
  bool reporting_ = false;               // the current call is reported
  JsonScanner json_;                     // the arguments: where they end, and whether they stay valid
};

// A whole output: its content and its calls (what feed() and finish() report, merged).
struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON text as the model wrote it
};
struct ParsedOutput {
  std::string content;
  std::vector<ParsedToolCall> calls;
};
void merge_events(const std::vector<ToolCallEvent>& events, ParsedOutput& out);
ParsedOutput parse_tool_calls(ToolCallFormat format, std::vector<std::string> names, std::string_view text,
                              int32_t max_calls = std::numeric_limits<int32_t>::max());

// The GBNF grammar of output that calls one of `tools` in `format` (parallel: one call or more; else exactly
// one), each call's arguments matching its function's parameters schema (any JSON object when it has none),
// after forced_call_prefix(format). Errors: the schema's own (invalid_argument, unimplemented,
// resource_exhausted) prefixed with the tool's name; invalid_argument for format none or no tools.
Result<std::string> tool_call_grammar(ToolCallFormat format, const std::vector<ToolDefinition>& tools,
                                      bool parallel);

// The control token that a forced call's output opens with in `format`, which no grammar over the output's
// text can write (a vocabulary's control tokens are never allowed): mistral's [TOOL_CALLS]; empty for the
// others (Qwen's <tool_call> is text to its tokenizer, Llama 3's <|python_tag|> is optional). The prompt of a
// forced call ends with it, after the template's generation prompt: the model then writes the call as it
// would after drawing the token itself, and the output is what the parser reads when the decoder leaves the
// token out (a call list at the start).
std::string_view forced_call_prefix(ToolCallFormat format);

}  // namespace kiln::server
