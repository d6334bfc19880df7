// CSV files: RFC 4180 quoting ("..." with "" for a quote), LF or CRLF line ends, an optional final line end, a header
// line naming the columns. Selected columns are parsed as numbers; anything else is an error with file, line, column.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <variant>
#include <vector>

#include "kiln/core/tensor.hpp"
#include "kiln/io/regular_file.hpp"

namespace kiln::data {

// A column chosen by header name ("Passengers") or by 0-based index (1).
class column_ref {
 public:
  column_ref(const char* name) : ref_(std::string(name)) {}
  column_ref(std::string name) : ref_(std::move(name)) {}
  column_ref(int index) : ref_(index) {}

  bool is_name() const { return std::holds_alternative<std::string>(ref_); }
  const std::string& name() const { return std::get<std::string>(ref_); }
  int index() const { return std::get<int>(ref_); }

 private:
  std::variant<std::string, int> ref_;
};

// What to read. With no feature columns given, every column but the label is a feature (and must be numeric).
struct csv_options {
  std::vector<column_ref> features{};  // numeric input columns, in this order
  std::optional<column_ref> label{};  // numeric target column (class index or regression target), if any
  char delimiter = ',';
  bool header = true;  // first line names the columns; without it, columns can only be chosen by index
  // Bounds on one record (a line, or several where a quoted field spans them); a file beyond them is an error, so
  // that a single endless line cannot make the reader hold millions of fields.
  std::size_t max_line_bytes = std::size_t{16} << 20;  // 16 MiB
  std::size_t max_columns = std::size_t{1} << 16;
};

// The parsed numeric columns: features (rows, features.size()) and labels (rows) when a label column was chosen.
template <class T = float>
struct csv_table {
  std::vector<std::string> column_names;   // every column in the file (from the header; "0", "1", ... without one)
  std::vector<std::string> feature_names;  // the selected feature columns, in order
  std::string label_name;                  // empty without a label column
  Tensor<T> features;
  Tensor<T> labels;
  index_t rows() const { return features.rank() ? features.extent(0) : 0; }
};

namespace detail {

// Splits CSV text into records of fields, tracking the line each record starts on (quoted fields may span lines).
class csv_scanner {
 public:
  csv_scanner(std::string_view text, const csv_options& options, const std::string& file)
      : text_(text), delimiter_(options.delimiter), max_line_bytes_(options.max_line_bytes),
        max_columns_(options.max_columns), file_(file) {
    if (text_.starts_with("\xEF\xBB\xBF")) pos_ = 3;  // a UTF-8 byte-order mark written by spreadsheet programs
  }

  // Reads the next non-blank record into `fields`; false at the end of the text.
  bool next(std::vector<std::string>& fields) {
    fields.clear();
    while (pos_ < text_.size() && (text_[pos_] == '\n' || text_[pos_] == '\r')) skip_line_end();  // blank lines
    if (pos_ >= text_.size()) return false;
    record_line_ = line_;
    const std::size_t record_start = pos_;
    std::string field;
    while (true) {
      field.clear();
      if (pos_ < text_.size() && text_[pos_] == '"') {
        std::size_t quote_line = line_;
        ++pos_;
        while (true) {
          if (pos_ >= text_.size())
            fail(file_, ":", quote_line, ": column ", fields.size() + 1, ": unterminated quoted field");
          char c = text_[pos_++];
          if (c == '"') {
            if (pos_ < text_.size() && text_[pos_] == '"') {
              field += '"';
              ++pos_;
            } else {
              break;
            }
          } else {
            if (c == '\n') ++line_;
            field += c;
          }
        }
        if (pos_ < text_.size() && text_[pos_] != delimiter_ && text_[pos_] != '\n' && text_[pos_] != '\r')
          fail(file_, ":", line_, ": column ", fields.size() + 1, ": unexpected character '", text_[pos_],
               "' after a closing quote (expected '", delimiter_, "' or the end of the line)");
      } else {
        while (pos_ < text_.size() && text_[pos_] != delimiter_ && text_[pos_] != '\n' && text_[pos_] != '\r')
          field += text_[pos_++];
      }
      if (pos_ - record_start > max_line_bytes_)
        fail(file_, ":", record_line_, ": expected a line of at most ", max_line_bytes_,
             " bytes (csv_options::max_line_bytes), found one longer");
      if (fields.size() == max_columns_)
        fail(file_, ":", record_line_, ": expected at most ", max_columns_,
             " columns (csv_options::max_columns), found more");
      fields.push_back(field);
      if (pos_ < text_.size() && text_[pos_] == delimiter_) {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size()) skip_line_end();
      return true;
    }
  }
  std::size_t record_line() const { return record_line_; }

 private:
  void skip_line_end() {
    if (text_[pos_] == '\r' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '\n') ++pos_;
    ++pos_;
    ++line_;
  }

