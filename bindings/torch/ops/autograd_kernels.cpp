#include "ops/autograd_kernels.hpp"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <memory>
#include <vector>

namespace symmpool::torch_ext {

namespace {

namespace autograd = torch::autograd;

// An op that mutates an input and returns nothing (all_reduce_), as
// generated in-place kernels do: a leaf that requires grad is refused, the
// input's version moves, and a mutated input that requires grad gets a
// NotImplemented grad_fn. torch's autogradNotImplementedFallback rebases
// only outputs that alias an input: with none, a backward through the
// mutated input treated the op as the identity (torch 2.11).
void mutating_op_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const std::size_t first = stack->size() - arguments.size();
  const bool grad_mode = at::GradMode::is_enabled();
  std::vector<at::Tensor> mutated, requiring_grad;
  for (std::size_t i = 0; i < arguments.size(); ++i) {
    const c10::IValue& value = (*stack)[first + i];
    TORCH_CHECK(!value.isTensorList(), op.schema().name(), ": tensor lists are not handled here");
    if (!value.isTensor()) continue;
    const at::Tensor& t = value.toTensor();
    if (grad_mode && t.requires_grad()) requiring_grad.push_back(t);
    const c10::AliasInfo* alias = arguments[i].alias_info();
    if (alias != nullptr && alias->isWrite()) mutated.push_back(t);
  }
  const bool any_requires_grad = !requiring_grad.empty();
  for (const at::Tensor& t : mutated) autograd::check_inplace(t, any_requires_grad);
  std::shared_ptr<autograd::NotImplemented> grad_fn;
  if (any_requires_grad) {
    grad_fn = std::shared_ptr<autograd::NotImplemented>(new autograd::NotImplemented(op.schema().name()),
                                                        autograd::deleteNode);
    grad_fn->set_next_edges(autograd::collect_next_edges(at::ArrayRef<at::Tensor>(requiring_grad)));
  }
  {
    at::AutoDispatchBelowADInplaceOrView below;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const at::Tensor& t : mutated) {
    autograd::increment_version(t);
    if (grad_fn && autograd::isDifferentiableType(t.scalar_type())) autograd::rebase_history(t, grad_fn);
  }
}

}  // namespace

void register_autograd_not_implemented(const std::string& name) {
  // One library for the process's life, as torch.library's are.
  static auto* library =
      new torch::Library(torch::Library::IMPL, "symmpool", c10::DispatchKey::Autograd, __FILE__, __LINE__);
  const auto op = c10::Dispatcher::singleton().findSchema({"symmpool::" + name, ""});
  TORCH_CHECK(op.has_value(), "symmpool::", name, " is not defined yet");
  if (op->schema().is_mutable())
    library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&mutating_op_autograd>());
  else
    library->impl(name.c_str(), torch::autograd::autogradNotImplementedFallback());
}

}  // namespace symmpool::torch_ext
