// Call sites: which frame of an allocation's stack names a place the user can act on
// (issue 29 item 9).
//
// A PyTorch stack (innermost first) starts with the unwinder that captured it, the caching
// allocator, tensor factories, the dispatcher and autograd's machinery, and the Python
// interpreter's C functions; none of these is where a user can change anything. The choice:
//
//   1. the innermost Python frame (a .py file) outside torch's own package, else
//   2. the innermost Python frame, else
//   3. for a stack of C++ frames only, a label: "C++ only", the thread it ran on when a frame
//      tells (autograd's backward threads), and the operator (the outermost at::_ops::<op> or
//      aten::<op> frame), with the autograd node that ran it (BmmBackward0, AccumulateGrad) when
//      there is one;
//      without an operator, the innermost frame that is none of the machinery above.
//
// What is machinery is one table (kFrameRules in call_site.cc): a frame's role comes from the
// first rule its name or file matches. Snapshots (SnapshotCallSite in snapshot/snapshot.h) and
// traces whose events carry stacks go through the same choice.
//
// Thread safety: all functions are pure.
#ifndef FRAGSCOPE_SOURCES_CALL_SITE_H_
#define FRAGSCOPE_SOURCES_CALL_SITE_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace fragscope::sources {

/// One frame of a stack as the chooser reads it.
struct FrameText {
  std::string_view name;
  std::string_view filename;
};

/// What a frame is, for the choice of a call site.
enum class FrameRole : std::uint8_t {
  kUserPython,     // a .py file outside torch's package: the call site
  kTorchPython,    // a .py file inside torch's package
  kUnknown,        // no function name ("", "??"): names nothing
  kUnwinder,       // the code that captured the stack (torch::unwind, CapturedTraceback)
  kAllocator,      // the caching allocator and c10's allocator interface
  kDispatcher,     // tensor factories, the dispatcher, generated kernel wrappers
  kAutograd,       // autograd's engine and wrappers (its node frames are kAutogradNode)
  kInterpreter,    // CPython's C functions and the C runtime's thread and process entry points
  kOperator,       // at::_ops::<op>... or aten::<op>: dispatcher machinery that names the op
  kAutogradNode,   // a generated <Node>::apply or AccumulateGrad: the backward function running
  kBackwardEntry,  // the entry of one of autograd's backward threads (machinery too)
  kNative,         // any other C++ frame
};

/// The role of one frame, by the first rule of the table that matches it.
FrameRole ClassifyFrame(const FrameText& frame);

/// True for a frame no call site is ever named after (the machinery roles and kUnknown).
bool IsMachinery(FrameRole role);

/// A stack's call site.
struct CallSite {
  /// Position in the stack of the frame that names the site; -1 when `label` names it or the
  /// stack is empty.
  std::int32_t frame = -1;
  /// For a stack of C++ frames only, e.g. "C++ only (autograd backward thread):
  /// at::_ops::bmm in BmmBackward0"; "" otherwise.
  std::string label;
};

/// The call site of `frames` (innermost first); `roles[i]` is ClassifyFrame(frames[i]) (a
/// caller that meets a frame in many stacks classifies it once). Sizes must be equal.
CallSite ChooseCallSite(std::span<const FrameText> frames, std::span<const FrameRole> roles);
/// Same, classifying each frame.
CallSite ChooseCallSite(std::span<const FrameText> frames);

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_CALL_SITE_H_
