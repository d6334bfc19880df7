// Stacked LSTM and GRU through cuDNN's RNN (the v8 API: cudnnRNNForward, cudnnRNNBackwardData_v8,
// cudnnRNNBackwardWeights_v8) for policy::cudnn. kiln's own path (layers/recurrent.hpp) launches a GEMM and a cell
// kernel per time step and direction; cuDNN runs the whole stack in one call forward and two backward.
//
// What makes the two interchangeable:
// - Parameters. cuDNN holds each gate's matrix and bias (two biases: CUDNN_RNN_DOUBLE_BIAS) as kiln does, row-major,
//   with the gates in PyTorch's order (i, f, g, o for the LSTM; r, z, n for the GRU), but it places them in its weight
//   space by its own rule, which may depend on the space's address. For each weight space it is handed, a plan asks
//   cuDNN where each one lies (cudnnGetRNNWeightParams) and keeps the map from kiln's flat layout (per layer and
//   direction W_ih, W_hh, b_ih, b_hh) as a few contiguous pieces. Where the map at the model's own parameters is the
//   identity and they are aligned as a fresh allocation is (256 bytes), they are cuDNN's weight space; likewise the
//   gradient buffer is cuDNN's weight gradient, which cuDNN adds to, as kiln's backward does. Otherwise the pieces are
//   copied into a weight space of the plan's before each call, and the gradient computed into another is added back
//   piece by piece.
// - Data. Sequences are time-major, (seq, batch, features), every sample the full length (SEQ_MAJOR_UNPACKED, as
//   PyTorch passes an unpacked batch); states are (layers * directions, batch, hidden). Null states are zeros, null
//   results are not written, as in kiln's rnn_forward.
// - Arithmetic. FP32 runs with CUDNN_FMA_MATH (no TF32), so results differ from kiln's kernels by summation order
//   alone.
// - Dropout between layers. Training with it falls back to kiln's steps: their masks come from kiln's counter-based
//   generator, so that the CPU and every GPU policy draw the same ones, and cuDNN draws its own.
//
// cuDNN's reserve space carries what the forward keeps for the backward. It is kept per forward's `saved` pointer
// (the layer's saved-activation region, the same in the backward that follows; rnn_copy_saved copies it along with
// a copy of the saved values), grows when a shape needs more, and lives as long as the process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "kiln/core/cuda/pinned_buffer.cuh"
#include "kiln/core/error.hpp"
#include "kiln/kernels/cuda/elementwise.cuh"
#include "kiln/kernels/cudnn/common.cuh"
#include "kiln/kernels/rnn_sequence.hpp"

