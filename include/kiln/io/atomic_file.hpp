// write_file_atomically: writes a file through a temporary next to it and renames it into place, so a failed or
// interrupted write never destroys the file that was there. The temporary is created exclusively under a fresh name
// (O_CREAT | O_EXCL | O_NOFOLLOW): whatever already lies at a name it tries, a symlink included, is never opened, so
// it cannot redirect the write to another file. Before the rename the data is flushed to the disk (fsync) and given
// the permissions of the file it replaces; after it, the directory is flushed too, so that a power loss leaves either
// the old file or the new one. The rename replaces the directory entry: a symlink at the target is replaced, its
// target never written. Temporaries of this writer left by a process that was killed mid-write are removed.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
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
  // Flushes the file to the disk with the permissions of the file at target (if any), closes it (where a delayed write
  // error can show), renames it to target and flushes the directory.
  void commit(const std::filesystem::path& target);
  const std::filesystem::path& path() const { return path_; }

  // The prefix of every temporary this writer makes for target: target's name, ".tmp-kiln-", the writer's process id.
  static std::string prefix(const std::filesystem::path& target) { return target.filename().string() + ".tmp-kiln-"; }
  // Removes the temporaries for target that a process no longer running left (killed in the middle of a write).
  static void remove_stale(const std::filesystem::path& target);
  // The directory that holds target (and its temporaries).
  static std::filesystem::path directory_of(const std::filesystem::path& target) {
    return target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  }

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
    path_ = target.parent_path() / prefix(target);
    path_ += std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
             std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd_ < 0 && errno != EEXIST) break;
  }
  if (fd_ < 0)
    fail("cannot create a temporary file next to '", target.string(), "' (tried '", path_.string(), "'): ",
         std::strerror(errno));
}

KILN_LIBRARY_FUNCTION void temporary_file::commit(const std::filesystem::path& target) {
  struct stat existing {};
  if (::stat(target.c_str(), &existing) == 0 && S_ISREG(existing.st_mode) &&
      ::fchmod(fd_, existing.st_mode & 07777) != 0)
    fail("cannot give '", path_.string(), "' the permissions of '", target.string(), "': ", std::strerror(errno));
  if (::fsync(fd_) != 0) fail("writing '", path_.string(), "' failed (fsync): ", std::strerror(errno));
  if (close() != 0) fail("writing '", path_.string(), "' failed: ", std::strerror(errno));
  if (::rename(path_.c_str(), target.c_str()) != 0)
    fail("cannot rename '", path_.string(), "' to '", target.string(), "': ", std::strerror(errno));
  committed_ = true;
  // The rename is durable once the directory is: flushed on a best-effort basis (some file systems refuse it).
  int dir = ::open(directory_of(target).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

KILN_LIBRARY_FUNCTION void temporary_file::remove_stale(const std::filesystem::path& target) {
  namespace fs = std::filesystem;
  const std::string start = prefix(target);
  std::error_code ec;
  for (fs::directory_iterator it(directory_of(target), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(start, 0) != 0) continue;
    // <target>.tmp-kiln-<pid>-<counter>-<clock>: stale when no process <pid> runs any more.
    const char* digits = name.c_str() + start.size();
    char* after = nullptr;
    const long pid = std::strtol(digits, &after, 10);
    if (after == digits || *after != '-' || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    std::error_code ignore;
    if (!it->is_symlink(ignore) && it->is_regular_file(ignore)) fs::remove(it->path(), ignore);
  }
}
#endif
}  // namespace detail

// Writes the parts one after the other (a header and a tensor's bytes, say, without joining them in memory).
KILN_LIBRARY_FUNCTION void write_file_atomically(const std::filesystem::path& path,
                                                 std::initializer_list<std::string_view> parts);
inline void write_file_atomically(const std::filesystem::path& path, std::string_view contents) {
  write_file_atomically(path, {contents});
}
#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION void write_file_atomically(const std::filesystem::path& path,
                                                 std::initializer_list<std::string_view> parts) {
  detail::temporary_file::remove_stale(path);
  detail::temporary_file temporary(path);
  std::size_t requested = 0;
  for (std::string_view part : parts) {
    requested += part.size();
    if (!temporary.write_all(part))
      fail("writing '", temporary.path().string(), "' failed after ", requested, " bytes were requested: ",
           std::strerror(errno));
  }
  temporary.commit(path);
}
#endif

}  // namespace kiln::io