  std::string_view text_;
  char delimiter_;
  std::size_t max_line_bytes_, max_columns_;
  const std::string& file_;
  std::size_t pos_ = 0, line_ = 1, record_line_ = 1;
};

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace detail

// Reads the chosen numeric columns of a CSV file. Throws kiln::error "<file>:<line>: column <k> ('<name>'): ..." for a
// cell that is not a number, a row with a different number of fields than the header, an unknown column, or an
// unterminated quote.
template <class T = float>
csv_table<T> read_csv(const std::filesystem::path& path, const csv_options& options = {}) {
  static_assert(std::is_floating_point_v<T>, "read_csv parses into float or double");
  const std::string file = path.string();
  const std::string text = io::read_regular_file(path, "CSV");

  detail::csv_scanner scanner(text, options, file);
  std::vector<std::string> fields;
  csv_table<T> table;
  std::size_t columns = 0;
  if (options.header) {
    if (!scanner.next(fields)) fail(file, ":1: expected a header line, found an empty file");
    table.column_names = fields;
    columns = fields.size();
  }

  // Data rows are parsed into flat vectors first: the row count is only known at the end of the file.
  std::vector<T> feature_values, label_values;
  std::vector<std::size_t> feature_columns;
  std::optional<std::size_t> label_column;
  bool resolved = false;
  auto resolve = [&](const column_ref& ref) -> std::size_t {
    if (ref.is_name()) {
      for (std::size_t c = 0; c < table.column_names.size(); ++c)
        if (table.column_names[c] == ref.name()) return c;
      std::string known;
      for (const auto& n : table.column_names) known += (known.empty() ? "'" : ", '") + n + "'";
      fail(file, ":1: no column named '", ref.name(), "' (columns: ", known.empty() ? "none, no header" : known, ")");
    }
    if (ref.index() < 0 || static_cast<std::size_t>(ref.index()) >= columns)
      fail(file, ":", options.header ? 1 : scanner.record_line(), ": column index ", ref.index(),
           " is out of range: the file has ", columns, " columns");
    return static_cast<std::size_t>(ref.index());
  };
  auto resolve_all = [&] {
    if (options.label) label_column = resolve(*options.label);
    if (options.features.empty()) {
      for (std::size_t c = 0; c < columns; ++c)
        if (c != label_column) feature_columns.push_back(c);
    } else {
      for (const auto& ref : options.features) feature_columns.push_back(resolve(ref));
    }
    for (std::size_t c : feature_columns) table.feature_names.push_back(table.column_names[c]);
    if (label_column) table.label_name = table.column_names[*label_column];
    resolved = true;
  };
  if (options.header) resolve_all();

  auto parse = [&](const std::string& cell, std::size_t column) -> T {
    std::string_view s = detail::trim(cell);
    T value{};
    // from_chars rejects a leading plus; one is allowed, before a digit or a point ("+-1" is not a number).
    if (s.size() > 1 && s.front() == '+' && s[1] != '-' && s[1] != '+') s.remove_prefix(1);
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec == std::errc::result_out_of_range && end == s.data() + s.size()) {
      // Too small in magnitude reads as the nearest float, zero or subnormal, as NumPy reads it; too large is an error.
      const double wide = std::strtod(std::string(s).c_str(), nullptr);
      if (std::isinf(wide) || std::fabs(wide) > double(std::numeric_limits<T>::max()))
        fail(file, ":", scanner.record_line(), ": column ", column + 1, " ('", table.column_names[column],
             "'): the number '", cell, "' is out of the range of ", sizeof(T) == 4 ? "float" : "double");
      return static_cast<T>(wide);
    }
    if (s.empty() || ec != std::errc() || end != s.data() + s.size())
      fail(file, ":", scanner.record_line(), ": column ", column + 1, " ('", table.column_names[column],
           "'): expected a number, found '", cell, "'");
    return value;
  };

  std::size_t rows = 0;
  while (scanner.next(fields)) {
    if (!resolved) {  // no header: the first row fixes the column count and default names
      columns = fields.size();
      for (std::size_t c = 0; c < columns; ++c) table.column_names.push_back(std::to_string(c));
      resolve_all();
    }
    if (fields.size() != columns)
      fail(file, ":", scanner.record_line(), ": expected ", columns, " fields", options.header ? " (as in the header)" : "",
           ", found ", fields.size(), " (ragged row)");
    for (std::size_t c : feature_columns) feature_values.push_back(parse(fields[c], c));
    if (label_column) label_values.push_back(parse(fields[*label_column], *label_column));
    ++rows;
  }
  const auto n = static_cast<index_t>(rows);
  table.features = Tensor<T>(shape{n, static_cast<index_t>(feature_columns.size())},
                             std::span<const T>(feature_values.data(), feature_values.size()));
  if (label_column) table.labels = Tensor<T>(shape{n}, std::span<const T>(label_values.data(), label_values.size()));
  return table;
}

}  // namespace kiln::data
