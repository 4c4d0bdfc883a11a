// Host-only check: utils.h and tensor.h compiled by g++ alone (no nvcc, no CUDA include path),
// exported through TVM-FFI for check_headers.py.
//   g++ -std=c++20 -O2 -fPIC -shared -I python/sglang/jit_kernel/include -I <tvm_ffi include>
//       host_only.cc -o host_only.so -L<tvm_ffi lib> -ltvm_ffi
#include <sgl_kernel/tensor.h>  // For TensorMatcher, SymbolicSize, SymbolicDType, SymbolicDevice
#include <sgl_kernel/utils.h>   // For RuntimeCheck, div_ceil, irange

#include <cstdint>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>

namespace {

// [num_rows, num_cols] fp32 or int32 on the CPU, second tensor [num_rows]; returns num_rows * num_cols.
int64_t match_host(tvm::ffi::TensorView matrix, tvm::ffi::TensorView row_ids) {
  using namespace host;
  SymbolicSize R{"num_rows"}, C{"num_cols"};
  SymbolicDevice device;
  device.set_options<kDLCPU>();
  SymbolicDType dtype;
  dtype.set_options<float, int32_t>();
  TensorMatcher({R, C}).with_dtype(dtype).with_device<kDLCPU>(device).verify(matrix, "matrix");
  TensorMatcher({R}).with_dtype<int64_t>().with_device(device).verify(row_ids, "row_ids");
  RuntimeCheck(dtype.is_type<float>() || dtype.is_type<int32_t>(), "unexpected dtype");
  int64_t total = 0;
  for (auto r : host::irange(R.unwrap())) total += C.unwrap() + 0 * r;
  return total + host::div_ceil(0, 7);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(match_host, match_host);
