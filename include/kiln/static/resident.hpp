// kiln::resident: says that a batch already lives in the static model's policy memory (a data set uploaded to the
// GPU once), so the model reads it in place instead of staging it through the host.
#pragma once

namespace kiln {

// The tag type of kiln::resident. Pass it first to forward, train_step, forward_backward, loss_value or predict:
//   net.train_step(kiln::resident, x_on_device, y_on_device, loss, opt);
// On CPU policies every batch is resident already, so the tag changes nothing there.
struct resident_t {
  explicit resident_t() = default;
};
inline constexpr resident_t resident{};

}  // namespace kiln
