"""OpenAI tool calling through `kiln serve`, driven by the unchanged `openai` client.

Tiny random-weight models (a Qwen2 with Qwen2.5's chat template, a Llama with Llama 3.1's, a Mistral with Mistral
Nemo's; SmolLM2's tokenizer with the templates' markers added) cannot choose a tool, so the calls here are forced:
tool_choice "required" or a named function makes the server constrain the output to a call in the model's own
syntax, whose arguments must then validate against the function's schema (jsonschema). The call goes back as an assistant message,
the tool's answer as a tool message, and the model answers in text. Streamed and not, with the same seed, the
calls are the same. Bad tool requests are 400s naming the field.

KILN_SLOW_TESTS=1 adds the real Qwen2.5-Coder-1.5B-Instruct (scripts/fetch-models.sh --large) on the CPU:
with tool_choice "auto", a question that needs the tool gets a parsed call.
"""
import copy
import http.client
import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import openai
import pytest

import parity_lib as lp

jsonschema = pytest.importorskip("jsonschema")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

KILN = Path(os.environ.get("KILN_BUILD_DIR", "build")) / "tools" / "kiln" / "kiln"
SMOLLM = lp.MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN_CODER = lp.MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "templates"
SLOW = float(os.environ.get("KILN_TEST_SLOW") or 1)

# Every string and number is bounded, so that a random model's forced call ends within max_tokens.
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Adds two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": -99, "maximum": 99},
                    "b": {"type": "integer", "minimum": -99, "maximum": 99},
                },
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
USER = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


class Server:
    def __init__(self, model: Path, *extra):
        assert KILN.exists(), f"build kiln first ({KILN})"
        args = ["serve", "-m", str(model), "--port", "0", "-t", "2", "-c", "2048", "--alias", "m", *map(str, extra)]
        self.proc = subprocess.Popen([str(KILN), *args], stderr=subprocess.PIPE, text=True)
        self.lines = []
        port = None
        deadline = time.time() + 120 * SLOW
        while port is None and time.time() < deadline:
            line = self.proc.stderr.readline()
            assert line, f"kiln serve exited: {''.join(self.lines)}"
            self.lines.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            port = int(m.group(1)) if m else None
        threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True).start()
        self.port = port
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                                    timeout=300 * SLOW)
        while time.time() < deadline:
            try:
                self.client.models.list()
                return
            except openai.APIError:
                time.sleep(0.1)
        raise AssertionError("kiln serve did not become ready")

    def post(self, path, body):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120 * SLOW)
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        payload = json.loads(r.read())
        assert r.status == 200, payload
        return payload

    def detokenize(self, tokens):
        return self.post("/detokenize", {"tokens": tokens})["prompt"]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        log = "".join(self.lines)
        assert "Sanitizer" not in log and "runtime error:" not in log, log


