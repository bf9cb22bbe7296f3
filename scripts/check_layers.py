#!/usr/bin/env python3
"""Checks kiln's structural rules (the layer table of src/README.md):
- every folder of src/ is a layer, and an #include in src/<layer>/ only names its own layer or a layer below it (src/runtime/scheduler/: only
  core/ and runtime/kv_cache/);
- src/ never includes tests/, bench/, dev/ or tools/;
- the public headers (include/kiln/) include only the standard library, fmt and each other: never src/;
- no file under src/, include/ or tools/ is longer than 1,000 lines (a big file becomes a folder).
Exit status 1 with one line per violation."""
import pathlib
import re
import sys

LAYERS = ["core", "formats", "tokenizer", "grammar", "ops", "backends", "models", "runtime", "server", "quant"]
# What each layer may include, besides itself (src/README.md).
ALLOWED = {
    "core": set(),
    "formats": {"core"},
    "tokenizer": {"core", "formats"},
    "grammar": {"core", "formats", "tokenizer"},
    "ops": {"core"},
    "backends": {"core", "ops"},
    "models": {"core", "ops", "backends", "formats"},
    "runtime": {"core", "ops", "backends", "formats", "models", "tokenizer", "grammar"},
    "server": {"core", "ops", "backends", "formats", "models", "tokenizer", "grammar", "runtime"},
    "quant": {"core", "ops", "backends", "formats", "models", "tokenizer", "grammar", "runtime"},  # not server
}
# Folders held to less than their layer allows: the scheduler is pure bookkeeping over the KV cache (no model).
NARROW = {"src/runtime/scheduler": ("core/", "runtime/kv_cache/", "runtime/scheduler/")}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
MAX_LINES = 1000


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    problems = []
    for folder in sorted(p for p in (root / "src").iterdir() if p.is_dir()):
        if folder.name not in LAYERS:
            problems.append(f"src/{folder.name}/: a folder that is no layer (add it to LAYERS and ALLOWED)")
    for layer in LAYERS:
        for path in sorted((root / "src" / layer).rglob("*")):
            if path.suffix not in {".h", ".hpp", ".cpp", ".cu", ".cuh"}:
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1).split("/")[0]
                rel = path.relative_to(root)
                folder = str(rel.parent)
                if folder in NARROW and "/" in m.group(1) and not m.group(1).startswith(NARROW[folder]):
                    problems.append(f"{rel}:{n}: {folder} may include only {', '.join(NARROW[folder])}")
                if target in {"tests", "bench", "dev", "tools"}:
                    problems.append(f"{rel}:{n}: src/ must not include {m.group(1)}")
                elif target in LAYERS and target != layer and target not in ALLOWED[layer]:
                    problems.append(f"{rel}:{n}: layer '{layer}' may not include '{m.group(1)}' "
                                    f"(allowed: {', '.join(sorted(ALLOWED[layer])) or 'nothing'})")
    for path in sorted((root / "include" / "kiln").glob("*.h")):
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if m and not m.group(1).startswith("kiln/"):
                problems.append(f"{path.relative_to(root)}:{n}: a public header may not include \"{m.group(1)}\"")
    for top in ["src", "include", "tools"]:
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and path.suffix in {".h", ".hpp", ".cpp", ".cu", ".cuh"}:
                n = sum(1 for _ in path.open(errors="replace"))
                if n > MAX_LINES:
                    problems.append(f"{path.relative_to(root)}: {n} lines (limit {MAX_LINES}: make it a folder)")
    for p in problems:
        print(p)
    print(f"structure: {len(problems)} problem(s)" if problems else "structure: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
