// History: what fit() records per epoch, writable as CSV and as a self-contained SVG plot of the loss and accuracy
// curves (training solid, validation dashed).
#pragma once

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/io/atomic_file.hpp"
#include "kiln/train/logs.hpp"

namespace kiln::train {

// One logs entry per finished epoch.
class history {
 public:
  void record(const logs& epoch_logs) { epochs_.push_back(epoch_logs); }
  const std::vector<logs>& epochs() const { return epochs_; }
  std::size_t size() const { return epochs_.size(); }

  // Every key seen in any epoch, in first-seen order.
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    for (auto& e : epochs_)
      for (auto& [k, v] : e.entries())
        if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
    return out;
  }
  // The values of one key over the epochs (NaN where an epoch lacks it).
  std::vector<double> series(const std::string& key) const {
    std::vector<double> out;
    for (auto& e : epochs_) out.push_back(e.get(key).value_or(std::nan("")));
    return out;
  }

  std::string to_csv() const {
    std::ostringstream out;
    auto k = keys();
    out << "epoch";
    for (auto& name : k) out << ',' << name;
    out << '\n' << std::setprecision(9);
    for (std::size_t e = 0; e < epochs_.size(); ++e) {
      out << e + 1;
      for (auto& name : k) {
        out << ',';
        if (auto v = epochs_[e].get(name)) out << *v;
      }
      out << '\n';
    }
    return out.str();
  }
  void write_csv(const std::string& path) const { io::write_file_atomically(path, to_csv()); }

  // Two panels side by side: losses on the left, everything else (accuracy, metrics) on the right.
  std::string to_svg() const {
    const int panel_w = 420, panel_h = 300, margin = 50;
    std::ostringstream svg;
    svg << std::setprecision(6);
    svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << 2 * panel_w << "\" height=\"" << panel_h + 40
        << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    std::vector<std::string> loss_keys, metric_keys;
    for (auto& k : keys()) {
      if (k == "lr" || k == "epoch_seconds") continue;
      (k.find("loss") != std::string::npos ? loss_keys : metric_keys).push_back(k);
    }
    draw_panel(svg, 0, panel_w, panel_h, margin, "loss", loss_keys);
    draw_panel(svg, panel_w, panel_w, panel_h, margin, "metrics", metric_keys);
    svg << "</svg>\n";
    return svg.str();
  }
  void write_svg(const std::string& path) const { io::write_file_atomically(path, to_svg()); }

 private:
  void draw_panel(std::ostringstream& svg, int x0, int w, int h, int margin, const std::string& title,
                  const std::vector<std::string>& keys) const {
    static const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
    double lo = INFINITY, hi = -INFINITY;
    for (auto& k : keys)
      for (double v : series(k))
        if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    if (!std::isfinite(lo)) lo = 0, hi = 1;
    if (hi - lo < 1e-12) hi = lo + 1;
    int left = x0 + margin, right = x0 + w - 20, top = 30, bottom = h - 10;
    svg << "<text x=\"" << x0 + w / 2 << "\" y=\"18\" text-anchor=\"middle\" font-weight=\"bold\">" << title
        << "</text>\n";
    svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << right - left << "\" height=\"" << bottom - top
        << "\" fill=\"none\" stroke=\"#888\"/>\n";
    for (int t = 0; t <= 4; ++t) {
      double v = lo + (hi - lo) * t / 4;
      double y = bottom - (bottom - top) * t / 4.0;
      svg << "<text x=\"" << left - 4 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << std::setprecision(3) << v
          << "</text>\n" << std::setprecision(6);
    }
    std::size_t n = epochs_.size();
    svg << "<text x=\"" << (left + right) / 2 << "\" y=\"" << h + 20 << "\" text-anchor=\"middle\">epoch (1-" << n
        << ")</text>\n";
    for (std::size_t i = 0; i < keys.size(); ++i) {
      auto values = series(keys[i]);
      const char* color = colors[i % 6];
      bool validation = keys[i].rfind("val_", 0) == 0;
      svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\""
          << (validation ? " stroke-dasharray=\"6 4\"" : "") << " points=\"";
      for (std::size_t e = 0; e < values.size(); ++e) {
        if (!std::isfinite(values[e])) continue;
        double x = n > 1 ? left + (right - left) * double(e) / double(n - 1) : (left + right) / 2.0;
        double y = bottom - (bottom - top) * (values[e] - lo) / (hi - lo);
        svg << x << ',' << y << ' ';
      }
      svg << "\"/>\n<text x=\"" << left + 8 << "\" y=\"" << top + 16 + 14 * i << "\" fill=\"" << color << "\">"
          << keys[i] << "</text>\n";
    }
  }

  std::vector<logs> epochs_;
};

}  // namespace kiln::train
