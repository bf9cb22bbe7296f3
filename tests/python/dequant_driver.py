"""tests/tools/dequant_driver from Python: the dtype table and the reference (de)quantizers of src/core, as the
tests of test_dequant.py, test_quant_rows.py and test_quant_iq.py call them. The binary is
$KILN_BUILD_DIR/tests/dequant_driver (ctest sets KILN_BUILD_DIR)."""

import os
import subprocess
from pathlib import Path

import numpy as np


def driver() -> Path:
    build = os.environ.get("KILN_BUILD_DIR")
    assert build, "KILN_BUILD_DIR is not set (ctest sets it)"
    path = Path(build) / "tests" / "dequant_driver"
    assert path.exists(), f"{path} is missing: build the dequant_driver target"
    return path


def run_driver(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(driver()), *map(str, args)], capture_output=True, text=True, timeout=120)


def quantize_rows(name: str, x: np.ndarray, importance: np.ndarray | None, tmp_path: Path) -> bytes:
    """kiln's DTypeInfo::quantize_rows over the rows of a 2-d array (importance: x.shape[1] weights or None)."""
    src, dst, imp = tmp_path / "rows.f32", tmp_path / f"rows.{name}", tmp_path / "importance.f32"
    src.write_bytes(np.ascontiguousarray(x, dtype=np.float32).tobytes())
    args = ["quantize-rows", name, src, dst, x.shape[1]]
    if importance is not None:
        imp.write_bytes(np.ascontiguousarray(importance, dtype=np.float32).tobytes())
        args.append(imp)
    r = run_driver(*args)
    assert r.returncode == 0, r.stderr
    return dst.read_bytes()
