// ONNX export of the lookup tables at a sequence model's input (kiln/io/onnx.hpp has the table of operators): a token
// embedding (nn::Embedding) and a positional table added to a sequence (nn::SinusoidalPositionalEncoding,
// nn::LearnedPositionalEmbedding). Dynamic mode's dispatch (kiln/io/onnx_dynamic.hpp) calls them with the tables as
// pointers, in PyTorch's layout.
//
// The graph's input is a float tensor, as every kiln graph's: an embedding reads it as ids, as nn::Embedding's
// Sequential forward does (whole numbers in floats), through a Cast to int64 and a Gather of the table's rows. A
// positional table is written whole under its state_dict name ("1.pe", "1.weight"); a Slice takes its first L rows,
// L the sequence length options.input_shape fixes. detail::onnx_sequence_length, the check of the sequence a layer
// reads (batch first or second, its width), serves the attention layers too (onnx_attention.hpp).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/onnx_builder.hpp"
#include "kiln/io/onnx_recurrent.hpp"

namespace kiln::io {

namespace detail {
// Checks that the current value is the sequence a layer of width features reads, [N, L, width] with batch_first and
// [L, N, width] without (layer names it in messages); returns L.
inline index_t onnx_sequence_length(const onnx_builder& b, const char* layer, index_t width, bool batch_first) {
  const std::vector<index_t>& s = b.sample_shape();
  if (s.size() != 2 || b.batch_axis() != (batch_first ? 0 : 1) || s[1] != width) {
    const std::string w = std::to_string(width);
    if (batch_first)
      fail("export_onnx: ", layer, " (batch_first) expects input of shape [N, seq, ", w, "], found a value of shape ",
           b.shape_text());
    fail("export_onnx: ", layer, " without batch_first expects input of shape [seq, N, ", w,
         "] (the batch second: options.input_shape {seq, -1, ", w, "} as the graph's input), found a value of shape ",
         b.shape_text());
  }
  if (s[0] < 1) fail("export_onnx: ", layer, " expects at least one position, found a value of shape ", b.shape_text());
  return s[0];
}
}  // namespace detail

// The rows of weight [num_embeddings, embedding_dim] at the ids the current value holds (any shape; whole numbers in
// [0, num_embeddings)): the value's shape plus [embedding_dim], the batch where it was. The weight is
// "<prefix>weight".
inline void onnx_embedding(onnx_builder& b, const float* weight, index_t num_embeddings, index_t embedding_dim) {
  const std::string table = b.parameter("weight", weight, {num_embeddings, embedding_dim});
  const std::string ids = b.fresh("ids");
  auto cast = onnx_builder::node("Cast", {b.current()}, ids);
  onnx_builder::attr_int(cast, "to", 7);  // INT64
  b.add_node(std::move(cast));
  const std::string y = b.fresh("embedding");
  auto gather = onnx_builder::node("Gather", {table, ids}, y);
  onnx_builder::attr_int(gather, "axis", 0);
  b.add_node(std::move(gather));
  std::vector<index_t> sample = b.sample_shape();
  sample.push_back(embedding_dim);
  b.set_current(y, std::move(sample));
}

// The current value x, a sequence [N, L, E] (batch_first) or [L, N, E], plus rows [0, L) of table [max_len, E],
// broadcast over the batch, as the positional layers' forward. layer names the layer in messages and name the table in
// its state_dict ("pe", "weight"; under the builder's parameter prefix).
inline void onnx_add_positions(onnx_builder& b, const char* layer, const char* name, const float* table,
                               index_t max_len, index_t width, bool batch_first) {
  const index_t length = detail::onnx_sequence_length(b, layer, width, batch_first);
  const std::vector<index_t> s = b.sample_shape();
  if (length > max_len)
    fail("export_onnx: ", layer, " holds ", max_len, " positions and the sequence has ", length,
         ", in a value of shape ", b.shape_text());
  std::string rows = b.parameter(name, table, {max_len, width});
  if (length < max_len) {
    const std::string first = b.fresh("positions");
    b.add_node(onnx_builder::node("Slice",
                                  {rows, b.int64_initializer("starts", {0}), b.int64_initializer("ends", {length}),
                                   b.int64_initializer("axes", {0})},
                                  first));
    rows = first;
  }
  // [L, E] broadcasts against [N, L, E]; a time-major [L, N, E] needs [L, 1, E].
  if (!batch_first) rows = detail::onnx_reshape(b, rows, {length, 1, width});
  const std::string y = b.fresh("add_positions");
  b.add_node(onnx_builder::node("Add", {b.current(), rows}, y));
  b.set_current(y, s);
}

}  // namespace kiln::io
