"""Structured output through `kiln serve`, driven by the unchanged `openai` client on the default model.

- every schema of tests/data/schemas whose language is finite, as response_format json_schema, streamed and
  not: the output parses and validates against its schema (jsonschema), and the request ends with "stop";
- json_object, llama.cpp's `grammar` and `json_schema`, vLLM's `guided_*` and `structured_outputs`, on chat
  and text completions: each output is in its language;
- a bad schema, an unsupported keyword, a GBNF syntax error, a regex too large, two constraints at once: a 400
  naming the field; a grammar that cannot end within max_tokens ends with "length", and nothing is left running.

KILN_SLOW_TESTS=1 runs the schema suite on Qwen2.5-Coder-1.5B-Instruct as well (scripts/fetch-models.sh --large).
"""
import concurrent.futures as cf
import json
import os
import re
from pathlib import Path

import pytest

from test_serve import MODELS, SLOW, Server, wait_idle

jsonschema = pytest.importorskip("jsonschema")

# Schemas whose language is infinite (any number of extra properties; a tree of any depth) are left out:
# nothing makes a model end such an output within max_tokens (greedy decoding adds properties to
# metadata_additional.json until the limit), so their verdict here would be luck. The grammar tests cover them
# (tests/grammar, test_schema_suite.py), and bench/structured_check.py sends them too.
UNBOUNDED = {"metadata_additional.json", "tree_ref.json"}
SCHEMAS = sorted(p for p in (Path(__file__).resolve().parent.parent / "data" / "schemas").glob("*.json")
                 if p.name not in UNBOUNDED)
QWEN_CODER = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


@pytest.fixture(scope="module")
def server():
    s = Server("--parallel", 4, "-c", 1024, "--api-key", "test-key-0123456789")
    yield s
    s.stop()


def ask_schema(client, model, schema_path, stream, seed):
    schema = json.loads(schema_path.read_text())
    messages = [{"role": "system", "content": "You answer with JSON only."},
                {"role": "user", "content": f"Give an example of {schema.get('title', schema_path.stem)}."}]
    kwargs = dict(model=model, messages=messages, max_tokens=700, temperature=0.7, seed=seed,
                  response_format={"type": "json_schema",
                                   "json_schema": {"name": schema_path.stem, "schema": schema, "strict": True}})
    if stream:
        text, finish = "", None
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
    else:
        r = client.chat.completions.create(**kwargs)
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
    return schema, text, finish


def check_suite(server, model_name):
    assert len(SCHEMAS) >= 10, "tests/data/schemas holds the suite"
    client = server.client()
    jobs = [(p, stream, seed) for p in SCHEMAS for stream in (False, True) for seed in (1,)]
    with cf.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda j: (j, ask_schema(client, model_name, *j)), jobs))
    for (path, stream, _), (schema, text, finish) in results:
        where = f"{path.name} (stream={stream}): {text!r}"
        assert finish == "stop", where
        value = json.loads(text)
        cls = jsonschema.validators.validator_for(schema)  # its draft's formats (time with an offset)
        jsonschema.validate(value, schema, cls=cls, format_checker=cls.FORMAT_CHECKER)
        assert value is not None, where
    wait_idle(server)


def test_schema_suite_validates_streamed_and_not(server):
    check_suite(server, "SmolLM2-135M-Instruct.Q4_1")


@pytest.mark.skipif(not os.environ.get("KILN_SLOW_TESTS") or not QWEN_CODER.exists(),
                    reason="KILN_SLOW_TESTS=1 and the 1.5B model (scripts/fetch-models.sh --large)")
def test_schema_suite_on_qwen_coder():
    s = Server("--parallel", 4, "-c", 2048, model=QWEN_CODER)
    try:
        check_suite(s, QWEN_CODER.stem)
    finally:
        s.stop()


