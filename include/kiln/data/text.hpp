// Text for language models: a byte vocabulary, a corpus split into training and validation text, and the windows of
// a token stream with their next-token targets as a data set.
//   auto corpus = kiln::data::load_text_corpus(kiln::data::find_data_dir("text", data_flag));
//   kiln::data::text_windows train(corpus.train, 128);     // sample i: tokens [128 i, 128 i + 128), targets shifted
//   kiln::data::data_loader loader(train, {.batch_size = 32, .shuffle = true});
//
// The vocabulary is the 256 byte values: a token is a byte, so any file is text and no byte is unknown (the fortune
// files' backspace overstriking and UTF-8 stay as the bytes they are). load_text_corpus holds out the end of every
// file for validation, cut where an entry begins (after a line holding only "%", the fortune files' separator) at or
// after the held-out fraction, and joins the parts of all files in name order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/data/byte_source.hpp"

namespace kiln::data {

// Bytes as tokens: ids 0 to 255.
struct byte_vocabulary {
  static constexpr index_t size = 256;
  static std::vector<std::uint8_t> encode(std::string_view text) { return {text.begin(), text.end()}; }
  static std::string decode(std::span<const std::uint8_t> tokens) { return {tokens.begin(), tokens.end()}; }
  // Token id to byte, refusing ids outside the vocabulary.
  static std::uint8_t token(std::int64_t id) {
    if (id < 0 || id >= size) fail("byte_vocabulary: expected a token id in [0, 256), found ", id);
    return static_cast<std::uint8_t>(id);
  }
};

struct text_corpus_options {
  double validation_fraction = 0.1;                   // of each file's bytes, held out from its end
  std::uint64_t max_bytes = std::uint64_t{1} << 30;  // per file: a larger one is refused, not read
};

// A corpus split into the training text and the held-out text, each the files' parts joined in name order.
struct text_corpus {
  std::vector<std::uint8_t> train, validation;
  std::vector<std::filesystem::path> files;
};

// Where the validation part of `text` begins: the start of the first entry (the byte after a line "%") at or after
// the fraction's byte, else the last entry start before it, else the fraction's byte itself.
inline std::size_t validation_cut(std::span<const std::uint8_t> text, double validation_fraction) {
  const std::size_t n = text.size();
  const auto at = std::min(n, static_cast<std::size_t>(static_cast<double>(n) * (1.0 - validation_fraction)));
  auto entry_starts_at = [&](std::size_t i) {  // text[i - 3 .. i) == "\n%\n", or "%\n" at the start
    if (i >= 3) return text[i - 3] == '\n' && text[i - 2] == '%' && text[i - 1] == '\n';
    return i == 2 && text[0] == '%' && text[1] == '\n';
  };
  for (std::size_t i = at; i < n; ++i)
    if (entry_starts_at(i)) return i;
  for (std::size_t i = at; i-- > 2;)
    if (entry_starts_at(i)) return i;
  return at;
}

// Reads one file (plain or gzip) whole, within options.max_bytes.
inline std::vector<std::uint8_t> read_text_file(const std::filesystem::path& path,
                                                const text_corpus_options& options = {}) {
  byte_source source(path, "text file");
  std::vector<std::uint8_t> bytes;  // unsigned char: byte_source's own type
  if (auto size = source.known_size()) {
    if (*size > options.max_bytes)
      fail(path.string(), ": ", *size, " bytes of text, more than the limit of ", options.max_bytes,
           " (text_corpus_options::max_bytes)");
    source.read_exact_growing(bytes, *size, "text");
  } else {
    unsigned char chunk[1 << 16];
    while (std::size_t got = source.read_some(chunk, sizeof chunk)) {
      if (bytes.size() + got > options.max_bytes)
        fail(path.string(), ": text longer than the limit of ", options.max_bytes,
             " bytes (text_corpus_options::max_bytes)");
      bytes.insert(bytes.end(), chunk, chunk + got);
    }
  }
  return bytes;
}

// The corpus in `path`: every regular file directly inside it (in name order, hidden files skipped), or the one file
// it names. Throws kiln::error for a missing path, a directory without files, or a file over the limit.
inline text_corpus load_text_corpus(const std::filesystem::path& path, const text_corpus_options& options = {}) {
  namespace fs = std::filesystem;
  if (!(options.validation_fraction >= 0.0 && options.validation_fraction < 1.0))
    fail("load_text_corpus: expected validation_fraction in [0, 1), found ", options.validation_fraction);
  std::error_code ec;
  text_corpus corpus;
  if (fs::is_directory(path, ec)) {
    for (const auto& entry : fs::directory_iterator(path, ec))
      if (entry.is_regular_file() && entry.path().filename().string().rfind('.', 0) != 0)
        corpus.files.push_back(entry.path());
    if (ec) fail("load_text_corpus: cannot list ", path.string(), ": ", ec.message());
    std::sort(corpus.files.begin(), corpus.files.end());
    if (corpus.files.empty()) fail("load_text_corpus: expected text files in ", path.string(), ", found none");
  } else if (fs::exists(path, ec)) {
    corpus.files.push_back(path);
  } else {
    fail("load_text_corpus: expected a text file or a directory of them, found nothing at ", path.string());
  }
  for (const auto& file : corpus.files) {
    const std::vector<std::uint8_t> text = read_text_file(file, options);
    const std::size_t cut = validation_cut(text, options.validation_fraction);
    corpus.train.insert(corpus.train.end(), text.begin(), text.begin() + static_cast<std::ptrdiff_t>(cut));
    corpus.validation.insert(corpus.validation.end(), text.begin() + static_cast<std::ptrdiff_t>(cut), text.end());
  }
  return corpus;
}

// The windows of a token stream as a data set (data/dataset.hpp): sample i is the `context` tokens starting at
// i * stride, as whole numbers in Feature (an nn::Embedding reads them), and its label the `context` tokens one
// further on, the next token at every position. Holds a reference-free copy of the stream.
template <class Feature = float>
class text_windows {
 public:
  using feature_type = Feature;
  using label_type = std::int64_t;

  // stride 0: context (windows side by side, every token predicted once per epoch).
  text_windows(std::vector<std::uint8_t> tokens, index_t context, index_t stride = 0)
      : tokens_(std::move(tokens)), context_(context), stride_(stride > 0 ? stride : context) {
    if (context < 1) fail("text_windows: expected a context of at least 1 token, found ", context);
    if (stride < 0) fail("text_windows: expected a non-negative stride, found ", stride);
  }

  index_t size() const {
    const auto n = static_cast<index_t>(tokens_.size());
    return n > context_ ? (n - context_ - 1) / stride_ + 1 : 0;
  }
  shape sample_shape() const { return shape{context_}; }
  shape label_shape() const { return shape{context_}; }
  index_t context() const { return context_; }
  const std::vector<std::uint8_t>& tokens() const { return tokens_; }

  void get(index_t i, tensor_view<Feature> x, tensor_view<std::int64_t> y) const {
    if (i < 0 || i >= size()) fail("text_windows::get: index ", i, " is out of range for ", size(), " windows");
    if (x.numel() != context_ || y.numel() != context_)
      fail("text_windows::get: expected views of ", context_, " tokens, found ", x.shape(), " and ", y.shape());
    const std::uint8_t* start = tokens_.data() + i * stride_;
    for (index_t j = 0; j < context_; ++j) {
      x.data()[j] = static_cast<Feature>(start[j]);
      y.data()[j] = static_cast<std::int64_t>(start[j + 1]);
    }
  }

 private:
  std::vector<std::uint8_t> tokens_;
  index_t context_, stride_;
};

}  // namespace kiln::data
