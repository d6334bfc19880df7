// Must NOT compile: exporting to ONNX a model whose Concat holds a layer without an ONNX export (Embedding); the
// message names that layer, however deep in blocks it sits.
#include "kiln/io/onnx.hpp"
#include "kiln/kiln.hpp"

int main() {
  using Net = kiln::Sequential<kiln::policy::cpu, kiln::Input<4>,
                               kiln::Concat<1, kiln::Dense<8>, kiln::Chain<kiln::Embedding<10, 2>, kiln::Flatten>>,
                               kiln::Dense<2>>;
  Net net(4);
  return static_cast<int>(kiln::io::onnx_model_bytes(net).size());
}