namespace kiln::kernels::cudnn {

// How many sequence passes cuDNN ran (tests check that the cuDNN path, not the fallback, ran).
struct rnn_call_counts {
  std::uint64_t forward = 0, backward = 0;
};

namespace detail {

using rnn_descriptor = descriptor<cudnnRNNDescriptor_t, cudnnCreateRNNDescriptor, cudnnDestroyRNNDescriptor>;
using rnn_data_descriptor =
    descriptor<cudnnRNNDataDescriptor_t, cudnnCreateRNNDataDescriptor, cudnnDestroyRNNDataDescriptor>;
using dropout_descriptor =
    descriptor<cudnnDropoutDescriptor_t, cudnnCreateDropoutDescriptor, cudnnDestroyDropoutDescriptor>;

inline rnn_call_counts& rnn_counts() {
  static rnn_call_counts counts;
  return counts;
}

// cuDNN's weight and reserve spaces are fresh allocations in PyTorch; kiln hands its own buffers to cuDNN only when
// they are aligned as one would be.
inline constexpr std::uintptr_t rnn_weight_alignment = 256;
inline bool rnn_weight_aligned(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % rnn_weight_alignment == 0;
}

// A run of parameters that is contiguous in kiln's flat layout and in cuDNN's weight space (offsets in elements).
struct rnn_weight_piece {
  index_t kiln_at = 0, cudnn_at = 0, count = 0;
};

// Everything cuDNN needs to run one stack shape. usable is false when cuDNN cannot run it kiln's way.
struct rnn_plan {
  bool usable = false;
  // kiln's parameters in a weight space starting at the key, in kiln's order (empty: cuDNN named a place outside it)
  std::map<const void*, std::vector<rnn_weight_piece>> pieces_at;
  rnn_descriptor rnn;
  dropout_descriptor no_dropout;
  rnn_data_descriptor x, y;
  tensor_descriptor h;
  kiln::cuda::device_buffer<std::int32_t> seq_lengths;  // every sample's length (seq), on the device
  std::size_t weight_bytes = 0, work_bytes = 0, reserve_bytes = 0;
  // Weight spaces of the plan's own, for parameters and gradients that cannot be cuDNN's in place (the weights' zeroed
  // when made, so that any gap in cuDNN's layout holds zeros; the gradients' before each backward)
  kiln::cuda::device_buffer<unsigned char> weight_copy, gradient_copy;
};

// Where cuDNN keeps each of kiln's gate matrices and biases in a weight space starting at `base`, as contiguous pieces
// in kiln's order; empty when cuDNN names a place outside the space or between elements. Asked once per base.
template <class T>
const std::vector<rnn_weight_piece>& rnn_pieces_at(const rnn_sequence& s, rnn_plan& plan, const void* base) {
  auto [at, added] = plan.pieces_at.try_emplace(base);
  if (!added) return at->second;
  const index_t space = static_cast<index_t>(plan.weight_bytes / sizeof(T));
  tensor_descriptor matrix, bias;
  const index_t H = s.hidden_size, G = s.gates();
  std::vector<rnn_weight_piece> pieces;
  bool ok = true;
  auto add = [&](index_t kiln_at, const void* cudnn_address, index_t count) {
    if (cudnn_address == nullptr) {
      ok = false;
      return;
    }
    const std::ptrdiff_t bytes =
        static_cast<const unsigned char*>(cudnn_address) - static_cast<const unsigned char*>(base);
    if (bytes < 0 || bytes % std::ptrdiff_t(sizeof(T)) != 0 || bytes / std::ptrdiff_t(sizeof(T)) + count > space) {
      ok = false;
      return;
    }
    const index_t cudnn_at = static_cast<index_t>(bytes / std::ptrdiff_t(sizeof(T)));
    if (!pieces.empty() && pieces.back().kiln_at + pieces.back().count == kiln_at &&
        pieces.back().cudnn_at + pieces.back().count == cudnn_at)
      pieces.back().count += count;  // contiguous in both: one piece
    else
      pieces.push_back({kiln_at, cudnn_at, count});
  };
  index_t block = 0;  // where the current (layer, direction) starts in kiln's layout
  for (index_t l = 0; l < s.num_layers; ++l) {
    const index_t I = s.layer_input(l);
    for (index_t dir = 0; dir < s.directions(); ++dir) {
      // cuDNN's linear layers: G on the input side, then G on the recurrent side, each with its bias. Kiln's order is
      // every matrix (W_ih's gates, then W_hh's), then every bias (b_ih's, then b_hh's).
      void* matrix_at[8] = {};
      void* bias_at[8] = {};
      for (index_t id = 0; id < 2 * G; ++id)
        KILN_CUDNN_CHECK(cudnnGetRNNWeightParams(kiln::cuda::cudnn_handle(), plan.rnn, int(l * s.directions() + dir),
                                                 plan.weight_bytes, base, int(id), matrix, &matrix_at[id], bias,
                                                 &bias_at[id]));
      for (index_t id = 0; id < 2 * G; ++id)
        add(id < G ? block + id * H * I : block + G * H * I + (id - G) * H * H, matrix_at[id], id < G ? H * I : H * H);
      if (s.bias)
        for (index_t id = 0; id < 2 * G; ++id) add(block + G * H * (I + H) + id * H, bias_at[id], H);
      block += s.layer_parameters(G, l);
    }
  }
  if (ok && block == s.parameter_count()) at->second = std::move(pieces);
  return at->second;
}

// Whether a weight space at `base` holds kiln's flat array as it is: one piece from its start, nothing after.
template <class T>
bool rnn_same_layout_at(const rnn_sequence& s, rnn_plan& plan, const void* base) {
  const auto& pieces = rnn_pieces_at<T>(s, plan, base);
  return pieces.size() == 1 && pieces[0].cudnn_at == 0 &&
         plan.weight_bytes == static_cast<std::size_t>(s.parameter_count()) * sizeof(T);
}

template <class T>
void build_rnn_plan(rnn_plan& plan, const rnn_sequence& s) {
  const index_t layers_directions = s.num_layers * s.directions();
  if (s.seq < 1 || s.batch < 1 || !fits_int({s.seq, s.batch, s.input_size}) ||
      !fits_int({s.seq, s.batch, s.output_size()}) || !fits_int({layers_directions, s.batch, s.hidden_size}) ||
      !fits_int({s.parameter_count() * index_t(sizeof(T))}))
    return;
  cudnnHandle_t handle = kiln::cuda::cudnn_handle();
  // No dropout inside cuDNN (see the header comment); a descriptor is set up all the same, as cuDNN expects one.
  KILN_CUDNN_CHECK(cudnnSetDropoutDescriptor(plan.no_dropout, handle, 0.0f, nullptr, 0, 0));
  const cudnnMathType_t math = std::is_same_v<T, float> ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
  KILN_CUDNN_CHECK(cudnnSetRNNDescriptor_v8(
      plan.rnn, CUDNN_RNN_ALGO_STANDARD, s.kind == rnn_sequence::cell::lstm ? CUDNN_LSTM : CUDNN_GRU,
      s.bias ? CUDNN_RNN_DOUBLE_BIAS : CUDNN_RNN_NO_BIAS, s.bidirectional ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL,
      CUDNN_LINEAR_INPUT, data_type<T>, data_type<T>, math, int(s.input_size), int(s.hidden_size),
      int(s.hidden_size) /* a projection as wide as the hidden state: none */, int(s.num_layers), plan.no_dropout,
      CUDNN_RNN_PADDED_IO_ENABLED));
  std::vector<int> lengths(static_cast<std::size_t>(s.batch), int(s.seq));
  KILN_CUDNN_CHECK(cudnnSetRNNDataDescriptor(plan.x, data_type<T>, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED,
                                             int(s.seq), int(s.batch), int(s.input_size), lengths.data(), nullptr));
  KILN_CUDNN_CHECK(cudnnSetRNNDataDescriptor(plan.y, data_type<T>, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED,
                                             int(s.seq), int(s.batch), int(s.output_size()), lengths.data(), nullptr));
  const int state_dims[3] = {int(layers_directions), int(s.batch), int(s.hidden_size)};
  const int state_strides[3] = {int(s.batch * s.hidden_size), int(s.hidden_size), 1};
  KILN_CUDNN_CHECK(cudnnSetTensorNdDescriptor(plan.h, data_type<T>, 3, state_dims, state_strides));
  KILN_CUDNN_CHECK(cudnnGetRNNWeightSpaceSize(handle, plan.rnn, &plan.weight_bytes));
  KILN_CUDNN_CHECK(cudnnGetRNNTempSpaceSizes(handle, plan.rnn, CUDNN_FWD_MODE_TRAINING, plan.x, &plan.work_bytes,
                                             &plan.reserve_bytes));
  plan.seq_lengths = kiln::cuda::device_buffer<std::int32_t>(s.batch);
  std::vector<std::int32_t> device_lengths(lengths.begin(), lengths.end());
  kiln::cuda::copy_to_device(device_lengths.data(), plan.seq_lengths.data(), s.batch);
  // Usable when cuDNN can place every parameter in a weight space of its own size (a fresh allocation, like the
  // plan's copies).
  plan.weight_copy = kiln::cuda::device_buffer<unsigned char>(static_cast<index_t>(plan.weight_bytes));
  KILN_CUDA_CHECK(cudaMemsetAsync(plan.weight_copy.data(), 0, plan.weight_bytes, kiln::cuda::current_stream()));
  plan.gradient_copy = kiln::cuda::device_buffer<unsigned char>(static_cast<index_t>(plan.weight_bytes));
  plan.usable = !rnn_pieces_at<T>(s, plan, plan.weight_copy.data()).empty() &&
                !rnn_pieces_at<T>(s, plan, plan.gradient_copy.data()).empty();
}

// The plan of a stack shape for T, made on first use and cached for the process's life.
template <class T>
rnn_plan& rnn_plan_for(const rnn_sequence& s) {
  using key_type = std::tuple<int, index_t, index_t, index_t, bool, bool, index_t, index_t>;
  static std::mutex mutex;
  static auto* cache = new std::map<key_type, rnn_plan>();
  std::lock_guard lock(mutex);
  auto [it, added] = cache->try_emplace(key_type{int(s.kind), s.input_size, s.hidden_size, s.num_layers, s.bias,
                                                 s.bidirectional, s.seq, s.batch});
  if (added) build_rnn_plan<T>(it->second, s);
  return it->second;
}

// The plan cuDNN runs the stack with, or null when kiln's steps must: one test for the forward and the backward, which
// must decline in the same cases.
template <class T>
rnn_plan* rnn_plan_to_run(const rnn_sequence& s) {
  if (s.draws_dropout) return nullptr;
  rnn_plan& plan = rnn_plan_for<T>(s);
  return plan.usable ? &plan : nullptr;
}

// Every forward's reserve space, by its saved pointer.
struct rnn_reserves {
  std::mutex mutex;
  std::map<const void*, kiln::cuda::device_buffer<unsigned char>> by_saved;
};
inline rnn_reserves& reserves() {
  static auto* all = new rnn_reserves();
  return *all;
}

// Makes buffer hold at least bytes (its contents are then undefined).
inline void grow_reserve(kiln::cuda::device_buffer<unsigned char>& buffer, index_t bytes) {
  if (buffer.size() < bytes) buffer = kiln::cuda::device_buffer<unsigned char>(bytes);
}

// The reserve space of the forward that wrote into `saved`: grown (forward) or looked up (backward).
inline void* rnn_reserve(const void* saved, std::size_t bytes, bool forward) {
  if (bytes == 0) return nullptr;
  std::lock_guard lock(reserves().mutex);
  auto& buffer = reserves().by_saved[saved];
  if (!forward && buffer.size() < static_cast<index_t>(bytes))
    fail("cuDNN RNN backward: expected the reserve space of a forward over the same saved activations (", bytes,
         " bytes), found ", buffer.size(), " bytes; run the layer's forward before its backward");
  grow_reserve(buffer, static_cast<index_t>(bytes));
  return buffer.data();
}

// The parameters as cuDNN reads them: the model's own where they are cuDNN's layout in place and aligned, else the
// plan's copy of them in cuDNN's layout.
template <class T>
const void* rnn_weights_for(const rnn_sequence& s, rnn_plan& plan, const T* params) {
  if (rnn_weight_aligned(params) && rnn_same_layout_at<T>(s, plan, params)) return params;
  T* space = reinterpret_cast<T*>(plan.weight_copy.data());
  for (const rnn_weight_piece& p : rnn_pieces_at<T>(s, plan, space))
    KILN_CUDA_CHECK(cudaMemcpyAsync(space + p.cudnn_at, params + p.kiln_at,
                                    static_cast<std::size_t>(p.count) * sizeof(T), cudaMemcpyDeviceToDevice,
                                    kiln::cuda::current_stream()));
  return space;
}

inline std::size_t round_up_to_alignment(std::size_t bytes) {
  return (bytes + rnn_weight_alignment - 1) / rnn_weight_alignment * rnn_weight_alignment;
}

}  // namespace detail

// The sequence kernels of policy::cudnn (device pointers). Each returns false, having done nothing, when cuDNN cannot
// run the stack kiln's way; layers/recurrent.hpp then runs its own steps.
struct rnn_kernels {
  // Forward in training mode (the reserve space is always filled, so that a backward may follow, also in
  // evaluation). x: (seq, batch, input); y: (seq, batch, directions * H); h0, c0, h_n, c_n: (layers * directions,
  // batch, H), each may be null; c0 and c_n are ignored for a GRU. saved: the key of this forward's reserve space.
  template <class T>
  static bool rnn_sequence_forward(const rnn_sequence& s, const T* params, const T* x, const T* h0, const T* c0, T* y,
                                   T* h_n, T* c_n, const void* saved) {
    detail::rnn_plan* runs = detail::rnn_plan_to_run<T>(s);
    if (!runs) return false;
    detail::rnn_plan& plan = *runs;
    const bool lstm = s.kind == rnn_sequence::cell::lstm;
    KILN_CUDNN_CHECK(cudnnRNNForward(kiln::cuda::cudnn_handle(), plan.rnn, CUDNN_FWD_MODE_TRAINING,
                                     plan.seq_lengths.data(), plan.x, x, plan.y, y, plan.h, h0, h_n, plan.h,
                                     lstm ? c0 : nullptr, lstm ? c_n : nullptr, plan.weight_bytes,
                                     detail::rnn_weights_for(s, plan, params), plan.work_bytes,
                                     detail::workspace(plan.work_bytes), plan.reserve_bytes,
                                     detail::rnn_reserve(saved, plan.reserve_bytes, true)));
    ++detail::rnn_counts().forward;
    return true;
  }

