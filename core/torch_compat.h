// The LibTorch API differences between the versions Starling builds
// against: Debian's LibTorch 1.13 (CPU) and the PyTorch 2.x wheels' (CUDA,
// scripts/gpu/). Each shim names the 2.x API it stands for; everything else
// Starling calls is the same in both (see docs/training.md, "LibTorch
// versions"). Header-only. The autocast state is thread-local: an
// AutocastScope affects only the thread that holds it.
#ifndef STARLING_CORE_TORCH_COMPAT_H_
#define STARLING_CORE_TORCH_COMPAT_H_

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

// True when building against LibTorch MAJOR.MINOR or newer.
#define STARLING_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||           \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace starling::torch_compat {

// at::autocast per device type. 2.4 replaced the per-device functions
// (set_enabled/is_enabled for CUDA, set_cpu_enabled, set_autocast_gpu_dtype,
// set_autocast_cpu_dtype) by set_autocast_enabled(DeviceType, bool) and
// set_autocast_dtype(DeviceType, ScalarType) in aten/src/ATen/autocast_mode.h
// and deprecated the old ones. Only CPU and CUDA are used here.
inline bool AutocastEnabled(c10::DeviceType type) {
#if STARLING_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(type);
#else
  return type == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                       : at::autocast::is_cpu_enabled();
#endif
}

inline void SetAutocastEnabled(c10::DeviceType type, bool enabled) {
#if STARLING_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(type, enabled);
#else
  if (type == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(enabled);
  } else {
    at::autocast::set_cpu_enabled(enabled);
  }
#endif
}

inline c10::ScalarType AutocastDtype(c10::DeviceType type) {
#if STARLING_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(type);
#else
  return type == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                       : at::autocast::get_autocast_cpu_dtype();
#endif
}

inline void SetAutocastDtype(c10::DeviceType type, c10::ScalarType dtype) {
#if STARLING_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (type == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

// What Python's `with torch.autocast(device_type, dtype)` does, for C++:
// ops on `type`'s tensors run in `dtype` where autocast's op lists say so,
// until the scope ends. On leaving the outermost scope the cache of cast
// weights is cleared: it is valid only until the optimizer changes them.
// Disabled (`enabled` false): does nothing at all.
class AutocastScope {
 public:
  AutocastScope(c10::DeviceType type, bool enabled,
                c10::ScalarType dtype = c10::ScalarType::BFloat16)
      : type_(type), active_(enabled) {
    if (!active_) return;
    was_enabled_ = AutocastEnabled(type_);
    was_dtype_ = AutocastDtype(type_);
    SetAutocastDtype(type_, dtype);
    SetAutocastEnabled(type_, true);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    SetAutocastEnabled(type_, was_enabled_);
    SetAutocastDtype(type_, was_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  const c10::DeviceType type_;
  const bool active_;
  bool was_enabled_ = false;
  c10::ScalarType was_dtype_ = c10::ScalarType::BFloat16;
};

}  // namespace starling::torch_compat

#endif  // STARLING_CORE_TORCH_COMPAT_H_
