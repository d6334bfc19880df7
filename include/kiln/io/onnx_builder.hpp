// The ONNX graph builder behind kiln::io::export_onnx (kiln/io/onnx.hpp): export options, and onnx_builder, which
// writes one operation at a time while tracking the current value's name, per-sample shape and batch axis. The layers'
// emitters (onnx.hpp for Dense, the activations, Softmax and Flatten; onnx_cnn.hpp for the convolutional-network
// layers; onnx_recurrent.hpp for LSTM and GRU; onnx_blocks.hpp for the blocks that branch and join) call its
// operations and, for their own nodes, its public building blocks. A layer's weights are initializers named as in
// the model's state_dict ("1.body.0.weight"): the exporter sets each layer's prefix before the layer writes them.
#pragma once

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/protobuf.hpp"
#include "kiln/kernels/activation.hpp"

namespace kiln::io {

// What export_onnx writes, in both modes.
struct onnx_options {
  // Operator set: 13 to 20 here (Gelu is a single node from 20; below, its Erf decomposition).
  int opset = 17;
  std::string graph_name = "kiln";
  std::string input_name = "input";
  std::string output_name = "output";
  // Dynamic mode only: the per-sample input shape (without the batch), e.g. {28, 28}. A leading -1 stands for the
  // batch dimension, as in a reshape, and is dropped ({-1, 28, 28} is {28, 28}). A -1 second puts the batch second,
  // for time-major sequences (an nn::LSTM / nn::GRU without batch_first reads (seq, batch, features)):
  // {12, -1, 4} is a graph input of shape [12, N, 4]; it needs at least three entries. No other extent may be negative.
  std::vector<index_t> input_shape{};
};

// A value of the graph as the builder tracks it: its name, its per-sample shape and where its batch is.
struct onnx_value {
  std::string name;
  std::vector<index_t> sample;
  int batch_axis = 0;
};

// Builds an ONNX graph one operation at a time, tracking the current value's name and per-sample shape. The batch is
// the value's first dimension, or its second (batch_axis 1) in a time-major sequence, whose per-sample shape then
// holds at least two extents, so that the batch is never last.
class onnx_builder {
 public:
  onnx_builder(onnx_options options, std::vector<index_t> sample_shape, int batch_axis = 0)
      : options_(std::move(options)), shape_(std::move(sample_shape)), current_(options_.input_name),
        batch_axis_(batch_axis) {
    if (options_.opset < 13 || options_.opset > 20)
      fail("export_onnx: expected an opset between 13 and 20, found ", options_.opset);
    if (shape_.empty()) fail("export_onnx: the input needs a per-sample shape (e.g. {784})");
    if (batch_axis_ < 0 || batch_axis_ > 1 || (batch_axis_ == 1 && shape_.size() < 2))
      fail("export_onnx: expected the batch at dim 0, or at dim 1 of an input of rank 3 or more, found it at dim ",
           batch_axis_, " of an input of rank ", shape_.size() + 1);
    for (auto d : shape_)
      if (d < 0) fail("export_onnx: expected per-sample input extents >= 0, found ", shape_text());
    check_names();
    input_shape_ = shape_;
    input_batch_axis_ = batch_axis_;
  }

  const std::vector<index_t>& sample_shape() const { return shape_; }
  // Where the batch sits in the current value: 0, or 1 in a time-major sequence.
  int batch_axis() const { return batch_axis_; }
  int opset() const { return options_.opset; }

  // y = x W^T + b, W of shape (out, in) as PyTorch stores it; b may be null.
  void linear(const float* weight, const float* bias, index_t in, index_t out) {
    if (shape_.back() != in)
      fail("export_onnx: a Linear layer expects ", in, " input features, found a value of shape ", shape_text());
    std::string b = bias ? parameter("bias", bias, {out}) : std::string();
    std::string y = fresh("linear");
    if (shape_.size() == 1) {
      std::string w = parameter("weight", weight, {out, in});
      auto inputs = b.empty() ? std::vector<std::string>{current_, w} : std::vector<std::string>{current_, w, b};
      auto n = node("Gemm", inputs, y);
      attr_int(n, "transB", 1);
      nodes_.push_back(n);
    } else {
      // MatMul needs W^T (in, out) for inputs of rank > 2.
      std::vector<float> wt(static_cast<std::size_t>(in * out));
      for (index_t o = 0; o < out; ++o)
        for (index_t i = 0; i < in; ++i) wt[static_cast<std::size_t>(i * out + o)] = weight[o * in + i];
      std::string w_t = parameter("weight_t", wt.data(), {in, out});
      std::string mm = b.empty() ? y : fresh("matmul");
      nodes_.push_back(node("MatMul", {current_, w_t}, mm));
      if (!b.empty()) nodes_.push_back(node("Add", {mm, b}, y));
    }
    shape_.back() = out;
    current_ = y;
  }

