"""bench/cuda_trace.py, the summary of a CUDA kernel timeline, on a trace written here (the records that
bench/cuda_trace.cpp writes on a GPU machine): which steps it compares, and how it splits a step's span."""
from __future__ import annotations

import gzip
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import cuda_trace  # noqa: E402

GEMV = ("void kiln::cuda::(anonymous namespace)::gemv_staged_kernel<(kiln::DType)2, 1, 8>"
        "(kiln::cuda::GemvArgs, unsigned int)")
NORM = ("void kiln::cuda::(anonymous namespace)::add_rms_norm_kernel<(kiln::cuda::(anonymous namespace)::"
        "NormOut)1, 256>(kiln::cuda::Rows, float*, long)")
ATTN = "void kiln::cuda::attention_staged_kernel<64, 4, __half>(kiln::cuda::Rows, kiln::cuda::Geometry)"


def write(path: Path, rows) -> Path:
    lines = ["start_ns,end_ns,correlation,graph_id,graph_node,name"]
    for start, end, corr, graph, name, *node in rows:
        q = name.replace('"', '""')
        lines.append(f'{start},{end},{corr},{graph},{node[0] if node else 0},"{q}"')
    path.write_text("\n".join(lines) + "\n")
    return path


def step(t0: int, corr: int) -> list:
    # The norm at 0-4 us, the GEMV at 3-10 (the two overlap for 1 us), nothing at 10-12, the attention at
    # 12-15: a span of 15 us, of which 3, 6 and 3 us alone, 1 shared and 2 idle.
    return [(t0, t0 + 4000, corr, 7, NORM), (t0 + 3000, t0 + 10000, corr, 7, GEMV),
            (t0 + 12000, t0 + 15000, corr, 7, ATTN)]


def test_short_names_drop_namespaces_and_parameters_and_name_the_dtypes():
    assert cuda_trace.short_name(GEMV) == "gemv_staged_kernel<q4_0, 1, 8>"
    assert cuda_trace.short_name(ATTN) == "attention_staged_kernel<64, 4, __half>"
    assert cuda_trace.short_name(NORM).startswith("add_rms_norm_kernel<")


def test_a_step_is_split_into_each_kernels_time_alone_the_shared_time_and_idle(tmp_path):
    rows = cuda_trace.load(write(tmp_path / "t.csv", step(1_000_000, 5)))
    (only,) = cuda_trace.steps(rows, 20)
    alone, shared, idle = cuda_trace.split(only)
    assert alone == [3000, 6000, 3000]
    assert shared == 1000 and idle == 2000
    assert sum(alone) + shared + idle == 15000


def test_a_steps_advances_add_up_to_its_span_and_a_kernel_ending_early_advances_nothing(tmp_path):
    rows = cuda_trace.load(write(tmp_path / "t.csv", step(1_000_000, 5)))
    (only,) = cuda_trace.steps(rows, 20)
    assert cuda_trace.advances(only) == [4000, 6000, 5000]  # the attention's includes the idle 2 us before it
    inner = step(0, 1)[:2] + [(5000, 8000, 1, 7, ATTN)]  # ends inside the GEMV
    (only,) = cuda_trace.steps(cuda_trace.load(write(tmp_path / "u.csv", inner)), 20)
    assert cuda_trace.advances(only) == [4000, 6000, 0]


def test_the_steps_compared_are_the_last_graph_replays_of_the_common_sequence(tmp_path):
    rows = []
    for i in range(5):  # five replays of one decode graph
        rows += step(1_000_000 * (i + 1), 100 + i)
    rows.append((500_000, 501_000, 1, 0, GEMV))  # a kernel launched outside a graph
    rows += [(9_000_000, 9_001_000, 200, 8, ATTN)]  # one replay of another graph
    chosen = cuda_trace.steps(cuda_trace.load(write(tmp_path / "t.csv", rows)), 3)
    assert [g[0]["corr"] for g in chosen] == [102, 103, 104]
    assert all(len(g) == 3 for g in chosen)


