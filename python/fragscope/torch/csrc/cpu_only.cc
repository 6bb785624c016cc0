#include "cpu_only.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <ATen/record_function.h>

namespace fragscope::vgpu {
namespace {

// Ops that only allocate on behalf of the op around them (tools/capture_trace.py's
// ALLOC_HELPER_OPS) and ops whose real output is made from Scalar arguments (FACTORY_OPS).
constexpr std::array<std::string_view, 18> kAllocHelperOps = {"aten::empty",
                                                              "aten::empty_like",
                                                              "aten::empty_strided",
                                                              "aten::new_empty",
                                                              "aten::new_empty_strided",
                                                              "aten::resize_",
                                                              "aten::zeros",
                                                              "aten::zeros_like",
                                                              "aten::ones_like",
                                                              "aten::full",
                                                              "aten::full_like",
                                                              "aten::new_zeros",
                                                              "aten::clone",
                                                              "aten::contiguous",
                                                              "aten::to",
                                                              "aten::_to_copy",
                                                              "aten::copy_",
                                                              "aten::lift_fresh"};
constexpr std::array<std::string_view, 8> kFactoryOps = {
    "aten::arange", "aten::scalar_tensor", "aten::full",   "aten::linspace",
    "aten::ones",   "aten::zeros",         "aten::tensor", "aten::randint"};

enum FrameFlag : std::uint16_t {
  kUserScope = 1 << 0,         // a record_function range, not an op (the capture has none)
  kOptimizerStep = 1 << 1,     // record_function("Optimizer.step#...")
  kHelper = 1 << 2,            // in kAllocHelperOps
  kFactory = 1 << 3,           // in kFactoryOps
  kScalarInput = 1 << 4,       // an input is a Scalar (the profiler's dtype "Scalar", shape [])
  kToOf0Dim = 1 << 5,          // aten::to whose first input is a 0-dim tensor
  kEmpty = 1 << 6,             // aten::empty
  kRecordFunctionOp = 1 << 7,  // profiler::_record_function_enter / _exit
};

struct Frame {
  const at::RecordFunction* fn;  // identifies the frame: live RecordFunctions do not share it
  std::uint16_t flags;
};

struct ThreadStack {
  std::uint64_t generation = 0;
  std::vector<Frame> frames;
  std::uint64_t entered = 0;  // scopes entered on this thread since tracking started
};

std::atomic<std::uint64_t> g_generation{1};
std::mutex g_install_mutex;
at::CallbackHandle g_handle = at::INVALID_CALLBACK_HANDLE;

ThreadStack& Stack() {
  thread_local ThreadStack stack;
  const std::uint64_t generation = g_generation.load(std::memory_order_relaxed);
  if (stack.generation != generation) {
    stack.frames.clear();
    stack.generation = generation;
    stack.entered = 0;
  }
  return stack;
}

bool In(std::string_view name, const auto& set) {
  return std::find(set.begin(), set.end(), name) != set.end();
}

std::uint16_t FlagsOf(const at::RecordFunction& fn) {
  const std::string_view name = fn.name();
  std::uint16_t flags = 0;
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    flags |= kUserScope;
    if (name.starts_with("Optimizer.step#")) flags |= kOptimizerStep;
    return flags;
  }
  if (name.starts_with("aten::")) {
    if (In(name, kAllocHelperOps)) flags |= kHelper;
    if (In(name, kFactoryOps)) flags |= kFactory;
    if (name == "aten::empty") flags |= kEmpty;
  } else if (name.starts_with("profiler::_record_function")) {
    flags |= kRecordFunctionOp;
  }
  const auto inputs = fn.inputs();
  for (const c10::IValue& input : inputs) {
    if (input.isScalar()) {
      flags |= kScalarInput;
      break;
    }
  }
  if (name == "aten::to" && !inputs.empty() && inputs[0].isTensor()) {
    const at::Tensor& self = inputs[0].toTensor();
    if (self.defined() && self.dim() == 0) flags |= kToOf0Dim;
  }
  return flags;
}

// No ObserverContext (a heap allocation per op): the frame is found by its RecordFunction.
std::unique_ptr<at::ObserverContext> OnEnter(const at::RecordFunction& fn) {
  ThreadStack& stack = Stack();
  stack.frames.push_back(Frame{&fn, FlagsOf(fn)});
  ++stack.entered;
  return nullptr;
}

void OnExit(const at::RecordFunction& fn, at::ObserverContext* /*context*/) {
  auto& frames = Stack().frames;
  if (!frames.empty() && frames.back().fn == &fn) [[likely]] {
    frames.pop_back();
    return;
  }
  // torch's own record_function range starts inside its enter op and ends inside its exit op,
  // so ranges and ops need not nest; an op entered before tracking started is not there.
  for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
    if (it->fn == &fn) {
      frames.erase(std::next(it).base());
      return;
    }
  }
}

}  // namespace

