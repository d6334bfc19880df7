// The op table of dynamic mode's tensor ops (tests/test_tensor_ops.cpp, and tests/cuda/test_cuda_tensor_ops.cu on
// the GPU): one entry per op, a generic lambda written once for float and double, the samples of
// tests/fixtures/ops/<op>.txt (made by tests/fixtures/generate_ops.py, which documents the array names), and the float
// check of a sample against PyTorch: its outputs, and the inputs' gradients of loss = sum_k sum(out_k * dout_k).
// Values are read back with tensor() and a copy of the gradient, so the check runs on any dynamic policy.
// KILN_OPS=exp,sum_dims restricts for_each_sample to those ops.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fixture.hpp"
#include "kiln/dynamic/nn.hpp"

namespace nn = kiln::nn;
using kiln::index_t;
using kiln::test::check_close;
using kiln::test::fixture;

namespace {

template <class T>
using variable = nn::basic_variable<T>;
template <class T>
using outs = std::vector<variable<T>>;

// Joins strings without operator+ on a literal, which trips GCC 12's false -Wrestrict warning at -O3.
std::string join(std::string head, std::string_view tail) {
  head += tail;
  return head;
}
std::string join(std::string head, std::string_view middle, std::string_view tail) {
  head += middle;
  head += tail;
  return head;
}

// "<sample>.<what>"
std::string key(const std::string& sample_name, std::string_view what) { return join(sample_name, ".", what); }

template <class T>
kiln::Tensor<T> read_values(const fixture& fx, const std::string& name) {
  if constexpr (std::is_same_v<T, float>) return fx.f32(name);
  else return fx.f64(name);  // the file's float32 values, widened
}

// One sample of an op, as the op's lambda sees it: its inputs, index tensors and parameters.
template <class T>
class sample {
 public:
  using value_type = T;

  sample(const fixture& fx, std::string name, bool requires_grad) : fx_(&fx), name_(std::move(name)) {
    for (int i = 0; fx.has(at(join("in", std::to_string(i)))); ++i)
      leaves_.emplace_back(read_values<T>(fx, at(join("in", std::to_string(i)))), requires_grad);
    if (fx.has(at("mask"))) mask_ = variable<T>(read_values<T>(fx, at("mask")));  // never requires grad
  }

  const std::string& name() const { return name_; }
  int inputs() const { return static_cast<int>(leaves_.size()); }
  // The leaf behind input i (the fixture's in<i>, which the gradients grad<i> are of).
  const variable<T>& leaf(int i) const { return leaves_.at(static_cast<std::size_t>(i)); }

  // Input i as the op gets it: the leaf, transposed if p.transpose<i> = [d0, d1], then sliced if p.slice<i> = [dim,
  // start, end, step]. Built anew at each call, so that finite differences see the perturbed leaf.
  variable<T> in(int i) const {
    variable<T> v = leaf(i);
    const std::string t = at(join("p.transpose", std::to_string(i)));
    if (fx_->has(t)) {
      const std::vector<std::int64_t> d = fx_->i64(t);
      v = nn::transpose(v, static_cast<int>(d.at(0)), static_cast<int>(d.at(1)));
    }
    const std::string s = at(join("p.slice", std::to_string(i)));
    if (fx_->has(s)) {
      const std::vector<std::int64_t> d = fx_->i64(s);
      v = nn::slice(v, static_cast<int>(d.at(0)), static_cast<index_t>(d.at(1)), static_cast<index_t>(d.at(2)),
                    static_cast<index_t>(d.at(3)));
    }
    return v;
  }
  // Every input, in order (cat, stack, einsum).
  std::vector<variable<T>> ins() const {
    std::vector<variable<T>> all;
    for (int i = 0; i < inputs(); ++i) all.push_back(in(i));
    return all;
  }
  variable<T> mask() const {
    if (!mask_.defined()) kiln::fail(fx_->path(), ": sample '", name_, "' has no mask");
    return mask_;
  }
  kiln::Tensor<std::int64_t> idx(int i) const {
    const std::string n = at(join("idx", std::to_string(i)));
    const std::vector<std::int64_t> values = fx_->i64(n);
    return kiln::Tensor<std::int64_t>(fx_->shape_of(n), std::span<const std::int64_t>(values));
  }

