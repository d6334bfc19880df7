// GPU matrix multiplication against the CPU: square products from 64 to 8192 (powers of two) and the MNIST MLP's
// shapes, float in three arithmetics on the GPU:
//   fp32  cuBLAS with CUBLAS_COMPUTE_32F, exact FP32 FMAs, no tensor cores (what policy::cuda uses)
//   tf32  cuBLAS with CUBLAS_COMPUTE_32F_FAST_TF32: tensor cores, inputs rounded to TF32, FP32 accumulation
//         (policy::cuda_tf32, PyTorch's allow_tf32)
//   bf16  cublasGemmEx on BF16 inputs and output with FP32 accumulation (PyTorch's bf16 matmul)
// plus kiln's own entry points (policy::cuda::gemm and policy::cuda_tf32::gemm, i.e. cuBLAS/cuBLASLt behind kiln's
// row-major contract) to show what the wrapper costs, and kiln's CPU GEMM (kernels::cpu::gemm) up to 2048 for the
// GPU/CPU ratio. GPU times are CUDA-event times of back-to-back calls on the kiln stream; each figure is the median of
// 7 repetitions of enough calls to last >= 2 ms (CPU: >= 50 ms). % of peak is of the best GFLOP/s this run measured
// for that arithmetic (over all sizes): the device's practical peak, measured instead of taken from a data sheet.
// Before timing, each arithmetic is checked against the CPU on a 256 x 256 x 256 product.
//
//   gpu_gemm_bench [--threads N] [--max-cpu 2048] [--max 8192] [--quick]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln/core/cuda/device.cuh"
#include "kiln/core/cuda/device_buffer.cuh"
#include "kiln/core/cuda/handles.cuh"
#include "kiln/core/cuda/stream.cuh"
#include "kiln/core/memory.hpp"
#include "kiln/core/threads.hpp"
#include "kiln/kernels/cpu/gemm.hpp"
#include "kiln/policy_cuda.cuh"
#include "gpu_timing.cuh"

using kiln::index_t;

