#!/bin/bash
# Register use per norm kernel instantiation (bf16, fp16, fp32): bash scripts/debug/regs.sh [extra nvcc flags]
# Compiles the norm TU for sm_90 to a cubin (device code only) and prints "regs spill kernel".
D=$(mktemp -d)
R=/work/main/python/sglang/jit_kernel
cat > $D/main.cu <<EOT
#include <sgl_kernel/tensor.h>
#include "$R/csrc/elementwise/rmsnorm.cuh"
#include "$R/csrc/elementwise/fused_add_rmsnorm.cuh"
#include "$R/csrc/elementwise/qknorm.cuh"
void* keep[] = {(void*)&rmsnorm<bf16_t>, (void*)&fused_add_rmsnorm<bf16_t>, (void*)&fused_inplace_qknorm<bf16_t>,
                (void*)&rmsnorm<fp16_t>, (void*)&fused_add_rmsnorm<fp16_t>, (void*)&fused_inplace_qknorm<fp16_t>,
                (void*)&rmsnorm<fp32_t>, (void*)&fused_add_rmsnorm<fp32_t>, (void*)&fused_inplace_qknorm<fp32_t>};
EOT
TI=$(/tmp/venv/bin/python -W ignore -c "import tvm_ffi,os;print(os.path.dirname(tvm_ffi.__file__)+'/include')" 2>/dev/null)
/usr/local/cuda/bin/nvcc -std=c++20 -O3 --expt-relaxed-constexpr -arch=sm_90 -DSGL_CUDA_ARCH=900 -I$R/include -I$TI -cubin -Xptxas -v "$@" -o $D/a.cubin $D/main.cu > $D/log 2>&1 || { cat $D/log; exit 1; }
awk '/Compiling entry/ {match($0, /_Z[^'"'"']*/); name=substr($0, RSTART, RLENGTH)} /bytes spill stores/ {match($0,/[0-9]+ bytes spill stores/); sp=substr($0,RSTART,RLENGTH)} /Used [0-9]+ registers/ {match($0,/Used [0-9]+/); print substr($0,RSTART+5,RLENGTH-5), sp, name}' $D/log \
 | c++filt | sed 's/(anonymous namespace):://g; s/ bytes spill stores/sp/; s/norm_rows_kernel<//; s/NormKind::k//; s/>(NormParams)//; s/(bool)//'
[ -n "$KEEP" ] && cp $D/log $KEEP; [ -n "$CUBIN" ] && cp $D/a.cubin $CUBIN; rm -rf $D