  // Parameters, by their name after the sample's: "p.dim".
  bool has(const char* p) const { return fx_->has(at(p)); }
  std::vector<std::int64_t> ints(const char* p) const { return fx_->i64(at(p)); }
  std::int64_t i(const char* p) const {
    if (fx_->shape_of(at(p)).rank() != 0) kiln::fail(fx_->path(), ": '", at(p), "' is not a rank-0 integer");
    return ints(p)[0];
  }
  index_t index(const char* p) const { return static_cast<index_t>(i(p)); }
  int dim(const char* p) const { return static_cast<int>(i(p)); }
  bool flag(const char* p) const { return i(p) != 0; }
  double f(const char* p) const { return fx_->scalar(at(p)); }
  // A float parameter as the op's scalar type (the file holds float32, so float and double get the same value).
  T t(const char* p) const { return static_cast<T>(f(p)); }
  // p.form: which spelling of the op the sample calls (0 when absent: the function).
  std::int64_t form() const { return has("p.form") ? i("p.form") : 0; }
  std::vector<int> dims(const char* p) const {
    std::vector<int> d;
    for (std::int64_t v : ints(p)) d.push_back(static_cast<int>(v));
    return d;
  }
  // An int (rank 0 in the file) or a braced list (rank 1) of dims, as a call would write it.
  nn::dims dim_list(const char* p) const {
    if (fx_->shape_of(at(p)).rank() == 0) return nn::dims(dim(p));
    const std::vector<int> d = dims(p);
    switch (d.size()) {
      case 1: return nn::dims{d[0]};
      case 2: return nn::dims{d[0], d[1]};
      case 3: return nn::dims{d[0], d[1], d[2]};
      case 4: return nn::dims{d[0], d[1], d[2], d[3]};
      case 5: return nn::dims{d[0], d[1], d[2], d[3], d[4]};
      case 6: return nn::dims{d[0], d[1], d[2], d[3], d[4], d[5]};
      default: break;
    }
    kiln::fail(fx_->path(), ": '", at(p), "' has ", d.size(), " dims; the table handles 1 to 6");
  }
  std::vector<index_t> sizes(const char* p) const {
    std::vector<index_t> s;
    for (std::int64_t v : ints(p)) s.push_back(static_cast<index_t>(v));
    return s;
  }
  kiln::shape shape(const char* p) const {
    const std::vector<std::int64_t> v = ints(p);
    return kiln::shape::from_range(v.begin(), v.end());
  }
  // A string parameter, stored as character codes (einsum's equation).
  std::string str(const char* p) const {
    std::string s;
    for (std::int64_t c : ints(p)) s.push_back(static_cast<char>(c));
    return s;
  }

 private:
  std::string at(std::string_view what) const { return key(name_, what); }

