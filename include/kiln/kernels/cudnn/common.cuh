// What the cuDNN kernels share: data types and scaling factors for kiln's float / double, owning descriptor handles,
// tensor descriptors cached by shape (so a training step creates none after its first), and one workspace for all
// cuDNN calls. Everything runs on the kiln stream, to which the cuDNN handle is bound.
#pragma once

#include <cudnn.h>

#include <array>
#include <climits>
#include <cstddef>
#include <initializer_list>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "kiln/core/config.hpp"
#include "kiln/core/cuda/check.cuh"
#include "kiln/core/cuda/device_buffer.cuh"
#include "kiln/core/cuda/handles.cuh"

namespace kiln::kernels::cudnn::detail {

template <class T>
inline constexpr cudnnDataType_t data_type = std::is_same_v<T, double> ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;

// cuDNN's alpha / beta blend factors: y = alpha op(x) + beta y. They are double for double data, float otherwise.
template <class T>
struct blend {
  using type = std::conditional_t<std::is_same_v<T, double>, double, float>;
  static inline const type one = 1, zero = 0;
  static const type* factor(bool on) { return on ? &one : &zero; }
};

// Whether every extent fits cuDNN's int arguments, and their product (the element count) too.
inline bool fits_int(std::initializer_list<index_t> extents) {
  index_t product = 1;
  for (index_t e : extents) {
    if (e < 0 || e > INT_MAX) return false;
    product *= e;
    if (product > INT_MAX) return false;
  }
  return true;
}

// An owning cuDNN descriptor: Create on construction, Destroy on destruction, movable, not copyable.
template <class Handle, cudnnStatus_t (*Create)(Handle*), cudnnStatus_t (*Destroy)(Handle)>
class descriptor {
 public:
  descriptor() { KILN_CUDNN_CHECK(Create(&handle_)); }
  ~descriptor() {
    if (handle_) Destroy(handle_);
  }
  descriptor(descriptor&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  descriptor& operator=(descriptor&& other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  descriptor(const descriptor&) = delete;
  descriptor& operator=(const descriptor&) = delete;
  Handle get() const { return handle_; }
  operator Handle() const { return handle_; }  // NOLINT: passes straight into cuDNN calls

 private:
  Handle handle_ = nullptr;
};

using tensor_descriptor =
    descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using filter_descriptor =
    descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using convolution_descriptor =
    descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;
using pooling_descriptor =
    descriptor<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor>;

// A packed NCHW tensor descriptor for (n, c, h, w) of type T, created once per shape. The cache lives as long as the
// process (it is never destroyed, so no descriptor outlives cuDNN at exit). Callers check fits_int first.
template <class T>
cudnnTensorDescriptor_t tensor_4d(index_t n, index_t c, index_t h, index_t w) {
  static std::mutex mutex;
  static auto* cache = new std::map<std::array<index_t, 4>, tensor_descriptor>();
  std::lock_guard lock(mutex);
  auto [it, added] = cache->try_emplace({n, c, h, w});
  if (added)
    KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(it->second, CUDNN_TENSOR_NCHW, data_type<T>, int(n), int(c), int(h),
                                                int(w)));
  return it->second;
}

// Device scratch of at least bytes for the cuDNN calls (convolution algorithms, ...). One buffer serves every call:
// they all run in order on the kiln stream. It grows when a new shape needs more and is kept for the process's life.
inline void* workspace(std::size_t bytes) {
  static std::mutex mutex;
  static auto* buffer = new kiln::cuda::device_buffer<unsigned char>();
  if (bytes == 0) return nullptr;
  std::lock_guard lock(mutex);
  if (buffer->size() < static_cast<index_t>(bytes))
    *buffer = kiln::cuda::device_buffer<unsigned char>(static_cast<index_t>(bytes));
  return buffer->data();
}

}  // namespace kiln::kernels::cudnn::detail
