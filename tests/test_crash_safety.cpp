// Crash safety of the writers: a process killed (SIGKILL) at any moment of save_weights or save_checkpoint leaves at
// the target a complete file, the one that was there or the one it was writing, never a torn or truncated one; what
// it leaves beside it (a temporary of the atomic writer) is never the target and is removed by the next save.
// A child process saves version after version of a large model to one path, every value of a version equal to its
// number; the parent kills it at varied moments (while a temporary of it is being written, or some milliseconds after
// a save completed) and after each kill loads the target and checks that it is exactly one complete version.
#include <doctest/doctest.h>

#include <poll.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "io_test_files.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/io/checkpoint.hpp"
#include "kiln/io/safetensors.hpp"
#include "kiln/io/weights.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

fs::path temp_dir(const std::string& name) { return io_test::fresh_dir("kiln_test_crash_safety", name); }

// The atomic writer's temporaries for target (<name>.tmp-kiln-<pid>-...), of any process or of process pid only.
std::vector<std::string> temporaries_of(const fs::path& target, pid_t pid = 0) {
  std::string prefix = target.filename().string() + ".tmp-kiln-";
  if (pid > 0) prefix += std::to_string(pid) + "-";
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(target.parent_path()))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().filename().string());
  return out;
}

// Waits until a temporary of process pid for target exists; false if none appeared within the timeout.
bool wait_for_temporary(const fs::path& target, pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (temporaries_of(target, pid).empty()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(100us);
  }
  return true;
}

// Waits for delay while checking, every 100 us, that the target as a reader would find it has the size of a
// complete version; returns the number of times it had not (a file written in place shows shorter while it is).
int watch_target(const fs::path& target, std::uintmax_t version_size, std::chrono::milliseconds delay) {
  const auto end = std::chrono::steady_clock::now() + delay;
  int torn = 0;
  while (std::chrono::steady_clock::now() < end) {
    std::error_code ec;
    if (fs::file_size(target, ec) != version_size || ec) ++torn;
    std::this_thread::sleep_for(100us);
  }
  return torn;
}

// A child process that saves version after version (first, first + 1, ...) with save(version) until it is killed,
// writing each version's number to a pipe once its save has returned. The child does nothing else and leaves with
// _exit (no test framework, no exit handlers), which keeps a fork of this multi-threaded process safe. Destroying the
// object kills the child, so that a failed check never leaves one writing.
class saving_child {
 public:
  saving_child(long long first, const std::function<void(long long)>& save) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      try {
        for (long long version = first;; ++version) {
          save(version);
          if (::write(fds[1], &version, sizeof version) != static_cast<ssize_t>(sizeof version)) break;
        }
      } catch (const std::exception& e) {
        const std::string message = std::string("saving child: ") + e.what() + "\n";
        [[maybe_unused]] ssize_t ignored = ::write(STDERR_FILENO, message.data(), message.size());
      }
      ::_exit(1);
    }
    ::close(fds[1]);
    reports_ = fds[0];
    if (pid_ < 0) ::close(reports_);
    REQUIRE(pid_ > 0);
  }
  saving_child(const saving_child&) = delete;
  saving_child& operator=(const saving_child&) = delete;
  ~saving_child() {
    if (pid_ > 0) kill_and_reap();
    ::close(reports_);
  }

  pid_t pid() const { return pid_; }
  // The last version the child reported saved; -1 while it has reported none.
  long long last_saved() const { return last_saved_; }

  // Waits up to timeout for the child to report one more saved version; false if it did not (or ended).
  bool wait_for_save(std::chrono::milliseconds timeout) {
    pollfd p{reports_, POLLIN, 0};
    int ready;
    while ((ready = ::poll(&p, 1, static_cast<int>(timeout.count()))) < 0 && errno == EINTR) {
    }
    return ready > 0 && read_report();
  }
  // Kills the child (SIGKILL), waits for it to be gone, and reads the reports it made before; returns its wait status.
  int kill_and_reap() {
    ::kill(pid_, SIGKILL);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    while (read_report()) {
    }
    return status;
  }

 private:
  bool read_report() {
    long long version = 0;
    ssize_t n;
    while ((n = ::read(reports_, &version, sizeof version)) < 0 && errno == EINTR) {
    }
    if (n != static_cast<ssize_t>(sizeof version)) return false;
    last_saved_ = version;
    return true;
  }
  pid_t pid_ = -1;
  int reports_ = -1;
  long long last_saved_ = -1;
};

// Where a kill lands: some milliseconds after a temporary of the child appeared (while it writes or flushes the
// temporary, or renames it), or after the child reported a completed save (while it prepares the next one, writes
// it, or has just renamed it).
struct kill_moment {
  bool after_temporary;
  int delay_ms;
};
constexpr kill_moment kill_moments[] = {{true, 0}, {false, 0},  {true, 2},  {false, 4},
                                        {true, 6}, {false, 12}, {true, 20}, {false, 35}};

// One writer under test. save(version) sets every value of the model (and optimizer) to the version's number and
// saves it to the target; load() loads the target into another model, checks that every value equals the version the
// file names, and returns that version.
struct versioned_writer {
  std::function<void(long long)> save;
  std::function<long long()> load;
};

// Round r's child saves versions 1000 (r + 1), 1000 (r + 1) + 1, ..., and the parent then saves 1000 (r + 1) + 999:
// four digits each, so that every version's file has the same size.
constexpr long long versions_per_round = 1000;

