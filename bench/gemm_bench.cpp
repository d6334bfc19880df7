// GEMM throughput: kiln's GEMM against OpenBLAS (when linked) on the MLP's shapes and 1024^3, float, on 1 and 2
// threads, each as GFLOP/s and as a percentage of this machine's single-core FP32 peak, which the bench measures first
// with a register-only FMA loop. Where kiln's AMX path is active (gemm_amx.hpp), "kiln" is that path and
// "kiln_avx512" the AVX-512 kernels alone, measured in the same run; "kiln_bf16" is kiln with its operands rounded to
// bfloat16 (product_precision::bfloat16, policy::cpu_bf16): one tile product instead of six on AMX, or AVX512-BF16's
// dot products (twice the float FMAs' flop per instruction) on CPUs that have those but no tiles; "kiln_bf16x3" with
// each operand split into two bfloat16 values (product_precision::bfloat16x3, policy::cpu_bf16x3): three products.
//
// Then the sparse-input products (dense_sparse_input.hpp) against the GEMM they replace, on a Dense layer's forward and
// weight gradient with MNIST's shapes, at several fractions of the input off its background: where they pay.
//
//   gemm_bench [--threads N] [--quick]
//
// Each figure is the median of >= 5 repetitions; each repetition runs the product enough times to last >= 20 ms.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kiln/core/memory.hpp"
#include "kiln/core/threads.hpp"
#include "kiln/kernels/cpu/dense_sparse_input.hpp"
#include "kiln/kernels/cpu/gemm.hpp"

#if defined(KILN_HAVE_CBLAS)
#include <cblas.h>
#endif

using kiln::index_t;
using clock_type = std::chrono::steady_clock;

namespace {

volatile float g_sink;  // keeps results alive

// Median (or, with best, minimum) seconds of one call of f, over `repetitions` repetitions of >= min_seconds each.
template <class F>
double time_per_call(F&& f, int repetitions, double min_seconds, bool best = false) {
  f();  // warm-up: scratch growth, page faults, thread pool start
  long calls = 1;
  for (;;) {  // calibrate calls per repetition
    auto t0 = clock_type::now();
    for (long i = 0; i < calls; ++i) f();
    double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (s >= min_seconds) break;
    calls = s <= 0 ? calls * 10 : std::max(calls * 2, long(double(calls) * min_seconds * 1.2 / s) + 1);
  }
  std::vector<double> per_call;
  for (int r = 0; r < repetitions; ++r) {
    auto t0 = clock_type::now();
    for (long i = 0; i < calls; ++i) f();
    per_call.push_back(std::chrono::duration<double>(clock_type::now() - t0).count() / double(calls));
  }
  std::sort(per_call.begin(), per_call.end());
  return best ? per_call.front() : per_call[per_call.size() / 2];
}

// FP32 peak in GFLOP/s of `threads` cores together: independent FMA chains per thread (more than latency 4 x 2 ports
// needs) on whole registers, no memory traffic. 16 chains with AVX-512's 32 registers; 12 with AVX2's 16, where 16
// chains plus the two operands spill to the stack and read half the real peak (Zen 3: 55 GFLOP/s against GEMMs at 72).
double measure_peak_gflops(int threads, int repetitions, double min_seconds) {
#if defined(__AVX512F__)
  constexpr int chains = 16;
#else
  constexpr int chains = 12;
#endif
  constexpr long iterations = 1 << 16;
#if defined(__AVX512F__)
  using reg = __m512;
  constexpr int lanes = 16;
  auto run = [] {
    reg acc[chains];
    for (int c = 0; c < chains; ++c) acc[c] = _mm512_set1_ps(float(c));
    const reg x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(0.001f);
    for (long i = 0; i < iterations; ++i)
#pragma GCC unroll 16
      for (int c = 0; c < chains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], x, y);
    float out[16], s = 0;
    for (int c = 0; c < chains; ++c) {
      _mm512_storeu_ps(out, acc[c]);
      for (float v : out) s += v;
    }
    g_sink = s;
  };
#elif defined(__AVX2__) && defined(__FMA__)
  constexpr int lanes = 8;
  auto run = [] {
    __m256 acc[chains];
    for (int c = 0; c < chains; ++c) acc[c] = _mm256_set1_ps(float(c));
    const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(0.001f);
    for (long i = 0; i < iterations; ++i)
#pragma GCC unroll 12
      for (int c = 0; c < chains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], x, y);
    float out[8], s = 0;
    for (int c = 0; c < chains; ++c) {
      _mm256_storeu_ps(out, acc[c]);
      for (float v : out) s += v;
    }
    g_sink = s;
  };
