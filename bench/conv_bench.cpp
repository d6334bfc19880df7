// Conv2D forward + backward throughput at the MNIST CNN's shapes (batch 64: 1->32 3x3 on 28x28, 32->64 3x3 on
// 26x26), through the layer functions both modes call (im2col + the policy's GEMM). The backward forms the weight,
// bias and input gradients. FLOPs count the multiply-adds of the three products (2 per multiply-add), as PyTorch's
// peer script bench/conv_bench_torch.py does. For the second convolution it then times the backward alone on an
// output gradient shaped by a max pool, with the sparse gradients on and off (medians of 5 alternating turns).
//
//   conv_bench [--threads N] [--batch 64] [--seconds 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "../examples/common.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;

int main(int argc, char** argv) try {
  examples::flags flags(argc, argv, {"--batch", "--seconds"});
  const int threads = static_cast<int>(flags.get_int("--threads", 1));
  const index_t batch = flags.get_int("--batch", 64);
  const double seconds = std::atof(flags.get("--seconds", "2").c_str());
  set_num_threads(threads);
  struct conv_shape {
    const char* name;
    index_t in, out, size;
  };
  for (auto s : {conv_shape{"conv1_1x28x28_to_32", 1, 32, 28}, conv_shape{"conv2_32x26x26_to_64", 32, 64, 26}}) {
    const conv_geometry g = make_conv_geometry(s.in, s.size, s.size, s.out, 3, 3, 1, 1, 0, 0, 1, 1, 1);
    random_generator rng(1);
    std::vector<float> x(static_cast<std::size_t>(batch * g.in_size())), w(static_cast<std::size_t>(s.out * g.group_k())),
        b(static_cast<std::size_t>(s.out)), y(static_cast<std::size_t>(batch * g.out_size())),
        dy(y.size()), dx(x.size()), dw(w.size()), db(b.size()),
        col(static_cast<std::size_t>(conv2d_col_size(g, batch)));
    for (auto& v : x) v = rng.normal<float>();
    for (auto& v : w) v = rng.normal<float>() * 0.1f;
    for (auto& v : dy) v = rng.normal<float>();
    using P = policy::cpu;
    auto forward = [&] { conv2d_forward<P>(x.data(), w.data(), b.data(), y.data(), col.data(), batch, g); };
    auto backward = [&] {
      conv2d_backward<P>(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), col.data(), batch, g, false);
    };
    const double flops = 2.0 * double(batch) * double(g.out_size()) * double(g.group_k());  // one product
    auto time = [&](auto&& body) {
      body();  // warm-up
      long long reps = 0;
      auto start = std::chrono::steady_clock::now();
      while (examples::seconds_since(start) < seconds || reps < 3) {
        body();
        ++reps;
      }
      return examples::seconds_since(start) / double(reps);
    };
    double tf = time(forward);
    double tfb = time([&] {
      forward();
      backward();
    });
    std::printf("RESULT bench=conv impl=kiln shape=%s batch=%lld threads=%d fwd_ms=%.3f fwd_bwd_ms=%.3f "
                "fwd_gflops=%.2f fwd_bwd_gflops=%.2f\n",
                s.name, static_cast<long long>(batch), threads, tf * 1e3, tfb * 1e3, flops / tf * 1e-9,
                3 * flops / tfb * 1e-9);
    if (g.channels % 16 != 0) continue;
    // The backward alone again, with dy as a 2 x 2 max pool and a ReLU leave it: in each window one position keeps
    // its value, and a tenth of those are zero again (the ReLU under a window whose four values were all negative).
    // The sparse gradients (kernels/cpu/conv_sparse_gradient.hpp) on and off take turns, so that both see the same
    // stretches of a noisy machine; the same bits either way.
    std::fill(dy.begin(), dy.end(), 0.0f);
    for (index_t plane = 0; plane < batch * g.out_channels; ++plane)
      for (index_t h = 0; h + 1 < g.out_height; h += 2)
        for (index_t w0 = 0; w0 + 1 < g.out_width; w0 += 2)
          if (rng.below(10) != 0)
            dy[std::size_t(plane * g.out_plane() + (h + index_t(rng.below(2))) * g.out_width + w0 +
                           index_t(rng.below(2)))] = rng.normal<float>();
    const double density =
        double(std::count_if(dy.begin(), dy.end(), [](float v) { return v != 0.0f; })) / double(dy.size());
    std::vector<double> sparse_ms, dense_ms;
    for (int turn = 0; turn < 5; ++turn)
      for (const bool sparse : {true, false}) {
        kernels::cpu::set_sparse_conv_gradients(sparse);
        (sparse ? sparse_ms : dense_ms).push_back(time(backward) * 1e3);
      }
    kernels::cpu::set_sparse_conv_gradients(true);
    std::sort(sparse_ms.begin(), sparse_ms.end());
    std::sort(dense_ms.begin(), dense_ms.end());
    std::printf("RESULT bench=conv impl=kiln shape=%s batch=%lld threads=%d pooled_dy_density=%.3f "
                "bwd_sparse_ms=%.3f bwd_dense_ms=%.3f dense_over_sparse=%.2f\n",
                s.name, static_cast<long long>(batch), threads, density, sparse_ms[2], dense_ms[2],
                dense_ms[2] / sparse_ms[2]);
  }
  return 0;
} catch (const kiln::error& e) {
  std::fprintf(stderr, "conv_bench: %s\n", e.what());
  return 1;
}