  const fixture* fx_;
  std::string name_;
  std::vector<variable<T>> leaves_;
  variable<T> mask_;
};

// An index result (argmax) as a Variable of the table's type, for uniform comparison.
template <class T>
variable<T> from_indices(const kiln::Tensor<std::int64_t>& indices) {
  kiln::Tensor<T> values(indices.shape());
  for (index_t i = 0; i < indices.numel(); ++i) values[i] = static_cast<T>(indices[i]);
  return variable<T>(values);
}

struct op_entry {
  std::string op;
  std::function<outs<float>(sample<float>&)> f32;
  std::function<outs<double>(sample<double>&)> f64;
  bool differentiable = true;
  bool index_output = false;  // the outputs are indices (i64 in the fixture)
  double rtol = 1e-5;         // non-differentiable ops compare exactly (0/1 masks, indices)
};

// The entry's function for the sample's type.
const std::function<outs<float>(sample<float>&)>& function_for(const op_entry& e, const sample<float>&) {
  return e.f32;
}
const std::function<outs<double>(sample<double>&)>& function_for(const op_entry& e, const sample<double>&) {
  return e.f64;
}

template <class F>
op_entry entry(std::string op, F f, bool differentiable = true) {
  op_entry e;
  e.op = std::move(op);
  e.f32 = f;
  e.f64 = f;
  e.differentiable = differentiable;
  return e;
}
template <class F>
op_entry index_entry(std::string op, F f) {
  op_entry e = entry(std::move(op), f, false);
  e.index_output = true;
  return e;
}

// The table. Each lambda calls the op with exactly the parameters the sample has: a parameter absent from the
// fixture is an argument left to its default.
const std::vector<op_entry>& op_table() {
  static const std::vector<op_entry> table = [] {
    std::vector<op_entry> t;

    // --- unary (pointwise.hpp, and the activations and neg that existed before) ---
    t.push_back(entry("exp", []<class T>(sample<T>& s) -> outs<T> { return {nn::exp(s.in(0))}; }));
    t.push_back(entry("log", []<class T>(sample<T>& s) -> outs<T> { return {nn::log(s.in(0))}; }));
    t.push_back(entry("log1p", []<class T>(sample<T>& s) -> outs<T> { return {nn::log1p(s.in(0))}; }));
    t.push_back(entry("sqrt", []<class T>(sample<T>& s) -> outs<T> { return {nn::sqrt(s.in(0))}; }));
    t.push_back(entry("rsqrt", []<class T>(sample<T>& s) -> outs<T> { return {nn::rsqrt(s.in(0))}; }));
    t.push_back(entry("abs", []<class T>(sample<T>& s) -> outs<T> { return {nn::abs(s.in(0))}; }));
    t.push_back(entry("sin", []<class T>(sample<T>& s) -> outs<T> { return {nn::sin(s.in(0))}; }));
    t.push_back(entry("cos", []<class T>(sample<T>& s) -> outs<T> { return {nn::cos(s.in(0))}; }));
    t.push_back(entry("reciprocal", []<class T>(sample<T>& s) -> outs<T> { return {nn::reciprocal(s.in(0))}; }));
    t.push_back(entry("square", []<class T>(sample<T>& s) -> outs<T> { return {nn::square(s.in(0))}; }));
    t.push_back(entry("neg", []<class T>(sample<T>& s) -> outs<T> { return {nn::neg(s.in(0))}; }));
    t.push_back(entry("relu", []<class T>(sample<T>& s) -> outs<T> { return {nn::relu(s.in(0))}; }));
    t.push_back(entry("gelu", []<class T>(sample<T>& s) -> outs<T> { return {nn::gelu(s.in(0))}; }));
    t.push_back(entry("sigmoid", []<class T>(sample<T>& s) -> outs<T> { return {nn::sigmoid(s.in(0))}; }));
    t.push_back(entry("tanh", []<class T>(sample<T>& s) -> outs<T> { return {nn::tanh(s.in(0))}; }));
    t.push_back(entry("leaky_relu", []<class T>(sample<T>& s) -> outs<T> {
      if (s.has("p.negative_slope")) return {nn::leaky_relu(s.in(0), s.t("p.negative_slope"))};
      return {nn::leaky_relu(s.in(0))};
    }));
    t.push_back(entry("pow", []<class T>(sample<T>& s) -> outs<T> { return {nn::pow(s.in(0), s.f("p.exponent"))}; }));
    t.push_back(entry("clamp", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::clamp(s.in(0), s.t("p.min"), s.t("p.max"))};
    }));
    t.push_back(entry("clamp_min", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::clamp_min(s.in(0), s.t("p.min"))};
    }));
    t.push_back(entry("clamp_max", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::clamp_max(s.in(0), s.t("p.max"))};
    }));

    // --- binary, broadcasting (p.form 1: the operator) ---
    t.push_back(entry("add", []<class T>(sample<T>& s) -> outs<T> {
      if (s.form() == 1) return {s.in(0) + s.in(1)};
      return {nn::add(s.in(0), s.in(1))};
    }));
    t.push_back(entry("sub", []<class T>(sample<T>& s) -> outs<T> {
      if (s.form() == 1) return {s.in(0) - s.in(1)};
      return {nn::sub(s.in(0), s.in(1))};
    }));
    t.push_back(entry("mul", []<class T>(sample<T>& s) -> outs<T> {
      if (s.form() == 1) return {s.in(0) * s.in(1)};
      return {nn::mul(s.in(0), s.in(1))};
    }));
    t.push_back(entry("div", []<class T>(sample<T>& s) -> outs<T> {
      if (s.form() == 1) return {s.in(0) / s.in(1)};
      return {nn::div(s.in(0), s.in(1))};
    }));
    t.push_back(entry("maximum", []<class T>(sample<T>& s) -> outs<T> { return {nn::maximum(s.in(0), s.in(1))}; }));
    t.push_back(entry("minimum", []<class T>(sample<T>& s) -> outs<T> { return {nn::minimum(s.in(0), s.in(1))}; }));
    t.push_back(entry("pow_tensor", []<class T>(sample<T>& s) -> outs<T> { return {nn::pow(s.in(0), s.in(1))}; }));

    // --- with a scalar: p.form 0 the function, 1 the operator with the scalar on the right, 2 on the left ---
    t.push_back(entry("add_scalar", []<class T>(sample<T>& s) -> outs<T> {
      const T c = s.t("p.other");
      if (s.form() == 1) return {s.in(0) + c};
      if (s.form() == 2) return {c + s.in(0)};
      return {nn::add(s.in(0), c)};
    }));
    t.push_back(entry("sub_scalar", []<class T>(sample<T>& s) -> outs<T> {
      const T c = s.t("p.other");
      if (s.form() == 1) return {s.in(0) - c};
      if (s.form() == 2) return {c - s.in(0)};
      return {nn::sub(s.in(0), c)};
    }));
    t.push_back(entry("mul_scalar", []<class T>(sample<T>& s) -> outs<T> {
      const T c = s.t("p.other");
      if (s.form() == 1) return {s.in(0) * c};
      if (s.form() == 2) return {c * s.in(0)};
      return {nn::mul(s.in(0), c)};
    }));
    t.push_back(entry("div_scalar", []<class T>(sample<T>& s) -> outs<T> {
      const T c = s.t("p.other");
      if (s.form() == 1) return {s.in(0) / c};
      if (s.form() == 2) return {c / s.in(0)};
      return {nn::div(s.in(0), c)};
    }));

    // --- comparisons: float masks of 0 and 1, no gradient ---
    t.push_back(entry("eq", []<class T>(sample<T>& s) -> outs<T> { return {nn::eq(s.in(0), s.in(1))}; }, false));
    t.push_back(entry("ne", []<class T>(sample<T>& s) -> outs<T> { return {nn::ne(s.in(0), s.in(1))}; }, false));
    t.push_back(entry("lt", []<class T>(sample<T>& s) -> outs<T> { return {nn::lt(s.in(0), s.in(1))}; }, false));
    t.push_back(entry("le", []<class T>(sample<T>& s) -> outs<T> { return {nn::le(s.in(0), s.in(1))}; }, false));
    t.push_back(entry("gt", []<class T>(sample<T>& s) -> outs<T> { return {nn::gt(s.in(0), s.in(1))}; }, false));
    t.push_back(entry("ge", []<class T>(sample<T>& s) -> outs<T> { return {nn::ge(s.in(0), s.in(1))}; }, false));
    t.push_back(entry("eq_scalar", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::eq(s.in(0), s.t("p.other"))};
    }, false));
    t.push_back(entry("ne_scalar", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::ne(s.in(0), s.t("p.other"))};
    }, false));
    t.push_back(entry("lt_scalar", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::lt(s.in(0), s.t("p.other"))};
    }, false));
    t.push_back(entry("le_scalar", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::le(s.in(0), s.t("p.other"))};
    }, false));
    t.push_back(entry("gt_scalar", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::gt(s.in(0), s.t("p.other"))};
    }, false));
    t.push_back(entry("ge_scalar", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::ge(s.in(0), s.t("p.other"))};
    }, false));

    // --- where and masked_fill (the mask is an input without gradient) ---
    t.push_back(entry("where", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::where(s.mask(), s.in(0), s.in(1))};
    }));
    t.push_back(entry("masked_fill", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::masked_fill(s.in(0), s.mask(), s.t("p.value"))};
    }));

    // --- reductions ---
    t.push_back(entry("sum", []<class T>(sample<T>& s) -> outs<T> { return {nn::sum(s.in(0))}; }));
    t.push_back(entry("mean", []<class T>(sample<T>& s) -> outs<T> { return {nn::mean(s.in(0))}; }));
    t.push_back(entry("sum_dims", []<class T>(sample<T>& s) -> outs<T> {
      if (s.has("p.keepdim")) return {nn::sum(s.in(0), s.dim_list("p.dim"), s.flag("p.keepdim"))};
      return {nn::sum(s.in(0), s.dim_list("p.dim"))};
    }));
    t.push_back(entry("mean_dims", []<class T>(sample<T>& s) -> outs<T> {
      if (s.has("p.keepdim")) return {nn::mean(s.in(0), s.dim_list("p.dim"), s.flag("p.keepdim"))};
      return {nn::mean(s.in(0), s.dim_list("p.dim"))};
    }));
    t.push_back(entry("amax", []<class T>(sample<T>& s) -> outs<T> {
      if (s.has("p.keepdim")) return {nn::amax(s.in(0), s.dim_list("p.dim"), s.flag("p.keepdim"))};
      return {nn::amax(s.in(0), s.dim_list("p.dim"))};
    }));
    t.push_back(entry("amin", []<class T>(sample<T>& s) -> outs<T> {
      if (s.has("p.keepdim")) return {nn::amin(s.in(0), s.dim_list("p.dim"), s.flag("p.keepdim"))};
      return {nn::amin(s.in(0), s.dim_list("p.dim"))};
    }));
    t.push_back(entry("logsumexp", []<class T>(sample<T>& s) -> outs<T> {
      if (s.has("p.keepdim")) return {nn::logsumexp(s.in(0), s.dim_list("p.dim"), s.flag("p.keepdim"))};
      return {nn::logsumexp(s.in(0), s.dim_list("p.dim"))};
    }));
    // var and std: p.keepdim only comes with p.correction (it follows it in the call).
    t.push_back(entry("var", []<class T>(sample<T>& s) -> outs<T> {
      if (!s.has("p.correction")) return {nn::var(s.in(0), s.dim_list("p.dim"))};
      if (!s.has("p.keepdim")) return {nn::var(s.in(0), s.dim_list("p.dim"), s.f("p.correction"))};
      return {nn::var(s.in(0), s.dim_list("p.dim"), s.f("p.correction"), s.flag("p.keepdim"))};
    }));
    t.push_back(entry("std", []<class T>(sample<T>& s) -> outs<T> {
      if (!s.has("p.correction")) return {nn::std(s.in(0), s.dim_list("p.dim"))};
      if (!s.has("p.keepdim")) return {nn::std(s.in(0), s.dim_list("p.dim"), s.f("p.correction"))};
      return {nn::std(s.in(0), s.dim_list("p.dim"), s.f("p.correction"), s.flag("p.keepdim"))};
    }));
    // norm(x, p = 2, dims = every element, keepdim = false); p.p may be inf.
    t.push_back(entry("norm", []<class T>(sample<T>& s) -> outs<T> {
      if (!s.has("p.p")) return {nn::norm(s.in(0))};
      const double p = s.f("p.p");
      if (!s.has("p.dim") && !s.has("p.keepdim")) return {nn::norm(s.in(0), p)};
      std::optional<nn::dims> d;
      if (s.has("p.dim")) d.emplace(s.dim_list("p.dim"));
      if (!s.has("p.keepdim")) return {nn::norm(s.in(0), p, d)};
      return {nn::norm(s.in(0), p, d, s.flag("p.keepdim"))};
    }));
    t.push_back(index_entry("argmax", []<class T>(sample<T>& s) -> outs<T> {
      if (s.has("p.keepdim")) return {from_indices<T>(nn::argmax(s.in(0), s.dim("p.dim"), s.flag("p.keepdim")))};
      return {from_indices<T>(nn::argmax(s.in(0), s.dim("p.dim")))};
    }));
    t.push_back(index_entry("argmin", []<class T>(sample<T>& s) -> outs<T> {
      if (s.has("p.keepdim")) return {from_indices<T>(nn::argmin(s.in(0), s.dim("p.dim"), s.flag("p.keepdim")))};
      return {from_indices<T>(nn::argmin(s.in(0), s.dim("p.dim")))};
    }));
    t.push_back(entry("softmax", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::softmax(s.in(0), s.dim("p.dim"))};
    }));
    t.push_back(entry("log_softmax", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::log_softmax(s.in(0), s.dim("p.dim"))};
    }));

    // --- shape ---
    t.push_back(entry("reshape", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::reshape(s.in(0), s.shape("p.shape"))};
    }));
    t.push_back(entry("view", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::view(s.in(0), s.shape("p.shape"))};
    }));
    t.push_back(entry("flatten", []<class T>(sample<T>& s) -> outs<T> {
      if (!s.has("p.start")) return {nn::flatten(s.in(0))};
      if (!s.has("p.end")) return {nn::flatten(s.in(0), s.dim("p.start"))};
      return {nn::flatten(s.in(0), s.dim("p.start"), s.dim("p.end"))};
    }));
    t.push_back(entry("unflatten", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::unflatten(s.in(0), s.dim("p.dim"), s.shape("p.sizes"))};
    }));
    t.push_back(entry("transpose", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::transpose(s.in(0), s.dim("p.dim0"), s.dim("p.dim1"))};
    }));
    t.push_back(entry("permute", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::permute(s.in(0), s.dim_list("p.dims"))};
    }));
    t.push_back(entry("contiguous", []<class T>(sample<T>& s) -> outs<T> { return {nn::contiguous(s.in(0))}; }));
    t.push_back(entry("squeeze", []<class T>(sample<T>& s) -> outs<T> { return {nn::squeeze(s.in(0))}; }));
    t.push_back(entry("squeeze_dim", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::squeeze(s.in(0), s.dim("p.dim"))};
    }));
    t.push_back(entry("unsqueeze", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::unsqueeze(s.in(0), s.dim("p.dim"))};
    }));
    t.push_back(entry("expand", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::expand(s.in(0), s.shape("p.size"))};
    }));
    t.push_back(entry("cat", []<class T>(sample<T>& s) -> outs<T> {
      if (s.has("p.dim")) return {nn::cat(s.ins(), s.dim("p.dim"))};
      return {nn::cat(s.ins())};
    }));
    t.push_back(entry("stack", []<class T>(sample<T>& s) -> outs<T> {
      if (s.has("p.dim")) return {nn::stack(s.ins(), s.dim("p.dim"))};
      return {nn::stack(s.ins())};
    }));
    t.push_back(entry("split", []<class T>(sample<T>& s) -> outs<T> {
      if (s.has("p.dim")) return nn::split(s.in(0), s.index("p.split_size"), s.dim("p.dim"));
      return nn::split(s.in(0), s.index("p.split_size"));
    }));
    t.push_back(entry("split_sizes", []<class T>(sample<T>& s) -> outs<T> {
      const std::vector<index_t> sizes = s.sizes("p.sizes");
      if (s.has("p.dim")) return nn::split(s.in(0), sizes, s.dim("p.dim"));
      return nn::split(s.in(0), sizes);
    }));
    t.push_back(entry("chunk", []<class T>(sample<T>& s) -> outs<T> {
      if (s.has("p.dim")) return nn::chunk(s.in(0), s.index("p.chunks"), s.dim("p.dim"));
      return nn::chunk(s.in(0), s.index("p.chunks"));
    }));
    t.push_back(entry("narrow", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::narrow(s.in(0), s.dim("p.dim"), s.index("p.start"), s.index("p.length"))};
    }));
    t.push_back(entry("slice", []<class T>(sample<T>& s) -> outs<T> {
      if (s.has("p.step"))
        return {nn::slice(s.in(0), s.dim("p.dim"), s.index("p.start"), s.index("p.end"), s.index("p.step"))};
      return {nn::slice(s.in(0), s.dim("p.dim"), s.index("p.start"), s.index("p.end"))};
    }));

    // --- indexing ---
    t.push_back(entry("index_select", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::index_select(s.in(0), s.dim("p.dim"), s.idx(0))};
    }));
    t.push_back(entry("gather", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::gather(s.in(0), s.dim("p.dim"), s.idx(0))};
    }));
    t.push_back(entry("scatter_add", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::scatter_add(s.in(0), s.dim("p.dim"), s.idx(0), s.in(1))};
    }));
    t.push_back(entry("embedding", []<class T>(sample<T>& s) -> outs<T> {
      if (s.has("p.padding_idx"))
        return {nn::embedding(s.idx(0), s.in(0), std::optional<index_t>(s.index("p.padding_idx")))};
      return {nn::embedding(s.idx(0), s.in(0))};
    }));
    t.push_back(entry("one_hot", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::one_hot<T>(s.idx(0), s.index("p.num_classes"))};
    }, false));

    // --- products ---
    t.push_back(entry("matmul", []<class T>(sample<T>& s) -> outs<T> { return {nn::matmul(s.in(0), s.in(1))}; }));
    t.push_back(entry("bmm", []<class T>(sample<T>& s) -> outs<T> { return {nn::bmm(s.in(0), s.in(1))}; }));
    t.push_back(entry("baddbmm", []<class T>(sample<T>& s) -> outs<T> {
      if (!s.has("p.beta")) return {nn::baddbmm(s.in(0), s.in(1), s.in(2))};
      if (!s.has("p.alpha")) return {nn::baddbmm(s.in(0), s.in(1), s.in(2), s.t("p.beta"))};
      return {nn::baddbmm(s.in(0), s.in(1), s.in(2), s.t("p.beta"), s.t("p.alpha"))};
    }));
    t.push_back(entry("einsum", []<class T>(sample<T>& s) -> outs<T> {
      return {nn::einsum(s.str("p.equation"), s.ins())};
    }));
    return t;
  }();
  return table;
}

