// The examples' --onnx FILE: the trained model written as an ONNX graph (kiln/io/onnx.hpp), which onnxruntime and
// other ONNX tools run as they are.
#pragma once

#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/io.hpp"

namespace kiln::examples {

// Writes net to the file --onnx names, if it names one. A dynamic model's graph needs its per-sample input shape
// (sample_shape); a static model's is part of its type.
template <class Net>
void export_onnx_if_asked(const flags& f, const Net& net, std::vector<index_t> sample_shape) {
  if (!f.has("--onnx")) return;
  const std::string path = f.get("--onnx", "");
  if constexpr (std::is_base_of_v<nn::Module, Net>)
    io::export_onnx(net, path, {.input_shape = std::move(sample_shape)});
  else
    io::export_onnx(net, path);
  std::printf("wrote %s (ONNX)\n", path.c_str());
}

}  // namespace kiln::examples