def tiny_model(root: Path, arch: str) -> Path:
    """A random-weight model folder: SmolLM2's tokenizer with the template's markers added, and its template."""
    from hf_cache import hf_tokenizer

    tok = copy.deepcopy(hf_tokenizer(SMOLLM))
    if arch == "qwen2":
        tok.add_tokens(["<tool_call>", "</tool_call>"])  # plain added tokens, as in Qwen2.5's tokenizer
        template, config_class, eos = "qwen2.5", transformers.Qwen2Config, ["<|im_end|>"]
    elif arch == "mistral":  # Mistral v3's control tokens
        tok.add_special_tokens({"additional_special_tokens": [
            "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]})
        tok.bos_token, tok.eos_token = "<s>", "</s>"
        template, config_class, eos = "mistral-nemo", transformers.MistralConfig, ["</s>"]
    else:
        tok.add_special_tokens({"additional_special_tokens": [
            "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
            "<|python_tag|>"]})
        tok.bos_token, tok.eos_token = "<|begin_of_text|>", "<|eot_id|>"
        template, config_class, eos = "llama3.1", transformers.LlamaConfig, ["<|eot_id|>", "<|eom_id|>"]
    tok.chat_template = (TEMPLATES / f"{template}.jinja").read_text()
    torch.manual_seed(7)
    cfg = config_class(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=2048,
                       initializer_range=0.1, tie_word_embeddings=True)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids(eos)
    out = root / arch
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module", params=["qwen2", "llama", "mistral"])
def server(request, tmp_path_factory):
    if not SMOLLM.exists():
        pytest.skip(f"missing {SMOLLM} (scripts/fetch-models.sh)")
    folder = tiny_model(tmp_path_factory.mktemp("tools"), request.param)
    s = Server(folder)
    s.arch, s.folder = request.param, folder
    yield s
    s.stop()


def check_calls(calls, names=None):
    """Each call names one of the tools and its arguments validate against that tool's schema."""
    assert calls
    for c in calls:
        assert c.type == "function" and c.id
        assert c.function.name in (names or SCHEMAS)
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def stream_calls(client, **kw):
    """A streamed completion put together the way OpenAI's clients do: content, and calls by index."""
    content, calls, finish, first = "", {}, None, {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        finish = ch.finish_reason or finish
        content += ch.delta.content or ""
        for d in ch.delta.tool_calls or []:
            if d.index not in calls:  # the first delta of a call: id, type, name, empty arguments
                first[d.index] = d
                assert d.id and d.type == "function" and d.function.name and d.function.arguments == ""
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            else:
                assert d.id is None and d.function.name is None
            calls[d.index]["arguments"] += d.function.arguments or ""
    assert sorted(calls) == list(range(len(calls)))
    return content, [calls[i] for i in sorted(calls)], finish


def test_rendering_matches_transformers(server):
    """The prompt of a conversation with tools, a call and its answer: transformers' apply_chat_template on the
    same messages with the arguments parsed (as vLLM passes them) is the reference."""
    from transformers import AutoTokenizer

    call = {"id": "abcDEF123", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"unit": "celsius", "city": "Zürich"}'}}
    messages = [{"role": "system", "content": "Be brief."}, *USER,
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "abcDEF123", "name": "get_weather", "content": '{"t": 21}'}]
    ref_messages = copy.deepcopy(messages)
    ref_messages[2]["content"] = ""
    ref_messages[2]["tool_calls"][0]["function"]["arguments"] = json.loads(call["function"]["arguments"])
    tok = AutoTokenizer.from_pretrained(str(server.folder))
    want = tok.apply_chat_template(ref_messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    got = server.detokenize(server.post("/tokenize", {"messages": messages, "tools": TOOLS})["tokens"])
    assert got == want
    assert '"city": "Zürich"' in got  # the arguments as the template writes them back


def test_required_call_then_answer(server):
    c = server.client
    # Llama 3.1's template renders no more than one call back: its model gets one, parallel_tool_calls or not.
    r = c.chat.completions.create(model="m", messages=USER, tools=TOOLS, tool_choice="required", max_tokens=200,
                                  seed=1)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    check_calls(ch.message.tool_calls)
    if server.arch == "llama":
        assert len(ch.message.tool_calls) == 1
    # The call and the tool's answer go back; the model answers in text.
    messages = USER + [ch.message.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": tc.id, "content": '{"temperature": 21}'} for tc in ch.message.tool_calls]
    r2 = c.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=8, seed=2)
    assert r2.choices[0].finish_reason in ("stop", "length")
    assert isinstance(r2.choices[0].message.content, str) and not r2.choices[0].message.tool_calls
    # The prompt shows the call (its arguments as the template writes them back) and the tool's answer.
    prompt = server.detokenize(server.post("/tokenize", {"messages": messages, "tools": TOOLS})["tokens"])
    call = ch.message.tool_calls[0].function
    assert f'"name": "{call.name}"' in prompt, prompt
    assert json.dumps(json.loads(call.arguments), ensure_ascii=False) in prompt, prompt
    assert "temperature" in prompt and prompt.count("temperature") == len(ch.message.tool_calls)


def test_streamed_call_is_the_same_call(server):
    c = server.client
    kw = dict(model="m", messages=USER, tools=TOOLS, tool_choice="required", max_tokens=200, seed=3,
              temperature=1.0)
    whole = c.chat.completions.create(**kw).choices[0]
    content, calls, finish = stream_calls(c, **kw)
    assert finish == "tool_calls" and content == (whole.message.content or "")
    assert [(x["name"], x["arguments"]) for x in calls] == [
        (tc.function.name, tc.function.arguments) for tc in whole.message.tool_calls]
    for x in calls:
        jsonschema.validate(json.loads(x["arguments"]), SCHEMAS[x["name"]])


def test_named_function_and_one_call(server):
    c = server.client
    r = c.chat.completions.create(model="m", messages=USER, tools=TOOLS, max_tokens=200, seed=4,
                                  tool_choice={"type": "function", "function": {"name": "add"}})
    calls = r.choices[0].message.tool_calls
    check_calls(calls, names=["add"])
    assert len(calls) == 1
    r = c.chat.completions.create(model="m", messages=USER, tools=TOOLS, tool_choice="required",
                                  parallel_tool_calls=False, max_tokens=200, seed=5)
    assert len(r.choices[0].message.tool_calls) == 1


def test_forced_call_prompt_ends_with_the_call_token(server):
    """Mistral's calls open with [TOOL_CALLS], a control token that the grammar cannot write: a forced call's
    prompt ends with it, and the model writes the call list after it. The others' prompts are the chat's."""
    chat = server.post("/tokenize", {"messages": USER, "tools": TOOLS})["tokens"]
    for stream in (False, True):
        kw = dict(model="m", messages=USER, tools=TOOLS, tool_choice="required", max_tokens=200, seed=8)
        if stream:
            chunks = list(server.client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                                **kw))
            usage = chunks[-1].usage
            assert any(ch.choices and ch.choices[0].delta.tool_calls for ch in chunks)
        else:
            r = server.client.chat.completions.create(**kw)
            usage = r.usage
            assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
            check_calls(r.choices[0].message.tool_calls)
        assert usage.prompt_tokens == len(chat) + (server.arch == "mistral")
    if server.arch == "mistral":
        marker = server.post("/tokenize", {"prompt": "[TOOL_CALLS]", "add_special_tokens": False})["tokens"]
        assert len(marker) == 1
        assert server.detokenize(chat + marker).endswith("[/INST][TOOL_CALLS]")


def test_tool_choice_none_answers_in_text(server):
    r = server.client.chat.completions.create(model="m", messages=USER, tools=TOOLS, tool_choice="none",
                                              max_tokens=6, seed=6)
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("body,param,needle", [
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name",
     "is required"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "'function'"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "'nope'"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "auto, none, required"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"tools": TOOLS, "tool_choice": "required", "extra_body": {"guided_regex": "a+"}}, "tool_choice",
     "another output constraint"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools[2].function.name", "defined twice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"x": {"type": "string", "contentMediaType": "image/png"}}}}}], "tool_choice": "required"},
     "tools", "contentMediaType"),
    ({"messages": USER + [{"role": "tool", "content": "21"}]}, "messages[1].tool_call_id", "required"),
    ({"messages": USER + [{"role": "function", "name": "f", "content": "21"}]}, "messages[1].role",
     "not supported"),
    ({"messages": USER + [{"role": "assistant", "tool_calls": [{"id": "x", "type": "function", "function": {
      "name": "add", "arguments": "{not json"}}]}]}, "messages[1].tool_calls[0].function.arguments", "JSON object"),
])
def test_bad_tool_requests_are_400_naming_the_field(server, body, param, needle):
    with pytest.raises(openai.BadRequestError) as e:
        server.client.chat.completions.create(**{"model": "m", "messages": USER, "max_tokens": 4, **body})
    err = e.value.body
    assert err["param"] == param and needle in err["message"], err