def chat(server, extra, max_tokens=120, path="/v1/chat/completions"):
    body = {"max_tokens": max_tokens, "temperature": 0.8, "seed": 7, **extra}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "Pick one and answer."}]
    else:
        body["prompt"] = "The answer is"
    status, payload, _ = server.request("POST", path, body)
    assert status == 200, payload
    c = payload["choices"][0]
    return (c["message"]["content"] if "message" in c else c["text"]), c["finish_reason"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_every_request_field_constrains(server, path):
    text, finish = chat(server, {"response_format": {"type": "json_object"}}, max_tokens=300, path=path)
    if finish == "stop":
        assert isinstance(json.loads(text), dict), text
    text, _ = chat(server, {"guided_regex": r"[0-9]{3}-[a-z]{2,5}"}, path=path)
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2,5}", text), text
    text, _ = chat(server, {"structured_outputs": {"regex": r"(yes|no), because [a-z ]{1,20}\."}}, path=path)
    assert re.fullmatch(r"(yes|no), because [a-z ]{1,20}\.", text), text
    choices = ["red", "green", "dark blue", 'say "hi"']
    for extra in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
        text, finish = chat(server, extra, path=path)
        assert text in choices and finish == "stop", text
    gbnf = 'root ::= "x=" num ("+" num){0,3}\nnum ::= [1-9] [0-9]{0,2}\n'  # at most 18 characters: it ends
    for extra in ({"grammar": gbnf}, {"guided_grammar": gbnf}, {"structured_outputs": {"grammar": gbnf}}):
        text, finish = chat(server, extra, max_tokens=40, path=path)
        assert finish == "stop" and re.fullmatch(r"x=[1-9][0-9]{0,2}(\+[1-9][0-9]{0,2}){0,3}", text), text
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 7}},
              "required": ["n"], "additionalProperties": False}
    for extra in ({"json_schema": schema}, {"guided_json": schema}, {"guided_json": json.dumps(schema)},
                  {"structured_outputs": {"json": schema}}):
        text, finish = chat(server, extra, path=path)
        assert finish == "stop" and 3 <= json.loads(text)["n"] <= 7, text
    wait_idle(server)


def test_a_grammar_that_cannot_end_in_time_ends_with_length(server):
    text, finish = chat(server, {"guided_regex": "[a-z]{200}"}, max_tokens=5)
    assert finish == "length" and re.fullmatch("[a-z]*", text), text
    wait_idle(server)


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}},
     "response_format.json_schema.schema", "frobnicate"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "contentEncoding": "base64"}}}}}},
     "response_format.json_schema.schema", "contentEncoding\" at #/properties/a/contentEncoding is not supported"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", "required"),
    # strict: a oneOf whose branches may overlap (1 is both) is refused, not enforced as anyOf.
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
        "type": "object", "properties": {"v": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}}}}},
     "response_format.json_schema.schema", "the oneOf at #/properties/v/oneOf is not shown exclusive"),
    ({"response_format": {"type": "xml"}}, "response_format", "xml"),
    ({"grammar": 'root ::= "a" | ( "b"'}, "grammar", "1:"),
    ({"grammar": "root ::= undefined-rule"}, "grammar", "undefined-rule"),
    ({"guided_regex": "(a"}, "guided_regex", "offset 0"),
    ({"guided_regex": r"(\w+)\1"}, "guided_regex", "backreference"),
    ({"guided_regex": "(([a-z]{1000}){1000}){1000}"}, "guided_regex", "bound"),
    ({"guided_choice": []}, "guided_choice", "list"),
    ({"guided_json": "{not json"}, "guided_json", "JSON"),
    ({"structured_outputs": {"frobnicate": 1}}, "structured_outputs.frobnicate", "frobnicate"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "both"),
]


@pytest.mark.parametrize("extra,param,needle", BAD, ids=[b[1] + "-" + str(i) for i, b in enumerate(BAD)])
def test_bad_constraints_are_400_naming_the_field(server, extra, param, needle):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
    status, payload, _ = server.request("POST", "/v1/chat/completions", body)
    assert status == 400, payload
    err = payload["error"]
    assert err["param"] == param, err
    assert needle in err["message"], err
    assert server.request("GET", "/health")[0] == 200
