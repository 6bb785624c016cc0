#include "synthetic.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <random>

namespace fragscope::bench {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

// Builds a request trace: ids are dense, sizes in bytes, one stream.
class Gen {
 public:
  explicit Gen(std::uint64_t seed) : rng_(seed) {}

  std::uint64_t Alloc(std::uint64_t size) {
    Event e;
    e.action = Action::kAlloc;
    e.addr = ++next_id_;
    e.size = std::max<std::uint64_t>(size, 1);
    events_.push_back(e);
    return e.addr;
  }
  void Free(std::uint64_t id) {
    Event e;
    e.action = Action::kFreeRequested;
    e.addr = id;
    events_.push_back(e);
  }
  void Step(std::int64_t step) {
    Event e;
    e.action = Action::kStep;
    e.step = step;
    events_.push_back(e);
  }
  std::int64_t Uniform(std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng_);
  }
  double Real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }
  std::mt19937_64& rng() { return rng_; }
  std::vector<Event> Take() { return std::move(events_); }

 private:
  std::mt19937_64 rng_;
  std::uint64_t next_id_ = 0;
  std::vector<Event> events_;
};

// A decoder transformer's training step: forward keeps each layer's activations for backward,
// backward frees them in reverse while making short-lived gradient buffers, then an optimizer
// temporary. `seq(step)` gives the sequence length of the step.
template <typename SeqFn>
std::vector<Event> Decoder(std::int64_t steps, std::uint64_t seed, SeqFn seq) {
  Gen g(seed);
  const std::uint64_t layers = 12, d = 1024, batch = 8, heads = 8;
  std::vector<std::uint64_t> weights;
  for (std::uint64_t l = 0; l < layers; ++l) {
    for (std::uint64_t w : {3 * d * d * 2, d * d * 2, 4 * d * d * 2, 4 * d * d * 2})
      weights.push_back(g.Alloc(w));
  }
  std::vector<std::uint64_t> grads;
  for (std::int64_t s = 0; s < steps; ++s) {
    g.Step(s);
    const std::uint64_t len = seq(s, g);
    const std::uint64_t tokens = batch * len;
    const std::uint64_t h = tokens * d * 2;
    std::vector<std::vector<std::uint64_t>> saved(layers);
    for (std::uint64_t l = 0; l < layers; ++l) {
      saved[l].push_back(g.Alloc(h));
      saved[l].push_back(g.Alloc(3 * h));
      const std::uint64_t scores = g.Alloc(batch * heads * len * len * 2);
      saved[l].push_back(g.Alloc(h));
      g.Free(scores);  // flash-style: the score matrix does not outlive the layer
      saved[l].push_back(g.Alloc(4 * h));
      saved[l].push_back(g.Alloc(h));
    }
    const std::uint64_t logits = g.Alloc(tokens * 32000 * 2);
    g.Free(logits);
    for (std::uint64_t l = layers; l-- > 0;) {
      const std::uint64_t t1 = g.Alloc(4 * h);
      const std::uint64_t t2 = g.Alloc(h);
      g.Free(t1);
      g.Free(t2);
      for (std::uint64_t id : saved[l]) g.Free(id);
    }
    if (grads.empty()) {
      for (std::uint64_t l = 0; l < layers; ++l) {
        for (std::uint64_t w : {3 * d * d * 2, d * d * 2, 4 * d * d * 2, 4 * d * d * 2})
          grads.push_back(g.Alloc(w));
      }
    }
    const std::uint64_t opt = g.Alloc(4 * d * d * 4);
    g.Free(opt);
  }
  return g.Take();
}

// A CNN's training step: activations shrink spatially and grow in channels; `batch(step)`.
template <typename BatchFn>
std::vector<Event> Cnn(std::int64_t steps, std::uint64_t seed, BatchFn batch_of) {
  Gen g(seed);
  struct Layer {
    std::uint64_t channels, side;
  };
  std::vector<Layer> net;
  for (std::uint64_t stage = 0; stage < 4; ++stage) {
    for (int b = 0; b < 4; ++b) net.push_back({64u << stage, 112u >> stage});
  }
  for (const Layer& l : net) g.Alloc(l.channels * l.channels * 9 * 4);  // weights (kept)
  for (std::int64_t s = 0; s < steps; ++s) {
    g.Step(s);
    const std::uint64_t batch = batch_of(s, g);
    std::vector<std::uint64_t> saved;
    for (const Layer& l : net) {
      const std::uint64_t act = batch * l.channels * l.side * l.side * 2;
      saved.push_back(g.Alloc(act));              // conv output
      saved.push_back(g.Alloc(act));              // batch-norm output
      const std::uint64_t ws = g.Alloc(act / 2);  // cuDNN workspace
      g.Free(ws);
    }
    for (std::size_t i = saved.size(); i-- > 0;) {
      const std::uint64_t grad = g.Alloc(g.rng()() % 2 == 0 ? 4 * kMiB : 6 * kMiB);
      g.Free(saved[i]);
      g.Free(grad);
    }
  }
  return g.Take();
}

