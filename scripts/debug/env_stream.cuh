// Debug probe: the stream TVM-FFI hands a launcher for a tensor's device, as an integer.
#pragma once
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <cstdint>

int64_t env_stream(tvm::ffi::TensorView t) {
  const DLDevice d = t.device();
  return reinterpret_cast<int64_t>(TVMFFIEnvGetStream(d.device_type, d.device_id));
}