std::string_view CpuOnlyKindName(CpuOnlyKind kind) {
  switch (kind) {
    case CpuOnlyKind::kNone:
      return "none";
    case CpuOnlyKind::kPythonScalar:
      return "python_scalar";
    case CpuOnlyKind::kOpScalar:
      return "op_scalar";
    case CpuOnlyKind::kScalarPromotion:
      return "scalar_promotion";
    case CpuOnlyKind::kStepCounter:
      return "adam_step_counter";
    case CpuOnlyKind::kRecordFunction:
      return "record_function";
  }
  return "none";
}

void InstallScopeTracking() {
  std::lock_guard<std::mutex> lock(g_install_mutex);
  if (g_handle != at::INVALID_CALLBACK_HANDLE) return;
  g_generation.fetch_add(1, std::memory_order_relaxed);
  g_handle = at::addGlobalCallback(at::RecordFunctionCallback(&OnEnter, &OnExit).needsInputs(true));
}

void UninstallScopeTracking() {
  std::lock_guard<std::mutex> lock(g_install_mutex);
  if (g_handle == at::INVALID_CALLBACK_HANDLE) return;
  at::removeCallback(g_handle);
  g_handle = at::INVALID_CALLBACK_HANDLE;
  g_generation.fetch_add(1, std::memory_order_relaxed);
}

CpuOnlyKind Classify(std::size_t bytes) {
  if (bytes > 16) return CpuOnlyKind::kNone;  // every CPU-only kind is a 0-dim tensor
  const auto& all = Stack().frames;
  bool in_optimizer = false;
  // The ops open on this thread, outermost first, without record_function ranges.
  thread_local std::vector<std::uint16_t> ops;
  ops.clear();
  for (const Frame& frame : all) {
    if (frame.flags & kUserScope) {
      in_optimizer = in_optimizer || (frame.flags & kOptimizerStep) != 0;
    } else {
      if (frame.flags & kRecordFunctionOp) return CpuOnlyKind::kRecordFunction;
      ops.push_back(frame.flags);
    }
  }
  if (ops.empty()) return CpuOnlyKind::kPythonScalar;
  if (in_optimizer && ops.size() == 1 && (ops[0] & kEmpty)) return CpuOnlyKind::kStepCounter;
  const std::uint16_t parent = ops.back();
  if ((bytes == 1 || bytes == 8 || bytes == 16) && !(parent & (kHelper | kFactory)) &&
      (parent & kScalarInput)) {
    return CpuOnlyKind::kOpScalar;
  }
  for (std::size_t i = 1; i < ops.size(); ++i) {
    if ((ops[i] & kToOf0Dim) && !(ops[i - 1] & kHelper)) return CpuOnlyKind::kScalarPromotion;
  }
  return CpuOnlyKind::kNone;
}

std::uint64_t ScopesEnteredOnThisThread() { return Stack().entered; }

UserScope::UserScope(std::string name) : name_(std::move(name)) {}
UserScope::~UserScope() = default;

void UserScope::Enter() {
  record_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (record_->isActive()) record_->before(name_);
}

void UserScope::Exit() { record_.reset(); }  // the destructor runs the end callbacks

}  // namespace fragscope::vgpu
