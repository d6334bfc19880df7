// libFuzzer target: read_csv over an arbitrary file with options drawn from the input's first byte: the delimiter,
// whether there is a header, and which column (if any) is the label.
#include <cstdint>

#include "fuzz_common.hpp"
#include "kiln/data/csv.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t choice = data[0];
  const auto path = kiln_fuzz::input_file("input.csv", data + 1, size - 1);
  kiln::data::csv_options options;
  options.delimiter = ",;\t|"[choice & 3];
  options.header = (choice & 4) == 0;
  if (choice & 8) options.label = static_cast<int>((choice >> 4) & 3);
  if (choice & 64) options.features = {0};
  options.max_line_bytes = 1 << 16;
  options.max_columns = 1 << 10;
  kiln::data::csv_table<float> table;
  if (!kiln_fuzz::refused([&] { table = kiln::data::read_csv<float>(path, options); }))
    kiln_fuzz::require(table.features.rank() == 2 && table.features.extent(0) == table.rows() &&
                           table.features.extent(1) == static_cast<kiln::index_t>(table.feature_names.size()),
                       "the features are rows x selected columns");
  kiln_fuzz::refused([&] { (void)kiln::data::read_csv<double>(path, options); });
  return 0;
}
