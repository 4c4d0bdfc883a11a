// Host cost of the pieces of one launch (eager_probe companion): TVM-FFI's env stream, cudaGetDevice,
// a plain <<<>>> launch, cudaLaunchKernelEx with / without the PDL attribute.
#pragma once
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.cuh>

namespace {

__global__ void empty_kernel() {}

int64_t piece(tvm::ffi::TensorView x, int64_t which) {
  const DLDevice d = x.device();
  if (which == 0) return 0;  // the FFI call alone
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(d.device_type, d.device_id));
  if (which == 1) return reinterpret_cast<int64_t>(stream);
  int dev = -1;
  cudaGetDevice(&dev);
  if (which == 2) return dev;
  if (which == 3) {
    empty_kernel<<<1, 32, 0, stream>>>();
    return 0;
  }
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attrs[1];
  config.gridDim = dim3(1);
  config.blockDim = dim3(32);
  config.stream = stream;
  config.attrs = attrs;
  if (which == 5) {
    attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[0].val.programmaticStreamSerializationAllowed = 1;
    config.numAttrs = 1;
  }
  cudaLaunchKernelEx(&config, empty_kernel);
  return 0;
}

}  // namespace