#else
  constexpr int lanes = 1;
  auto run = [] {
    float acc[chains];
    for (int c = 0; c < chains; ++c) acc[c] = float(c);
    for (long i = 0; i < iterations; ++i)
      for (int c = 0; c < chains; ++c) acc[c] = acc[c] * 0.999f + 0.001f;
    float s = 0;
    for (float v : acc) s += v;
    g_sink = s;
  };
#endif
  auto run_all = [&] {
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
    run();
#else
    run();
#endif
  };
  // The fastest repetition: a peak is what the core reaches at its best clock, and this machine's clock varies by
  // several per cent between repetitions (the GEMMs' medians would otherwise land above a median "peak").
  const double seconds = time_per_call(run_all, 3 * repetitions, min_seconds, /*best=*/true);
  return double(iterations) * chains * lanes * 2 * threads / seconds * 1e-9;
}

struct gemm_shape {
  const char* what;
  bool transpose_a, transpose_b;
  index_t m, n, k;
};

struct result {
  std::string shape, what, system;
  int threads;
  double gflops;
};

void fill(float* x, std::size_t count, unsigned seed) {
  unsigned s = seed;
  for (std::size_t i = 0; i < count; ++i) {
    s = s * 1664525u + 1013904223u;
    x[i] = float(s >> 8) / float(1u << 24) - 0.5f;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int only_threads = 0;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      only_threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--quick"))
      quick = true;
    else {
      std::fprintf(stderr, "usage: %s [--threads N] [--quick]\n", argv[0]);
      return 2;
    }
  }
  const int repetitions = 5;
  const double min_seconds = quick ? 0.02 : 0.05;
  std::vector<int> thread_counts = only_threads > 0 ? std::vector<int>{only_threads} : std::vector<int>{1, 2};

  // MLP 784-128-10 at batch 64: forward X W^T, backward dX = dY W, dW = dY^T X; the same for a wide 784-1024 layer
  // at batch 256; and the classic square.
  std::vector<gemm_shape> shapes = {
      {"mlp_forward", false, true, 64, 128, 784},   {"mlp_backward_dx", false, false, 64, 784, 128},
      {"mlp_backward_dw", true, false, 128, 784, 64}, {"wide_forward", false, true, 256, 1024, 784},
      {"wide_backward_dx", false, false, 256, 784, 1024}, {"wide_backward_dw", true, false, 1024, 784, 256},
      {"square", false, false, 1024, 1024, 1024},
  };
  if (quick) shapes.pop_back();

  kiln::set_num_threads(1);
  const double peak = measure_peak_gflops(1, repetitions, min_seconds);
  const double peak_all = measure_peak_gflops(thread_counts.back(), repetitions, min_seconds);
  std::printf("single-core FP32 peak (register-only FMA loop): %.1f GFLOP/s; %d threads together: %.1f GFLOP/s\n\n",
              peak, thread_counts.back(), peak_all);

  std::vector<const char*> systems = {"kiln"};
  const bool amx = kiln::kernels::cpu::amx_gemm_active();
  std::printf("kiln's AMX path: %s\n", amx ? "active" : "not available on this CPU (or KILN_AMX=0)");
  std::printf("kiln's AVX512-BF16 path for bfloat16 operands: %s\n\n",
              kiln::kernels::cpu::bf16_dot_gemm_active() ? (amx ? "built (AMX takes them)" : "active")
                                                         : "not built for this CPU (or KILN_BF16_DOT=0)");
  if (amx) systems.push_back("kiln_avx512");
  systems.push_back("kiln_bf16x3");
  systems.push_back("kiln_bf16");
#if defined(KILN_HAVE_CBLAS)
  systems.push_back("openblas");
#endif

  std::vector<result> results;
  // One system at a time: OpenBLAS's worker threads spin for a while after each call and would steal the second
  // core from kiln's OpenMP team (and vice versa) if the two were interleaved.
  for (const char* system : systems) {
    for (int threads : thread_counts) {
      kiln::set_num_threads(threads);
#if defined(KILN_HAVE_CBLAS)
      openblas_set_num_threads(threads);
#endif
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the other pool's spinning threads sleep
      for (const auto& s : shapes) {
        const index_t a_rows = s.transpose_a ? s.k : s.m, a_cols = s.transpose_a ? s.m : s.k;
        const index_t b_rows = s.transpose_b ? s.n : s.k, b_cols = s.transpose_b ? s.k : s.n;
        kiln::aligned_buffer<float> a(a_rows * a_cols), b(b_rows * b_cols), c(s.m * s.n);
        fill(a.data(), std::size_t(a.size()), 1);
        fill(b.data(), std::size_t(b.size()), 2);
        fill(c.data(), std::size_t(c.size()), 3);
        std::function<void()> call;
        kiln::kernels::cpu::set_amx_gemm(amx && std::strcmp(system, "kiln_avx512") != 0);
        if (!std::strncmp(system, "kiln", 4)) {
          using kiln::kernels::cpu::product_precision;
          const auto precision = !std::strcmp(system, "kiln_bf16")     ? product_precision::bfloat16
                                 : !std::strcmp(system, "kiln_bf16x3") ? product_precision::bfloat16x3
                                                                       : product_precision::single;
          call = [&, precision] {
            kiln::kernels::cpu::gemm<float>(s.transpose_a, s.transpose_b, s.m, s.n, s.k, 1.0f, a.data(), a_cols,
                                            b.data(), b_cols, 0.0f, c.data(), s.n, {}, precision);
          };
        }
#if defined(KILN_HAVE_CBLAS)
        else {
          call = [&] {
            cblas_sgemm(CblasRowMajor, s.transpose_a ? CblasTrans : CblasNoTrans,
                        s.transpose_b ? CblasTrans : CblasNoTrans, int(s.m), int(s.n), int(s.k), 1.0f, a.data(),
                        int(a_cols), b.data(), int(b_cols), 0.0f, c.data(), int(s.n));
          };
        }
#endif
        const double seconds = time_per_call(call, repetitions, min_seconds);
        g_sink = c.data()[0];
        const std::string shape =
            std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
        results.push_back({shape, s.what, system, threads, 2.0 * double(s.m * s.n * s.k) / seconds * 1e-9});
      }
    }
  }

  kiln::kernels::cpu::set_amx_gemm(amx);

  std::printf("%-18s %-14s %-3s %-3s", "op", "MxNxK", "tA", "tB");
  for (const char* system : systems)
    for (int threads : thread_counts) std::printf(" %11s/%dt %%peak", system, threads);
  std::printf("\n");
  for (const auto& s : shapes) {
    const std::string shape = std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
    std::printf("%-18s %-14s %-3s %-3s", s.what, shape.c_str(), s.transpose_a ? "T" : "N", s.transpose_b ? "T" : "N");
    for (const auto& r : results)
      if (r.shape == shape && r.what == s.what) std::printf(" %13.1f %5.0f%%", r.gflops, 100.0 * r.gflops / peak);
    std::printf("\n");
  }
  std::printf("(GFLOP/s; %%peak is of the single-core peak above, so 2 threads can reach 200%%)\n\n");

  // Tiny products (a Linear(8, 8) forward at batch 1 and 64; the MLP's 128 -> 10 output layer): call latency.
  struct small_shape {
    bool transpose_a, transpose_b;
    index_t m, n, k;
  };
  std::vector<std::pair<std::string, double>> small_ns;
  kiln::set_num_threads(thread_counts.back());
  for (const small_shape& s : {small_shape{false, true, 1, 8, 8}, small_shape{false, true, 64, 8, 8},
                               small_shape{false, true, 64, 10, 128}, small_shape{false, false, 64, 128, 10}}) {
    kiln::aligned_buffer<float> a(s.m * s.k), b(s.k * s.n), c(s.m * s.n), bias(s.n);
    fill(a.data(), std::size_t(a.size()), 1);
    fill(b.data(), std::size_t(b.size()), 2);
    fill(bias.data(), std::size_t(bias.size()), 3);
    const kiln::kernels::cpu::epilogue<float> ep{bias.data(), kiln::activation::relu, 0.01f};
    const double seconds = time_per_call(
        [&] {
          kiln::kernels::cpu::gemm<float>(s.transpose_a, s.transpose_b, s.m, s.n, s.k, 1.0f, a.data(), s.k, b.data(),
                                          s.transpose_b ? s.k : s.n, 0.0f, c.data(), s.n, ep);
        },
        repetitions, min_seconds / 4);
    small_ns.push_back({std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k), seconds * 1e9});
    std::printf("small %-10s %s%s + bias + relu: %8.1f ns/call\n", small_ns.back().first.c_str(),
                s.transpose_a ? "T" : "N", s.transpose_b ? "T" : "N", seconds * 1e9);
  }
  std::printf("\n");

  // The sparse-input products against the GEMM: an input of `density` elements off a background of -0.4242 (MNIST's
  // blank pixel, normalised), the forward y = relu(x W^T + b) and the weight gradient dW = dy^T x, each timed as the
  // layer calls it (the listing included).
  struct sparse_row {
    std::string shape;
    double density;
    int threads;
    double forward_us, forward_dense_us, gradient_us, gradient_dense_us;
  };
  std::vector<sparse_row> sparse_rows;
  std::printf("sparse-input products against the GEMM (us per call; the input's fraction off its background):\n");
  std::printf("%-16s %8s %8s %12s %12s %8s %12s %12s %8s\n", "layer", "density", "threads", "forward", "gemm",
              "ratio", "dW", "gemm", "ratio");
  for (const auto& [batch, in, out] : {std::tuple<index_t, index_t, index_t>{64, 784, 128}, {256, 784, 1024}}) {
    kiln::aligned_buffer<float> x(batch * in), w(out * in), bias(out), y(batch * out), dy(batch * out), dw(out * in);
    fill(w.data(), std::size_t(w.size()), 5);
    fill(bias.data(), std::size_t(bias.size()), 6);
    fill(dy.data(), std::size_t(dy.size()), 7);
    const std::string shape = std::to_string(batch) + "x" + std::to_string(in) + "->" + std::to_string(out);
    // At random places (unlike MNIST's, whose inked pixels neighbour one another): at 0.3 the listing would cost more
    // than sparse_input_max_work allows, and the layer would take the GEMM.
    for (double density : {0.05, 0.1, 0.19, 0.25}) {
      fill(x.data(), std::size_t(x.size()), 8);
      for (index_t i = 0; i < x.size(); ++i)  // fill's values lie in [-0.5, 0.5): keep those below the cut
        if (i == 0 || x.data()[i] + 0.5f >= float(density)) x.data()[i] = -0.4242f;
      for (int threads : thread_counts) {
        kiln::set_num_threads(threads);
        using kernels = kiln::kernels::cpu::sparse_input_kernels;
        const kiln::kernels::cpu::epilogue<float> ep{bias.data(), kiln::activation::relu, 0.0f};
        sparse_row row{shape, density, threads, 0, 0, 0, 0};
        row.forward_us = 1e6 * time_per_call([&] {
          if (!kernels::dense_forward_sparse_input(x.data(), w.data(), bias.data(), y.data(), batch, in, out,
                                                   kiln::activation::relu, 0.0f))
            std::abort();  // every input here qualifies
        }, repetitions, min_seconds / 4);
        row.forward_dense_us = 1e6 * time_per_call([&] {
          kiln::kernels::cpu::gemm<float>(false, true, batch, out, in, 1.0f, x.data(), in, w.data(), in, 0.0f,
                                          y.data(), out, ep);
        }, repetitions, min_seconds / 4);
        row.gradient_us = 1e6 * time_per_call([&] {
          if (!kernels::dense_weight_gradient_sparse_input(x.data(), dy.data(), dw.data(), batch, in, out, false))
            std::abort();
        }, repetitions, min_seconds / 4);
        row.gradient_dense_us = 1e6 * time_per_call([&] {
          kiln::kernels::cpu::gemm<float>(true, false, out, in, batch, 1.0f, dy.data(), out, x.data(), in, 0.0f,
                                          dw.data(), in);
        }, repetitions, min_seconds / 4);
        std::printf("%-16s %8.2f %8d %12.1f %12.1f %7.2fx %12.1f %12.1f %7.2fx\n", shape.c_str(), density, threads,
                    row.forward_us, row.forward_dense_us, row.forward_dense_us / row.forward_us, row.gradient_us,
                    row.gradient_dense_us, row.gradient_dense_us / row.gradient_us);
        sparse_rows.push_back(row);
      }
    }
  }
  std::printf("(ratio: the GEMM's time over the sparse-input product's)\n\n");

  std::printf("RESULT bench=gemm metric=peak threads=1 gflops=%.2f\n", peak);
  std::printf("RESULT bench=gemm metric=peak threads=%d gflops=%.2f\n", thread_counts.back(), peak_all);
  for (const auto& r : results)
    std::printf("RESULT bench=gemm shape=%s op=%s system=%s threads=%d gflops=%.2f pct_peak=%.1f\n", r.shape.c_str(),
                r.what.c_str(), r.system.c_str(), r.threads, r.gflops, 100.0 * r.gflops / peak);
  for (const auto& [shape, ns] : small_ns)
    std::printf("RESULT bench=gemm shape=%s op=small_bias_relu system=kiln threads=%d ns_per_call=%.1f\n",
                shape.c_str(), thread_counts.back(), ns);
  for (const auto& r : sparse_rows)
    std::printf("RESULT bench=gemm shape=%s op=sparse_input density=%.2f threads=%d forward_us=%.2f "
                "forward_gemm_us=%.2f dw_us=%.2f dw_gemm_us=%.2f\n",
                r.shape.c_str(), r.density, r.threads, r.forward_us, r.forward_dense_us, r.gradient_us,
                r.gradient_dense_us);
  return 0;
}