// Kills a child that saves with writer.save at each of kill_moments, the target keeping a complete version's size all
// the while before, and checks the target after each kill: it has that size, it loads, and it is the last version the
// child reported saved or the next one (renamed into place just before the kill); only the killed child's
// temporaries lie beside it, and the parent's next save removes them.
void check_survives_kills(const fs::path& target, const versioned_writer& writer) {
  std::uintmax_t version_size = 0;
  int kills_leaving_a_temporary = 0, kills_after_a_rename = 0;
  long long round = 0;
  for (const kill_moment moment : kill_moments) {
    CAPTURE(round);
    CAPTURE(moment.after_temporary);
    CAPTURE(moment.delay_ms);
    const long long first = (round + 1) * versions_per_round, parents = first + versions_per_round - 1;
    saving_child child(first, writer.save);
    REQUIRE_MESSAGE(child.wait_for_save(20s), "the child saved nothing");
    if (version_size == 0) version_size = fs::file_size(target);
    if (moment.after_temporary) REQUIRE_MESSAGE(wait_for_temporary(target, child.pid(), 20s), "no temporary seen");
    CHECK(watch_target(target, version_size, std::chrono::milliseconds(moment.delay_ms)) == 0);
    const pid_t pid = child.pid();
    const int status = child.kill_and_reap();
    REQUIRE_MESSAGE((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL), "the child ended before the kill");
    const long long saved = child.last_saved();
    REQUIRE(saved >= first);
    REQUIRE(saved < parents);

    // What the kill left beside the target: temporaries of the killed child only.
    const auto left = temporaries_of(target);
    if (!left.empty()) ++kills_leaving_a_temporary;
    CHECK(left.size() == temporaries_of(target, pid).size());
    REQUIRE(fs::is_regular_file(target));
    CHECK(fs::file_size(target) == version_size);
    long long found = -1;
    REQUIRE_NOTHROW(found = writer.load());
    CHECK((found == saved || found == saved + 1));
    if (found == saved + 1) ++kills_after_a_rename;

    // The parent's save removes the dead child's temporaries (it is the next round's starting file).
    writer.save(parents);
    CHECK(temporaries_of(target).empty());
    ++round;
  }
  MESSAGE(kills_leaving_a_temporary, " of ", round, " kills left a temporary, ", kills_after_a_rename,
          " landed between a rename and its report");
  // Otherwise no kill landed in the middle of a write, and the rounds showed nothing about one.
  CHECK(kills_leaving_a_temporary > 0);
  fs::remove_all(target.parent_path());
}

void fill(float* values, index_t n, long long version) { std::fill(values, values + n, static_cast<float>(version)); }
// Whether each of the n values is the version's number.
bool all_equal(const float* values, index_t n, long long version) {
  return std::all_of(values, values + n, [&](float v) { return v == static_cast<float>(version); });
}

// A static MLP of 4.2 million parameters: 17 MB of weights.
using large_static_net = Sequential<policy::cpu, Input<1024>, Dense<2048, ReLU>, Dense<1024>>;

// A dynamic MLP of 2.1 million parameters: with Adam's two moments a checkpoint of 25 MB.
nn::Sequential large_dynamic_net() {
  manual_seed(3);
  return nn::Sequential(nn::Linear(1024, 1024), nn::ReLU(), nn::Linear(1024, 1024));
}

}  // namespace

TEST_CASE("save_weights: a process killed at any moment of a save leaves a complete file, old or new") {
  const auto target = temp_dir("weights") / "model.safetensors";
  large_static_net net(1, 7), loaded(1, 8);
  versioned_writer writer{
      [&](long long version) {
        auto values = net.parameter_values();
        fill(values.data(), static_cast<index_t>(values.size()), version);
        io::save_weights(net, target, {{"version", std::to_string(version)}});
      },
      [&] {
        const io::st_file file = io::read_safetensors(target);
        io::load_weights(loaded, file, target.string());
        REQUIRE(file.meta("version"));
        const long long version = std::stoll(*file.meta("version"));
        auto values = loaded.parameter_values();
        CHECK(all_equal(values.data(), static_cast<index_t>(values.size()), version));
        return version;
      }};
  check_survives_kills(target, writer);
}

TEST_CASE("save_checkpoint: a process killed at any moment of a save leaves a complete checkpoint, old or new") {
  const auto target = temp_dir("checkpoint") / "run.ckpt";
  auto model = large_dynamic_net(), loaded = large_dynamic_net();
  optim::Adam opt(model.parameters()), loaded_opt(loaded.parameters());
  {
    // One step, so that Adam has its moments (two thirds of the checkpoint).
    auto loss = nn::sum(model(nn::Variable(Tensor<float>(shape{2, 1024}, 0.5f))));
    loss.backward();
    opt.step();
  }
  versioned_writer writer{
      [&](long long version) {
        for (auto& p : model.parameters()) fill(p.data(), p.numel(), version);
        for (auto& st : opt.state()) {
          st.step = version;
          st.for_each_buffer(opt.options(), [&](const char*, auto& buffer, bool) {
            fill(buffer.data(), static_cast<index_t>(buffer.size()), version);
          });
        }
        opt.set_steps_taken(version);
        io::save_checkpoint(target, model, opt, {.epoch = version, .step = version});
      },
      [&] {
        const auto state = io::load_checkpoint(target, loaded, loaded_opt);
        const long long version = state.step;
        CHECK(state.epoch == version);
        CHECK(loaded_opt.steps_taken() == version);
        for (auto& p : loaded.parameters()) CHECK(all_equal(p.data(), p.numel(), version));
        REQUIRE(loaded_opt.state().size() == model.parameters().size());
        for (auto& st : loaded_opt.state()) {
          CHECK(st.step == version);
          st.for_each_buffer(loaded_opt.options(), [&](const char* name, auto& buffer, bool used) {
            CAPTURE(name);
            if (used) CHECK(all_equal(buffer.data(), static_cast<index_t>(buffer.size()), version));
          });
        }
        return version;
      }};
  check_survives_kills(target, writer);
}