  void activation_node(activation kind, double slope) {
    switch (kind) {
      case activation::identity: return;
      case activation::relu: unary("Relu"); return;
      case activation::sigmoid: unary("Sigmoid"); return;
      case activation::tanh: unary("Tanh"); return;
      case activation::leaky_relu: {
        std::string y = fresh("leaky_relu");
        auto n = node("LeakyRelu", {current_}, y);
        attr_float(n, "alpha", static_cast<float>(slope));
        nodes_.push_back(n);
        current_ = y;
        return;
      }
      case activation::gelu: {
        if (options_.opset >= 20) {
          unary("Gelu");
          return;
        }
        float inv_sqrt2 = static_cast<float>(1.0 / std::sqrt(2.0)), one = 1.0f, half = 0.5f;
        std::string c_inv = initializer("inv_sqrt2", &inv_sqrt2, {}), c_one = initializer("one", &one, {}),
                    c_half = initializer("half", &half, {});
        std::string x = current_, scaled = fresh("gelu_scaled"), erf = fresh("gelu_erf"), plus = fresh("gelu_plus"),
                    xh = fresh("gelu_half_x"), y = fresh("gelu");
        nodes_.push_back(node("Mul", {x, c_inv}, scaled));
        nodes_.push_back(node("Erf", {scaled}, erf));
        nodes_.push_back(node("Add", {erf, c_one}, plus));
        nodes_.push_back(node("Mul", {x, c_half}, xh));
        nodes_.push_back(node("Mul", {xh, plus}, y));
        current_ = y;
        return;
      }
    }
  }

  // dim counts the value's dimensions, the batch's included (PyTorch's numbering); negative counts from the end.
  void softmax(int dim, bool log) {
    int rank = static_cast<int>(shape_.size()) + 1;
    if (dim < -rank || dim >= rank) fail("export_onnx: softmax dim ", dim, " is out of range for rank ", rank);
    std::string y = fresh(log ? "log_softmax" : "softmax");
    auto n = node(log ? "LogSoftmax" : "Softmax", {current_}, y);
    attr_int(n, "axis", dim);
    nodes_.push_back(n);
    current_ = y;
  }

  // Merges dimensions start..end (in batch-including numbering, as torch.flatten).
  void flatten(int start = 1, int end = -1) {
    int rank = static_cast<int>(shape_.size()) + 1;
    int s = start < 0 ? start + rank : start, e = end < 0 ? end + rank : end;
    if (s < 0 || e >= rank || s > e) fail("export_onnx: Flatten(", start, ", ", end, ") does not fit rank ", rank);
    if (s == e) return;
    if (s <= batch_axis_ && batch_axis_ <= e)
      fail("export_onnx: Flatten(", start, ", ", end, ") would merge the batch dimension of a value of shape ",
           shape_text(), ", which is not exported");
    // The merged per-sample shape; the batch (before s) keeps its place.
    std::vector<index_t> merged;
    index_t run = 1;
    for (int d = 0; d < rank; ++d) {
      if (d == batch_axis_) continue;
      const index_t extent = shape_[static_cast<std::size_t>(d < batch_axis_ ? d : d - 1)];
      if (d < s || d > e) merged.push_back(extent);
      else {
        run *= extent;
        if (d == e) merged.push_back(run);
      }
    }
    std::string y = fresh("flatten");
    if (batch_axis_ == 0 && s == 1 && e == rank - 1) {
      auto n = node("Flatten", {current_}, y);
      attr_int(n, "axis", 1);
      nodes_.push_back(n);
    } else {
      std::vector<std::int64_t> target(merged.begin(), merged.end());
      target.insert(target.begin() + batch_axis_, 0);  // 0: keep the input's extent there, the batch
      std::string shape_name = int64_initializer("shape", target);
      nodes_.push_back(node("Reshape", {current_, shape_name}, y));
    }
    shape_ = merged;
    current_ = y;
  }

