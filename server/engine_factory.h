// Builds the engine verifyd serves from its flags: the one place that knows the backends.
// Thread-safety: a pure function (the engine it returns follows tp/engine.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tp/checkpoint_reader.h"
#include "tp/engine.h"
#include "tp/engine_options.h"

namespace verifyd::server {

struct EngineSpec {
  std::string backend = "auto";  // cpu | cuda | auto (cuda when built and a GPU is present,
                                 // else cpu) | toy (test stand-in, no model)
  // What the engine is built from (model, seed, tp, kv_slots, limits.max_batch, ...), handed
  // unchanged to the backend. The server's default pool is larger than the engine's.
  tp::EngineOptions engine = [] {
    tp::EngineOptions o;
    o.kv_slots = 65536;
    return o;
  }();
  // Fault injection for the reliability tests (cpu backend only; "" = none), installed as
  // engine.fault_hook:
  //   "fail:<rank>@<step>"  rank fails at engine step <step> (0-based): engine failed
  //   "slow:<ms>"           every step, rank 0 first sleeps <ms> ms (calls stay in flight)
  //   "load:<ms>"           the model load takes <ms> ms longer (listeners up, not serving)
  std::string testing_fault;
  // Called as a checkpoint's tensors are read (tp/checkpoint_reader.h LoadProgress: shards,
  // bytes, time), one call at a time, from the loading threads; unused for presets.
  tp::LoadProgressCallback on_load_progress;
};

// InvalidArgument for a bad spec (naming the flag), Unavailable for a backend not built or
// without devices, or the backend's own error. A checkpoint directory (engine.model, cpu /
// cuda / auto) is opened here once (tp::CheckpointWeightSource: headers validated, the number
// of files and mapped bytes logged) and passed to the engine as engine.source; a bad
// checkpoint fails here naming the file and the tensor.
absl::StatusOr<std::unique_ptr<tp::Engine>> CreateEngine(const EngineSpec& spec);

}  // namespace verifyd::server