// The samples of an op's fixture: the names before '.in0' or '.out0', in file order.
std::vector<std::string> sample_names(const fixture& fx) {
  std::vector<std::string> names;
  for (const std::string& n : fx.names()) {
    const std::size_t dot = n.find('.');
    if (dot == std::string::npos) continue;
    const std::string_view rest = std::string_view(n).substr(dot + 1);
    if (rest != "in0" && rest != "out0") continue;
    std::string s = n.substr(0, dot);
    if (std::find(names.begin(), names.end(), s) == names.end()) names.push_back(std::move(s));
  }
  return names;
}

// How many of <sample>.<stem>0, <stem>1, ... the fixture has.
std::size_t count_indexed(const fixture& fx, const std::string& sample_name, const char* stem) {
  std::size_t n = 0;
  while (fx.has(key(sample_name, join(stem, std::to_string(n))))) ++n;
  return n;
}

bool selected(const std::string& op) {
  const char* env = std::getenv("KILN_OPS");
  if (!env || !*env) return true;
  return join(",", env, ",").find(join(",", op, ",")) != std::string::npos;
}

kiln::Tensor<float> expected_output(const fixture& fx, const std::string& name, bool indices) {
  if (!indices) return fx.f32(name);
  const std::vector<std::int64_t> v = fx.i64(name);
  kiln::Tensor<float> t(fx.shape_of(name));
  for (std::size_t i = 0; i < v.size(); ++i) t[static_cast<index_t>(i)] = static_cast<float>(v[i]);
  return t;
}

