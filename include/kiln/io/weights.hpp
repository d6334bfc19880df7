// save_weights / load_weights: a model's parameters and buffers in a safetensors file under PyTorch's state_dict
// names, for a static kiln::Sequential and any dynamic nn::Module alike. A file written by
// safetensors.torch.save_file(model.state_dict(), path) loads into the equivalent kiln model, and kiln's files load
// into PyTorch.
//
//   kiln::io::save_weights(net, "mlp.safetensors");
//   kiln::io::load_weights(net, "mlp.safetensors");                        // every name, every shape must match
//   kiln::io::load_weights(net, "pre.safetensors", {.strict = false, .exclude = {"3."}});  // all but the old head
//
// Loading checks the whole file first (format, names, dtypes, shapes) and raises kiln::error naming the file and
// every offending tensor, leaving the model unchanged; only then are the values copied. Integer (I64) tensors load
// into the model's float buffers when every value is exactly representable, as PyTorch's BatchNorm
// num_batches_tracked is; integers that would be rounded are refused. Tensors that are excluded or ignored may have
// any safetensors dtype.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/safetensors.hpp"

namespace kiln::io {

// Anything with PyTorch's state_dict pair: state_dict() returns (name, Tensor) pairs, load_state_dict takes them.
template <class M>
concept has_state_dict = requires(M& m, const M& cm) {
  typename M::value_type;
  cm.state_dict();
  m.load_state_dict(cm.state_dict());
};

struct load_options {
  // Every tensor of the model must be in the file and every tensor of the file in the model. Off: names missing from
  // the file keep their values and names the model lacks are ignored (shapes and dtypes must still agree).
  bool strict = true;
  // Name prefixes ignored on both sides ("3." skips a head that is being replaced): the file's tensors under them are
  // not loaded, the model's keep their values.
  std::vector<std::string> exclude{};
};

namespace detail {
inline bool excluded(const std::string& name, const std::vector<std::string>& prefixes) {
  for (const auto& p : prefixes)
    if (std::string_view(name).substr(0, p.size()) == p) return true;
  return false;
}
// Checkpoints hold optimizer state beside the weights; weight loading skips it.
inline bool is_checkpoint(const st_file& file) {
  const std::string* format = file.meta("kiln.format");
  return format && *format == "checkpoint";
}
inline bool is_optimizer_state(const std::string& name) { return name.rfind("optimizer.", 0) == 0; }

// The model's state dict with the file's values put in, after checking everything; throws (model untouched) on any
// problem.
template <class M>
auto merged_state_dict(const M& model, const st_file& file, const std::string& source, const load_options& options) {
  using T = typename M::value_type;
  auto dict = model.state_dict();
  std::vector<std::string> problems;
  std::vector<bool> found(dict.size(), false);
  // Looked up by name in one pass over the file: linear in the number of tensors.
  std::unordered_map<std::string_view, std::size_t> index;
  index.reserve(dict.size());
  for (std::size_t i = 0; i < dict.size(); ++i) index.emplace(dict[i].first, i);
  const bool checkpoint = is_checkpoint(file);
  for (const auto& t : file.tensors) {
    if (excluded(t.name, options.exclude) || (checkpoint && is_optimizer_state(t.name))) continue;
    const auto entry = index.find(t.name);
    const std::size_t at = entry == index.end() ? dict.size() : entry->second;
    if (at == dict.size()) {
      if (options.strict) {
        std::string p = "unexpected tensor '";
        p += t.name;
        p += "' (shape ";
        p += t.shape.str();
        p += ", not in the model)";
        problems.push_back(std::move(p));
      }
      continue;
    }
    found[at] = true;
    // Only tensors that are loaded need a dtype kiln converts: an excluded or ignored BOOL mask is fine.
    if (std::string p = st_conversion_problem<T>(t); !p.empty()) {
      problems.push_back(std::move(p));
      continue;
    }
    if (!(t.shape == dict[at].second.shape())) {
      std::string p = "shape mismatch for '";
      p += t.name;
      p += "': the model has ";
      p += dict[at].second.shape().str();
      p += ", the file ";
      p += t.shape.str();
      problems.push_back(std::move(p));
      continue;
    }
    dict[at].second = to_tensor<T>(t, source);
  }
  if (options.strict)
    for (std::size_t i = 0; i < dict.size(); ++i)
      if (!found[i] && !excluded(dict[i].first, options.exclude)) {
        std::string p = "missing tensor '";
        p += dict[i].first;
        p += "' (shape ";
        p += dict[i].second.shape().str();
        p += ")";
        problems.push_back(std::move(p));
      }
  if (!problems.empty()) {
    std::string message = "load_weights from '";
    message += source;
    message += "': ";
    for (std::size_t i = 0; i < problems.size(); ++i) {
      if (i) message += "; ";
      message += problems[i];
    }
    fail(message);
  }
  return dict;
}
}  // namespace detail

// Writes the model's state_dict (parameters and buffers, PyTorch's names) to a safetensors file, atomically.
template <has_state_dict M>
void save_weights(const M& model, const std::filesystem::path& path,
                  std::vector<std::pair<std::string, std::string>> metadata = {}) {
  write_state_dict(path, model.state_dict(), std::move(metadata));
}

// Loads weights from an already parsed file (a checkpoint's, for instance).
template <has_state_dict M>
void load_weights(M& model, const st_file& file, const std::string& source, const load_options& options = {}) {
  auto dict = detail::merged_state_dict(model, file, source, options);
  model.load_state_dict(dict);
}

// Loads a safetensors file's tensors into the model by name (see load_options). Checked completely before anything
// is copied: on error the model keeps its values.
template <has_state_dict M>
void load_weights(M& model, const std::filesystem::path& path, const load_options& options = {}) {
  load_weights(model, read_safetensors(path), path.string(), options);
}

}  // namespace kiln::io