  // The serialised ModelProto.
  std::string finish() const {
    protobuf::message graph;
    for (const auto& n : nodes_) graph.nested(1, n);
    graph.bytes(2, options_.graph_name);
    for (const auto& t : initializers_) graph.nested(5, t);
    // The output is the last value; an identity graph (no nodes) gets one Identity node.
    std::string out_name = current_;
    protobuf::message extra;
    if (out_name != options_.output_name) {
      graph.nested(1, node("Identity", {current_}, options_.output_name));
      out_name = options_.output_name;
    }
    graph.nested(11, value_info(options_.input_name, input_shape_, input_batch_axis_));
    graph.nested(12, value_info(out_name, shape_, batch_axis_));

    protobuf::message model;
    model.varint(1, options_.opset >= 20 ? 9 : 8);  // ir_version: 8 goes with opset 17, 9 with 20
    model.bytes(2, "kiln");                          // producer_name
    model.bytes(3, "0.1");                           // producer_version
    model.nested(7, graph);
    protobuf::message opset;
    opset.bytes(1, "");
    opset.varint(2, options_.opset);
    model.nested(8, opset);
    return model.str();
  }

  // --- the graph's building blocks, for the emitters beside this file (onnx_cnn.hpp, onnx_recurrent.hpp, ...) --
  // The value the next operation reads.
  const std::string& current() const { return current_; }
  // The same with its shape and batch axis, to come back to (the input of a block's every branch).
  onnx_value value() const { return {current_, shape_, batch_axis_}; }
  void set_current(onnx_value v) { set_current(std::move(v.name), std::move(v.sample), v.batch_axis); }
  // Appends a node made by node() (attributes added); set_current() makes its output the current value.
  void add_node(protobuf::message n) { nodes_.push_back(std::move(n)); }
  // value, of per-sample shape sample, becomes what the next operation reads; the batch stays where it was.
  void set_current(std::string value, std::vector<index_t> sample) {
    current_ = std::move(value);
    shape_ = std::move(sample);
  }
  // The same with the batch at batch_axis (0, or 1 with at least two per-sample extents).
  void set_current(std::string value, std::vector<index_t> sample, int batch_axis) {
    set_current(std::move(value), std::move(sample));
    batch_axis_ = batch_axis;
  }
  // Internal names skip the user's input and output names (even "linear_0") and the parameters' names, so that every
  // value is named once.
  std::string fresh(const char* what) {
    std::string name;
    do name = std::string(what) + "_" + std::to_string(counter_++);
    while (taken(name));
    names_.insert(name);
    return name;
  }
  // The state_dict prefix of the layer being written ("1.body.0."; empty for a model that is one layer).
  void set_parameter_prefix(std::string prefix) { prefix_ = std::move(prefix); }
  const std::string& parameter_prefix() const { return prefix_; }
  // The current value's shape as messages show it: [N, 3, 28, 28], or [12, N, 4] with the batch second.
  std::string shape_text() const { return shape_text(value()); }
  // The same for any value.
  static std::string shape_text(const onnx_value& v) {
    std::string s = "[";
    for (std::size_t d = 0; d <= v.sample.size(); ++d) {
      if (d > 0) s += ", ";
      const auto at = static_cast<std::size_t>(v.batch_axis);
      s += d == at ? std::string("N") : std::to_string(v.sample[d < at ? d : d - 1]);
    }
    return s + "]";
  }
  static protobuf::message node(const char* op, const std::vector<std::string>& inputs, const std::string& output) {
    return node(op, inputs, std::vector<std::string>{output});
  }
  // A node with several outputs, named after its first named one; an empty name leaves an optional output out.
  static protobuf::message node(const char* op, const std::vector<std::string>& inputs,
                                const std::vector<std::string>& outputs) {
    protobuf::message n;
    for (const auto& i : inputs) n.bytes(1, i);
    for (const auto& o : outputs) n.bytes(2, o);
    for (const auto& o : outputs)
      if (!o.empty()) {
        n.bytes(3, o);
        break;
      }
    n.bytes(4, op);
    return n;
  }
  static void attr_int(protobuf::message& n, const char* name, std::int64_t v) {
    protobuf::message a;
    a.bytes(1, name);
    a.varint(20, 2);  // AttributeType INT
    a.varint(3, v);
    n.nested(5, a);
  }
  static void attr_float(protobuf::message& n, const char* name, float v) {
    protobuf::message a;
    a.bytes(1, name);
    a.varint(20, 1);  // AttributeType FLOAT
    a.float32(2, v);
    n.nested(5, a);
  }
  static void attr_string(protobuf::message& n, const char* name, const std::string& v) {
    protobuf::message a;
    a.bytes(1, name);
    a.varint(20, 3);  // AttributeType STRING
    a.bytes(4, v);
    n.nested(5, a);
  }
  static void attr_ints(protobuf::message& n, const char* name, const std::vector<index_t>& values) {
    protobuf::message a;
    a.bytes(1, name);
    a.varint(20, 7);  // AttributeType INTS
    for (auto v : values) a.varint(8, v);
    n.nested(5, a);
  }
  // A float tensor of shape dims (no batch) in the graph; returns its name.
  std::string initializer(const char* what, const float* data, const std::vector<index_t>& dims) {
    return float_initializer(fresh(what), data, dims);
  }
  // A float tensor of the layer being written, named prefix + name: its state_dict name ("1.body.0.weight") for a
  // tensor exported as the model stores it; a tensor derived from one says how in its name ("0.weight_t", the
  // transpose). A name already in the graph (a module that appears twice) gives a fresh one instead.
  std::string parameter(const std::string& name, const float* data, const std::vector<index_t>& dims) {
    std::string full = prefix_ + name;
    if (taken(full)) full = fresh(full.c_str());
    else names_.insert(full);
    return float_initializer(std::move(full), data, dims);
  }
  // An int64 vector (a shape, axes, pads), or a scalar (a 0-d tensor, e.g. Gather's index) when scalar is set.
  std::string int64_initializer(const char* what, const std::vector<std::int64_t>& values, bool scalar = false) {
    std::string name = fresh(what);
    protobuf::message t;
    if (!scalar) t.varint(1, static_cast<std::int64_t>(values.size()));
    t.varint(2, 7);  // INT64
    t.bytes(8, name);
    t.bytes(9, std::string_view(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(std::int64_t)));
    initializers_.push_back(t);
    return name;
  }

