// The Markov bias cache of SPEC §4 around the rows a rank holds (MarkovCache, lib/model/backend.hpp): the
// previous tokens the drafts saw and the cache's hits among them, and the token files an operator keeps.
#pragma once

#include <cstdint>
#include <filesystem>
#include <utility>
#include <vector>

namespace dspark {

// The previous tokens the Markov positions of the drafts saw (the anchor at position 0, then each drafted
// token), whether the cache held each, and how often each was seen: the hit rate, and the hottest tokens
// for the next start's token file.
class MarkovTokenBook {
 public:
  MarkovTokenBook() = default;
  // vocab: V; cached: the tokens with a bias row (each in [0, V)).
  MarkovTokenBook(int64_t vocab, const std::vector<int32_t>& cached);
  void count(int32_t prev);                             // a token outside [0, V) is not counted
  void set_cached(const std::vector<int32_t>& cached);  // the cache's new tokens (the counts stay)
  uint64_t lookups() const { return lookups_; }
  uint64_t hits() const { return hits_; }
  bool cached(int32_t token) const;
  // The n most seen tokens (most seen first, the lower id on equal counts) with their counts; only those
  // without a bias row when uncached_only.
  std::vector<std::pair<int32_t, uint64_t>> hottest(size_t n, bool uncached_only) const;

 private:
  std::vector<uint64_t> seen_;
  std::vector<bool> cached_;
  uint64_t lookups_ = 0, hits_ = 0;
};

// The token ids of a cache token file: whitespace-separated decimal ids, '#' to the end of a line a comment.
// Throws dspark::Error naming the file and line for a token that is not an id in [0, vocab) or appears
// twice, and for a file that cannot be read. Returns at most max_rows of them (the file's first).
std::vector<int32_t> read_markov_cache_tokens(const std::filesystem::path& file, int64_t vocab,
                                              int64_t max_rows);
// Writes `tokens` (id and count per line, most seen first) for a later read_markov_cache_tokens.
void write_markov_cache_tokens(const std::filesystem::path& file,
                               const std::vector<std::pair<int32_t, uint64_t>>& tokens);

}  // namespace dspark
