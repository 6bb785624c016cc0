#include "sources/call_site.h"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace fragscope::sources {
namespace {

// ---- The rules ------------------------------------------------------------------------------

// How a rule looks at a frame. A C++ frame's "head" is its qualified function name: the name
// without a return type, template arguments or parameters ("void at::meta::f<T>(int)" reads
// "at::meta::f"); "(anonymous namespace)" counts as a component.
enum class Match : std::uint8_t {
  kNameIs,        // the whole name equals the text
  kHeadPrefix,    // the head starts with the text
  kHeadContains,  // the head contains the text
  kFileContains,  // the file name contains the text
};

struct FrameRule {
  Match match;
  std::string_view text;
  FrameRole role;
};

// The first rule that matches a C++ frame gives its role; none: kNative. Python frames (.py
// files) are told apart before these, by kTorchPackage below. Order matters where prefixes
// overlap: a more specific rule comes first.
constexpr FrameRule kFrameRules[] = {
    // No function name: nothing to show.
    {Match::kNameIs, "", FrameRole::kUnknown},
    {Match::kNameIs, "??", FrameRole::kUnknown},
    // The code that captured the stack for the snapshot.
    {Match::kHeadPrefix, "torch::unwind::", FrameRole::kUnwinder},
    {Match::kHeadPrefix, "torch::CapturedTraceback::", FrameRole::kUnwinder},
    {Match::kHeadPrefix, "torch::cuda::(anonymous namespace)::gather", FrameRole::kUnwinder},
    // The operator: at::_ops::<op>::call / ::redispatch, or a profiler-style aten::<op>.
    {Match::kHeadPrefix, "at::_ops::", FrameRole::kOperator},
    {Match::kHeadPrefix, "aten::", FrameRole::kOperator},
    // The caching allocator and c10's allocator interface (c10::Allocator, CUDAAllocator, ...).
    {Match::kHeadPrefix, "c10::cuda::CUDACachingAllocator::", FrameRole::kAllocator},
    {Match::kHeadContains, "Allocator::", FrameRole::kAllocator},
    // Tensor factories, the dispatcher, boxing, generated registration wrappers, structured
    // kernels' shape checks.
    {Match::kHeadPrefix, "at::detail::", FrameRole::kDispatcher},
    {Match::kHeadPrefix, "at::native::empty_", FrameRole::kDispatcher},
    {Match::kHeadPrefix, "at::meta::", FrameRole::kDispatcher},
    {Match::kHeadPrefix, "at::(anonymous namespace)::", FrameRole::kDispatcher},
    {Match::kHeadPrefix, "c10::Dispatcher", FrameRole::kDispatcher},
    {Match::kHeadPrefix, "c10::impl::", FrameRole::kDispatcher},
    {Match::kHeadPrefix, "c10::BoxedKernel", FrameRole::kDispatcher},
    {Match::kHeadPrefix, "c10::KernelFunction", FrameRole::kDispatcher},
    {Match::kHeadPrefix, "c10::OperatorHandle", FrameRole::kDispatcher},
    {Match::kHeadPrefix, "c10::TypedOperatorHandle", FrameRole::kDispatcher},
    {Match::kFileContains, "Register", FrameRole::kDispatcher},  // RegisterCUDA.cpp, ...
    {Match::kFileContains, "core/boxing/", FrameRole::kDispatcher},
    // Autograd: helpers of generated nodes, the nodes themselves, the backward threads' entry,
    // and the rest of its machinery (VariableType wrappers, Engine, Node::operator()).
    {Match::kHeadPrefix, "torch::autograd::generated::details::", FrameRole::kAutograd},
    {Match::kHeadPrefix, "torch::autograd::generated::", FrameRole::kAutogradNode},
    {Match::kHeadPrefix, "torch::autograd::AccumulateGrad::", FrameRole::kAutogradNode},
    {Match::kHeadPrefix, "torch::autograd::Engine::thread_", FrameRole::kBackwardEntry},
    {Match::kHeadPrefix, "torch::autograd::python::PythonEngine::thread_",
     FrameRole::kBackwardEntry},
    {Match::kHeadPrefix, "torch::autograd::", FrameRole::kAutograd},
    {Match::kFileContains, "VariableType", FrameRole::kAutograd},
    // CPython's C functions, binding glue, and the C runtime's entry points.
    {Match::kHeadPrefix, "_Py", FrameRole::kInterpreter},
    {Match::kHeadPrefix, "Py", FrameRole::kInterpreter},
    {Match::kHeadPrefix, "pymain_", FrameRole::kInterpreter},
    {Match::kHeadPrefix, "cfunction_", FrameRole::kInterpreter},
    {Match::kHeadPrefix, "method_vectorcall", FrameRole::kInterpreter},
    {Match::kHeadPrefix, "slot_tp_", FrameRole::kInterpreter},
    {Match::kHeadPrefix, "pybind11::", FrameRole::kInterpreter},
    {Match::kHeadPrefix, "_start", FrameRole::kInterpreter},
    {Match::kHeadPrefix, "__libc_start", FrameRole::kInterpreter},
    {Match::kHeadPrefix, "start_thread", FrameRole::kInterpreter},
    {Match::kHeadPrefix, "execute_native_thread_routine", FrameRole::kInterpreter},
    {Match::kHeadPrefix, "pthread_", FrameRole::kInterpreter},
    {Match::kNameIs, "clone", FrameRole::kInterpreter},
    {Match::kFileContains, "libpython", FrameRole::kInterpreter},
    {Match::kFileContains, "Python/", FrameRole::kInterpreter},
    {Match::kFileContains, "Objects/", FrameRole::kInterpreter},
    {Match::kFileContains, "Modules/main.c", FrameRole::kInterpreter},
};

// A .py file inside torch's own package: a path with a torch/ component (site-packages,
// dist-packages or a source tree), or one that starts with it.
constexpr std::string_view kTorchPackage[] = {"/torch/", "\\torch\\"};
constexpr std::string_view kTorchPackageStart = "torch/";

// What the label says for the thread a C++ stack ran on, by the role of its entry frame.
constexpr std::string_view kBackwardThread = "autograd backward thread";

// Pieces of a label are cut to this many bytes (a name is untrusted input).
constexpr std::size_t kMaxLabelPiece = 200;

// ---- Reading names --------------------------------------------------------------------------

constexpr std::string_view kAnonymous = "(anonymous namespace)";

// The qualified function name of a C++ frame's name (see Match): a space outside template
// arguments ends a return type, template arguments are left out, the first '(' that does not
// open "(anonymous namespace)" ends it.
std::string Head(std::string_view name) {
  std::string head;
  int depth = 0;
  std::size_t i = 0;
  while (i < name.size()) {
    const char c = name[i];
    if (c == '(' && name.substr(i, kAnonymous.size()) == kAnonymous) {
      if (depth == 0) head += kAnonymous;
      i += kAnonymous.size();
      continue;
    }
    if (c == '<') {
      ++depth;
    } else if (c == '>' && depth > 0) {
      --depth;
    } else if (depth == 0) {
      if (c == '(') break;
      if (c == ' ') {
        head.clear();  // what came before was a return type
      } else {
        head += c;
      }
    }
    ++i;
  }
  return head;
}

bool Matches(const FrameRule& rule, const FrameText& frame, std::string_view head) {
  switch (rule.match) {
    case Match::kNameIs:
      return frame.name == rule.text;
    case Match::kHeadPrefix:
      return head.starts_with(rule.text);
    case Match::kHeadContains:
      return head.find(rule.text) != std::string_view::npos;
    case Match::kFileContains:
      return frame.filename.find(rule.text) != std::string_view::npos;
  }
  return false;
}

bool IsPythonFile(std::string_view filename) {
  return filename.size() > 3 && filename.ends_with(".py");
}

bool InTorchPackage(std::string_view filename) {
  if (filename.starts_with(kTorchPackageStart)) return true;
  for (const std::string_view part : kTorchPackage) {
    if (filename.find(part) != std::string_view::npos) return true;
  }
  return false;
}

std::string_view Cut(std::string_view text) { return text.substr(0, kMaxLabelPiece); }

// "at::_ops::bmm::call" -> "at::_ops::bmm"; "aten::mm" stays.
std::string OperatorName(std::string head) {
  constexpr std::string_view kOps = "at::_ops::";
  if (!head.starts_with(kOps)) return head;
  const std::size_t end = head.find("::", kOps.size());
  if (end != std::string::npos) head.resize(end);
  return head;
}

// The class of a node's method: "torch::autograd::generated::BmmBackward0::apply" ->
// "BmmBackward0", "torch::autograd::AccumulateGrad::accumulateGrad" -> "AccumulateGrad".
std::string NodeName(std::string_view head) {
  const std::size_t last = head.rfind("::");
  if (last == std::string_view::npos) return std::string(head);
  head = head.substr(0, last);
  const std::size_t before = head.rfind("::");
  return std::string(before == std::string_view::npos ? head : head.substr(before + 2));
}

}  // namespace

