// Counts the test executable's heap allocations: replacements of every global operator new and delete, the count in
// kiln_test::heap_allocations. Replacement operators must be defined once per program, so include this from exactly
// one translation unit of a test executable (each tests/test_*.cpp is its own executable).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace kiln_test {
inline std::atomic<long long> heap_allocations{0};
}

// The replacements pair malloc with free on purpose; GCC's heuristic cannot see that both sides are replaced, and
// warns where it inlines them into a caller of this translation unit.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

void* operator new(std::size_t bytes) {
  kiln_test::heap_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t bytes) { return operator new(bytes); }
void* operator new(std::size_t bytes, std::align_val_t align) {
  kiln_test::heap_allocations.fetch_add(1, std::memory_order_relaxed);
  const std::size_t a = static_cast<std::size_t>(align);
  if (void* p = std::aligned_alloc(a, (bytes + a - 1) / a * a)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t bytes, std::align_val_t align) { return operator new(bytes, align); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
