#!/usr/bin/env python3
"""The peer of tests/attention_bench's prefill rows: PyTorch's scaled_dot_product_attention (its flash
kernel) on one sequence of T tokens, causal, in f16, with the same shape and the same count of operations
(4 x head_dim a query head and position seen), so that the two tables compare line by line.

  python3 bench/attention_peer.py [--shape 8b|HxKVxD] [--prefill 512,2048,4096]

Needs PyTorch with CUDA (the GPU machine's image has it); not part of any test.
"""
import argparse
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8b", help="8b (32 heads, 8 KV heads, head dim 128) or HxKVxD")
    ap.add_argument("--prefill", default="512,2048,4096", help="token counts, comma-separated")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        sys.exit(f"attention_peer.py needs PyTorch: {e}")
    if not torch.cuda.is_available():
        sys.exit("attention_peer.py: no CUDA device")
    heads, kv, dim = (32, 8, 128) if args.shape == "8b" else map(int, args.shape.split("x"))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| kind    | heads     | tokens |   us/call | TFLOP/s | backend |")
    print("|---------|-----------|-------:|----------:|--------:|---------|")
    for t in (int(x) for x in args.prefill.split(",")):
        q = torch.randn(1, heads, t, dim, device="cuda", dtype=torch.float16)
        # The flash kernel takes GQA as K/V heads repeated: repeated outside the timed calls.
        k = torch.randn(1, kv, t, dim, device="cuda", dtype=torch.float16).repeat_interleave(heads // kv, 1)
        v = torch.randn(1, kv, t, dim, device="cuda", dtype=torch.float16).repeat_interleave(heads // kv, 1)
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            try:
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    reps = 50
                    start.record()
                    for _ in range(reps):
                        F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    end.record()
                    torch.cuda.synchronize()
            except RuntimeError as e:
                print(f"| prefill | {heads}/{kv}x{dim} | {t:6d} | {backend.name}: {str(e).splitlines()[0]} |")
                continue
            us = start.elapsed_time(end) * 1e3 / reps
            seen = t * (t + 1) / 2
            tflops = 4.0 * dim * heads * seen / (us * 1e-6) / 1e12
            print(f"| prefill | {heads}/{kv}x{dim:<4d} | {t:6d} | {us:9.1f} | {tflops:7.1f} | {backend.name} |")


if __name__ == "__main__":
    main()
