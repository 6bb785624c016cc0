// CpuOnlyClassifier: tells, at the moment c10's CPU allocator is called, whether the allocation
// would be a CPU tensor in a GPU run of the same program too, so that the virtual GPU leaves it
// out (docs/virtual-gpu.md, "What reaches the virtual GPU"). The rules are those of
// tools/capture_trace.py's cpu_only_kind (docs/capturing-traces.md, "CPU-only allocations"),
// applied to the same information the profiler records: the stack of RecordFunction scopes
// (ops, autograd nodes, record_function ranges) open on the allocating thread, with each op's
// input shapes. A global RecordFunction callback keeps one stack per thread.
//
// Thread safety: Install/Uninstall from one thread at a time; Classify reads only the calling
// thread's stack.
#ifndef FRAGSCOPE_PYTHON_NATIVE_CPU_ONLY_H_
#define FRAGSCOPE_PYTHON_NATIVE_CPU_ONLY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace at {
class RecordFunction;
}

namespace fragscope::vgpu {

/// Why an allocation stays on the CPU in a GPU run; kNone = it would go to the device.
enum class CpuOnlyKind : std::uint8_t {
  kNone,
  kPythonScalar,     // a Python number wrapped into a 0-dim tensor outside any op
  kOpScalar,         // a Scalar argument wrapped into a 0-dim tensor inside an op
  kScalarPromotion,  // the dtype-promotion copy (nested aten::to) of such a scalar
  kStepCounter,      // an optimizer's `state['step'] = torch.tensor(0.)` inside Optimizer.step
  kRecordFunction,   // the handle record_function's enter op allocates (a CPU object)
};
inline constexpr int kNumCpuOnlyKinds = 6;

/// "python_scalar", "op_scalar", "scalar_promotion", "adam_step_counter", "record_function".
std::string_view CpuOnlyKindName(CpuOnlyKind kind);

/// Starts tracking op scopes on every thread (a global RecordFunction callback that needs the
/// ops' inputs). Idempotent.
void InstallScopeTracking();
/// Stops it; stacks of threads still inside ops are cleared lazily. Idempotent.
void UninstallScopeTracking();

/// The kind of an allocation of `bytes` made now on the calling thread.
CpuOnlyKind Classify(std::size_t bytes);

/// Ops, autograd nodes and ranges the tracking saw start on the calling thread since it was
/// installed (for the cost benchmark).
std::uint64_t ScopesEnteredOnThisThread();

/// A record_function range (RecordScope::USER_SCOPE) that allocates nothing: in 1.13,
/// torch.autograd.profiler.record_function makes a tensor in __init__ and another one in
/// __enter__ (CPU objects on a GPU run too); fragscope.torch uses this instead while a virtual
/// GPU is active, so that profilers and Classify still see the range (Optimizer.step#...).
class UserScope {
 public:
  explicit UserScope(std::string name);
  ~UserScope();
  UserScope(const UserScope&) = delete;
  UserScope& operator=(const UserScope&) = delete;
  void Enter();
  void Exit();

 private:
  std::string name_;
  std::unique_ptr<at::RecordFunction> record_;
};

}  // namespace fragscope::vgpu

#endif  // FRAGSCOPE_PYTHON_NATIVE_CPU_ONLY_H_
