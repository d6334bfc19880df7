// libFuzzer target: parse_safetensors over arbitrary bytes, then every parsed file loaded into a static and a dynamic
// model (strict, and not strict), its tensors converted, and the file written back out. A refused load must leave the
// model bit for bit as it was; a parsed file must survive serialize_safetensors and parse again to the same tensors.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_common.hpp"
#include "fuzz_models.hpp"
#include "kiln/io/safetensors.hpp"
#include "kiln/io/weights.hpp"

namespace {

template <class M>
void load_into(M& model, const kiln::io::st_file& file) {
  for (bool strict : {true, false}) {
    const std::string before = kiln_fuzz::state_bytes(model);
    if (kiln_fuzz::refused([&] { kiln::io::load_weights(model, file, "fuzz input", {.strict = strict}); }))
      kiln_fuzz::require(kiln_fuzz::state_bytes(model) == before, "a refused load_weights leaves the model unchanged");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const kiln::io::safetensors_limits limits{.max_header_bytes = 1 << 20, .header = {.max_values = 1 << 16}};
  kiln::io::st_file file;
  if (kiln_fuzz::refused([&] { file = kiln::io::parse_safetensors(bytes, "fuzz input", limits); })) return 0;

  for (const auto& t : file.tensors) {
    kiln_fuzz::refused([&] { (void)kiln::io::to_tensor<float>(t); });
    kiln_fuzz::refused([&] { (void)kiln::io::to_tensor<double>(t); });
    kiln_fuzz::refused([&] { (void)kiln::io::to_tensor<std::int64_t>(t); });
  }
  auto static_net = kiln_fuzz::make_static_model();
  load_into(static_net, file);
  auto dynamic_net = kiln_fuzz::make_dynamic_model();
  load_into(dynamic_net, file);

  const std::string again = kiln::io::serialize_safetensors(file);
  const auto reparsed = kiln::io::parse_safetensors(again, "fuzz input, written back", limits);
  kiln_fuzz::require(reparsed.tensors.size() == file.tensors.size(), "a file written back holds the same tensors");
  for (std::size_t i = 0; i < file.tensors.size(); ++i)
    kiln_fuzz::require(reparsed.tensors[i].name == file.tensors[i].name &&
                           reparsed.tensors[i].bytes == file.tensors[i].bytes,
                       "a file written back holds the same tensors, in the same order");
  return 0;
}
