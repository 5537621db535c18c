#include "lib/bench/local_exchanges.hpp"

#include "lib/core/error.hpp"

namespace dspark::bench {

void LocalExchangeCommunicator::all_reduce_sum(const Tensor& partial) {
  exchange(Kind::sum, partial);
}

void LocalExchangeCommunicator::argmax_exchange(const Tensor& cand) {
  exchange(Kind::argmax, cand);
}

void LocalExchangeCommunicator::exchange(Kind kind, const Tensor& t) {
  nth_ = kind == last_ ? nth_ + 1 : 0;
  last_ = kind;
  const Key key{kind, nth_, t.dtype, t.shape};
  const char* what = kind == Kind::sum ? "sum" : "argmax exchange";
  if (mode_ == Mode::learn) {
    if (kind == Kind::sum)
      inner_.all_reduce_sum(t);
    else
      inner_.argmax_exchange(t);
    auto it = kept_.find(key);
    if (it == kept_.end()) it = kept_.emplace(key, be_.alloc(t.dtype, t.shape)).first;
    be_.copy(t, it->second);  // the last learned step of this shape is the one kept
    ++learned_;
    return;
  }
  const auto it = kept_.find(key);
  if (it == kept_.end())
    fail("local exchanges: {} {} of a step on {} {} was never learned (run the step in learn mode first)",
         what, nth_, dtype_name(t.dtype), shape_str(t.shape));
  be_.copy(it->second, t);
  ++copied_;
}

}  // namespace dspark::bench
