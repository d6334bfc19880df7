// Matrix products with PyTorch's rules: matmul (1-D operands as vectors, batches broadcast over the leading
// dimensions), bmm, baddbmm, and einsum for the contractions of one or two operands.
//
// A batched product is one GEMM per matrix of the result, through Policy::gemm; when the right operand is a single
// matrix, the left one's batch folds into its rows and the product is one GEMM ([B, n, k] x [k, m] as [B n, k] x
// [k, m]). einsum is written over the differentiable ops (sum, permute, reshape, matmul), so its gradient is theirs.
//   auto scores = kiln::nn::matmul(q, kiln::nn::transpose(k, -2, -1));            // [B, H, L, D] x [B, H, D, L]
//   auto same = kiln::nn::einsum("bhqd,bhkd->bhqk", {q, k});
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/dynamic/functional/arithmetic.hpp"
#include "kiln/dynamic/functional/common.hpp"
#include "kiln/dynamic/functional/reduce.hpp"
#include "kiln/dynamic/functional/shape.hpp"
#include "kiln/kernels/strided.hpp"

namespace kiln::nn {

namespace detail {

// a [..., n, k] times b [..., k, m], both of rank 2 or more: the broadcast batch and a walk over it whose operands
// are the result (0), a (1) and b (2), with strides counted in matrices.
struct matmul_plan {
  index_t n = 0, k = 0, m = 0;
  kiln::shape out;
  kernels::strided_walk<3> batches;
  bool fold_rows = false;  // b is one matrix: a's batch becomes rows of one product
};

inline matmul_plan plan_matmul(const kiln::shape& a, const kiln::shape& b, const char* op) {
  matmul_plan p;
  p.n = a[a.rank() - 2];
  p.k = a[a.rank() - 1];
  p.m = b[b.rank() - 1];
  if (b[b.rank() - 2] != p.k)
    fail(op, ": the inner extents differ: ", a, " x ", b, " (the last extent of the first, ", p.k,
         ", must equal the second's next-to-last, ", b[b.rank() - 2], ")");
  kiln::shape batch_a, batch_b;
  for (int d = 0; d + 2 < a.rank(); ++d) batch_a.push_back(a[d]);
  for (int d = 0; d + 2 < b.rank(); ++d) batch_b.push_back(b[d]);
  const kiln::shape batch = broadcast_shapes(batch_a, batch_b, op);
  p.out = batch;
  p.out.push_back(p.n);
  p.out.push_back(p.m);
  p.batches.rank = batch.rank();
  for (int d = 0; d < batch.rank(); ++d) p.batches.extent[d] = batch[d];
  kernels::contiguous_strides(batch, p.batches.stride[0]);
  kernels::broadcast_strides(batch_a, batch, p.batches.stride[1]);
  kernels::broadcast_strides(batch_b, batch, p.batches.stride[2]);
  p.batches.coalesce();
  p.fold_rows = b.rank() == 2;
  return p;
}

// Calls body(out, a, b) with the matrix offsets (in elements) of each product of the batch.
template <class Body>
void for_each_product(const matmul_plan& p, Body&& body) {
  const index_t out_size = p.n * p.m, a_size = p.n * p.k, b_size = p.k * p.m;
  kernels::for_each_run(p.batches, [&](const index_t* at, index_t count, const index_t* step) {
    for (index_t i = 0; i < count; ++i)
      body((at[0] + i * step[0]) * out_size, (at[1] + i * step[1]) * a_size, (at[2] + i * step[2]) * b_size);
  });
}

// The number of matrices in a batch of shape s: the product of its extents but the last two.
inline index_t matrices(const kiln::shape& s) {
  index_t count = 1;
  for (int d = 0; d + 2 < s.rank(); ++d) count *= s[d];
  return count;
}

template <class T>
void matmul_backward(const tape_entry<T>& e) {
  using P = dynamic_policy;
  variable_node<T>*a = e.in[0], *b = e.in[1];
  const matmul_plan p = plan_matmul(a->shape, b->shape, "matmul");
  const T* dy = e.out->grad;
  const index_t n = p.n, k = p.k, m = p.m;
  if (p.fold_rows) {
    const index_t rows = leading_size(a->shape);
    write_or_add<P>(grad_target_for(a), rows * k, [&](T* dst) {  // dA = dY B^T
      P::gemm(false, true, rows, k, m, T(1), dy, m, b->value, m, T(0), dst, k);
    });
    write_or_add<P>(grad_target_for(b), k * m, [&](T* dst) {  // dB = A^T dY
      P::gemm(true, false, k, m, rows, T(1), a->value, k, dy, m, T(0), dst, m);
    });
    return;
  }
  // An operand broadcast over part of the batch takes the sum of its products' gradients: it is zeroed (when fresh)
  // and every product adds.
  for (int side = 0; side < 2; ++side) {
    variable_node<T>* x = e.in[side];
    auto t = grad_target_for(x);
    if (!t.data) continue;
    const bool broadcast = matrices(x->shape) != matrices(p.out);
    if (broadcast && !t.accumulate) zero_values(t.data, x->shape.numel());
    const T beta = broadcast || t.accumulate ? T(1) : T(0);
    for_each_product(p, [&](index_t yo, index_t ao, index_t bo) {
      if (side == 0) P::gemm(false, true, n, k, m, T(1), dy + yo, m, b->value + bo, m, beta, t.data + ao, k);
      else P::gemm(true, false, k, m, n, T(1), a->value + ao, k, dy + yo, m, beta, t.data + bo, m);
    });
  }
}

template <class T>
basic_variable<T> matmul_batched(const basic_variable<T>& a, const basic_variable<T>& b, const char* op) {
  using P = dynamic_policy;
  auto* an = node_of(a, op);
  auto* bn = node_of(b, op);
  const matmul_plan p = plan_matmul(an->shape, bn->shape, op);
  const bool record = should_record<T>({an, bn});
  auto y = make_output<T>(p.out, record);
  const index_t n = p.n, k = p.k, m = p.m;
  if (p.fold_rows) {
    const index_t rows = leading_size(an->shape);
    P::gemm(false, false, rows, m, k, T(1), an->value, k, bn->value, m, T(0), y.data(), m);
  } else {
    for_each_product(p, [&](index_t yo, index_t ao, index_t bo) {
      P::gemm(false, false, n, m, k, T(1), an->value + ao, k, bn->value + bo, m, T(0), y.data() + yo, m);
    });
  }
  if (record) tape<T>::instance().record(&matmul_backward<T>, y.node(), an, bn);
  return y;
}

}  // namespace detail

// The matrix product with torch.matmul's rules: two vectors give their dot product (rank 0); a vector on the left is
// a row ([k] x [..., k, m] -> [..., m]) and on the right a column ([..., n, k] x [k] -> [..., n]); otherwise the last
// two dimensions multiply as matrices and the leading ones broadcast.
template <class T>
basic_variable<T> matmul(const basic_variable<T>& a, const basic_variable<T>& b) {
  auto* an = detail::node_of(a, "matmul");
  auto* bn = detail::node_of(b, "matmul");
  const int ra = an->shape.rank(), rb = bn->shape.rank();
  if (ra == 0 || rb == 0)
    fail("matmul: both arguments need at least one dimension, found shapes ", an->shape, " and ", bn->shape);
  if (ra == 1 && rb == 1) {
    if (an->shape[0] != bn->shape[0])
      fail("matmul: the vectors' lengths differ: ", an->shape, " and ", bn->shape);
    return reshape(detail::matmul_batched(unsqueeze(a, 0), unsqueeze(b, 1), "matmul"), kiln::shape{});
  }
  if (ra == 1) return squeeze(detail::matmul_batched(unsqueeze(a, 0), b, "matmul"), -2);
  if (rb == 1) return squeeze(detail::matmul_batched(a, unsqueeze(b, 1), "matmul"), -1);
  return detail::matmul_batched(a, b, "matmul");
}

// The products of two batches of matrices, [B, n, k] x [B, k, m] -> [B, n, m], as torch.bmm (no broadcasting).
template <class T>
basic_variable<T> bmm(const basic_variable<T>& a, const basic_variable<T>& b) {
  auto* an = detail::node_of(a, "bmm");
  auto* bn = detail::node_of(b, "bmm");
  if (an->shape.rank() != 3 || bn->shape.rank() != 3 || an->shape[0] != bn->shape[0])
    fail("bmm: expected batches [B, n, k] and [B, k, m] of the same B, found ", an->shape, " and ", bn->shape);
  return detail::matmul_batched(a, b, "bmm");
}

// beta * input + alpha * bmm(batch1, batch2), with input broadcast to the result, as torch.baddbmm (beta = 0 ignores
// input, NaN included).
template <class T>
basic_variable<T> baddbmm(const basic_variable<T>& input, const basic_variable<T>& batch1,
                          const basic_variable<T>& batch2, std::type_identity_t<T> beta = 1,
                          std::type_identity_t<T> alpha = 1) {
  basic_variable<T> product = bmm(batch1, batch2);
  if (alpha != T(1)) product = mul(product, alpha);
  const kiln::shape out =
      detail::broadcast_shapes(detail::node_of(input, "baddbmm")->shape, product.shape(), "baddbmm");
  if (!(out == product.shape()))
    fail("baddbmm: input of shape ", input.shape(), " does not broadcast to the product's shape ", product.shape());
  if (beta == T(0)) return product;
  return add(beta == T(1) ? input : mul(input, beta), product);
}

namespace detail {

// One operand's subscripts, checked: letters only, no letter twice (a diagonal is not supported).
inline std::string einsum_term(std::string_view term, int rank, int which, std::string_view equation) {
  std::string s(term);
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
      fail("einsum: unexpected character '", c, "' in \"", equation,
           "\" (subscripts are letters; '...' is not supported)");
    if (s.find(c) != i)
      fail("einsum: subscript '", c, "' repeats in operand ", which, " of \"", equation,
           "\" (diagonals are not supported)");
  }
  if (static_cast<int>(s.size()) != rank)
    fail("einsum: operand ", which, " has ", rank, " dimensions but \"", term, "\" names ", s.size(), " in \"",
         equation, "\"");
  return s;
}

// Sums x over the subscripts of `term` that `keep` lacks; returns the remaining term.
template <class T>
std::string einsum_sum_out(basic_variable<T>& x, const std::string& term, const std::string& keep) {
  int list[kiln::shape::max_rank] = {}, count = 0;
  std::string rest;
  for (std::size_t i = 0; i < term.size(); ++i) {
    if (keep.find(term[i]) == std::string::npos) list[count++] = static_cast<int>(i);
    else rest += term[i];
  }
  if (count > 0) x = sum(x, dims(std::span<const int>(list, static_cast<std::size_t>(count))));
  return rest;
}

// x (subscripts `term`) permuted into the order of `order` (the same letters).
template <class T>
basic_variable<T> einsum_permute(const basic_variable<T>& x, const std::string& term, const std::string& order) {
  if (term == order) return x;
  int list[kiln::shape::max_rank] = {};
  for (std::size_t i = 0; i < order.size(); ++i) list[i] = static_cast<int>(term.find(order[i]));
  return permute(x, dims(std::span<const int>(list, order.size())));
}

}  // namespace detail

