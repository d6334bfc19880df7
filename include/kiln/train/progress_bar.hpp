// A progress bar like Keras': step count, bar, elapsed time or ETA, time per step, running loss and metrics. On a
// terminal it is redrawn in place (at most every 50 ms); otherwise it prints one line per epoch.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include "kiln/train/logs.hpp"

namespace kiln::train {

// Draws one epoch's progress to an output stream.
class progress_bar {
 public:
  explicit progress_bar(std::ostream& out = std::cout, bool interactive = ::isatty(STDOUT_FILENO) != 0)
      : out_(out), interactive_(interactive) {}

  void begin_epoch(int epoch, int epochs, long long steps) {
    steps_ = steps;
    start_ = last_draw_ = clock::now();
    out_ << "Epoch " << epoch << '/' << epochs << '\n';
    out_.flush();
  }
  // Called after each step with the running values.
  void update(long long step, const logs& running) {
    if (!interactive_) return;
    auto now = clock::now();
    if (step < steps_ && now - last_draw_ < std::chrono::milliseconds(50)) return;
    last_draw_ = now;
    out_ << '\r' << line(step, running, false) << "\033[K";
    out_.flush();
  }
  // Called once at the end of the epoch with the final values (validation included).
  void end_epoch(const logs& final_logs) {
    if (interactive_) out_ << '\r';
    out_ << line(steps_, final_logs, true) << (interactive_ ? "\033[K\n" : "\n");
    out_.flush();
  }

  // The text of the bar for a step; public so tests can read it without a terminal.
  std::string line(long long step, const logs& values, bool finished) const {
    std::ostringstream s;
    int width = 30;
    int digits = static_cast<int>(std::to_string(steps_).size());
    s.width(digits);
    s << step << '/' << steps_ << " [";
    long long filled = steps_ > 0 ? step * width / steps_ : width;
    for (int i = 0; i < width; ++i) s << (i < filled ? '=' : (i == filled && !finished ? '>' : '.'));
    s << "] - ";
    double elapsed = seconds(clock::now() - start_);
    if (finished || step >= steps_) {
      s << format_time(elapsed) << ' ' << format_step(step > 0 ? elapsed / double(step) : 0.0) << "/step";
    } else {
      double eta = step > 0 ? elapsed / double(step) * double(steps_ - step) : 0.0;
      s << "ETA: " << format_time(eta);
    }
    s.precision(4);
    s << std::fixed;
    for (auto& [k, v] : values.entries()) {
      if (k == "lr") continue;
      s << " - " << k << ": " << v;
    }
    return s.str();
  }

 private:
  using clock = std::chrono::steady_clock;
  static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }
  static std::string format_time(double s) {
    char buffer[32];
    if (s < 60) std::snprintf(buffer, sizeof buffer, "%.0fs", s);
    else std::snprintf(buffer, sizeof buffer, "%dm%02ds", int(s) / 60, int(s) % 60);
    return buffer;
  }
  static std::string format_step(double s) {
    char buffer[32];
    if (s >= 1) std::snprintf(buffer, sizeof buffer, "%.1fs", s);
    else if (s >= 1e-3) std::snprintf(buffer, sizeof buffer, "%.0fms", s * 1e3);
    else std::snprintf(buffer, sizeof buffer, "%.0fus", s * 1e6);
    return buffer;
  }

  std::ostream& out_;
  bool interactive_;
  long long steps_ = 0;
  clock::time_point start_, last_draw_;
};

}  // namespace kiln::train
