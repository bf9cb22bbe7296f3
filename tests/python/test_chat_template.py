"""Chat templates rendered by kiln's Jinja interpreter vs Python jinja2 set up the way transformers does it.

The reference is transformers.utils.chat_template_utils._compile_jinja_template (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loopcontrols, HF's tojson / raise_exception / strftime_now). kiln renders every case
of a template in one tests/template_driver process (JSON in, JSON out).
"""

import copy
import json
import os
import random
import subprocess
from pathlib import Path

import gguf
import pytest
from transformers.utils.chat_template_utils import _compile_jinja_template

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE.parent / "data" / "templates"
BUILD = Path(os.environ.get("KILN_BUILD_DIR", HERE.parents[1] / "build"))
DRIVER = BUILD / "tests" / "template_driver"
MODELS = Path(os.path.expanduser(os.environ.get("KILN_MODELS_DIR", "~/.cache/kiln/models")))

REAL_TEMPLATES = ["smollm2", "gemma3", "llama3.1", "llama3.2", "qwen2.5", "qwen3", "mistral-nemo"]
MIN_RENDERED = 50  # conversations each real template must render identically (reference succeeded)


def run_driver(jobs):
    assert DRIVER.exists(), f"{DRIVER} is missing: build the template_driver target"
    p = subprocess.run([str(DRIVER)], input=json.dumps({"jobs": jobs}), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["results"]


def reference(source, case):
    """(ok, text or error message) from jinja2 the way transformers renders chat templates."""
    tmpl = _compile_jinja_template(source)
    ctx = dict(copy.deepcopy(case.get("extra_context", {})))
    ctx.update(
        messages=copy.deepcopy(case["messages"]),
        tools=copy.deepcopy(case.get("tools")),
        add_generation_prompt=case.get("add_generation_prompt", False),
        bos_token=case.get("bos_token", ""),
        eos_token=case.get("eos_token", ""),
    )
    try:
        return True, tmpl.render(**ctx)
    except Exception as e:  # noqa: BLE001 - any failure of the reference must be a failure of kiln too
        return False, f"{type(e).__name__}: {e}"


# ---- conversations ----

TEXTS = [
    "Hello!",
    "What is the capital of France?",
    "  leading and trailing spaces  ",
    "line one\nline two\n\nline four",
    "",
    "Unicode: héllo wörld — naïve café, 日本語のテキスト, 中文,한국어, emoji 👋🏽🎉, e\u0301 combining",
    "quotes ' and \" and backslash \\ and tab\tand {{ not_a_var }} {% raw %}",
    "<think>inner thoughts</think>The answer is 42.",
    "Tabs\tand\r\nCRLF",
    "Numbers 3.14159 and 1e10 and -0",
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Zürich"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]


def tool_call(rng, as_string):
    args = rng.choice([{"city": "Zürich", "unit": "celsius"}, {"a": 1.5, "b": 2}, {"city": "東京"}, {}])
    name = "add" if "a" in args else "get_weather"
    return {
        "id": rng.choice(["abc123XYZ", "call00001", "Z9y8X7w6V"]),
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args},
    }


def conversation(rng, i):
    """One conversation; `i` picks the shape so every shape appears."""
    msgs = []
    if i % 3 != 0:
        msgs.append({"role": "system", "content": rng.choice(TEXTS[:4] + [TEXTS[5]])})
    turns = 1 + i % 4
    with_tools = i % 5 in (1, 3)
    for t in range(turns):
        msgs.append({"role": "user", "content": rng.choice(TEXTS)})
        if t == turns - 1 and i % 2 == 0:
            break  # ends on a user turn
        if with_tools and t == turns - 1 - (i % 2):
            calls = [tool_call(rng, as_string=(i + t) % 2 == 0) for _ in range(1 + (i % 7 == 1))]
            msgs.append({"role": "assistant", "content": rng.choice([None, "", "Let me check."]), "tool_calls": calls})
            for c in calls:
                msgs.append({"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
                             "content": rng.choice(['{"temperature": 21, "sky": "clear"}', "3.5", "Zürich: 12°C"])})
            msgs.append({"role": "assistant", "content": rng.choice(TEXTS[:3])})
        else:
            m = {"role": "assistant", "content": rng.choice(TEXTS)}
            if i % 4 == 1:
                m["reasoning_content"] = "Step 1: think.\nStep 2: answer."
            msgs.append(m)
    case = {
        "messages": msgs,
        "tools": TOOLS if (with_tools or i % 7 == 2) else None,
        "add_generation_prompt": i % 2 == 0,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "extra_context": {},
    }
    if i % 6 == 4:
        case["extra_context"]["enable_thinking"] = False
    elif i % 6 == 5:
        case["extra_context"]["enable_thinking"] = True
    if i % 8 == 3:
        case["extra_context"]["date_string"] = "26 Jul 2024"
    if i % 8 == 5:
        case["extra_context"]["tools_in_user_message"] = False
    return case


def gemma_style_conversation(rng, i):
    """Strictly alternating user/assistant turns, some with list-of-parts content (Gemma 3's image/text parts)."""
    msgs = []
    if i % 2:
        msgs.append({"role": "system", "content": rng.choice(TEXTS[:4])})
    for t in range(1 + i % 3):
        content = rng.choice(TEXTS)
        if (i + t) % 3 == 0:
            content = [{"type": "image"}, {"type": "text", "text": content}]
        msgs.append({"role": "user", "content": content})
        msgs.append({"role": "assistant", "content": rng.choice(TEXTS)})
    msgs.pop() if i % 2 == 0 else None
    return {"messages": msgs, "tools": None, "add_generation_prompt": i % 2 == 0, "bos_token": "<bos>",
            "eos_token": "<eos>", "extra_context": {}}


def all_cases():
    rng = random.Random(1234)
    cases = [conversation(rng, i) for i in range(80)]
    cases += [gemma_style_conversation(rng, i) for i in range(30)]
    # Edge cases: an empty conversation, a lone system message, None content.
    cases.append({"messages": [], "tools": None, "add_generation_prompt": True, "bos_token": "<s>", "eos_token": ""})
    cases.append({"messages": [{"role": "system", "content": "only system"}], "tools": None,
                  "add_generation_prompt": False, "bos_token": "", "eos_token": ""})
    return cases


def load_template(name):
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


def test_smollm2_template_is_the_gguf_one():
    path = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.exists(), f"test model missing: {path}"
    r = gguf.GGUFReader(str(path))
    f = r.fields["tokenizer.chat_template"]
    assert bytes(f.parts[f.data[0]]).decode("utf-8") == load_template("smollm2")


@pytest.fixture(scope="module")
def rendered():
    cases = all_cases()
    jobs = [{"template": load_template(n), "cases": cases} for n in REAL_TEMPLATES]
    results = run_driver(jobs)
    return cases, dict(zip(REAL_TEMPLATES, results))


@pytest.mark.parametrize("name", REAL_TEMPLATES)
def test_real_template_matches_jinja2(name, rendered):
    cases, results = rendered
    source = load_template(name)
    matched = 0
    for k, (case, got) in enumerate(zip(cases, results[name])):
        ok, want = reference(source, case)
        if ok:
            assert got["ok"], f"{name} case {k}: kiln failed: {got.get('error')}\nmessages={case['messages']}"
            assert got["text"] == want, f"{name} case {k}: prompt differs\nmessages={case['messages']}"
            matched += 1
        else:
            assert not got["ok"], f"{name} case {k}: jinja2 failed ({want}) but kiln rendered:\n{got.get('text')}"
    assert matched >= MIN_RENDERED, f"{name}: only {matched} conversations rendered by the reference"


HOSTILE = {
    "macro_recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "huge_range": "{% for i in range(10**9) %}x{% endfor %}",
    "nested_loops": "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}"
                    "{% endfor %}{% endfor %}{% endfor %}",
    "string_blowup": "{{ 'a' * 10**9 }}",
    "concat_doubling": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                       "{% endfor %}{{ ns.s | length }}",
    "list_doubling": "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}"
                     "{% endfor %}{{ ns.l | length }}",
    "output_flood": "{% for i in range(900000) %}{{ 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' }}{% endfor %}",
    "shared_list_print": "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}"
                         "{% endfor %}{{ ns.l | string | length }}",
    "shared_list_tojson": "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}"
                          "{% endfor %}{{ ns.l | tojson }}",
    "caller_recursion": "{% macro g() %}{% call g() %}{% endcall %}{% endmacro %}{{ g() }}",
}


def test_hostile_templates_fail_within_budget():
    jobs = [{"template": src, "cases": [{"messages": []}]} for src in HOSTILE.values()]
    results = run_driver(jobs)
    for name, res in zip(HOSTILE, results):
        r = res[0]
        assert not r["ok"], f"{name} rendered"
        assert r["code"] == "resource_exhausted", f"{name}: {r['code']}: {r['error']}"


def test_constructs_template_matches_jinja2():
    source = load_template("constructs")
    cases = [c for c in all_cases()[:40]]
    for i, c in enumerate(cases):
        c["extra_context"] = {"flag": i % 2 == 0, "n": i, "ratio": i / 4, "items": {"b": 2, "a": 1, "c": [1, 2]}}
    results = run_driver([{"template": source, "cases": cases}])[0]
    for k, (case, got) in enumerate(zip(cases, results)):
        ok, want = reference(source, case)
        assert ok, want
        assert got["ok"], f"case {k}: {got.get('error')}"
        assert got["text"] == want, f"case {k} differs"


# Small templates for Jinja semantics the real templates may not reach: scoping, printing, whitespace control,
# filters, tests. Each must render exactly as jinja2 does (or fail where it fails).
SNIPPETS = [
    "[{{ '\u3000\u00a0 wide\u2003space \u2029' | trim }}] {{ 'a\u00a0b\u3000c d'.split() }} [{{ 'éxaé'.strip('é') }}] [{{ 'ãé'.strip('é') }}]",
    '{% for i in [1, 2] %}{% if i == 2 %}{{ x }}{% endif %}{% set x = i %}{% endfor %}',
    '{% set x = 5 %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{% endfor %}{{ x }}',
    "{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }}{% endfor %}{{ loop.index }}{% endfor %}",
    "{{ [1, 2, 3][1:] }}{{ 'abc'[-1] }}{{ 'abc'[5:] }}{{ [1,2,3][-2:] }}{{ [1,2,3][::-2] }}",
    "{{ 1 if none }}|{{ none is not none }}|{{ 'a' is not string }}",
    '{{ -2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ not 1 == 2 }} {{ 1 + 2 ~ 3 }}',
    '{{ 3.0 * 2 }} {{ 1.5 + 1.5 }} {{ 1 / 3 }} {{ 2 / 3 }} {{ 100.0 }} {{ 123456789012345678.0 }} {{ 0.0001 }} {{ 0.00001 }}',
    "{{ 'Hello' ~ ' ' ~ 'World' | upper }}",
    "{{ ['a','b'] | join }}{{ [1, 2] | join(', ') }}",
    "{{ 'x' in 'xyz' }} {{ 'a' in {'a': 1} }} {{ 1 in [1] }} {{ 'q' not in 'abc' }}",
    "{{ {'a': 1}.a }} {{ {'a': {'b': [10, 20]}}.a.b[1] }}",
    '{% if true %}\n  indented\n{% endif %}\nafter',
    "  {% if true %}x{% endif %}  \n  {{ 'y' }}  \n",
    "{%- for m in ['a', 'b'] -%}\n  {{ m }}\n{%- endfor %}\n",
    '{% macro m() %}{{ varargs }}{% endmacro %}{{ m is defined }}',
    "{{ 'a b c'.split(' ', 1) }} {{ 'a\\nb'.split('\\n') }} {{ '  x  '.rstrip() }}|{{ '  x  '.lstrip() }}|",
    "{{ true == 1 }} {{ 1.0 == 1 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ none == none }}",
    "{{ [] | first }}|{{ [] | last }}|{{ [1,2] | first }}{{ 'abc' | last }}",
    "{{ 42 | string }}{{ 4.0 | int }}{{ '12' | int * 2 }}{{ true | int }}{{ 'abc' | list }}",
    '{% set s %}multi\nline{% endset %}[{{ s }}]',
    '{{ range(0) | list }} {{ range(5, 0, -2) | list }}',
    "{{ 'é' | upper }}{{ 'ÀB' | lower }}",
    "{{ [{'n': 2}, {'n': 1}] | sort(attribute='n') }}",
    "{{ {'b': 1, 'a': 2} | dictsort(by='value') }}",
    "{{ 'abc' | reverse }} {{ [1, 2] | reverse | list }}",
    "{{ [1, 2, 3] | map('string') | join('-') }}",
    "{{ 1.5 | round }} {{ 2.5 | round }} {{ 2.675 | round(2) }} {{ 7 | round }} {{ 1.23 | round(1, 'floor') }}",
    "{{ '%s' }} {{ '{}' }} {{ '\\\\' }}",
    '{{ loop is defined }}{% for x in [1] %}{{ loop is defined }}{% endfor %}',
    "{% for x in [1, 2, 3] %}{{ loop.previtem is defined }}{{ loop.nextitem | default('END') }}{% endfor %}",
    "{{ ({'a': 1}).items() | list }}",
    "{{ {'a': none}.a is none }}{{ {'a': none}.a is defined }}",
    '{{ \'abc\'.title() }} {{ \'hello world-foo\'.title() }} {{ \'hello world-foo\' | title }} {{ "it\'s" | title }}',
    '{% for i in range(3) %}{{ i }}{% else %}E{% endfor %}{% for i in [] %}{% else %}E{% endfor %}',
    "{{ [1, 2] * 2 }} {{ 3 * 'ab' }}",
    "{{ 'a' if 0 else 'b' if 0 else 'c' }}",
    '{{ 10 // 3 * 3 + 10 % 3 }} {{ -10 // 3 }} {{ 10.5 % 3 }} {{ -1 % 5 }}',
    '{{ [0, 1, 2] | select | list }} {{ [0, 1, 2] | reject | list }}',
    "{{ x | default }}|{{ none | default('n') }}|{{ false | default('f', boolean=true) }}",
    "{{ {'z': 1, 'a': 2} }} {{ {'k': 'v'} | tojson }} {{ 'é\\u2028\\x01' | tojson }} {{ [1.0, 1e100, -0.0] | tojson }}",
    "{{ '  a\\n\\n  b  ' | trim }}|{{ 'xxhixx' | trim('x') }}",
    "{{ messages | length }}{% for m in messages %}{{ m.role }}:{{ m['content'] }};{% endfor %}",
    "{{ 'abc'.find('c') }} {{ 'abca'.count('a') }} {{ ', '.join(['x', 'y']) }}",
    "{%- set ns = namespace(found=false) -%}{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.found = true -%}{%- endif -%}{%- endfor -%}{{ ns.found }}",
    'a {# comment #} b {#- trimmed -#} c',
    "{{ 'a' }}{# c #}\n{{ 'b' }}{% if true %}\n{% endif %}c",
    '{{ 1 }}\n\n{% raw %}\n{{ x }}\n{% endraw %}\n',
    "{{ [3, 1] | max }} {{ ['b', 'A', 'c'] | max }} {{ ['b', 'A', 'c'] | min }} {{ [1.5, 2] | sum }} {{ [] | sum }}",
    "{{ 'aXbX'.split('X') }} {{ ''.split() }} {{ ''.split(',') }}",
    "{{ '\\t' | length }} {{ '日本' | length }} {{ '日本'[1] }}",
    '{{ 9999999999 * 9 }} {{ -5 | abs }} {{ -5.5 | abs }}',
    "{{ 'a' * 0 }}|{{ 'a' * -1 }}|{{ [1] * 0 }}",
    '{{ 1 == 1 == 1 }} {{ 1 < 2 > 1 }} {{ 3 > 2 > 1 }}',
    "{{ 'ab' ~ [1] ~ {'a': 1} ~ none }}",
    '{{ 0.1 * 3 }} {{ 1e300 * 1e10 }} {{ 5e-324 }} {{ 2.0 ** 0.5 }}',
    "{{ 'Straße ÀÉÎõü ÿ Ā ā Ĺ ĺ αβγ ΑΒΓ ς привет ПРИВЕТ ёЁ 日本' | upper }}|{{ 'Straße ÀÉÎõü Ÿ Ā ā Ĺ ĺ αβγ ΑΒΓ привет ПРИВЕТ ёЁ' | lower }}",
]


def test_snippets_match_jinja2():
    ctx = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    results = run_driver([{"template": s, "cases": [ctx]} for s in SNIPPETS])
    for src, res in zip(SNIPPETS, results):
        ok, want = reference(src, ctx)
        got = res[0]
        assert got["ok"] == ok, f"{src!r}: jinja2 {'ok' if ok else want}, kiln {got.get('error', 'ok')}"
        if ok:
            assert got["text"] == want, f"{src!r}: want {want!r}, got {got['text']!r}"