// Einstein summation over one or two operands, as torch.einsum: "bij,bjk->bik", "bhqd,bhkd->bhqk", "ij->ji", "i,i->"
// (an implicit output, with no "->", lists the letters that appear once, in alphabetical order). Subscripts are
// letters; ellipses and repeated subscripts within one operand (diagonals) are refused.
template <class T>
basic_variable<T> einsum(std::string_view equation, const std::vector<basic_variable<T>>& operands) {
  std::string eq;
  for (char c : equation)
    if (c != ' ') eq += c;
  const auto arrow = eq.find("->");
  const std::string inputs = eq.substr(0, arrow);
  const auto comma = inputs.find(',');
  const std::size_t count = comma == std::string::npos ? 1 : 2;
  if (inputs.find(',', comma == std::string::npos ? inputs.size() : comma + 1) != std::string::npos)
    fail("einsum: \"", equation, "\" has more than two operands; only one or two are supported");
  if (operands.size() != count)
    fail("einsum: \"", equation, "\" names ", count, " operands, found ", operands.size());
  for (const auto& x : operands) detail::node_of(x, "einsum");
  std::string terms[2];
  terms[0] = detail::einsum_term(inputs.substr(0, comma), operands[0].dim(), 0, equation);
  if (count == 2) terms[1] = detail::einsum_term(inputs.substr(comma + 1), operands[1].dim(), 1, equation);
  std::string out;
  if (arrow != std::string::npos) {
    out = detail::einsum_term(eq.substr(arrow + 2), static_cast<int>(eq.size() - arrow - 2), -1, equation);
    for (char c : out)
      if (terms[0].find(c) == std::string::npos && terms[1].find(c) == std::string::npos)
        fail("einsum: output subscript '", c, "' of \"", equation, "\" appears in no operand");
  } else {
    const std::string all = terms[0] + terms[1];
    for (char c = 'A'; c <= 'z'; ++c)
      if (std::count(all.begin(), all.end(), c) == 1) out += c;
  }
  basic_variable<T> a = operands[0];
  if (count == 1) {
    const std::string rest = detail::einsum_sum_out(a, terms[0], out);
    return detail::einsum_permute(a, rest, out);
  }
  basic_variable<T> b = operands[1];
  for (std::size_t i = 0; i < terms[0].size(); ++i) {
    const auto j = terms[1].find(terms[0][i]);
    if (j != std::string::npos && operands[0].shape()[static_cast<int>(i)] != operands[1].shape()[static_cast<int>(j)])
      fail("einsum: subscript '", terms[0][i], "' of \"", equation, "\" has extent ",
           operands[0].shape()[static_cast<int>(i)], " in operand 0 and ", operands[1].shape()[static_cast<int>(j)],
           " in operand 1");
  }
  // Letters only one operand has and the output lacks are summed first; then the rest sorts into the batch (both
  // operands and the output), the contracted (both, not the output) and each side's free letters.
  const std::string ta = detail::einsum_sum_out(a, terms[0], terms[1] + out);
  const std::string tb = detail::einsum_sum_out(b, terms[1], ta + out);
  std::string batch, contracted, left, right;
  for (char c : ta) {
    const bool in_b = tb.find(c) != std::string::npos, in_out = out.find(c) != std::string::npos;
    if (in_b && in_out) batch += c;
    else if (in_b) contracted += c;
    else left += c;
  }
  for (char c : tb)
    if (ta.find(c) == std::string::npos) right += c;
  auto extent_of = [&](const basic_variable<T>& x, const std::string& term, const std::string& letters) {
    index_t n = 1;
    for (char c : letters) n *= x.shape()[static_cast<int>(term.find(c))];
    return n;
  };
  kiln::shape result_shape;
  for (char c : batch) result_shape.push_back(a.shape()[static_cast<int>(ta.find(c))]);
  for (char c : left) result_shape.push_back(a.shape()[static_cast<int>(ta.find(c))]);
  for (char c : right) result_shape.push_back(b.shape()[static_cast<int>(tb.find(c))]);
  const index_t nb = extent_of(a, ta, batch), nl = extent_of(a, ta, left), nk = extent_of(a, ta, contracted),
                nr = extent_of(b, tb, right);
  auto am = reshape(detail::einsum_permute(a, ta, batch + left + contracted), kiln::shape{nb, nl, nk});
  auto bm = reshape(detail::einsum_permute(b, tb, batch + contracted + right), kiln::shape{nb, nk, nr});
  auto product = reshape(detail::matmul_batched(am, bm, "einsum"), result_shape);
  return detail::einsum_permute(product, batch + left + right, out);
}

template <class T>
basic_variable<T> einsum(std::string_view equation, std::initializer_list<basic_variable<T>> operands) {
  return einsum(equation, std::vector<basic_variable<T>>(operands));
}

}  // namespace kiln::nn
