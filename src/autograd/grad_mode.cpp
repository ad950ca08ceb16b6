// Thread-local grad mode.
#include "hadatrain/autograd/grad_mode.h"

namespace ht {
namespace {
thread_local bool t_grad_enabled = true;
}
bool grad_enabled() { return t_grad_enabled; }
GradModeGuard::GradModeGuard(bool enabled) : prev_(t_grad_enabled) { t_grad_enabled = enabled; }
GradModeGuard::~GradModeGuard() { t_grad_enabled = prev_; }
}  // namespace ht
