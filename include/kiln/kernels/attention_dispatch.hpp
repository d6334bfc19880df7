// The attention kernel a policy runs, for both modes (dynamic mode's scaled_dot_product_attention and static mode's
// MultiheadSelfAttention), so that both run the same one: the policy's own where it has attention_forward and
// attention_backward members, else the CPU's tiled kernel (kernels/cpu/attention.hpp) at the policy's product
// precision.
#pragma once

#include "kiln/kernels/cpu/attention.hpp"
#include "kiln/kernels/cpu/product_precision.hpp"

namespace kiln::kernels {

// Whether a policy brings an attention kernel of its own.
template <class P, class T>
concept has_attention_kernel = requires(const cpu::attention_problem<T>& p, T* out, const T* in,
                                        const cpu::attention_grad<T>& g) {
  P::attention_forward(p, out, out);
  P::attention_backward(p, in, in, in, g, g, g);
};

// The precision of a CPU policy's products (policy::cpu's gemm_precision), for the tiles' products.
template <class P>
cpu::product_precision product_precision_of() {
  if constexpr (requires { P::gemm_precision(); }) return P::gemm_precision();
  else return cpu::product_precision::single;
}

template <class P, class T>
struct attention_kernel {
  static void forward(const cpu::attention_problem<T>& p, T* out, T* lse) {
    if constexpr (has_attention_kernel<P, T>) P::attention_forward(p, out, lse);
    else cpu::attention_forward(p, out, lse);
  }
  static void backward(const cpu::attention_problem<T>& p, const T* out, const T* lse, const T* dout,
                       const cpu::attention_grad<T>& dq, const cpu::attention_grad<T>& dk,
                       const cpu::attention_grad<T>& dv) {
    if constexpr (has_attention_kernel<P, T>) P::attention_backward(p, out, lse, dout, dq, dk, dv);
    else cpu::attention_backward(p, out, lse, dout, dq, dk, dv);
  }
};

}  // namespace kiln::kernels
