// Must NOT compile: Gaussian noise added to unsigned bytes would wrap around (and converting the negative noise to
// an unsigned byte is undefined behaviour).
#include "kiln/data/transforms.hpp"

int main() {
  kiln::Tensor<std::uint8_t> image(kiln::shape{2, 2});
  kiln::data::transform_context ctx;
  kiln::data::gaussian_noise{0.1f}(image.view(), ctx);
  return 0;
}
