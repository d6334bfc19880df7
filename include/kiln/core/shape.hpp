// kiln::shape: the extents of a tensor, rank 0 to 8, stored inline so that shapes never touch the heap.
#pragma once

#include <algorithm>
#include <array>
#include <initializer_list>
#include <ostream>
#include <sstream>
#include <string>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln {

// Extents of a contiguous, row-major tensor. Dimension 0 is the batch wherever a batch exists.
class shape {
 public:
  static constexpr int max_rank = 8;

  constexpr shape() = default;
  constexpr shape(std::initializer_list<index_t> extents) {
    if (extents.size() > max_rank) fail("shape: expected at most ", max_rank, " dimensions, found ", extents.size());
    for (index_t e : extents) extents_[rank_++] = e;
  }
  template <class It>
  static shape from_range(It first, It last) {
    shape s;
    for (; first != last; ++first) s.push_back(static_cast<index_t>(*first));
    return s;
  }

  constexpr int rank() const { return rank_; }
  constexpr index_t operator[](int dim) const { return extents_[dim]; }
  constexpr index_t& operator[](int dim) { return extents_[dim]; }
  constexpr const index_t* begin() const { return extents_; }
  constexpr const index_t* end() const { return extents_ + rank_; }

  // Number of elements; 1 for rank 0.
  constexpr index_t numel() const {
    index_t n = 1;
    for (int d = 0; d < rank_; ++d) n *= extents_[d];
    return n;
  }
  // Elements per batch row: the product of every extent but the first.
  constexpr index_t row_size() const {
    index_t n = 1;
    for (int d = 1; d < rank_; ++d) n *= extents_[d];
    return n;
  }

  constexpr void push_back(index_t extent) {
    if (rank_ >= max_rank) fail("shape: cannot add a dimension beyond rank ", max_rank);
    extents_[rank_++] = extent;
  }
  // The same shape with dimension 0 replaced, used to view the first rows of a batch.
  constexpr shape with_batch(index_t batch) const {
    shape s = *this;
    s.extents_[0] = batch;
    return s;
  }
  // A negative dim counts from the end, as in PyTorch; anything else out of range throws.
  int normalize_dim(int dim, const char* where) const {
    int d = dim < 0 ? dim + rank_ : dim;
    if (d < 0 || d >= rank_) fail(where, ": dim ", dim, " is out of range for a tensor of shape ", str());
    return d;
  }

  friend constexpr bool operator==(const shape& a, const shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int d = 0; d < a.rank_; ++d)
      if (a.extents_[d] != b.extents_[d]) return false;
    return true;
  }

  std::string str() const {
    std::ostringstream out;
    out << *this;
    return out.str();
  }
  friend std::ostream& operator<<(std::ostream& out, const shape& s) {
    out << '[';
    for (int d = 0; d < s.rank_; ++d) out << (d ? ", " : "") << s.extents_[d];
    return out << ']';
  }

 private:
  index_t extents_[max_rank] = {};
  int rank_ = 0;
};

}  // namespace kiln
