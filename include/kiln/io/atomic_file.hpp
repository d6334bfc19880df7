// write_file_atomically: writes a file through a temporary next to it and renames it into place, so a failed or
// interrupted write never destroys the file that was there. The temporary is created exclusively under a fresh name
// (O_CREAT | O_EXCL | O_NOFOLLOW): whatever already lies at a name it tries, a symlink included, is never opened, so
// it cannot redirect the write to another file.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/core/error.hpp"

namespace kiln::io {

namespace detail {
// An open temporary file that is removed again unless committed (renamed into place), whatever fails in between.
class temporary_file {
 public:
  explicit temporary_file(const std::filesystem::path& target);
  temporary_file(const temporary_file&) = delete;
  temporary_file& operator=(const temporary_file&) = delete;
  ~temporary_file() {
    close();
    if (!committed_) ::unlink(path_.c_str());
  }

  // Writes all of contents, retrying short writes; false (errno set) on failure.
  bool write_all(std::string_view contents) {
    while (!contents.empty()) {
      ssize_t n = ::write(fd_, contents.data(), contents.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      contents.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }
  // Closes the file (where a delayed write error can show) and renames it to target.
  void commit(const std::filesystem::path& target) {
    if (close() != 0) fail("writing '", path_.string(), "' failed: ", std::strerror(errno));
    if (::rename(path_.c_str(), target.c_str()) != 0)
      fail("cannot rename '", path_.string(), "' to '", target.string(), "': ", std::strerror(errno));
    committed_ = true;
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  int close() {
    int result = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return result;
  }
  std::filesystem::path path_;
  int fd_ = -1;
  bool committed_ = false;
};
#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION temporary_file::temporary_file(const std::filesystem::path& target) {
  // A name nobody else is likely to be using: a clash only costs another try, since the open is exclusive.
  static std::atomic<unsigned> counter{0};
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    path_ = target;
    path_ += ".tmp-kiln-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
             std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd_ < 0 && errno != EEXIST) break;
  }
  if (fd_ < 0)
    fail("cannot create a temporary file next to '", target.string(), "' (tried '", path_.string(), "'): ",
         std::strerror(errno));
}
#endif
}  // namespace detail

KILN_LIBRARY_FUNCTION void write_file_atomically(const std::filesystem::path& path, std::string_view contents);
#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION void write_file_atomically(const std::filesystem::path& path, std::string_view contents) {
  detail::temporary_file temporary(path);
  if (!temporary.write_all(contents))
    fail("writing '", temporary.path().string(), "' failed after ", contents.size(), " bytes were requested: ",
         std::strerror(errno));
  temporary.commit(path);
}
#endif

}  // namespace kiln::io
