/* The CUDA kernel table and the entry point the core's loader calls (core/kernel_table.h). */
#include <stdio.h>

#include "kernel_table.h"
#include "misc.h"

static const tsr_kernel_table cuda_table = {
    .abi = TSR_KERNEL_TABLE_ABI,
    .struct_size = sizeof(tsr_kernel_table),
    .name = "cuda",
    .device = TSR_DEVICE_CUDA,
    .gemm = tsr_cuda_k_gemm,
    .matmul_forward = tsr_cuda_k_matmul_forward,
    .matmul_backward = tsr_cuda_k_matmul_backward,
    .rmsnorm_forward = tsr_cuda_k_rmsnorm_forward,
    .rmsnorm_backward = tsr_cuda_k_rmsnorm_backward,
    .rope_tables = tsr_cuda_k_rope_tables,
    .rope_forward = tsr_cuda_k_rope_forward,
    .rope_backward = tsr_cuda_k_rope_backward,
    .blhd_to_bhld = tsr_cuda_k_blhd_to_bhld,
    .bhld_to_blhd = tsr_cuda_k_bhld_to_blhd,
    .swiglu_forward = tsr_cuda_k_swiglu_forward,
    .swiglu_backward = tsr_cuda_k_swiglu_backward,
    .embedding_forward = tsr_cuda_k_embedding_forward,
    .embedding_backward = tsr_cuda_k_embedding_backward,
    .cross_entropy = tsr_cuda_k_cross_entropy,
    .logits_row_max = tsr_cuda_k_logits_row_max,
    .logits_row_sumexp = tsr_cuda_k_logits_row_sumexp,
    .logits_target = tsr_cuda_k_logits_target,
    .cross_entropy_shard_backward = tsr_cuda_k_cross_entropy_shard_backward,
    .attention_forward = tsr_cuda_k_attention_forward,
    .attention_backward = tsr_cuda_k_attention_backward,
    .attention_forward_blhd = tsr_cuda_k_attention_forward_blhd,
    .attention_backward_blhd = tsr_cuda_k_attention_backward_blhd,
    .attention_merge = tsr_cuda_k_attention_merge,
    .adamw = tsr_cuda_k_adamw,
    .sum_squares = tsr_cuda_k_sum_squares,
    .global_norm = tsr_cuda_k_global_norm,
    /* Host arithmetic on two doubles: the CPU function is the definition. */
    .clip_coef = tsr_kernel_clip_coef,
    .scale = tsr_cuda_k_scale,
    .owns = tsr_cuda_k_owns,
    .allocator_init = tsr_cuda_k_allocator_init,
    .allocator_release = tsr_cuda_k_allocator_release,
    .copy_h2d = tsr_cuda_k_copy_h2d,
    .copy_d2h = tsr_cuda_k_copy_d2h,
    .copy_d2d = tsr_cuda_k_copy_d2d,
    .zero = tsr_cuda_k_zero,
    .copy_strided = tsr_cuda_k_copy_strided,
    .add = tsr_cuda_k_add,
    .sync = tsr_cuda_k_sync,
    .matmul_forward_bf16 = tsr_cuda_k_matmul_forward_bf16,
    .matmul_backward_bf16 = tsr_cuda_k_matmul_backward_bf16,
};

const tsr_kernel_table *tsr_cuda_kernel_table_v1(uint32_t abi, char *why, unsigned why_len) {
  if (abi != TSR_KERNEL_TABLE_ABI) {
    snprintf(why, why_len, "libtessera-cuda.so has kernel table ABI %d, the core asks for %u",
             TSR_KERNEL_TABLE_ABI, abi);
    return NULL;
  }
  char reason[256] = "";
  if (tsr_cuda_device_count(reason, sizeof reason) == 0) {
    snprintf(why, why_len, "no CUDA device (%s)", reason);
    return NULL;
  }
  return &cuda_table;
}