  // Backward after rnn_sequence_forward with the same stack, inputs, parameters and saved key; y is that forward's
  // output. dy: (seq, batch, directions * H); dh_n, dc_n may be null (zero). Writes dx, dh0, dc0 where not null and
  // ADDS the parameter gradients into dparams.
  template <class T>
  static bool rnn_sequence_backward(const rnn_sequence& s, const T* params, const T* x, const T* h0, const T* c0,
                                    const T* y, const T* dy, const T* dh_n, const T* dc_n, T* dx, T* dh0, T* dc0,
                                    T* dparams, const void* saved) {
    detail::rnn_plan* runs = detail::rnn_plan_to_run<T>(s);
    if (!runs) return false;
    detail::rnn_plan& plan = *runs;
    const bool lstm = s.kind == rnn_sequence::cell::lstm;
    cudnnHandle_t handle = kiln::cuda::cudnn_handle();
    void* reserve = detail::rnn_reserve(saved, plan.reserve_bytes, false);
    const void* weights = detail::rnn_weights_for(s, plan, params);
    // cuDNN always writes dx: without a caller's buffer it goes to the workspace, after cuDNN's own part.
    const std::size_t work_bytes = detail::round_up_to_alignment(plan.work_bytes);
    const std::size_t dx_bytes = dx ? 0 : static_cast<std::size_t>(s.seq * s.batch * s.input_size) * sizeof(T);
    auto* work = static_cast<unsigned char*>(detail::workspace(work_bytes + dx_bytes));
    KILN_CUDNN_CHECK(cudnnRNNBackwardData_v8(handle, plan.rnn, plan.seq_lengths.data(), plan.y, y, dy, plan.x,
                                             dx ? static_cast<void*>(dx) : work + work_bytes, plan.h, h0, dh_n, dh0,
                                             plan.h, lstm ? c0 : nullptr, lstm ? dc_n : nullptr,
                                             lstm ? dc0 : nullptr, plan.weight_bytes, weights, plan.work_bytes, work,
                                             plan.reserve_bytes, reserve));
    // cuDNN adds the weight gradients (CUDNN_WGRAD_MODE_ADD): into the caller's buffer where it is cuDNN's layout and
    // aligned, else into a zeroed buffer in cuDNN's layout whose pieces are then added to the caller's.
    const bool direct = detail::rnn_weight_aligned(dparams) && detail::rnn_same_layout_at<T>(s, plan, dparams);
    void* gradient = direct ? static_cast<void*>(dparams) : plan.gradient_copy.data();
    if (!direct) KILN_CUDA_CHECK(cudaMemsetAsync(gradient, 0, plan.weight_bytes, kiln::cuda::current_stream()));
    KILN_CUDNN_CHECK(cudnnRNNBackwardWeights_v8(handle, plan.rnn, CUDNN_WGRAD_MODE_ADD, plan.seq_lengths.data(),
                                                plan.x, x, plan.h, h0, plan.y, y, plan.weight_bytes, gradient,
                                                plan.work_bytes, work, plan.reserve_bytes, reserve));
    if (!direct)
      for (const detail::rnn_weight_piece& p : detail::rnn_pieces_at<T>(s, plan, gradient))
        kernels::cuda::elementwise_kernels::accumulate(static_cast<const T*>(gradient) + p.cudnn_at,
                                                       dparams + p.kiln_at, p.count);
    ++detail::rnn_counts().backward;
    return true;
  }

