// kiln::Tensor (owning, contiguous, row-major, any rank) and kiln::tensor_view (non-owning window onto one).
#pragma once

#include <algorithm>
#include <initializer_list>
#include <span>
#include <type_traits>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/memory.hpp"
#include "kiln/core/shape.hpp"

namespace kiln {

// A non-owning view of contiguous row-major data with a shape. tensor_view<const T> reads, tensor_view<T> writes.
template <class T>
class tensor_view {
 public:
  using value_type = std::remove_const_t<T>;

  tensor_view() = default;
  tensor_view(T* data, const kiln::shape& s) : data_(data), shape_(s) {}
  // A writable view converts to a read-only one.
  template <class U>
    requires std::is_same_v<const U, T> && (!std::is_same_v<U, T>)
  tensor_view(const tensor_view<U>& other) : data_(other.data()), shape_(other.shape()) {}

  T* data() const { return data_; }
  const kiln::shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  index_t numel() const { return shape_.numel(); }
  index_t extent(int dim) const { return shape_[dim]; }
  std::span<T> span() const { return {data_, static_cast<std::size_t>(numel())}; }
  T& operator[](index_t i) const { return data_[i]; }

  // Rows [first, first + count) of dimension 0: how a batch is sliced out of a data set without copying.
  tensor_view rows(index_t first, index_t count) const {
    if (shape_.rank() == 0 || first < 0 || count < 0 || first + count > shape_[0])
      fail("tensor_view::rows: expected rows [", first, ", ", first + count, ") inside dimension 0 of shape ", shape_);
    return {data_ + first * shape_.row_size(), shape_.with_batch(count)};
  }
  // The same data under another shape with the same number of elements.
  tensor_view reshaped(const kiln::shape& s) const {
    if (s.numel() != numel()) fail("tensor_view::reshaped: cannot view shape ", shape_, " as ", s);
    return {data_, s};
  }

 private:
  T* data_ = nullptr;
  kiln::shape shape_;
};

// An owning, contiguous, 64-byte aligned tensor of float or double (or any trivially copyable element).
template <class T>
class Tensor {
  static_assert(std::is_trivially_copyable_v<T>, "kiln::Tensor holds trivially copyable elements");

 public:
  using value_type = T;

  // An empty tensor of shape [0], as torch.Tensor() (a rank-0 shape would claim one element it does not have).
  Tensor() : shape_{0} {}
  // Zero-filled tensor of the given shape.
  explicit Tensor(const kiln::shape& s) : shape_(s), storage_(s.numel()) { fill(T{}); }
  Tensor(const kiln::shape& s, T value) : shape_(s), storage_(s.numel()) { fill(value); }
  // Shape plus values in row-major order; the count must match.
  Tensor(const kiln::shape& s, std::initializer_list<T> values) : Tensor(s, std::span<const T>(values.begin(), values.size())) {}
  Tensor(const kiln::shape& s, std::span<const T> values) : shape_(s), storage_(s.numel()) {
    if (static_cast<index_t>(values.size()) != s.numel())
      fail("Tensor: shape ", s, " needs ", s.numel(), " values, found ", values.size());
    std::copy(values.begin(), values.end(), storage_.data());
  }
  // Deep copy of a view.
  explicit Tensor(tensor_view<const T> v) : Tensor(v.shape(), v.span()) {}

  const kiln::shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  index_t numel() const { return shape_.numel(); }
  index_t extent(int dim) const { return shape_[dim]; }
  T* data() { return storage_.data(); }
  const T* data() const { return storage_.data(); }
  T& operator[](index_t i) { return storage_.data()[i]; }
  const T& operator[](index_t i) const { return storage_.data()[i]; }
  std::span<T> span() { return {data(), static_cast<std::size_t>(numel())}; }
  std::span<const T> span() const { return {data(), static_cast<std::size_t>(numel())}; }

  // Element access by multi-index (checked rank, unchecked extents); for tests and small examples.
  template <class... I>
  T& at(I... indices) {
    return storage_.data()[offset_of({static_cast<index_t>(indices)...})];
  }
  template <class... I>
  const T& at(I... indices) const {
    return storage_.data()[offset_of({static_cast<index_t>(indices)...})];
  }

  tensor_view<T> view() { return {data(), shape_}; }
  tensor_view<const T> view() const { return {data(), shape_}; }
  operator tensor_view<T>() { return view(); }
  operator tensor_view<const T>() const { return view(); }
  tensor_view<T> rows(index_t first, index_t count) { return view().rows(first, count); }
  tensor_view<const T> rows(index_t first, index_t count) const { return view().rows(first, count); }

  // Changes the shape in place; the element count must stay the same.
  void reshape(const kiln::shape& s) {
    if (s.numel() != numel()) fail("Tensor::reshape: cannot reshape ", shape_, " to ", s);
    shape_ = s;
  }
  void fill(T value) { std::fill_n(storage_.data(), numel(), value); }

 private:
  index_t offset_of(std::initializer_list<index_t> indices) const {
    if (static_cast<int>(indices.size()) != shape_.rank())
      fail("Tensor::at: expected ", shape_.rank(), " indices for shape ", shape_, ", found ", indices.size());
    index_t offset = 0;
    int d = 0;
    for (index_t i : indices) offset = offset * shape_[d++] + i;
    return offset;
  }

  kiln::shape shape_;
  aligned_buffer<T> storage_;
};

}  // namespace kiln