 private:
  std::string float_initializer(std::string name, const float* data, const std::vector<index_t>& dims) {
    protobuf::message t;
    index_t n = 1;
    for (auto d : dims) {
      t.varint(1, d);
      n *= d;
    }
    t.varint(2, 1);  // FLOAT
    t.bytes(8, name);
    t.bytes(9, std::string_view(reinterpret_cast<const char*>(data), static_cast<std::size_t>(n) * sizeof(float)));
    initializers_.push_back(t);
    return name;
  }
  bool taken(const std::string& name) const {
    return name == options_.input_name || name == options_.output_name || names_.count(name) > 0;
  }
  // ONNX names each value once and needs non-empty names for the graph's input and output.
  void check_names() const {
    if (options_.input_name.empty() || options_.output_name.empty())
      fail("export_onnx: expected non-empty input and output names, found input '", options_.input_name,
           "' and output '", options_.output_name, "'");
    if (options_.input_name == options_.output_name)
      fail("export_onnx: expected different input and output names, found '", options_.input_name, "' for both");
  }
  static protobuf::message value_info(const std::string& name, const std::vector<index_t>& sample, int batch_axis) {
    protobuf::message shape;
    for (std::size_t d = 0; d <= sample.size(); ++d) {
      protobuf::message dim;
      const auto at = static_cast<std::size_t>(batch_axis);
      if (d == at) dim.bytes(2, "N");  // dim_param
      else dim.varint(1, sample[d < at ? d : d - 1]);  // dim_value
      shape.nested(1, dim);
    }
    protobuf::message tensor;
    tensor.varint(1, 1);  // elem_type FLOAT
    tensor.nested(2, shape);
    protobuf::message type;
    type.nested(1, tensor);  // tensor_type
    protobuf::message v;
    v.bytes(1, name);
    v.nested(2, type);
    return v;
  }
  void unary(const char* op) {
    std::string y = fresh(op);
    nodes_.push_back(node(op, {current_}, y));
    current_ = y;
  }

  onnx_options options_;
  std::vector<index_t> shape_, input_shape_;
  std::string current_;
  int batch_axis_ = 0, input_batch_axis_ = 0;
  std::vector<protobuf::message> nodes_, initializers_;
  int counter_ = 0;
  std::string prefix_;
  std::set<std::string> names_;  // every name given out: fresh values and initializers, and parameters
};

}  // namespace kiln::io