kiln::Tensor<float> as_float(const kiln::Tensor<float>& t) { return t; }
kiln::Tensor<float> as_float(const kiln::Tensor<double>& t) {
  kiln::Tensor<float> f(t.shape());
  for (index_t i = 0; i < t.numel(); ++i) f[i] = static_cast<float>(t[i]);
  return f;
}

bool all_zero(const kiln::Tensor<float>& t) {
  return std::all_of(t.span().begin(), t.span().end(), [](float v) { return v == 0; });
}

// sum_k sum(out_k * dout_k) over the outputs that have elements (an empty one adds 0); undefined when none has.
template <class T>
variable<T> weighted_loss(const outs<T>& out, const std::vector<variable<T>>& dout) {
  variable<T> loss;
  for (std::size_t k = 0; k < out.size() && k < dout.size(); ++k) {
    if (out[k].numel() == 0) continue;
    variable<T> term = nn::sum(nn::mul(out[k], dout[k]));
    loss = loss.defined() ? nn::add(loss, term) : term;
  }
  return loss;
}

// Runs the op on the sample and compares its outputs with the fixture's (their count, shapes and values; exactly for
// ops without gradient). Returns the outputs, and whether their count and shapes matched.
template <class T>
std::pair<outs<T>, bool> run_and_compare(const op_entry& e, sample<T>& s, const fixture& fx, const std::string& where) {
  outs<T> out = function_for(e, s)(s);
  const std::size_t expected_count = count_indexed(fx, s.name(), "out");
  bool ok = out.size() == expected_count;
  CHECK_MESSAGE(out.size() == expected_count, (join(where, ": ", std::to_string(out.size())) + " outputs, PyTorch has " +
                                                   std::to_string(expected_count)));
  const double rtol = e.differentiable ? e.rtol : 0.0;
  for (std::size_t k = 0; k < std::min(out.size(), expected_count); ++k) {
    const std::string name = key(s.name(), join("out", std::to_string(k)));
    const kiln::Tensor<float> expected = expected_output(fx, name, e.index_output);
    const kiln::Tensor<float> actual = as_float(out[k].tensor());
    ok = ok && actual.shape() == expected.shape();
    check_close(actual, expected, join(where, " ", join("out", std::to_string(k))).c_str(), rtol);
  }
  return {std::move(out), ok};
}