def test_replays_are_found_by_their_nodes_when_each_kernel_has_its_own_correlation_id(tmp_path):
    rows = []
    for i in range(3):
        rows += [(start, end, 1000 + 10 * i + j, 7, name, 50 + j)
                 for j, (start, end, _, _, name) in enumerate(step(1_000_000 * (i + 1), 0))]
    chosen = cuda_trace.steps(cuda_trace.load(write(tmp_path / "t.csv", rows)), 20)
    assert [len(g) for g in chosen] == [3, 3, 3]
    assert [g[0]["start"] for g in chosen] == [1_000_000, 2_000_000, 3_000_000]


def test_the_report_gives_the_shares_and_the_sequence(tmp_path):
    rows = step(1_000_000, 5) + step(2_000_000, 6)
    text = cuda_trace.report(cuda_trace.load(write(tmp_path / "t.csv", rows)), 20, 12, "toy")
    assert "2 steps of 3 kernels: span 15.0 us" in text
    assert "1.0 us with several kernels running, 2.0 us with none" in text
    assert "| `gemv_staged_kernel<q4_0, 1, 8>` | 1 | 7.00 | 6.0 | 6.0 | 40.0% |" in text
    assert "| `attention_staged_kernel<64, 4, __half>` | 1 | 3.00 | 3.0 | 5.0 | 33.3% |" in text
    assert "| 1 | `gemv_staged_kernel<q4_0, 1, 8>` | 7.00 | -1.00 | 6.00 |" in text
    assert "| 2 | `attention_staged_kernel<64, 4, __half>` | 3.00 | 2.00 | 5.00 |" in text


def test_a_layer_is_the_repeating_unit_that_covers_the_most_kernels_at_its_latest_start():
    layer = ["norm", "qkv", "rope", "attn", "o"]
    names = ["embd", "first_norm", "qkv", "rope", "attn", "o"] + layer * 6 + ["final_norm", "head"]
    assert cuda_trace.layer_period(names) == (5, 6, 6)  # not from the first layer's qkv: it has no norm
    assert cuda_trace.layer_period(["a", "b", "a", "b", "c"]) == (0, 0, 0)  # two repeats are not a layer
    assert cuda_trace.layer_period(["a", "b"] * 2 + ["a", "c"] * 3) == (2, 4, 3)


def test_the_report_averages_a_layer_over_the_layers_and_the_steps(tmp_path):
    rows = []
    for s, t0 in enumerate((1_000_000, 2_000_000)):
        rows.append((t0, t0 + 1000, 10 + s, 7, ATTN))  # a prologue kernel, then 4 layers of NORM, GEMV
        t = t0 + 1000
        for _ in range(4):
            rows += [(t, t + 2000, 10 + s, 7, NORM), (t + 1000, t + 5000, 10 + s, 7, GEMV)]
            t += 5000
    text = cuda_trace.report(cuda_trace.load(write(tmp_path / "t.csv", rows)), 20, 12, "toy")
    assert "A layer: 2 kernels from kernel 1, 4 times a step" in text
    # The norm: 2 us, ending 2 us after the GEMV before it (or the prologue); the GEMV: 4 us, ending 3 us after.
    assert "| 0 | `add_rms_norm_kernel<(NormOut)1, 256>` | 2.00 | 2.00 |" in text
    assert "| 1 | `gemv_staged_kernel<q4_0, 1, 8>` | 4.00 | 3.00 |" in text
    assert "| | a layer | | 5.00 |" in text


def test_a_compressed_trace_reads_as_the_plain_one(tmp_path):
    plain = write(tmp_path / "t.csv", step(1_000_000, 5))
    packed = tmp_path / "t.csv.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert cuda_trace.load(packed) == cuda_trace.load(plain)


def test_a_trace_without_graph_replays_says_so(tmp_path):
    text = cuda_trace.report(cuda_trace.load(write(tmp_path / "t.csv", [(0, 10, 1, 0, GEMV)])), 20, 12, "x")
    assert "no kernel replayed from a CUDA graph" in text


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
