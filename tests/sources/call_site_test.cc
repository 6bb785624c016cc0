#include "sources/call_site.h"

#include <vector>

#include <gtest/gtest.h>

namespace fragscope::sources {
namespace {

// The innermost frames of every stack PyTorch records with C++ context: the unwinder that
// captured it, then the caching allocator (frame names as in real snapshots).
const std::vector<FrameText> kCapture = {
    {"torch::unwind::unwind()", "??"},
    {"torch::CapturedTraceback::gather(bool, bool, bool)", "??"},
    {"torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp"},
    {"c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, "
     "unsigned long, CUstream_st*)",
     "CUDACachingAllocator.cpp"},
    {"c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)",
     ""},
    {"at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, c10::Allocator*, "
     "c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)",
     ""},
    {"at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)", "??"},
};

std::vector<FrameText> Stack(std::vector<FrameText> tail) {
  std::vector<FrameText> out = kCapture;
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

// The frames of an autograd backward thread running BmmBackward0 (outermost last).
std::vector<FrameText> BackwardBmm() {
  return Stack({
      {"at::(anonymous namespace)::wrapper_CUDA_bmm(at::Tensor const&, at::Tensor const&)",
       "RegisterCUDA.cpp"},
      {"c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::WrapFunctionIntoFunctor_<"
       "c10::CompileTimeFunctionPointer<at::Tensor (at::Tensor const&, at::Tensor const&), "
       "&at::(anonymous namespace)::wrapper_CUDA_bmm>>>::call(c10::OperatorKernel*)",
       "RegisterCUDA.cpp"},
      {"at::_ops::bmm::redispatch(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&)",
       "??"},
      {"torch::autograd::VariableType::(anonymous namespace)::bmm(c10::DispatchKeySet, "
       "at::Tensor const&, at::Tensor const&)",
       "VariableType_3.cpp"},
      {"at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)", "??"},
      {"torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor, "
       "std::allocator<at::Tensor> >&&)",
       "??"},
      {"torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> "
       ">&&)",
       ""},
      {"torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)",
       "??"},
      {"torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)",
       "??"},
      {"torch::autograd::python::PythonEngine::thread_init(int, "
       "std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)",
       "??"},
      {"execute_native_thread_routine", "thread48.o"},
      {"start_thread", "??"},
      {"clone", "??"},
  });
}

TEST(CallSiteTest, FirstUserPythonFrameWinsOverEverythingInnerToIt) {
  // The capture, the allocator, the dispatcher, the interpreter's C frames, torch's Python,
  // then the user's code.
  std::vector<FrameText> frames = Stack({
      {"at::_ops::mm::call(at::Tensor const&, at::Tensor const&)", "??"},
      {"torch::autograd::THPVariable_mm(_object*, _object*, _object*)", "??"},
      {"cfunction_call", "Objects/methodobject.c"},
      {"_PyObject_MakeTpCall", "Objects/call.c"},
      {"_PyEval_EvalFrameDefault", "Python/ceval.c"},
      {"linear", "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py"},
      {"forward", "/home/u/model.py"},
      {"train", "/home/u/train.py"},
  });
  const CallSite site = ChooseCallSite(frames);
  ASSERT_GE(site.frame, 0);
  EXPECT_EQ(frames[static_cast<std::size_t>(site.frame)].filename, "/home/u/model.py");
  EXPECT_EQ(site.label, "");
}

TEST(CallSiteTest, TorchsPythonWhenNoOtherPythonFrame) {
  std::vector<FrameText> frames = Stack({
      {"_PyEval_EvalFrameDefault", "??"},
      {"step", "/usr/lib/python3/dist-packages/torch/optim/adamw.py"},
      {"_use_grad", "torch/optim/optimizer.py"},
  });
  const CallSite site = ChooseCallSite(frames);
  ASSERT_GE(site.frame, 0);
  EXPECT_EQ(frames[static_cast<std::size_t>(site.frame)].name, "step");
}

TEST(CallSiteTest, BackwardThreadStackIsLabelledWithOperatorAndNode) {
  const CallSite site = ChooseCallSite(BackwardBmm());
  EXPECT_EQ(site.frame, -1);
  EXPECT_EQ(site.label, "C++ only (autograd backward thread): at::_ops::bmm in BmmBackward0");
}

TEST(CallSiteTest, OutermostOperatorNamesTheStack) {
  // new_zeros made an empty tensor through new_empty and empty: new_zeros is what the node
  // asked for.
  std::vector<FrameText> frames = Stack({
      {"at::_ops::empty_memory_format::call(c10::ArrayRef<c10::SymInt>)", "??"},
      {"at::_ops::new_empty::call(at::Tensor const&, c10::ArrayRef<c10::SymInt>)", "??"},
      {"at::native::new_zeros(at::Tensor const&, c10::ArrayRef<long>)", "??"},
      {"at::_ops::new_zeros::call(at::Tensor const&, c10::ArrayRef<c10::SymInt>)", "??"},
      {"torch::autograd::generated::IndexBackward0::apply(std::vector<at::Tensor>&&)", "??"},
      {"torch::autograd::Engine::thread_init(int, std::shared_ptr<ReadyQueue> const&, bool)", "??"},
  });
  EXPECT_EQ(ChooseCallSite(frames).label,
            "C++ only (autograd backward thread): at::_ops::new_zeros in IndexBackward0");
}

TEST(CallSiteTest, GradientAccumulationIsANodeToo) {
  std::vector<FrameText> frames = Stack({
      {"at::_ops::new_empty_strided::call(at::Tensor const&, c10::ArrayRef<c10::SymInt>)", "??"},
      {"torch::autograd::utils::clone_obey_contract(at::Tensor const&, at::Tensor const&)", ""},
      {"void torch::autograd::AccumulateGrad::accumulateGrad<torch::autograd::AccumulateGrad::"
       "apply(std::vector<at::Tensor>&&)::{lambda(at::Tensor&&)#1}>(at::Tensor const&)",
       ""},
      {"torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor>&&)", ""},
      {"torch::autograd::Engine::thread_main(std::shared_ptr<GraphTask> const&)", "??"},
  });
  EXPECT_EQ(ChooseCallSite(frames).label,
            "C++ only (autograd backward thread): at::_ops::new_empty_strided in AccumulateGrad");
}

TEST(CallSiteTest, CppStackWithoutThreadOrNodeNamesTheOperatorOnly) {
  std::vector<FrameText> frames = Stack({
      {"at::_ops::mm::call(at::Tensor const&, at::Tensor const&)", "??"},
      {"my_extension::run(at::Tensor const&)", "ext.cpp"},
  });
  EXPECT_EQ(ChooseCallSite(frames).label, "C++ only: at::_ops::mm");
  // aten::<op> names it too.
  std::vector<FrameText> aten = Stack({{"aten::addmm", ""}});
  EXPECT_EQ(ChooseCallSite(aten).label, "C++ only: aten::addmm");
}

TEST(CallSiteTest, CppStackWithoutOperatorNamesTheInnermostFrameOutsideTheMachinery) {
  // cuBLAS's workspace: no operator frame inner to it; the innermost frame that is none of the
  // unwinder, allocator, dispatcher or interpreter names it, without its parameters.
  std::vector<FrameText> frames = Stack({
      {"at::cuda::getNewWorkspace()", ""},
      {"at::cuda::getCurrentCUDABlasHandle()", "??"},
      {"??", "??"},
      {"_PyEval_EvalFrameDefault", "libpython3.11.so"},
  });
  EXPECT_EQ(ChooseCallSite(frames).label, "C++ only: at::cuda::getNewWorkspace");
  // Nothing but machinery: the label alone.
  EXPECT_EQ(ChooseCallSite(kCapture).label, "C++ only");
}

TEST(CallSiteTest, EmptyStackHasNoSite) {
  const CallSite site = ChooseCallSite(std::vector<FrameText>{});
  EXPECT_EQ(site.frame, -1);
  EXPECT_EQ(site.label, "");
}

TEST(CallSiteTest, ClassifiesByTheTable) {
  struct Case {
    FrameText frame;
    FrameRole role;
  };
  const Case cases[] = {
      {{"torch::unwind::unwind()", "??"}, FrameRole::kUnwinder},
      {{"??", "??"}, FrameRole::kUnknown},
      {{"", ""}, FrameRole::kUnknown},
      {{"c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int)", ""},
       FrameRole::kAllocator},
      {{"c10::Allocator::allocate(unsigned long)", ""}, FrameRole::kAllocator},
      // A return type does not hide the function; template arguments do not match rules.
      {{"void at::meta::common_checks_baddbmm_bmm<at::meta::structured_bmm>(int)", ""},
       FrameRole::kDispatcher},
      {{"c10::impl::wrap_kernel_functor_unboxed_<c10::Allocator::X>::call()", ""},
       FrameRole::kDispatcher},
      {{"c10::Dispatcher::call<at::Tensor>(c10::TypedOperatorHandle const&)", ""},
       FrameRole::kDispatcher},
      {{"at::_ops::mm::call(at::Tensor const&, at::Tensor const&)", "??"}, FrameRole::kOperator},
      {{"torch::autograd::generated::MmBackward0::apply(int)", ""}, FrameRole::kAutogradNode},
      {{"torch::autograd::generated::details::mm_mat1_backward(int)", ""}, FrameRole::kAutograd},
      {{"torch::autograd::Engine::thread_main(int)", ""}, FrameRole::kBackwardEntry},
      {{"_PyEval_EvalFrameDefault", "Python/ceval.c"}, FrameRole::kInterpreter},
      {{"PyObject_Call", "??"}, FrameRole::kInterpreter},
      {{"??", "/usr/lib/libpython3.10.so.1.0"}, FrameRole::kUnknown},
      {{"some_c_function", "/usr/lib/libpython3.10.so.1.0"}, FrameRole::kInterpreter},
      {{"at::cuda::getNewWorkspace()", ""}, FrameRole::kNative},
      {{"forward", "/home/u/model.py"}, FrameRole::kUserPython},
      {{"forward", "/home/u/torchvision_fork/model.py"}, FrameRole::kUserPython},
      {{"linear", "/x/site-packages/torch/nn/functional.py"}, FrameRole::kTorchPython},
      {{"linear", "torch/nn/modules/linear.py"}, FrameRole::kTorchPython},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ClassifyFrame(c.frame), c.role) << c.frame.name << " @ " << c.frame.filename;
  }
}

}  // namespace
}  // namespace fragscope::sources
