// VerifyBfcRemedies: `fragscope explain LOG --trace T` for a TensorFlow / JAX failure. Replays
// the job's request trace through the BFC allocator model (model::BfcRequestReplayer) once
// under the job's own settings and once per remedy that names a framework setting the model
// knows (memory growth / preallocation, the memory fraction, a memory limit, garbage
// collection), then ranks the remedies as VerifyRemedies does for PyTorch's. The settings that
// leave the BFC allocator (TF_GPU_ALLOCATOR=cuda_malloc_async,
// XLA_PYTHON_CLIENT_ALLOCATOR=platform) get a bound instead: the trace's live bytes against the
// same limit, which is what an allocator without a pool to fragment could at best do; the
// report says it is a bound. docs/explain.md, "Replaying TensorFlow and JAX remedies".
//
// Thread safety: a pure function over its arguments.
#ifndef FRAGSCOPE_ANALYSIS_BFC_VERIFY_H_
#define FRAGSCOPE_ANALYSIS_BFC_VERIFY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analysis/bfc_explain.h"
#include "fragscope/bfc_report.h"
#include "fragscope/event.h"
#include "fragscope/status.h"
#include "model/bfc_allocator_sim.h"

namespace fragscope::analysis {

/// The job's BFC settings as the log shows them: the memory limit L, and preallocation when the
/// pool is one region of the whole limit (growth otherwise), or what the log's
/// "(growth enabled)" / TF_FORCE_GPU_ALLOW_GROWTH / XLA_PYTHON_CLIENT_PREALLOCATE says. `why`
/// receives a sentence naming the evidence.
model::BfcSettings JobBfcSettings(const BfcReport& report, const BfcLogContext& context,
                                  std::string* why);

/// The BFC settings a remedy's framework setting (Remedy::setting) gives when applied to
/// `current`; nullopt when the model cannot replay it (a code change, a setting outside the
/// BFC allocator, a fraction without a device size), and then `why_not` (optional) says why.
/// `kind` tells model or bound.
std::optional<model::BfcSettings> ApplyBfcRemedy(const std::string& setting,
                                                 const model::BfcSettings& current,
                                                 bool capacity_known, BfcCheckKind* kind,
                                                 std::string* why_not = nullptr);

/// Replays `requests` under the job's settings and each remedy's, fills each replayed remedy's
/// check and re-ranks: settings that avoid the OOM first (lowest peak pool first), then the
/// remedies a replay cannot test in their order, then settings that still run out of memory
/// (the later OOM first), then those worse than the job's own. Errors: a bad current_conf or a
/// trace the replayer rejects (kInvalidArgument naming the request event).
Result<BfcVerification> VerifyBfcRemedies(const std::vector<Event>& requests,
                                          const BfcReport& report, const BfcLogContext& context,
                                          const BfcVerifyOptions& options,
                                          BfcExplanation* explanation);

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_BFC_VERIFY_H_
