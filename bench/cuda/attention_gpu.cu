// Attention on the GPU: kiln's fused kernel (policy::cuda's attention_forward / attention_backward,
// kernels/cuda/attention.cuh) against attention composed of cuBLAS products and kiln's softmax (scores, softmax,
// weights times values: the [L, L] scores held in memory), for sequences of 128 to 4096 tokens, 32 sequences x heads
// of 64 features, causal or not. Before timing, the fused kernel is checked against the CPU's tiled kernel on a small
// problem. Times are CUDA-event medians of 7 repetitions, each of enough calls to last >= 2 ms (gpu_timing.cuh); the composed forward
// leaves out the causal mask (it only makes it slower), so its figure is a lower bound. PyTorch's flash attention on
// the same shapes: bench/peers/torch_gpu_bench.py.
//
//   attention_gpu [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/core/cuda/device.cuh"
#include "kiln/core/cuda/device_buffer.cuh"
#include "kiln/core/cuda/stream.cuh"
#include "kiln/kernels/cpu/attention.hpp"
#include "kiln/policy_cuda.cuh"
#include "gpu_timing.cuh"

using kiln::index_t;

namespace {

std::vector<float> random_values(index_t n, unsigned seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  unsigned s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = float(s >> 8) / float(1u << 24) - 0.5f;
  }
  return v;
}
kiln::cuda::device_buffer<float> to_device(const std::vector<float>& host) {
  kiln::cuda::device_buffer<float> d(static_cast<index_t>(host.size()));
  kiln::cuda::copy_to_device(host.data(), d.data(), d.size());
  return d;
}

// The fused kernel against the CPU's on 3 x 70 queries and keys of 64 features, causal: the largest difference of
// the outputs and of dq.
bool check_against_cpu() {
  const index_t B = 3, L = 70, D = 64;
  const auto q = random_values(B * L * D, 1), k = random_values(B * L * D, 2), v = random_values(B * L * D, 3),
             g = random_values(B * L * D, 4);
  kiln::kernels::cpu::attention_problem<float> p;
  p.batch = B;
  p.queries = p.keys = L;
  p.head_dim = p.value_dim = D;
  p.scale = 0.125f;
  p.causal = true;
  std::vector<float> out(q.size()), lse(B * L), dq(q.size());
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  kiln::kernels::cpu::attention_forward(p, out.data(), lse.data());
  kiln::kernels::cpu::attention_backward<float>(p, out.data(), lse.data(), g.data(), {dq.data(), false}, {}, {});
  auto qd = to_device(q), kd = to_device(k), vd = to_device(v), gd = to_device(g), od = to_device(out),
       ld = to_device(lse), dqd = to_device(dq);
  p.q = qd.data();
  p.k = kd.data();
  p.v = vd.data();
  kiln::policy::cuda::attention_forward(p, od.data(), ld.data());
  kiln::policy::cuda::attention_backward<float>(p, od.data(), ld.data(), gd.data(), {dqd.data(), false}, {}, {});
  std::vector<float> gpu_out(out.size()), gpu_dq(dq.size());
  kiln::cuda::copy_to_host(od.data(), gpu_out.data(), od.size());
  kiln::cuda::copy_to_host(dqd.data(), gpu_dq.data(), dqd.size());
  double worst = 0;
  for (std::size_t i = 0; i < out.size(); ++i)
    worst = std::max({worst, double(std::fabs(gpu_out[i] - out[i])), double(std::fabs(gpu_dq[i] - dq[i]))});
  std::printf("check: fused kernel against the CPU's, largest difference %.3g (%s)\n", worst,
              worst < 1e-4 ? "ok" : "FAILED");
  return worst < 1e-4;
}

}  // namespace

int main(int argc, char** argv) try {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (!kiln::cuda::device_available()) {
    std::printf("attention_gpu: no CUDA device; nothing measured\n");
    return 0;
  }
  if (!check_against_cpu()) return 1;
  using P = kiln::policy::cuda;
  const index_t sequences = 32, D = 64;
  std::printf("\n%-6s %-7s %14s %16s %18s %10s\n", "L", "causal", "fused fwd us", "fused fwd+bwd us",
              "composed fwd us", "fused x");
  for (index_t L : {index_t(128), index_t(512), index_t(1024), index_t(2048), index_t(4096)}) {
    if (quick && L > 1024) break;
    const index_t n = sequences * L * D;
    auto q = to_device(random_values(n, 5)), k = to_device(random_values(n, 6)), v = to_device(random_values(n, 7)),
         g = to_device(random_values(n, 8));
    kiln::cuda::device_buffer<float> out(n), lse(sequences * L), dq(n), dk(n), dv(n);
    // The composed attention's scores and weights, [sequences, L, L] each (what the fused kernel never holds).
    kiln::cuda::device_buffer<float> scores(sequences * L * L), weights(sequences * L * L), composed(n);
    for (bool causal : {false, true}) {
      kiln::kernels::cpu::attention_problem<float> p;
      p.q = q.data();
      p.k = k.data();
      p.v = v.data();
      p.batch = sequences;
      p.queries = p.keys = L;
      p.head_dim = p.value_dim = D;
      p.scale = float(1.0 / std::sqrt(double(D)));
      p.causal = causal;
      using kiln::bench::gpu_seconds_per_call;
      const double fwd = gpu_seconds_per_call([&] { P::attention_forward(p, out.data(), lse.data()); }, 7, 2e-3);
      const auto forward_and_backward = [&] {
        P::attention_forward(p, out.data(), lse.data());
        P::attention_backward<float>(p, out.data(), lse.data(), g.data(), {dq.data(), false}, {dk.data(), false},
                                     {dv.data(), false});
      };
      const auto composed_forward = [&] {
        P::gemm_strided_batched(false, true, L, L, D, p.scale, q.data(), D, L * D, k.data(), D, L * D, 0.0f,
                                scores.data(), L, L * L, sequences);
        P::softmax_forward(static_cast<const float*>(scores.data()), weights.data(), sequences * L, L, 1, false);
        P::gemm_strided_batched(false, false, L, D, L, 1.0f, weights.data(), L, L * L, v.data(), D, L * D, 0.0f,
                                composed.data(), D, L * D, sequences);
      };
      const double both = gpu_seconds_per_call(forward_and_backward, 7, 2e-3);
      const double comp = gpu_seconds_per_call(composed_forward, 7, 2e-3);
      std::printf("%-6lld %-7s %14.1f %16.1f %18.1f %9.2fx\n", static_cast<long long>(L), causal ? "yes" : "no",
                  fwd * 1e6, both * 1e6, comp * 1e6, comp / fwd);
      std::printf("RESULT bench=attention_gpu length=%lld causal=%d fused_fwd_us=%.2f fused_fwd_bwd_us=%.2f "
                  "composed_fwd_us=%.2f\n",
                  static_cast<long long>(L), causal ? 1 : 0, fwd * 1e6, both * 1e6, comp * 1e6);
    }
  }
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "attention_gpu: %s\n", e.what());
  return 1;
}