@pytest.mark.skipif(os.environ.get("KILN_SLOW_TESTS") != "1", reason="KILN_SLOW_TESTS=1: a 1.5B model on the CPU")
def test_qwen_coder_calls_the_tool_on_its_own():
    if not QWEN_CODER.exists():
        pytest.skip(f"missing {QWEN_CODER} (scripts/fetch-models.sh --large)")
    s = Server(QWEN_CODER)
    try:
        messages = [{"role": "user", "content": "What is the weather like in Paris right now? Use celsius."}]
        r = s.client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="auto",
                                             max_tokens=100, temperature=0)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        check_calls(ch.message.tool_calls, names=["get_weather"])
        assert "paris" in json.loads(ch.message.tool_calls[0].function.arguments)["city"].lower()
        content, calls, finish = stream_calls(s.client, model="m", messages=messages, tools=TOOLS,
                                              tool_choice="auto", max_tokens=100, temperature=0)
        assert finish == "tool_calls" and [(x["name"], x["arguments"]) for x in calls] == [
            (tc.function.name, tc.function.arguments) for tc in ch.message.tool_calls]
        messages += [ch.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": ch.message.tool_calls[0].id,
                      "content": '{"temperature": 21, "sky": "clear"}'}]
        # The answer in text ("none": as vLLM, the tools are still shown and the output is not read for calls).
        r2 = s.client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="none",
                                              max_tokens=80, temperature=0)
        assert not r2.choices[0].message.tool_calls and "21" in r2.choices[0].message.content
    finally:
        s.stop()