template <class T>
std::vector<variable<T>> upstream_gradients(const fixture& fx, const std::string& sample_name, std::size_t count) {
  std::vector<variable<T>> dout;
  for (std::size_t k = 0; k < count; ++k)
    dout.emplace_back(read_values<T>(fx, key(sample_name, join("dout", std::to_string(k)))));
  return dout;
}

// A copy in host memory of a leaf's gradient (device memory on a GPU policy).
template <class T>
kiln::Tensor<T> host_copy_of_grad(const variable<T>& leaf) {
  const kiln::tensor_view<T> g = leaf.grad();
  kiln::Tensor<T> copy(g.shape());
  nn::detail::copy_values_to_host(static_cast<const T*>(g.data()), copy.data(), g.numel());
  return copy;
}

// (a) float: outputs and input gradients against PyTorch.
// rtol_scale widens every entry's tolerance (a GPU sums in other orders).
void check_float_sample(const op_entry& e, const fixture& fx, const std::string& name, const std::string& where,
                        double rtol_scale = 1) {
  sample<float> s(fx, name, e.differentiable);
  auto [out, shapes_ok] = run_and_compare(e, s, fx, where);
  if (!e.differentiable) {
    // Without gradient even when the inputs require it.
    if (s.inputs() == 0) return;
    sample<float> tracked(fx, name, true);
    for (const auto& o : e.f32(tracked))
      CHECK_MESSAGE(!o.requires_grad(), join(where, ": an output of an op without gradient requires grad"));
    return;
  }
  if (!shapes_ok) return;  // reported above; the upstream gradients would not fit
  const auto dout = upstream_gradients<float>(fx, name, out.size());
  variable<float> loss = weighted_loss(out, dout);
  if (loss.defined()) loss.backward();
  for (int i = 0; i < s.inputs(); ++i) {
    const std::string what = join(where, " ", join("grad", std::to_string(i)));
    const kiln::Tensor<float> expected = fx.f32(key(name, join("grad", std::to_string(i))));
    const variable<float>& leaf = s.leaf(i);
    if (leaf.has_grad()) {
      check_close(host_copy_of_grad(leaf), expected, what.c_str(), e.rtol * rtol_scale);
    } else {
      CHECK_MESSAGE(all_zero(expected), join(what, ": no gradient reached the input; PyTorch's is nonzero"));
    }
  }
}

// Runs check on every sample of every selected entry; an exception fails that sample only.
void for_each_sample(
    const std::function<void(const op_entry&, const fixture&, const std::string&, const std::string&)>& check) {
  std::size_t ops = 0, samples = 0;
  for (const op_entry& e : op_table()) {
    if (!selected(e.op)) continue;
    ++ops;
    std::optional<fixture> fx;
    try {
      fx.emplace(join("ops/", e.op));
    } catch (const std::exception& ex) {
      FAIL_CHECK(join(e.op, ": ", ex.what()));
      continue;
    }
    for (const std::string& name : sample_names(*fx)) {
      ++samples;
      const std::string where = join(e.op, "/", name);
      try {
        check(e, *fx, name, where);
      } catch (const std::exception& ex) {
        FAIL_CHECK(join(where, ": threw: ", ex.what()));
      }
      nn::clear_tape<float>();
      nn::clear_tape<double>();
    }
  }
  MESSAGE((std::to_string(ops) + " ops, " + std::to_string(samples) + " samples"));
}

}  // namespace
