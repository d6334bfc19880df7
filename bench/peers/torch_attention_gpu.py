#!/usr/bin/env python3
"""PyTorch's attention on the GPU: the peer of bench/cuda/attention_gpu.cu.

F.scaled_dot_product_attention on 32 sequences x heads (8 x 4) of 64 features, 128 to 4096 tokens, causal or not,
forward and forward + backward, through each backend PyTorch offers (torch.nn.attention.sdpa_kernel):
  math       the composed reference, float32
  efficient  memory-efficient attention, float32 (kiln's fused kernel computes in float32 too)
  flash      FlashAttention-2, bfloat16 (it takes no float32)
  cudnn      cuDNN's fused attention, bfloat16
Times are CUDA-event medians of 7 repetitions of enough calls to last >= 2 ms. A backend that refuses a shape is
reported as unavailable.

  torch_attention_gpu.py [--quick]
Prints SKIPPED and exits 0 when torch or CUDA is missing.
"""
import sys


def main():
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print("SKIPPED torch_attention_gpu: %s" % e)
        return 0
    if not torch.cuda.is_available():
        print("SKIPPED torch_attention_gpu: no CUDA device")
        return 0
    quick = "--quick" in sys.argv[1:]
    backends = [("math", SDPBackend.MATH, torch.float32), ("efficient", SDPBackend.EFFICIENT_ATTENTION, torch.float32),
                ("flash", SDPBackend.FLASH_ATTENTION, torch.bfloat16),
                ("cudnn", getattr(SDPBackend, "CUDNN_ATTENTION", None), torch.bfloat16)]

    def seconds_per_call(f):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def timed(calls):
            start.record()
            for _ in range(calls):
                f()
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop) * 1e-3

        timed(2)
        calls = 1
        while calls < (1 << 16) and timed(calls) < 2e-3:
            calls *= 2
        per_call = sorted(timed(calls) / calls for _ in range(7))
        return per_call[len(per_call) // 2]

    print("%-6s %-7s %-10s %-9s %12s %16s" % ("L", "causal", "backend", "dtype", "fwd us", "fwd+bwd us"))
    for length in (128, 512, 1024, 2048, 4096):
        if quick and length > 1024:
            break
        for causal in (False, True):
            for name, backend, dtype in backends:
                if backend is None:
                    print("RESULT bench=attention_gpu system=pytorch backend=%s length=%d causal=%d status=unavailable "
                          "reason=not_in_this_torch" % (name, length, int(causal)))
                    continue
                q, k, v = (torch.randn(8, 4, length, 64, device="cuda", dtype=dtype, requires_grad=True)
                           for _ in range(3))
                grad = torch.randn(8, 4, length, 64, device="cuda", dtype=dtype)
                try:
                    with sdpa_kernel(backend):
                        forward = seconds_per_call(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))

                        def step():
                            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            torch.autograd.grad(out, (q, k, v), grad)

                        both = seconds_per_call(step)
                except RuntimeError as e:
                    reason = str(e).splitlines()[0][:80].replace(" ", "_") if str(e) else "RuntimeError"
                    print("RESULT bench=attention_gpu system=pytorch backend=%s length=%d causal=%d status=unavailable "
                          "reason=%s" % (name, length, int(causal), reason))
                    continue
                print("%-6d %-7s %-10s %-9s %12.1f %16.1f" % (length, "yes" if causal else "no", name,
                                                              str(dtype).replace("torch.", ""), forward * 1e6,
                                                              both * 1e6))
                print("RESULT bench=attention_gpu system=pytorch version=%s backend=%s dtype=%s length=%d causal=%d "
                      "fwd_us=%.2f fwd_bwd_us=%.2f" % (torch.__version__, name, str(dtype).replace("torch.", ""),
                                                       length, int(causal), forward * 1e6, both * 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
