#!/usr/bin/env python3
"""Structured output against a running `kiln serve` (any device), with the standard library alone, so that it
runs on a machine without the test venv: every schema of a folder as response_format json_schema, streamed and
not, at CONCURRENCY requests at once; the outputs go to a JSON file. `--validate FILE` (where the jsonschema
package is) then checks each output against its schema.

    bench/structured_check.py --base-url http://localhost:8090 --out /tmp/structured.json
    ~/.cache/kiln/venv/bin/python bench/structured_check.py --validate /tmp/structured.json
"""
import argparse
import concurrent.futures as cf
import json
import sys
import urllib.request
from pathlib import Path

SCHEMAS = Path(__file__).resolve().parent.parent / "tests" / "data" / "schemas"


def post(base_url, body, stream):
    req = urllib.request.Request(base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        if not stream:
            c = json.load(r)["choices"][0]
            return c["message"]["content"], c["finish_reason"]
        text, finish = "", None
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for c in json.loads(line[6:]).get("choices", []):
                text += c.get("delta", {}).get("content") or ""
                finish = c.get("finish_reason") or finish
        return text, finish


def run(args):
    jobs = []
    for path in sorted(Path(args.schemas).glob("*.json")):
        schema = json.loads(path.read_text())
        for stream in (False, True):
            for seed in range(args.seeds):
                jobs.append((path.name, schema, stream, seed))

    def one(job):
        name, schema, stream, seed = job
        body = {"messages": [{"role": "system", "content": "You answer with JSON only."},
                             {"role": "user", "content": f"Give an example of {schema.get('title', name)}."}],
                "max_tokens": 700, "temperature": 0.7, "seed": seed, "stream": stream,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": Path(name).stem, "schema": schema, "strict": True}}}
        text, finish = post(args.base_url, body, stream)
        return {"schema": name, "stream": stream, "seed": seed, "text": text, "finish": finish}

    with cf.ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(one, jobs))
    Path(args.out).write_text(json.dumps({"schemas": args.schemas, "results": results}, indent=1))
    stopped = sum(r["finish"] == "stop" for r in results)
    print(f"{len(results)} requests, {stopped} ended with stop; outputs in {args.out}")
    return 0


# Schemas whose language is infinite (any number of extra properties, a tree of any depth): a small model may
# fill max_tokens with them (tests/python/test_serve_structured.py leaves them out for that reason). An output
# cut by the length is reported, and counted apart from the bounded schemas' failures.
UNBOUNDED = {"metadata_additional.json", "tree_ref.json"}


def validate(path):
    import jsonschema
    data = json.loads(Path(path).read_text())
    bad = cut = 0
    for r in data["results"]:
        if r["schema"] in UNBOUNDED and r["finish"] == "length":
            cut += 1
            print(f"{r['schema']} stream={r['stream']} seed={r['seed']}: cut at max_tokens (unbounded schema)")
            continue
        schema = json.loads((SCHEMAS / r["schema"]).read_text())
        try:
            assert r["finish"] == "stop", f"finish_reason {r['finish']}"
            cls = jsonschema.validators.validator_for(schema)  # its draft's formats (time with an offset)
            jsonschema.validate(json.loads(r["text"]), schema, cls=cls, format_checker=cls.FORMAT_CHECKER)
        except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
            bad += 1
            print(f"{r['schema']} stream={r['stream']} seed={r['seed']}: {e}\n  {r['text']!r}")
    n = len(data["results"]) - cut
    print(f"{n - bad} of {n} outputs parse and validate"
          + (f"; {cut} of an unbounded schema cut at max_tokens" if cut else ""))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://localhost:8090")
    ap.add_argument("--schemas", default=str(SCHEMAS))
    ap.add_argument("--out", default="structured.json")
    ap.add_argument("--seeds", type=int, default=2, help="requests per schema and mode")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--validate", metavar="FILE", help="check a run's outputs against their schemas")
    args = ap.parse_args()
    sys.exit(validate(args.validate) if args.validate else run(args))


if __name__ == "__main__":
    main()
