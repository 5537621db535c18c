// What hosts report of the drafts (DraftRequest::accepted, SPEC §6): how many tokens of a slot's previous
// draft the target accepted. The book keeps each slot's last answered draft (its k' and temperature class)
// and tallies, per k' and class, the reports, the tokens accepted and, per position j, how many drafts
// reached j (every earlier token accepted) and how many of those had token j accepted: acceptance by position
// is accepted[j] / reached[j], the mean accepted length accepted_tokens / reports.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/api/status.hpp"
#include "lib/api/step_plan.hpp"

namespace dspark {

// The temperature classes acceptance is kept in: greedy (0), then (0, 0.5], (0.5, 1], (1, 2], (2, 100].
constexpr int kTemperatureClasses = 5;
int temperature_class(float tau);
// The class's label: "0", "(0,0.5]", "(0.5,1]", "(1,2]", "(2,100]".
const char* temperature_class_name(int c);

class AcceptanceBook {
 public:
  AcceptanceBook(int64_t slots, int64_t k);

  struct Report {
    int64_t k = 0;              // k' of the draft reported on
    int64_t accepted = 0;       // its tokens accepted, 0..k
    int temperature_class = 0;  // the draft's (temperature_class)
  };
  struct Taken {
    std::vector<Report> counted;
    int64_t unmatched = 0;  // reports for a slot without an answered draft, or above its k' (not counted)
  };
  // A step the ranks executed, answered `s` (OK or INTERNAL): its reports are counted against the slots'
  // last drafts; then each OK draft becomes its slot's last, and a reset or failed slot has none.
  Taken take(const StepPlan& plan, Status s);
  // Every slot's last draft forgotten (the host left: its slots were reset).
  void forget_all();

  struct Tally {
    uint64_t reports = 0, accepted_tokens = 0;
    std::vector<uint64_t> reached, accepted;  // per position 0..k'-1
  };
  // The tally of drafts of k' = k_prime (1..k) in a temperature class (greedy by default).
  const Tally& tally(int64_t k_prime, int temperature_class = 0) const;

 private:
  struct LastDraft {
    int32_t k = 0;  // k' of the slot's last answered draft, 0 = none
    int32_t temperature_class = 0;
  };
  int64_t k_;
  std::vector<LastDraft> last_;  // per slot
  std::vector<Tally> tallies_;   // by class * k + k' - 1
};

}  // namespace dspark
