// How the fusion rules (static/fusion_rules.hpp) are applied to a chain of layers, the same way at every level: the
// Sequential's executor (static/executor.hpp) and the chains inside blocks (static/blocks.hpp) both call choose before
// a pass and run for each position.
//
// choose decides every position of one pass in the pass's order: a position that is the partner of the rule chosen at
// its neighbour runs as that rule says; otherwise the first rule of the list that matches the position and applies to
// the pass runs it as its anchor; otherwise the layer runs its own forward or backward. The choices depend on the
// pass alone (options, batch, policy), so the same pass always gives the same choices, and nothing is carried from
// one layer or one pass to the next.
//
// G, the chain's plan: T, policy, layer_count, layer<I> (as written), bound<I> (bound to its input).
// X, the chain's runner: at<I>(pass) gives layer I's memory (params, buffers, dparams, x, y, dy, dx, scratch, ctx);
//    pass_through<I>() makes layer I's output its input. Pass: has `fuse` and `ctx`.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/static/fusion_rules.hpp"

namespace kiln::fusion {

// A position's choice: plain, the anchor of rule k (k), or the partner of rule k (partner_tag + k).
inline constexpr int plain = -1;
inline constexpr int partner_tag = 1000;

template <class Rules, std::size_t K>
struct rule_at;
template <class... R, std::size_t K>
struct rule_at<rule_list<R...>, K> {
  using type = std::tuple_element_t<K, std::tuple<R...>>;
};

// Which way a rule list's partners lie: forward rules take the position after the anchor, backward rules the one
// before it.
template <class Rules>
constexpr int partner_of(int k) {
  int partner = 0;
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    ((k == int(K) ? partner = rule_at<Rules, K>::type::partner : 0), ...);
  }(std::make_index_sequence<Rules::size>{});
  return partner;
}

// The first rule of Rules that matches position I of G and applies to the pass, or plain.
template <class G, class Rules, std::size_t I, class Pass>
int first_applying(const Pass& p) {
  int found = plain;
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    (
        [&] {
          using R = typename rule_at<Rules, K>::type;
          if constexpr (R::template matches<G, I>())
            if (found == plain && R::template applies<G, I>(p)) found = int(K);
        }(),
        ...);
  }(std::make_index_sequence<Rules::size>{});
  return found;
}

// Every position's choice for one pass, in the pass's order (Direction +1: forward; -1: backward), so that a
// partner is known before the position is considered as an anchor.
template <class G, class Rules, int Direction, class Pass>
std::array<int, G::layer_count> choose(const Pass& p) {
  constexpr std::size_t count = G::layer_count;
  std::array<int, count> choices;
  choices.fill(plain);
  const auto consider = [&]<std::size_t I>() {
    constexpr bool has_previous = Direction > 0 ? I > 0 : I + 1 < count;
    if constexpr (has_previous) {
      const int previous = choices[Direction > 0 ? I - 1 : I + 1];
      if (previous != plain && previous < partner_tag && partner_of<Rules>(previous) == Direction) {
        choices[I] = partner_tag + previous;
        return;
      }
    }
    choices[I] = first_applying<G, Rules, I>(p);
  };
  if constexpr (Direction > 0) {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (consider.template operator()<I>(), ...); }(
        std::make_index_sequence<count>{});
  } else {
    [&]<std::size_t... R>(std::index_sequence<R...>) { (consider.template operator()<count - 1 - R>(), ...); }(
        std::make_index_sequence<count>{});
  }
  return choices;
}

// Runs position I of G as `choice` says; returns false for plain, which the caller then runs.
template <class G, class Rules, std::size_t I, class X, class Pass>
bool run(int choice, X& x, const Pass& p) {
  bool done = false;
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    (
        [&] {
          using R = typename rule_at<Rules, K>::type;
          if constexpr (R::template matches<G, I>()) {
            if (choice == int(K)) {
              R::template anchor<G, I>(x, p);
              done = true;
            }
          }
          constexpr long anchor = long(I) - R::partner;
          if constexpr (anchor >= 0 && anchor < long(G::layer_count)) {
            if constexpr (R::template matches<G, std::size_t(anchor)>()) {
              if (choice == partner_tag + int(K)) {
                R::template partner_run<G, I>(x, p);
                done = true;
              }
            }
          }
        }(),
        ...);
  }(std::make_index_sequence<Rules::size>{});
  return done;
}

// The fusions a pass makes, one line each ("3.body.0 Conv2D(3x3) + 3.body.1 ReLU: activation into the layer before it
// (forward)"), labels[i] naming position i.
template <class Rules, std::size_t N>
void describe(const std::array<int, N>& choices, const std::vector<std::string>& labels,
              std::vector<std::string>& out) {
  for (std::size_t i = 0; i < N; ++i) {
    if (choices[i] == plain || choices[i] >= partner_tag) continue;
    const int k = choices[i];
    const long other = long(i) + partner_of<Rules>(k);
    const std::size_t lo = std::size_t(std::min(long(i), other)), hi = std::size_t(std::max(long(i), other));
    std::string rule;
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      ((k == int(K) ? (void)(rule = rule_at<Rules, K>::type::name) : (void)0), ...);
    }(std::make_index_sequence<Rules::size>{});
    out.push_back(labels[lo] + " + " + labels[hi] + ": " + rule);
  }
}

}  // namespace kiln::fusion
