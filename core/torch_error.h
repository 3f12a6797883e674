// Turns an exception thrown by LibTorch (c10::Error, or a TorchScript
// exception carrying a Python-side traceback) into one readable line for an
// absl::Status message. Stateless; thread-safe.
#ifndef STARLING_CORE_TORCH_ERROR_H_
#define STARLING_CORE_TORCH_ERROR_H_

#include <exception>
#include <string>

namespace starling {

std::string TorchErrorMessage(const std::exception& e);

}  // namespace starling

#endif  // STARLING_CORE_TORCH_ERROR_H_