FrameRole ClassifyFrame(const FrameText& frame) {
  if (IsPythonFile(frame.filename)) {
    return InTorchPackage(frame.filename) ? FrameRole::kTorchPython : FrameRole::kUserPython;
  }
  const std::string head = Head(frame.name);
  for (const FrameRule& rule : kFrameRules) {
    if (Matches(rule, frame, head)) return rule.role;
  }
  return FrameRole::kNative;
}

bool IsMachinery(FrameRole role) {
  switch (role) {
    case FrameRole::kUserPython:
    case FrameRole::kTorchPython:
    case FrameRole::kNative:
      return false;
    default:
      return true;
  }
}

CallSite ChooseCallSite(std::span<const FrameText> frames, std::span<const FrameRole> roles) {
  CallSite site;
  const std::size_t n = std::min(frames.size(), roles.size());
  if (n == 0) return site;
  std::int32_t first_python = -1;
  for (std::size_t i = 0; i < n; ++i) {
    if (roles[i] == FrameRole::kUserPython) {
      site.frame = static_cast<std::int32_t>(i);
      return site;
    }
    if (roles[i] == FrameRole::kTorchPython && first_python < 0) {
      first_python = static_cast<std::int32_t>(i);
    }
  }
  if (first_python >= 0) {
    site.frame = first_python;
    return site;
  }
  // C++ frames only.
  bool backward_thread = false;
  std::string op, node, native;
  for (std::size_t i = 0; i < n; ++i) {
    switch (roles[i]) {
      case FrameRole::kBackwardEntry:
        backward_thread = true;
        break;
      case FrameRole::kOperator:
        op = OperatorName(Head(frames[i].name));  // the outermost one stays
        break;
      case FrameRole::kAutogradNode:
        if (node.empty()) node = NodeName(Head(frames[i].name));
        break;
      case FrameRole::kNative:
        if (native.empty()) native = Head(frames[i].name);
        break;
      default:
        break;
    }
  }
  std::string what;
  if (!op.empty()) {
    what = Cut(op);
    if (!node.empty()) {
      what += " in ";
      what += Cut(node);
    }
  } else if (!node.empty()) {
    what = Cut(node);
  } else {
    what = Cut(native);
  }
  site.label = "C++ only";
  if (backward_thread) {
    site.label += " (";
    site.label += kBackwardThread;
    site.label += ")";
  }
  if (!what.empty()) {
    site.label += ": ";
    site.label += what;
  }
  return site;
}

CallSite ChooseCallSite(std::span<const FrameText> frames) {
  std::vector<FrameRole> roles;
  roles.reserve(frames.size());
  for (const FrameText& f : frames) roles.push_back(ClassifyFrame(f));
  return ChooseCallSite(frames, roles);
}

}  // namespace fragscope::sources
