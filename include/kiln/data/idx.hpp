// IDX files (the MNIST format): a big-endian header (two zero bytes, a type code, a rank, then one u32 per dimension)
// followed by the elements in row-major order. Plain or gzip-compressed; see shared/data/README.md.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <vector>

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/data/byte_source.hpp"

namespace kiln::data {

namespace detail {
inline std::uint32_t big_endian_u32(const unsigned char* b) {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | std::uint32_t{b[3]};
}
inline const char* idx_type_name(unsigned code) {
  switch (code) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "short";
    case 0x0C: return "int";
    case 0x0D: return "float";
    case 0x0E: return "double";
    default: return "unknown";
  }
}
}  // namespace detail

// Reads an unsigned-byte IDX file of any rank (1 to 8) into a tensor of that shape. Throws kiln::error naming the file
// and the byte offset for a wrong magic, another element type, a truncated file, data beyond the declared size or a
// corrupt gzip stream, or declared data beyond limits.max_bytes. Memory grows only with data actually read, so a
// lying header cannot trigger a huge allocation.
KILN_LIBRARY_FUNCTION Tensor<std::uint8_t> read_idx(const std::filesystem::path& path, const read_limits& limits = {});
#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION Tensor<std::uint8_t> read_idx(const std::filesystem::path& path, const read_limits& limits) {
  byte_source in(path, "IDX");
  unsigned char magic[4];
  in.read_exact(magic, 4, "IDX magic number");
  if (magic[0] != 0 || magic[1] != 0)
    in.fail_at(0, "wrong magic: an IDX file starts with two zero bytes, found 0x", std::hex, unsigned{magic[0]}, " 0x",
               unsigned{magic[1]}, std::dec, " (not an IDX file, or a compressed format other than gzip)");
  if (magic[2] != 0x08)
    in.fail_at(2, "unsupported IDX element type 0x", std::hex, unsigned{magic[2]}, std::dec, " (",
               detail::idx_type_name(magic[2]), "); only 0x08 (unsigned byte) is supported");
  int rank = magic[3];
  if (rank < 1 || rank > shape::max_rank)
    in.fail_at(3, "IDX rank ", rank, " is out of range: expected 1 to ", shape::max_rank, " dimensions");

  unsigned char dims[4 * shape::max_rank];
  in.read_exact(dims, static_cast<std::size_t>(4 * rank), "IDX dimensions");
  shape s;
  std::uint64_t count = 1, nonzero_product = 1;
  bool overflow = false;
  for (int d = 0; d < rank; ++d) {
    std::uint32_t extent = detail::big_endian_u32(dims + 4 * d);
    s.push_back(static_cast<index_t>(extent));
    // Zeros left out: [0, 2^32 - 1, 2^32 - 1] holds nothing, but a row of it would overflow every size after.
    if (extent != 0 && nonzero_product > (std::uint64_t{1} << 48) / extent) overflow = true;
    if (extent != 0) nonzero_product *= extent;
    count *= extent;
  }
  const std::uint64_t header = 4 + 4 * static_cast<std::uint64_t>(rank);
  if (overflow)
    in.fail_at(4, "the header declares dimensions ", s,
               ": their nonzero extents multiply past 2^48, not a real data set");
  if (auto size = in.known_size(); size && *size != header + count)
    in.fail_at(header, "the header declares dimensions ", s, " = ", count, " bytes of data after the ", header,
               "-byte header, but the file holds ", *size - header, " (file size ", *size, ", expected ", header + count,
               ")");
  in.check_limit(4, count, "IDX data", limits);

  Tensor<std::uint8_t> result;
  if (in.compressed()) {
    std::vector<unsigned char> bytes;
    in.read_exact_growing(bytes, count, "IDX data (as declared by the header)");
    result = Tensor<std::uint8_t>(s, std::span<const std::uint8_t>(bytes.data(), bytes.size()));
  } else {
    result = Tensor<std::uint8_t>(s);  // the size was checked against the file above
    in.read_exact(result.data(), static_cast<std::size_t>(count), "IDX data (as declared by the header)");
  }
  if (!in.at_end())
    in.fail_at(header + count, "unexpected data after the ", count, " bytes the header declares (dimensions ", s,
               "): the counts disagree with the file size");
  return result;
}
#endif

// An images file: rank 3, (N, rows, cols).
KILN_LIBRARY_FUNCTION Tensor<std::uint8_t> read_idx_images(const std::filesystem::path& path,
                                                           const read_limits& limits = {});
#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION Tensor<std::uint8_t> read_idx_images(const std::filesystem::path& path,
                                                           const read_limits& limits) {
  Tensor<std::uint8_t> images = read_idx(path, limits);
  if (images.rank() != 3)
    fail(path.string(), ": at byte offset 3: expected an IDX images file of rank 3 (N, rows, cols), found rank ",
         images.rank(), " with shape ", images.shape());
  return images;
}
#endif

// A labels file: rank 1, (N). Label = std::uint8_t keeps the bytes; std::int64_t gives class indices for losses.
template <class Label = std::uint8_t>
Tensor<Label> read_idx_labels(const std::filesystem::path& path, const read_limits& limits = {}) {
  Tensor<std::uint8_t> bytes = read_idx(path, limits);
  if (bytes.rank() != 1)
    fail(path.string(), ": at byte offset 3: expected an IDX labels file of rank 1 (N), found rank ", bytes.rank(),
         " with shape ", bytes.shape());
  if constexpr (std::is_same_v<Label, std::uint8_t>) {
    return bytes;
  } else {
    Tensor<Label> labels(bytes.shape());
    for (index_t i = 0; i < bytes.numel(); ++i) labels[i] = static_cast<Label>(bytes[i]);
    return labels;
  }
}

}  // namespace kiln::data
