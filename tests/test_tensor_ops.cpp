// The op table of dynamic mode's tensor ops (tests/op_table.hpp), in the manner of PyTorch's OpInfo: one entry per op
// (a generic lambda that calls it, written once for float and double), checked on every sample of
// tests/fixtures/ops/<op>.txt (made by tests/fixtures/generate_ops.py, which documents the array names):
//   - float: the outputs, and the inputs' gradients of loss = sum_k sum(out_k * dout_k), against PyTorch's;
//   - double: the outputs again, and that loss's gradient against central finite differences;
//   - the table covers every public op of the functional headers, and every entry has a fixture with samples.
// Samples apply the op to leaves seen through nn::transpose / nn::slice where the fixture says so (p.transpose<i>,
// p.slice<i>), so that it meets non-contiguous inputs, and the gradient is the leaf's, through the view.
// KILN_OPS=exp,sum_dims restricts the first two test cases to those ops.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "op_table.hpp"

namespace {

// (b) double: outputs against PyTorch (float32 reference), gradients against central finite differences.
void check_double_sample(const op_entry& e, const fixture& fx, const std::string& name, const std::string& where) {
  sample<double> s(fx, name, e.differentiable);
  auto [out, shapes_ok] = run_and_compare(e, s, fx, where);
  if (!e.differentiable || !shapes_ok || fx.has(key(name, "skip_fd"))) return;
  const auto dout = upstream_gradients<double>(fx, name, out.size());
  variable<double> loss = weighted_loss(out, dout);
  if (!loss.defined()) return;  // every output is empty: nothing to differentiate
  loss.backward();
  const double eps = 1e-6, tolerance = 1e-6;
  for (int l = 0; l < s.inputs(); ++l) {
    const variable<double>& leaf = s.leaf(l);
    const kiln::Tensor<double> analytic = leaf.has_grad()
                                              ? kiln::Tensor<double>(kiln::tensor_view<const double>(leaf.grad()))
                                              : kiln::Tensor<double>(leaf.shape());
    kiln::tensor_view<double> value = leaf.value();
    std::size_t failures = 0;
    double worst = 0, worst_analytic = 0, worst_numeric = 0;
    index_t worst_index = 0;
    for (index_t i = 0; i < leaf.numel(); ++i) {
      const double saved = value[i];
      double plus, minus;
      {
        nn::no_grad guard;
        value[i] = saved + eps;
        plus = weighted_loss(e.f64(s), dout).item();
        value[i] = saved - eps;
        minus = weighted_loss(e.f64(s), dout).item();
        value[i] = saved;
      }
      const double numeric = (plus - minus) / (2 * eps);
      const double a = analytic[i];
      const double ratio = std::abs(a - numeric) / (tolerance * std::max({1.0, std::abs(numeric), std::abs(a)}));
      if (ratio > 1) ++failures;
      if (ratio > worst) {
        worst = ratio;
        worst_index = i;
        worst_analytic = a;
        worst_numeric = numeric;
      }
    }
    std::ostringstream msg;
    msg.precision(10);
    msg << where << " in" << l << ": " << failures << " of " << leaf.numel()
        << " gradient elements differ from central differences by more than 1e-6 * max(1, |numeric|, |analytic|); "
        << "worst at flat index " << worst_index << ": analytic " << worst_analytic << ", numeric " << worst_numeric;
    CHECK_MESSAGE(failures == 0, msg.str());
  }
}

// Public op names in a functional header: lines that start with a result type and NAME( outside namespace detail.
std::vector<std::string> public_ops(const std::filesystem::path& header) {
  static const char* const result_types[] = {"basic_variable<T> ", "std::vector<basic_variable<T>> ",
                                             "kiln::Tensor<std::int64_t> "};
  std::ifstream in(header);
  std::vector<std::string> names;
  std::string line;
  bool in_detail = false;
  while (std::getline(in, line)) {
    const std::string_view l(line);
    if (l.starts_with("namespace ") && l.find("detail {") != std::string_view::npos) {
      in_detail = true;
      continue;
    }
    if (l.starts_with("}  // namespace") && l.ends_with("detail")) {
      in_detail = false;
      continue;
    }
    if (in_detail) continue;
    for (const char* type : result_types) {
      if (!l.starts_with(type)) continue;
      const std::string_view rest = l.substr(std::strlen(type));
      std::size_t n = 0;
      while (n < rest.size() && (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) ++n;
      if (n == 0 || n == rest.size() || rest[n] != '(' || std::isdigit(static_cast<unsigned char>(rest[0]))) continue;
      std::string name(rest.substr(0, n));
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
    }
  }
  return names;
}

bool table_has(const std::string& name) {
  for (const op_entry& e : op_table())
    if (e.op == name || (e.op.size() > name.size() && e.op.starts_with(name) && e.op[name.size()] == '_')) return true;
  return false;
}

}  // namespace

TEST_CASE("op table: float outputs and gradients match PyTorch") {
  for_each_sample([](const op_entry& e, const fixture& fx, const std::string& name, const std::string& where) {
    check_float_sample(e, fx, name, where);
  });
}

TEST_CASE("op table: double outputs match PyTorch and gradients match central differences") {
  for_each_sample(&check_double_sample);
}

TEST_CASE("op table: every public op of the functional headers has an entry") {
  const std::filesystem::path dir = std::filesystem::path(KILN_SOURCE_DIR) / "include/kiln/dynamic/functional";
  std::size_t headers = 0, names = 0;
  for (const char* file : {"pointwise.hpp", "broadcast.hpp", "reduce.hpp", "shape.hpp", "indexing.hpp", "matmul.hpp"}) {
    const std::filesystem::path header = dir / file;
    if (!std::filesystem::exists(header)) continue;
    ++headers;
    for (const std::string& name : public_ops(header)) {
      ++names;
      CHECK_MESSAGE(table_has(name), join(join("the public op '", name, "' of "), file,
                                          " has no entry in the op table of tests/test_tensor_ops.cpp"));
    }
  }
  MESSAGE((std::to_string(names) + " public ops in " + std::to_string(headers) + " headers"));
  CHECK(headers > 0);
}

TEST_CASE("op table: every entry has a fixture with samples") {
  std::set<std::string> seen;
  for (const op_entry& e : op_table()) {
    CHECK_MESSAGE(seen.insert(e.op).second, join("duplicate table entry ", e.op));
    try {
      fixture fx(join("ops/", e.op));
      CHECK_MESSAGE(!sample_names(fx).empty(), join(fx.path(), ": no samples (no <sample>.in0 or .out0 arrays)"));
    } catch (const std::exception& ex) {
      FAIL_CHECK(join(e.op, ": ", ex.what()));
    }
  }
}
