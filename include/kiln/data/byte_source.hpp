// kiln::data::byte_source: sequential reading of a binary file that may be gzip-compressed, with the byte offset of
// every read known, so that each reader can say exactly where a file went wrong.
#pragma once

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/io/regular_file.hpp"

namespace kiln::data {

// The most data a reader takes from one file, counted after decompression. A gzip stream can inflate a
// thousandfold, so a file of a few MB could otherwise make a reader allocate gigabytes because its header says so;
// the header's claim is checked against this bound before anything is read. Raise it for larger data sets.
struct read_limits {
  std::uint64_t max_bytes = std::uint64_t{1} << 32;  // 4 GiB
};

// Reads a file front to back, inflating it on the fly when it starts with the gzip magic (1f 8b) whatever its name.
// Offsets count bytes of the decompressed stream: the positions the file format talks about. Every failure throws
// kiln::error naming the file and the offset; a corrupt or truncated gzip stream is an error, never a crash.
class byte_source {
 public:
  // `format` names the file's format in the error for a path that is not a regular file.
  explicit byte_source(const std::filesystem::path& path, std::string_view format = "data file") : path_(path) {
    io::regular_file file(path_, format);  // a directory, FIFO or device is refused here, by name
    file_size_ = file.size();
    // gzdopen reads plain files transparently too; the magic is still sniffed to know whether the size is known.
    unsigned char magic[2] = {0, 0};
    ssize_t got = ::pread(file.descriptor(), magic, 2, 0);
    compressed_ = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    file_ = gzdopen(file.descriptor(), "rb");
    if (!file_) fail(path_.string(), ": cannot open for reading");
    file.release();  // gzclose closes it now
    gzbuffer(file_, 1u << 18);  // larger than the 8 KiB default: inflating a .gz file is then bound by inflate alone
  }
  byte_source(const byte_source&) = delete;
  byte_source& operator=(const byte_source&) = delete;
  ~byte_source() {
    if (file_) gzclose(file_);
  }

  const std::filesystem::path& path() const { return path_; }
  bool compressed() const { return compressed_; }
  // Bytes delivered so far: the offset of the next byte.
  std::uint64_t offset() const { return offset_; }
  // The exact payload size for a plain file; empty for gzip, whose decompressed size is only known at its end.
  std::optional<std::uint64_t> known_size() const {
    if (compressed_) return std::nullopt;
    return file_size_;
  }
  std::uint64_t file_size() const { return file_size_; }

  // Reads up to `count` bytes; returns fewer only at the end of the data. Corrupt gzip data throws.
  std::size_t read_some(void* destination, std::size_t count) {
    auto* out = static_cast<unsigned char*>(destination);
    std::size_t total = 0;
    while (total < count) {
      unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(count - total, 1u << 30));
      int got = gzread(file_, out + total, chunk);
      if (got < 0) gzip_failure();
      total += static_cast<std::size_t>(got);
      offset_ += static_cast<std::uint64_t>(got);
      if (static_cast<unsigned>(got) < chunk) {
        check_gzip_state();  // a short read is either the clean end or a truncated/corrupt stream
        break;
      }
    }
    return total;
  }

  // Reads exactly `count` bytes of `what` or throws "truncated" with the offset where the data ran out.
  void read_exact(void* destination, std::size_t count, const char* what) {
    std::uint64_t start = offset_;
    std::size_t got = read_some(destination, count);
    if (got != count)
      fail_at(start, "truncated: expected ", count, " bytes of ", what, ", found only ", got, " before the end of the ",
              compressed_ ? "decompressed data" : "file");
  }

  // Reads exactly `count` bytes into a vector that grows as data actually arrives, so a corrupt header that declares
  // a huge size costs at most twice the real data, never the declared amount.
  void read_exact_growing(std::vector<unsigned char>& out, std::uint64_t count, const char* what) {
    std::uint64_t start = offset_;
    out.clear();
    constexpr std::uint64_t first_chunk = 1u << 20;
    while (out.size() < count) {
      std::uint64_t want = std::min<std::uint64_t>(count - out.size(), std::max<std::uint64_t>(out.size(), first_chunk));
      std::size_t old = out.size();
      out.resize(old + static_cast<std::size_t>(want));
      std::size_t got = read_some(out.data() + old, static_cast<std::size_t>(want));
      if (got != want) {
        out.resize(old + got);
        fail_at(start, "truncated: expected ", count, " bytes of ", what, ", found only ", out.size(),
                " before the end of the ", compressed_ ? "decompressed data" : "file");
      }
    }
  }

  // Throws unless `count` bytes of `what`, which the header at byte `at` declares, are within limits.max_bytes.
  void check_limit(std::uint64_t at, std::uint64_t count, const char* what, const read_limits& limits) const {
    if (count > limits.max_bytes)
      fail_at(at, "the header declares ", count, " bytes of ", what, ", more than the reader's limit of ",
              limits.max_bytes, " (read_limits::max_bytes)");
  }

  // True when no byte is left; used to reject files longer than their header says.
  bool at_end() {
    unsigned char probe;
    std::uint64_t before = offset_;
    bool end = read_some(&probe, 1) == 0;
    offset_ = before;  // the probe byte is reported as "after" the expected data, not consumed
    return end;
  }

  // Throws kiln::error "<file>: at byte offset <n>: <parts>".
  template <class... Parts>
  [[noreturn]] void fail_at(std::uint64_t at, const Parts&... parts) const {
    fail(path_.string(), ": at byte offset ", at, compressed_ ? " (decompressed)" : "", ": ", parts...);
  }

 private:
  [[noreturn]] void gzip_failure() const {
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    fail_at(offset_, "corrupt gzip data (zlib: ", message ? message : "unknown error", ", compressed offset ",
            static_cast<long long>(gzoffset(file_)), ")");
  }
  void check_gzip_state() const {
    int code = Z_OK;
    gzerror(file_, &code);
    if (code != Z_OK && code != Z_STREAM_END) gzip_failure();
  }

  std::filesystem::path path_;
  gzFile file_ = nullptr;
  std::uint64_t file_size_ = 0;
  std::uint64_t offset_ = 0;
  bool compressed_ = false;
};

}  // namespace kiln::data
