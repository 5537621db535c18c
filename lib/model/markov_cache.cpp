#include "lib/model/markov_cache.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "lib/core/error.hpp"

namespace dspark {

MarkovTokenBook::MarkovTokenBook(int64_t vocab, const std::vector<int32_t>& cached)
    : seen_(static_cast<size_t>(vocab), 0), cached_(static_cast<size_t>(vocab), false) {
  set_cached(cached);
}

void MarkovTokenBook::set_cached(const std::vector<int32_t>& cached) {
  std::fill(cached_.begin(), cached_.end(), false);
  for (const int32_t t : cached)
    if (t >= 0 && static_cast<size_t>(t) < cached_.size()) cached_[static_cast<size_t>(t)] = true;
}

bool MarkovTokenBook::cached(int32_t token) const {
  return token >= 0 && static_cast<size_t>(token) < cached_.size() && cached_[static_cast<size_t>(token)];
}

void MarkovTokenBook::count(int32_t prev) {
  if (prev < 0 || static_cast<size_t>(prev) >= seen_.size()) return;
  ++lookups_;
  if (cached_[static_cast<size_t>(prev)]) ++hits_;
  ++seen_[static_cast<size_t>(prev)];
}

std::vector<std::pair<int32_t, uint64_t>> MarkovTokenBook::hottest(size_t n, bool uncached_only) const {
  std::vector<std::pair<int32_t, uint64_t>> all;
  for (size_t t = 0; t < seen_.size(); ++t)
    if (seen_[t] > 0 && !(uncached_only && cached_[t])) all.emplace_back(static_cast<int32_t>(t), seen_[t]);
  const auto hotter = [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  };
  const size_t m = std::min(n, all.size());
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(m), all.end(), hotter);
  all.resize(m);
  return all;
}

std::vector<int32_t> read_markov_cache_tokens(const std::filesystem::path& file, int64_t vocab,
                                              int64_t max_rows) {
  std::ifstream in(file);
  if (!in) fail("markov_cache.tokens_file: cannot read {}", file.string());
  std::vector<int32_t> tokens;
  std::vector<bool> seen(static_cast<size_t>(vocab), false);
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    std::istringstream words(line.substr(0, line.find('#')));
    std::string w;
    // A line is "id" or "id count" (write_markov_cache_tokens' form): its first word is the token.
    if (!(words >> w)) continue;
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(w, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != w.size() || id < 0 || id >= vocab)
      fail("markov_cache.tokens_file {} line {}: '{}' is not a token id in [0, {})", file.string(), n, w,
           vocab);
    if (seen[static_cast<size_t>(id)])
      fail("markov_cache.tokens_file {} line {}: token {} is listed twice", file.string(), n, id);
    seen[static_cast<size_t>(id)] = true;
    tokens.push_back(static_cast<int32_t>(id));
  }
  if (static_cast<int64_t>(tokens.size()) > max_rows) tokens.resize(static_cast<size_t>(max_rows));
  return tokens;
}

void write_markov_cache_tokens(const std::filesystem::path& file,
                               const std::vector<std::pair<int32_t, uint64_t>>& tokens) {
  const std::filesystem::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) fail("markov_cache.hot_tokens_file: cannot write {}", tmp.string());
    out << "# previous tokens of the Markov positions, most seen first: id count\n";
    for (const auto& [id, n] : tokens) out << id << ' ' << n << '\n';
    if (!out.flush()) fail("markov_cache.hot_tokens_file: cannot write {}", tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec)
    fail("markov_cache.hot_tokens_file: cannot rename {} to {}: {}", tmp.string(), file.string(),
         ec.message());
}

}  // namespace dspark
