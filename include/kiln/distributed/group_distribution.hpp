// kiln::distributed::group_distribution: train::distribution (what Model::fit needs to train across processes) over
// a process group: its rank and size, and sums as blocking all-reduces that time out as the group's do.
#pragma once

#include <span>

#include "kiln/distributed/process_group.hpp"
#include "kiln/train/distribution.hpp"

namespace kiln::distributed {

class group_distribution final : public train::distribution {
 public:
  explicit group_distribution(process_group& group) : group_(&group) {}
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  void sum(std::span<double> values) override {
    if (!values.empty()) group_->all_reduce(values, reduce_op::sum, "sum of Model::fit's epoch logs");
  }

 private:
  process_group* group_;
};

}  // namespace kiln::distributed
