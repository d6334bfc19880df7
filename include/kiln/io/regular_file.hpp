// Opening a file that a reader is about to trust: it must be a regular file. A directory, a FIFO, a socket or a device
// (/dev/zero, a terminal) given as a weights, checkpoint or data path is refused with an error that names what was
// found, instead of blocking on a FIFO with no writer or reading an endless device until memory runs out. The check is
// made on the opened descriptor (fstat), so the path cannot be swapped for something else between check and read, and
// the open does not block (O_NONBLOCK), so a FIFO is refused rather than waited on.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/core/error.hpp"

namespace kiln::io {

// An open regular file, read-only; closed when it goes out of scope unless released.
class regular_file {
 public:
  // Opens path for reading; throws kiln::error "<reader>: cannot read '<path>': expected a regular file, found a
  // FIFO" (a directory, a device, ...) or the system's reason it cannot be opened. `reader` names the format.
  regular_file(const std::filesystem::path& path, std::string_view reader);
  regular_file(const regular_file&) = delete;
  regular_file& operator=(const regular_file&) = delete;
  ~regular_file() {
    if (fd_ >= 0) ::close(fd_);
  }

  int descriptor() const { return fd_; }
  // The size when the file was opened.
  std::uint64_t size() const { return size_; }
  // Gives up ownership of the descriptor (to a reader that closes it itself, gzdopen's).
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

namespace detail {
inline const char* file_kind_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "something other than a regular file";
}
}  // namespace detail

#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION regular_file::regular_file(const std::filesystem::path& path, std::string_view reader) {
  do {
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) fail(reader, ": cannot open '", path.string(), "' for reading: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    int code = errno;
    ::close(fd_);
    fd_ = -1;
    fail(reader, ": cannot read '", path.string(), "': ", std::strerror(code));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    fail(reader, ": cannot read '", path.string(), "': expected a regular file, found ", detail::file_kind_name(st.st_mode));
  }
  // Regular files never block; clearing the flag keeps later reads ordinary.
  int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  size_ = static_cast<std::uint64_t>(st.st_size);
}
#endif

// The whole contents of a regular file of at most max_bytes, read with as many bytes as its size said when it was
// opened: a file that grows while it is read is not followed, one that shrinks is an error.
KILN_LIBRARY_FUNCTION std::string read_regular_file(const std::filesystem::path& path, std::string_view reader,
                                                    std::uint64_t max_bytes = UINT64_MAX);
#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION std::string read_regular_file(const std::filesystem::path& path, std::string_view reader,
                                                    std::uint64_t max_bytes) {
  regular_file file(path, reader);
  if (file.size() > max_bytes)
    fail(reader, ": cannot read '", path.string(), "': expected at most ", max_bytes, " bytes (the reader's limit), ",
         "found a file of ", file.size());
  std::string bytes(static_cast<std::size_t>(file.size()), '\0');
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::read(file.descriptor(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(reader, ": reading '", path.string(), "' failed at byte ", done, ": ", std::strerror(errno));
    if (n == 0)
      fail(reader, ": reading '", path.string(), "': the file ended at byte ", done, " while it was read, expected ",
           bytes.size(), " bytes (changed by another process?)");
    done += static_cast<std::size_t>(n);
  }
  return bytes;
}
#endif

}  // namespace kiln::io
