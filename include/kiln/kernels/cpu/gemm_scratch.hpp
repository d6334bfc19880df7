// The GEMMs' per-thread scratch: a buffer that grows to the largest block seen and is then reused, so steady-state
// calls never touch the heap.
#pragma once

#include <cstddef>

#include "kiln/core/memory.hpp"

namespace kiln::kernels::cpu::gemm_detail {

// One per thread and purpose (OpenMP keeps its worker threads alive between parallel regions): packed blocks of the
// blocked GEMM (gemm.hpp) and of the AMX path (gemm_amx.hpp), a prepacked B.
class gemm_scratch {
 public:
  gemm_scratch() = default;
  gemm_scratch(const gemm_scratch&) = delete;
  gemm_scratch& operator=(const gemm_scratch&) = delete;
  ~gemm_scratch() { aligned_free(data_); }

  void* reserve(std::size_t bytes) {
    if (bytes > capacity_) {
      aligned_free(data_);
      data_ = nullptr;
      capacity_ = 0;
      data_ = aligned_allocate(bytes);
      capacity_ = bytes;
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

}  // namespace kiln::kernels::cpu::gemm_detail