  // The reserve space of the forward that saved at `from`, copied for a backward from a copy of its saved values at
  // `to` (cuDNN's backward may write into the reserve space, so each backward needs its own).
  static void rnn_sequence_copy_saved(const void* from, void* to) {
    std::lock_guard lock(detail::reserves().mutex);
    auto& all = detail::reserves().by_saved;
    const auto source = all.find(from);
    if (source == all.end() || source->second.empty()) return;  // that forward ran kiln's steps
    auto& target = all[to];
    detail::grow_reserve(target, source->second.size());
    KILN_CUDA_CHECK(cudaMemcpyAsync(target.data(), source->second.data(), source->second.bytes(),
                                    cudaMemcpyDeviceToDevice, kiln::cuda::current_stream()));
  }

  // How many forward and backward passes cuDNN has run in this process.
  static rnn_call_counts rnn_sequence_calls() { return detail::rnn_counts(); }
  // How many contiguous pieces kiln's parameters make in a cuDNN weight space for this stack starting at `base` (1 and
  // nothing after: the same layout), or 0 when cuDNN cannot run the stack kiln's way there.
  template <class T>
  static index_t rnn_sequence_weight_pieces(const rnn_sequence& s, const void* base) {
    detail::rnn_plan& plan = detail::rnn_plan_for<T>(s);
    return plan.usable ? static_cast<index_t>(detail::rnn_pieces_at<T>(s, plan, base).size()) : 0;
  }
  // The size of that weight space in bytes (0 when cuDNN cannot run the stack).
  template <class T>
  static std::size_t rnn_sequence_weight_bytes(const rnn_sequence& s) {
    const detail::rnn_plan& plan = detail::rnn_plan_for<T>(s);
    return plan.usable ? plan.weight_bytes : 0;
  }
};

}  // namespace kiln::kernels::cudnn
