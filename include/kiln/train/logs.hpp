// logs: the named numbers of one epoch or batch ("loss", "accuracy", "val_loss", "lr"...), in insertion order.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln::train {

// An ordered name -> value list; small, so a linear search is the fastest lookup.
class logs {
 public:
  void set(const std::string& name, double value) {
    for (auto& [k, v] : entries_)
      if (k == name) {
        v = value;
        return;
      }
    entries_.emplace_back(name, value);
  }
  std::optional<double> get(const std::string& name) const {
    for (auto& [k, v] : entries_)
      if (k == name) return v;
    return std::nullopt;
  }
  bool has(const std::string& name) const { return get(name).has_value(); }
  const std::vector<std::pair<std::string, double>>& entries() const { return entries_; }
  void clear() { entries_.clear(); }

 private:
  std::vector<std::pair<std::string, double>> entries_;
};

}  // namespace kiln::train
