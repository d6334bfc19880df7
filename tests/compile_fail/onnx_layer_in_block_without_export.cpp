// Must NOT compile: exporting to ONNX a model whose Concat holds a layer without an ONNX export (a user's own layer
// with no onnx_emit overload); the message names that layer, however deep in blocks it sits.
#include "kiln/io/onnx.hpp"
#include "kiln/kiln.hpp"

namespace user {
// A layer of one's own: the layer contract's required members (layers/layer_contract.hpp), the identity.
struct Identity2 {
  static constexpr const char* name = "Identity2";
  static constexpr bool is_activation = false;
  template <class In>
  static constexpr bool accepts = true;
  static constexpr const char* requirement = "any input";
  template <class In>
  struct bind {
    using output = In;
    static constexpr kiln::index_t param_count = 0;
    static constexpr kiln::index_t scratch_per_sample = 0;
    static constexpr bool aliases_input = false;
    template <class T>
    static void init(T*, kiln::random_generator&) {}
    template <class Policy, class T>
    static void forward(const T*, T*, const T* x, T* y, T*, const kiln::layer_context& ctx, bool) {
      Policy::copy(x, y, ctx.batch * In::size);
    }
    template <class Policy, class T>
    static void backward(const T*, const T*, const T*, T* dy, T* dx, T*, T*, const kiln::layer_context& ctx) {
      if (dx) Policy::copy(static_cast<const T*>(dy), dx, ctx.batch * In::size);
    }
    static std::string description() { return "Identity2"; }
  };
};
}  // namespace user

int main() {
  using Net = kiln::Sequential<kiln::policy::cpu, kiln::Input<4>,
                               kiln::Concat<1, kiln::Dense<8>, kiln::Chain<user::Identity2, kiln::Flatten>>,
                               kiln::Dense<2>>;
  Net net(4);
  return static_cast<int>(kiln::io::onnx_model_bytes(net).size());
}