// A mixture-of-experts layer stack: each step routes a fixed number of tokens to 8 experts with
// data-dependent (skewed, drifting) shares; each expert's buffers are sized by its tokens.
std::vector<Event> Moe(std::int64_t steps, std::uint64_t seed) {
  Gen g(seed);
  const std::uint64_t experts = 8, layers = 8, d = 1024, tokens = 16384;
  for (std::uint64_t i = 0; i < layers * experts; ++i) g.Alloc(2 * d * 4 * d * 2);
  std::gamma_distribution<double> share(0.7, 1.0);
  for (std::int64_t s = 0; s < steps; ++s) {
    g.Step(s);
    std::vector<std::uint64_t> saved;
    for (std::uint64_t l = 0; l < layers; ++l) {
      std::vector<double> w(experts);
      double sum = 0;
      for (double& x : w) sum += (x = share(g.rng()) + 1e-3);
      saved.push_back(g.Alloc(tokens * d * 2));
      for (double x : w) {
        const auto t = static_cast<std::uint64_t>(x / sum * static_cast<double>(tokens)) + 1;
        saved.push_back(g.Alloc(t * d * 2));      // dispatched tokens
        saved.push_back(g.Alloc(t * 4 * d * 2));  // expert hidden
        const std::uint64_t out = g.Alloc(t * d * 2);
        saved.push_back(out);
      }
    }
    for (std::size_t i = saved.size(); i-- > 0;) g.Free(saved[i]);
  }
  return g.Take();
}

// An inference server: requests arrive (more of them as traffic ramps up over the run), each
// holds a key/value cache that grows by reallocation every 16 tokens (the torch.cat pattern),
// and leaves after a random number of generated tokens. One step = one decode iteration.
std::vector<Event> KvServer(std::int64_t steps, std::uint64_t seed) {
  Gen g(seed);
  const std::uint64_t per_token = 2 * 24 * 2048 * 2;  // K and V, 24 layers, 2048 wide, fp16
  for (int i = 0; i < 48; ++i) g.Alloc(32 * kMiB);    // weights
  struct Request {
    std::uint64_t tokens, left, cache;
  };
  std::deque<Request> active;
  for (std::int64_t s = 0; s < steps; ++s) {
    g.Step(s);
    const double ramp = static_cast<double>(s) / static_cast<double>(steps);
    const auto cap = static_cast<std::size_t>(4 + 28 * ramp);
    while (active.size() < cap && g.Real(0, 1) < 0.5) {
      const auto prompt = static_cast<std::uint64_t>(g.Uniform(32, 1024));
      active.push_back({prompt, static_cast<std::uint64_t>(g.Uniform(16, 512)),
                        g.Alloc(((prompt + 15) / 16) * 16 * per_token)});
    }
    const std::uint64_t act = g.Alloc(active.size() * 2048 * 2 * 8 + 1);
    for (auto it = active.begin(); it != active.end();) {
      ++it->tokens;
      if (--it->left == 0) {
        g.Free(it->cache);
        it = active.erase(it);
        continue;
      }
      if (it->tokens % 16 == 0) {
        const std::uint64_t bigger = g.Alloc((it->tokens + 16) * per_token);
        g.Free(it->cache);
        it->cache = bigger;
      }
      ++it;
    }
    g.Free(act);
  }
  return g.Take();
}

}  // namespace

std::vector<SyntheticWorkload> MakeSyntheticWorkloads(std::int64_t steps, std::uint64_t seed) {
  std::vector<SyntheticWorkload> out;
  // Variable length with a length curriculum: the longest allowed sequence grows over the run,
  // each batch draws its length in [max/2, max] (multiples of 64).
  out.push_back(
      {"synthetic_decoder_varlen", Decoder(steps, seed + 1, [steps](std::int64_t s, Gen& g) {
         const double f = static_cast<double>(s) / static_cast<double>(steps);
         const auto max_len = static_cast<std::int64_t>(256 + 1792 * f);
         return static_cast<std::uint64_t>(64 * g.Uniform(max_len / 128, max_len / 64));
       })});
  out.push_back({"synthetic_decoder_fixed",
                 Decoder(steps, seed + 2, [](std::int64_t, Gen&) { return std::uint64_t{1024}; })});
  out.push_back({"synthetic_cnn_fixed_batch",
                 Cnn(steps, seed + 3, [](std::int64_t, Gen&) { return std::uint64_t{32}; })});
  out.push_back({"synthetic_cnn_var_batch", Cnn(steps, seed + 4, [](std::int64_t, Gen& g) {
                   return static_cast<std::uint64_t>(g.Uniform(8, 48));
                 })});
  out.push_back({"synthetic_moe_routing", Moe(steps, seed + 5)});
  out.push_back({"synthetic_kv_cache_server", KvServer(steps, seed + 6)});
  return out;
}

}  // namespace fragscope::bench