namespace {

volatile float g_sink;  // keeps CPU results alive

struct gemm_shape {
  std::string what;
  bool transpose_a, transpose_b;
  index_t m, n, k;
  std::string dims() const { return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k); }
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

// Deterministic values in [-0.5, 0.5).
void fill(float* x, index_t count, unsigned seed) {
  unsigned s = seed;
  for (index_t i = 0; i < count; ++i) {
    s = s * 1664525u + 1013904223u;
    x[i] = float(s >> 8) / float(1u << 24) - 0.5f;
  }
}

__global__ void to_bf16_kernel(const float* in, __nv_bfloat16* out, index_t n) {
  for (index_t i = index_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(in[i]);
}
__global__ void from_bf16_kernel(const __nv_bfloat16* in, float* out, index_t n) {
  for (index_t i = index_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += index_t(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(in[i]);
}

// The same on the CPU with a steady clock.
double cpu_seconds_per_call(const std::function<void()>& f, int repetitions, double min_seconds) {
  using clock = std::chrono::steady_clock;
  f();
  long calls = 1;
  auto time_calls = [&](long n) {
    const auto t0 = clock::now();
    for (long i = 0; i < n; ++i) f();
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  for (;;) {
    const double s = time_calls(calls);
    if (s >= min_seconds) break;
    calls = s <= 0 ? calls * 10 : std::max(calls * 2, long(double(calls) * min_seconds * 1.2 / s) + 1);
  }
  std::vector<double> per_call;
  for (int r = 0; r < repetitions; ++r) per_call.push_back(time_calls(calls) / double(calls));
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

// Device operands of one shape in float and BF16 (row-major, as kiln stores them).
struct operands {
  kiln::cuda::device_buffer<float> a, b, c;
  kiln::cuda::device_buffer<__nv_bfloat16> a16, b16, c16;
};

operands make_operands(const gemm_shape& s, bool with_bf16) {
  operands o{kiln::cuda::device_buffer<float>(s.m * s.k), kiln::cuda::device_buffer<float>(s.k * s.n),
             kiln::cuda::device_buffer<float>(s.m * s.n), {}, {}, {}};
  std::vector<float> host(static_cast<std::size_t>(std::max(s.m * s.k, s.k * s.n)));
  fill(host.data(), s.m * s.k, 1);
  kiln::cuda::copy_to_device(host.data(), o.a.data(), s.m * s.k);
  fill(host.data(), s.k * s.n, 2);
  kiln::cuda::copy_to_device(host.data(), o.b.data(), s.k * s.n);
  KILN_CUDA_CHECK(cudaMemsetAsync(o.c.data(), 0, o.c.bytes(), kiln::cuda::current_stream()));
  if (with_bf16) {
    o.a16 = kiln::cuda::device_buffer<__nv_bfloat16>(s.m * s.k);
    o.b16 = kiln::cuda::device_buffer<__nv_bfloat16>(s.k * s.n);
    o.c16 = kiln::cuda::device_buffer<__nv_bfloat16>(s.m * s.n);
    to_bf16_kernel<<<1024, 256, 0, kiln::cuda::current_stream()>>>(o.a.data(), o.a16.data(), s.m * s.k);
    to_bf16_kernel<<<1024, 256, 0, kiln::cuda::current_stream()>>>(o.b.data(), o.b16.data(), s.k * s.n);
    KILN_CUDA_CHECK_LAUNCH();
  }
  kiln::cuda::synchronize();
  return o;
}

// One call of a GPU system on a shape: C = op(A) op(B), row-major, through cuBLAS's column-major interface (C^T =
// op(B)^T op(A)^T: B first, m and n swapped), or through kiln's policy.
std::function<void()> gpu_call(const std::string& system, const gemm_shape& s, operands& o) {
  const index_t lda = s.transpose_a ? s.m : s.k, ldb = s.transpose_b ? s.k : s.n, ldc = s.n;
  const cublasOperation_t ta = s.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = s.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (system == "kiln_cuda")
    return [&o, s, lda, ldb, ldc] {
      kiln::policy::cuda::gemm<float>(s.transpose_a, s.transpose_b, s.m, s.n, s.k, 1.0f, o.a.data(), lda, o.b.data(),
                                      ldb, 0.0f, o.c.data(), ldc);
    };
  if (system == "kiln_cuda_tf32")
    return [&o, s, lda, ldb, ldc] {
      kiln::policy::cuda_tf32::gemm<float>(s.transpose_a, s.transpose_b, s.m, s.n, s.k, 1.0f, o.a.data(), lda,
                                           o.b.data(), ldb, 0.0f, o.c.data(), ldc);
    };
  const bool bf16 = system == "cublas_bf16";
  const cublasComputeType_t compute = system == "cublas_tf32" ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  return [&o, s, lda, ldb, ldc, ta, tb, bf16, compute, type] {
    const float alpha = 1.0f, beta = 0.0f;
    const void* a = bf16 ? static_cast<const void*>(o.a16.data()) : o.a.data();
    const void* b = bf16 ? static_cast<const void*>(o.b16.data()) : o.b.data();
    void* c = bf16 ? static_cast<void*>(o.c16.data()) : o.c.data();
    KILN_CUBLAS_CHECK(cublasGemmEx(kiln::cuda::cublas_handle(), tb, ta, int(s.n), int(s.m), int(s.k), &alpha, b, type,
                                   int(ldb), a, type, int(lda), &beta, c, type, int(ldc), compute,
                                   CUBLAS_GEMM_DEFAULT));
  };
}

// Largest |gpu - cpu| relative to the largest |cpu| over C, for the accuracy check.
double relative_error(const std::string& system, const gemm_shape& s, operands& o) {
  gpu_call(system, s, o)();
  std::vector<float> gpu(static_cast<std::size_t>(s.m * s.n));
  if (system == "cublas_bf16") {
    kiln::cuda::device_buffer<float> widened(s.m * s.n);
    from_bf16_kernel<<<256, 256, 0, kiln::cuda::current_stream()>>>(o.c16.data(), widened.data(), s.m * s.n);
    KILN_CUDA_CHECK_LAUNCH();
    kiln::cuda::copy_to_host(widened.data(), gpu.data(), s.m * s.n);
  } else {
    kiln::cuda::copy_to_host(o.c.data(), gpu.data(), s.m * s.n);
  }
  std::vector<float> a(static_cast<std::size_t>(s.m * s.k)), b(static_cast<std::size_t>(s.k * s.n)),
      c(static_cast<std::size_t>(s.m * s.n));
  fill(a.data(), s.m * s.k, 1);
  fill(b.data(), s.k * s.n, 2);
  kiln::kernels::cpu::gemm<float>(s.transpose_a, s.transpose_b, s.m, s.n, s.k, 1.0f, a.data(),
                                  s.transpose_a ? s.m : s.k, b.data(), s.transpose_b ? s.k : s.n, 0.0f, c.data(), s.n);
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    worst = std::max(worst, std::abs(double(gpu[i]) - double(c[i])));
    scale = std::max(scale, std::abs(double(c[i])));
  }
  return worst / std::max(scale, 1e-30);
}

struct result {
  std::string what, dims, system;
  double gflops, microseconds;
};

}  // namespace

int main(int argc, char** argv) try {
  int threads = 1;
  index_t max_cpu = 2048, max_size = 8192;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--max-cpu") && i + 1 < argc)
      max_cpu = std::atol(argv[++i]);
    else if (!std::strcmp(argv[i], "--max") && i + 1 < argc)
      max_size = std::atol(argv[++i]);
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else {
      std::fprintf(stderr, "usage: %s [--threads N] [--max-cpu 2048] [--max 8192] [--quick]\n", argv[0]);
      return 2;
    }
  }
  const cudaError_t status = kiln::cuda::device_status();
  if (status != cudaSuccess) {
    std::printf("SKIPPED: no CUDA device (%s)\n", cudaGetErrorString(status));
    return 0;
  }
  kiln::set_num_threads(threads);
  const int repetitions = quick ? 3 : 7;
  const double gpu_min_seconds = quick ? 0.5e-3 : 2e-3, cpu_min_seconds = quick ? 0.01 : 0.05;
  std::printf("gpu_gemm_bench on %s; CPU GEMM on %d thread%s\n\n", kiln::cuda::describe_device().c_str(), threads,
              threads == 1 ? "" : "s");

  std::vector<gemm_shape> shapes;
  for (index_t n = 64; n <= max_size; n *= 2) shapes.push_back({"square", false, false, n, n, n});
  // MNIST MLP 784-128-10 at batch 64: forward X W^T, backward dX = dY W, dW = dY^T X.
  shapes.push_back({"mlp_forward", false, true, 64, 128, 784});
  shapes.push_back({"mlp_backward_dx", false, false, 64, 784, 128});
  shapes.push_back({"mlp_backward_dw", true, false, 128, 784, 64});
  const std::vector<std::string> systems = {"cublas_fp32", "cublas_tf32", "cublas_bf16", "kiln_cuda",
                                            "kiln_cuda_tf32"};
  auto precision_of = [](const std::string& system) -> std::string {
    if (system.find("bf16") != std::string::npos) return "bf16";
    if (system.find("tf32") != std::string::npos) return "tf32";
    return "fp32";
  };

  // Accuracy first: FP32 differs from the CPU by summation order only; TF32 and BF16 round their inputs (10- and
  // 7-bit mantissas), so their errors are ~1e-3 and ~1e-2 of the largest value.
  {
    const gemm_shape check{"check", false, true, 256, 256, 256};
    operands o = make_operands(check, true);
    for (const auto& system : systems) {
      const double error = relative_error(system, check, o);
      const std::string precision = precision_of(system);
      const double limit = precision == "fp32" ? 1e-5 : precision == "tf32" ? 1e-2 : 5e-2;
      std::printf("check %-15s 256x256x256 NT: max |gpu - cpu| / max |cpu| = %.2e (limit %.0e)\n", system.c_str(),
                  error, limit);
      if (!(error <= limit)) {
        std::fprintf(stderr, "gpu_gemm_bench: %s disagrees with the CPU GEMM\n", system.c_str());
        return 1;
      }
    }
    std::printf("\n");
  }

  std::vector<result> gpu_results, cpu_results;
  for (const auto& s : shapes) {
    operands o = make_operands(s, true);
    for (const auto& system : systems) {
      const double seconds =
          kiln::bench::gpu_seconds_per_call(gpu_call(system, s, o), repetitions, gpu_min_seconds);
      gpu_results.push_back({s.what, s.dims(), system, s.flops() / seconds * 1e-9, seconds * 1e6});
    }
    if (s.m <= max_cpu && s.n <= max_cpu && s.k <= max_cpu) {
      kiln::aligned_buffer<float> a(s.m * s.k), b(s.k * s.n), c(s.m * s.n);
      fill(a.data(), a.size(), 1);
      fill(b.data(), b.size(), 2);
      const double seconds = cpu_seconds_per_call(
          [&] {
            kiln::kernels::cpu::gemm<float>(s.transpose_a, s.transpose_b, s.m, s.n, s.k, 1.0f, a.data(),
                                            s.transpose_a ? s.m : s.k, b.data(), s.transpose_b ? s.k : s.n, 0.0f,
                                            c.data(), s.n);
          },
          repetitions, cpu_min_seconds);
      g_sink = c.data()[0];
      cpu_results.push_back({s.what, s.dims(), "kiln_cpu", s.flops() / seconds * 1e-9, seconds * 1e6});
    }
  }

  // The measured peak of each arithmetic: its best GFLOP/s over all sizes and systems.
  std::map<std::string, double> peak;
  for (const auto& r : gpu_results) peak[precision_of(r.system)] = std::max(peak[precision_of(r.system)], r.gflops);
  auto cpu_gflops = [&](const result& g) {
    for (const auto& c : cpu_results)
      if (c.dims == g.dims && c.what == g.what) return c.gflops;
    return 0.0;
  };

  std::printf("%-16s %-16s", "op", "MxNxK");
  for (const auto& system : systems) std::printf(" %15s %%peak", system.c_str());
  std::printf(" %10s %9s\n", "kiln_cpu", "fp32/cpu");
  for (const auto& s : shapes) {
    std::printf("%-16s %-16s", s.what.c_str(), s.dims().c_str());
    double fp32 = 0, cpu = 0;
    for (const auto& r : gpu_results)
      if (r.dims == s.dims() && r.what == s.what) {
        std::printf(" %15.1f %4.0f%%", r.gflops, 100.0 * r.gflops / peak[precision_of(r.system)]);
        if (r.system == "cublas_fp32") fp32 = r.gflops, cpu = cpu_gflops(r);
      }
    if (cpu > 0)
      std::printf(" %10.1f %8.0fx\n", cpu, fp32 / cpu);
    else
      std::printf(" %10s %9s\n", "-", "-");
  }
  std::printf("(GFLOP/s; %%peak of the best this run measured for the same arithmetic: fp32 %.0f, tf32 %.0f, bf16 %.0f)\n\n",
              peak["fp32"], peak["tf32"], peak["bf16"]);

  for (const auto& [precision, gflops] : peak)
    std::printf("RESULT bench=gpu_gemm metric=peak precision=%s gflops=%.1f\n", precision.c_str(), gflops);
  for (const auto& r : gpu_results)
    std::printf("RESULT bench=gpu_gemm shape=%s op=%s system=%s precision=%s gflops=%.1f pct_peak=%.1f us=%.3f\n",
                r.dims.c_str(), r.what.c_str(), r.system.c_str(), precision_of(r.system).c_str(), r.gflops,
                100.0 * r.gflops / peak[precision_of(r.system)], r.microseconds);
  for (const auto& r : cpu_results)
    std::printf("RESULT bench=gpu_gemm shape=%s op=%s system=kiln_cpu precision=fp32 threads=%d gflops=%.2f us=%.3f\n",
                r.dims.c_str(), r.what.c_str(), threads, r.gflops, r.microseconds);
  for (const auto& r : gpu_results)
    if (r.system == "cublas_fp32")
      if (const double cpu = cpu_gflops(r); cpu > 0)
        std::printf("RESULT bench=gpu_gemm shape=%s op=%s metric=gpu_cpu_ratio precision=fp32 threads=%d ratio=%.1f\n",
                    r.dims.c_str(), r.what.c_str(), threads, r.gflops / cpu);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gpu_gemm_bench: %s\n", e.what());
  return 1;
}
