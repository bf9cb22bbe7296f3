"""The JSON schemas of tests/data/schemas against the jsonschema package (Draft 2020-12 with its format checker).

Each schema's examples are valid, and kiln's grammar (tests/schema_driver) accepts them. Then many mutations of the
examples (a key dropped or added, a value replaced, an array grown or shrunk), written compactly as kiln writes
JSON: every text the grammar accepts must be valid (the grammar never lets an invalid document through), and a
mutation that only changes a number, boolean or null to a valid value must be accepted (the grammar does not
lose what the schema allows there).
"""

import copy
import json
import os
import subprocess
from pathlib import Path

import jsonschema

HERE = Path(__file__).resolve().parent
SCHEMAS = sorted((HERE.parent / "data" / "schemas").glob("*.json"))
BUILD = Path(os.environ.get("KILN_BUILD_DIR", HERE.parents[1] / "build"))
DRIVER = BUILD / "tests" / "schema_driver"

SCALARS = [None, True, False, 0, 1, -1, 2, 7, 99, 100, 101, 130, 131, -40, -41, 85, 86, 0.5, -0.5, 0.25, 12.5,
           1000, 1001, 4096, 4097, 99999, 100000, -90, 90.5, 180, -180.5]
STRINGS = ["", "x", "open", "celsius", "GB", "gb", "ABC-001", "ORD-000123", "ORD-12", "2024-02-29", "2023-02-29",
           "09:30:00Z", "9:30", "a@b.co", "no-at-sign", "123e4567-e89b-12d3-a456-426614174000", "12345",
           "94103-1234", "+14155550100", "5551234567", "ab_cd", "Ab", "x" * 41, "quote\"and\\slash", "tab\there"]


def compact(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def paths(value, prefix=()):
    """Every location in a JSON value: tuples of keys and indices."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, prefix + (i,))


def get(value, path):
    for p in path:
        value = value[p]
    return value


def replaced(value, path, new):
    out = copy.deepcopy(value)
    if not path:
        return new
    get(out, path[:-1])[path[-1]] = new
    return out


def mutations(example):
    """(document, scalar_only): scalar_only when a number, boolean or null replaced a number, boolean or null."""
    for path in paths(example):
        target = get(example, path)
        for s in SCALARS:
            scalar = not isinstance(target, (dict, list, str)) and "e" not in compact(s)
            yield replaced(example, path, s), scalar
        for s in STRINGS + ([target + "x", target[:-1], target.upper()] if isinstance(target, str) else []):
            yield replaced(example, path, s), False
        yield replaced(example, path, []), False
        yield replaced(example, path, {}), False
        if isinstance(target, dict):
            for k in target:
                d = copy.deepcopy(target)
                del d[k]
                yield replaced(example, path, d), False
            yield replaced(example, path, {**target, "zz_extra": 1}), False
            yield replaced(example, path, {**target, "zz_extra": "s"}), False
            yield replaced(example, path, dict(reversed(list(target.items())))), False
        if isinstance(target, list):
            if target:
                yield replaced(example, path, target + [target[-1]]), False
                yield replaced(example, path, target + target + target), False
                yield replaced(example, path, target[:-1]), False


def run_driver(requests):
    assert DRIVER.exists(), f"{DRIVER} is missing: build the schema_driver target"
    stdin = "".join(json.dumps(r) + "\n" for r in requests)
    out = subprocess.run([str(DRIVER)], input=stdin, capture_output=True, text=True, check=True, timeout=300)
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_suite_has_a_dozen_schemas_with_valid_examples():
    assert len(SCHEMAS) >= 12
    for path in SCHEMAS:
        schema = json.loads(path.read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        assert schema["examples"], path.name
        for e in schema["examples"]:
            validator.validate(e)


def test_grammar_accepts_only_valid_documents():
    requests, cases = [], []
    for path in SCHEMAS:
        schema = json.loads(path.read_text())
        validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        docs = {}
        for e in schema["examples"]:
            docs[compact(e)] = (True, True)
            for doc, scalar in mutations(e):
                text = compact(doc)
                if text not in docs:
                    docs[text] = (validator.is_valid(doc), scalar)
        texts = list(docs)
        requests.append({"schema": schema, "texts": texts})
        cases.append((path.name, texts, [docs[t] for t in texts]))
    replies = run_driver(requests)
    checked = valid_seen = 0
    for (name, texts, verdicts), reply in zip(cases, replies):
        assert reply["ok"], f"{name}: {reply.get('error')}"
        for text, accepted, (valid, scalar) in zip(texts, reply["accepted"], verdicts):
            assert valid or not accepted, f"{name}: the grammar accepts an invalid document: {text}"
            if valid and scalar:
                assert accepted, f"{name}: the grammar rejects a valid document: {text}"
            checked += 1
            valid_seen += valid
    assert checked > 5000 and valid_seen > 500, (checked, valid_seen)
