/* CPU kernels of the Llama model: raw-pointer functions over contiguous f32 buffers.
 *
 * Conventions, shared by every function below:
 *  - Buffers are contiguous, row-major; the shape of each pointer is given beside it.
 *  - Forward kernels overwrite their outputs.
 *  - Backward kernels ACCUMULATE (+=) into every gradient buffer they are given, so a parameter
 *    used twice (tied embeddings, pipeline micro-batches, ring attention steps) needs no extra
 *    add; callers zero gradients once. A NULL gradient pointer means "not wanted" where noted.
 *  - Functions that can reject their input return tsr_status and leave a message naming the
 *    offending argument and value for tsr_last_error(); the rest return void.
 *  - The caller owns all memory; no kernel allocates from the heap except
 *    tsr_kernel_sgemm_peak_gflops, the attention forward/backward (small per-thread tile
 *    buffers) and the bf16 matmuls (their rounded operands); TSR_ENOMEM if they cannot be had.
 *
 * Threads: GEMM runs on OpenBLAS's thread pool, which is process-wide; the hand-written kernels
 * split their outer loop over a per-calling-thread count. See tsr_kernel_set_threads.
 */
#ifndef TESSERA_KERNELS_H
#define TESSERA_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "tessera/export.h"
#include "tessera/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Thread budget
 * ------------------------------------------------------------------------------------------- */

/* Cores this process may run on (its CPU affinity mask, else the online processor count). */
TSR_API int tsr_kernel_num_cores(void);

/* Threads one rank may use so that `ranks_per_host` ranks never oversubscribe the cores:
 * max(1, cores / ranks_per_host). `ranks_per_host` < 1 is treated as 1. */
TSR_API int tsr_kernel_thread_budget(int cores, int ranks_per_host);

/* Sets the calling thread's kernel thread count to max(1, n).
 *
 * Two things change:
 *  - the hand-written kernels called from this thread split their work across n threads (the
 *    count is thread-local, so each rank of the thread-based `local` backend keeps its own);
 *  - OpenBLAS's thread count, which is process-wide, is set to n if it differs.
 *
 * Because the OpenBLAS setting is shared, every rank of one process must pass the same n, and it
 * must be called before any rank starts computing (resizing OpenBLAS's pool while another thread
 * is inside a GEMM is not safe). With R thread-ranks on C cores each rank passes
 * tsr_kernel_thread_budget(C, R); the first call applies it and the others find it already set.
 * With process ranks (MPI) each process applies its own budget. */
TSR_API void tsr_kernel_set_threads(int n);

/* The calling thread's hand-kernel thread count (1 until tsr_kernel_set_threads is called). */
TSR_API int tsr_kernel_threads(void);

/* Since ABI 1.4. OpenBLAS's idle worker threads spin (yielding) for 2^28 cycles, about 0.1 s,
 * after each GEMM before they sleep, so between two GEMMs they hold cores the hand-written
 * kernels want. OpenBLAS takes the spin from OPENBLAS_THREAD_TIMEOUT (log2 of the cycles) once,
 * as it loads, before any code of the program runs. A program that trains calls this first in
 * main(): when the variable is unset, it sets it to TSR_BLAS_THREAD_TIMEOUT (2^18 cycles, about
 * 0.1 ms) and executes the program again (/proc/self/exe, the same argv and environment); it
 * returns having done nothing when the variable is set (by the user, to keep their own, or by
 * the first start), under valgrind (which an exec would leave behind) or when the exec fails. */
#define TSR_BLAS_THREAD_TIMEOUT 18
TSR_API void tsr_kernel_blas_reexec(char **argv);

/* ---------------------------------------------------------------------------------------------
 * Time accounting (benchmarks)
 * ------------------------------------------------------------------------------------------- */

/* What a kernel's time is counted as. */
typedef enum tsr_kernel_kind {
  TSR_KERNEL_GEMM,      /* tsr_kernel_gemm, tsr_kernel_matmul_forward/backward (and _bf16) */
  TSR_KERNEL_ATTENTION, /* attention forward, backward, merge (their GEMMs included) */
  TSR_KERNEL_LOSS,      /* cross-entropy and its vocabulary-parallel pieces */
  TSR_KERNEL_LAYERS,    /* RMSNorm, RoPE, SwiGLU, embedding, head layout changes */
  TSR_KERNEL_OPTIM,     /* AdamW, sums of squares, scaling */
  TSR_KERNEL_KINDS
} tsr_kernel_kind;

/* Turns kernel timing on or off for the whole process (off at start). While on, every kernel
 * called from outside another kernel adds its wall time to its kind's total, from whichever thread
 * calls it; kernels called by kernels are not counted again. */
TSR_API void tsr_kernel_profile_enable(bool on);

/* The totals in seconds since the last reset, per kind; with `reset` they restart from 0. */
TSR_API void tsr_kernel_profile_read(double seconds[TSR_KERNEL_KINDS], bool reset);

/* ---------------------------------------------------------------------------------------------
 * GEMM (CBLAS)
 * ------------------------------------------------------------------------------------------- */

/* General row-major GEMM: c = alpha * op(a) · op(b) + beta * c, op(x) = xᵀ when trans_x.
 * op(a) is (M, K), op(b) is (K, N). With beta == 0, c need not be initialised. */
TSR_API void tsr_kernel_gemm(float *c /* (M, N) */,
                             const float *a /* (M, K), or (K, M) if trans_a */,
                             const float *b /* (K, N), or (N, K) if trans_b */, int M, int N, int K,
                             bool trans_a, bool trans_b, float alpha, float beta);

/* nn.Linear: out = x · wᵀ (+ bias). */
TSR_API void tsr_kernel_matmul_forward(float *out /* (N, OC) */, const float *x /* (N, C) */,
                                       const float *w /* (OC, C) */,
                                       const float *bias /* (OC) or NULL */, int N, int C, int OC);

/* Backward of tsr_kernel_matmul_forward: dx += dout · w, dw += doutᵀ · x, dbias += Σ_rows dout.
 * Any of dx, dw, dbias may be NULL. */
TSR_API void tsr_kernel_matmul_backward(float *dx /* (N, C) or NULL */,
                                        float *dw /* (OC, C) or NULL */,
                                        float *dbias /* (OC) or NULL */,
                                        const float *dout /* (N, OC) */,
                                        const float *x /* (N, C) */, const float *w /* (OC, C) */,
                                        int N, int C, int OC);

/* The same products in mixed precision ([job] dtype = bf16): every operand of a GEMM is rounded
 * to bf16 (nearest even, as tsr_f32_to_bf16), the products are accumulated in f32 and the outputs
 * are f32 (the bias is added in f32). A bf16 product is exact in f32, so this is what a bf16
 * tensor-core GEMM with f32 accumulation computes, up to the order of the sums. The backward
 * rounds dout and the forward's operands alike; its gradients are those of the rounded product
 * (the rounding itself passes gradients straight through, as autocast's casts do). They copy the
 * rounded operands to the heap: TSR_ENOMEM when that fails, with nothing written. */
TSR_API tsr_status tsr_kernel_matmul_forward_bf16(float *out /* (N, OC) */,
                                                  const float *x /* (N, C) */,
                                                  const float *w /* (OC, C) */,
                                                  const float *bias /* (OC) or NULL */, int N,
                                                  int C, int OC);
TSR_API tsr_status tsr_kernel_matmul_backward_bf16(
    float *dx /* (N, C) or NULL */, float *dw /* (OC, C) or NULL */,
    float *dbias /* (OC) or NULL */, const float *dout /* (N, OC) */, const float *x /* (N, C) */,
    const float *w /* (OC, C) */, int N, int C, int OC);

/* Measures single-precision GEMM throughput with `threads` OpenBLAS threads: square 1024 GEMMs
 * repeated for about `seconds` (at least one), best rate in GFLOP/s (2·M·N·K per GEMM). Restores
 * the previous OpenBLAS thread count, so call it only while no other thread computes. Returns a
 * negative value if the work buffers cannot be allocated. */
TSR_API double tsr_kernel_sgemm_peak_gflops(int threads, double seconds);

/* ---------------------------------------------------------------------------------------------
 * RMSNorm (LlamaRMSNorm): out = x · rstd · w, rstd = 1 / sqrt(mean(x²) + eps), per row.
 * ------------------------------------------------------------------------------------------- */

TSR_API void tsr_kernel_rmsnorm_forward(float *out /* (N, C) */, float *rstd /* (N) */,
                                        const float *x /* (N, C) */, const float *w /* (C) */,
                                        int N, int C, float eps);

/* dx += ∂/∂x, dw += ∂/∂w, from the rstd saved by the forward. dw may be NULL. */
TSR_API void tsr_kernel_rmsnorm_backward(float *dx /* (N, C) */, float *dw /* (C) or NULL */,
                                         const float *dout /* (N, C) */,
                                         const float *x /* (N, C) */, const float *w /* (C) */,
                                         const float *rstd /* (N) */, int N, int C);

/* ---------------------------------------------------------------------------------------------
 * Rotary position embedding, Hugging Face `rotate_half` convention.
 *
 * For head_dim D: inv_freq[i] = theta^(-2i/D) for i < D/2; for position p the angles are
 * cat(p·inv_freq, p·inv_freq) (length D); out = x·cos + rotate_half(x)·sin with
 * rotate_half(x) = cat(-x[D/2:], x[:D/2]). Positions are explicit so that a sequence shard
 * (contiguous or zigzag) rotates by its global positions.
 * ------------------------------------------------------------------------------------------- */

/* Fills the cos/sin tables for L positions (NULL: 0 .. L-1). D must be even. Computed in f32 in the
 * order Hugging Face uses (1 / theta^(2i/D), then p · inv_freq, then cos/sin), so tables agree with
 * theirs to the last bit of the platform's cosf/sinf. */
TSR_API tsr_status tsr_kernel_rope_tables(float *cos_t /* (L, D) */, float *sin_t /* (L, D) */,
                                          const int32_t *pos /* (L) or NULL */, int L, int D,
                                          float theta);

/* Rotates x laid out as (B, L, H, D), the layout a projection (B·L, H·D) produces. In-place
 * (out == x) is allowed. */
TSR_API void tsr_kernel_rope_forward(float *out /* (B, L, H, D) */,
                                     const float *x /* (B, L, H, D) */,
                                     const float *cos_t /* (L, D) */,
                                     const float *sin_t /* (L, D) */, int B, int L, int H, int D);

/* dx += Rᵀ · dout (the rotation's transpose). */
TSR_API void tsr_kernel_rope_backward(float *dx /* (B, L, H, D) */,
                                      const float *dout /* (B, L, H, D) */,
                                      const float *cos_t /* (L, D) */,
                                      const float *sin_t /* (L, D) */, int B, int L, int H, int D);

/* Layout change between projection output and attention input: (B, L, H, D) → (B, H, L, D).
 * Its adjoint is tsr_kernel_bhld_to_blhd (which also overwrites). */
TSR_API void tsr_kernel_blhd_to_bhld(float *out /* (B, H, L, D) */,
                                     const float *x /* (B, L, H, D) */, int B, int L, int H, int D);
TSR_API void tsr_kernel_bhld_to_blhd(float *out /* (B, L, H, D) */,
                                     const float *x /* (B, H, L, D) */, int B, int L, int H, int D);

/* ---------------------------------------------------------------------------------------------
 * SwiGLU: out = silu(gate) · up, silu(g) = g · sigmoid(g). Element-wise over n values.
 * ------------------------------------------------------------------------------------------- */

TSR_API void tsr_kernel_swiglu_forward(float *out /* (n) */, const float *gate /* (n) */,
                                       const float *up /* (n) */, int64_t n);

TSR_API void tsr_kernel_swiglu_backward(float *dgate /* (n) */, float *dup /* (n) */,
                                        const float *dout /* (n) */, const float *gate /* (n) */,
                                        const float *up /* (n) */, int64_t n);

/* ---------------------------------------------------------------------------------------------
 * Embedding
 * ------------------------------------------------------------------------------------------- */

/* out[i] = table[ids[i]]. Every id is checked before anything is written: an id outside [0, V)
 * returns TSR_EINVAL naming the id and its position. */
TSR_API tsr_status tsr_kernel_embedding_forward(float *out /* (N, C) */,
                                                const int32_t *ids /* (N) */,
                                                const float *table /* (V, C) */, int N, int V,
                                                int C);

/* dtable[ids[i]] += dout[i], with the same bounds check. */
TSR_API tsr_status tsr_kernel_embedding_backward(float *dtable /* (V, C) */,
                                                 const float *dout /* (N, C) */,
                                                 const int32_t *ids /* (N) */, int N, int V, int C);

/* ---------------------------------------------------------------------------------------------
 * Cross-entropy
 * ------------------------------------------------------------------------------------------- */

#define TSR_IGNORE_INDEX (-100)

/* Fused softmax cross-entropy as torch's F.cross_entropy defaults: targets equal to
 * TSR_IGNORE_INDEX are skipped and the loss is the mean over the others (NaN when all are
 * ignored, as torch). The softmax subtracts the row max, so any finite logits are safe.
 * If dlogits is non-NULL it accumulates dloss · (softmax − onehot) / n_valid on valid rows.
 * n_valid (may be NULL) receives the count of non-ignored targets. A target outside [0, V) that is
 * not the ignore index returns TSR_EINVAL naming it, before anything is written. */
TSR_API tsr_status tsr_kernel_cross_entropy(float *loss /* () */, int *n_valid /* () or NULL */,
                                            float *dlogits /* (N, V) or NULL */,
                                            const float *logits /* (N, V) */,
                                            const int32_t *targets /* (N) */, int N, int V,
                                            float dloss);

/* Pieces of a vocabulary-parallel loss, where this rank holds the logit columns
 * [vocab_start, vocab_start + Vl) of a vocabulary of global size V. The caller combines them
 * across ranks: max of row_max, then sum of the sum-exps taken against the global max, then sum
 * of the target logits (each target lies in exactly one shard). The loss of row i is
 * log(sumexp_i) + max_i − target_logit_i. */

/* row_max[i] = max_j logits[i, j] over the local columns. */
TSR_API void tsr_kernel_logits_row_max(float *row_max /* (N) */, const float *logits /* (N, Vl) */,
                                       int N, int Vl);

/* sumexp[i] = Σ_j exp(logits[i, j] − row_max[i]), row_max being the global one. */
TSR_API void tsr_kernel_logits_row_sumexp(float *sumexp /* (N) */,
                                          const float *logits /* (N, Vl) */,
                                          const float *row_max /* (N) */, int N, int Vl);

/* target_logit[i] = logits[i, targets[i] − vocab_start] if the target falls in this shard, else 0
 * (also 0 for ignored rows). */
TSR_API void tsr_kernel_logits_target(float *target_logit /* (N) */,
                                      const float *logits /* (N, Vl) */,
                                      const int32_t *targets /* (N) */, int N, int Vl,
                                      int vocab_start);

/* dlogits += scale · (softmax − onehot) on the local columns of each non-ignored row, from the
 * global row_max and sumexp. scale is dloss / (global count of valid targets). */
TSR_API void tsr_kernel_cross_entropy_shard_backward(float *dlogits /* (N, Vl) */,
                                                     const float *logits /* (N, Vl) */,
                                                     const int32_t *targets /* (N) */,
                                                     const float *row_max /* (N) */,
                                                     const float *sumexp /* (N) */, int N, int Vl,
                                                     int vocab_start, float scale);

/* ---------------------------------------------------------------------------------------------
 * Causal attention with GQA, blockwise with an online softmax.
 *
 * q: (B, Hq, Lq, D), k and v: (B, Hkv, Lk, D), contiguous. Hq % Hkv == 0 and query head h reads
 * key/value head h / (Hq / Hkv). Scores are scaled by 1/sqrt(D). Query i may see key j when
 * !causal, or when k_pos[j] <= q_pos[i]; positions are global token positions, so a shard of the
 * sequence (ring attention, zigzag layouts) passes its own. NULL positions mean 0, 1, 2, ...
 * (the top-left aligned causal mask when Lq != Lk). A query that sees no key gets out = 0 and
 * lse = -inf, without NaN.
 * ------------------------------------------------------------------------------------------- */

/* out = softmax(q kᵀ / sqrt(D) + mask) v and lse = log Σ_j exp(score_j) (natural log), per query
 * row. head_dim may be 1 to 512. Returns TSR_EINVAL for bad head counts or sizes, TSR_ENOMEM when
 * the tile buffers cannot be allocated. */
TSR_API tsr_status tsr_kernel_attention_forward(
    float *out /* (B, Hq, Lq, D) */, float *lse /* (B, Hq, Lq) */,
    const float *q /* (B, Hq, Lq, D) */, const float *k /* (B, Hkv, Lk, D) */,
    const float *v /* (B, Hkv, Lk, D) */, const int32_t *q_pos /* (Lq) or NULL */,
    const int32_t *k_pos /* (Lk) or NULL */, int B, int Hq, int Hkv, int Lq, int Lk, int D,
    bool causal);

/* Backward from out and lse; probabilities are recomputed, not stored. dq, dk, dv accumulate;
 * dk/dv sum over the query heads of each group. `out` and `lse` may be those of a larger key set
 * than k/v (the merged result of ring attention): the gradients are then this key block's share,
 * which is what ring attention's backward needs. */
TSR_API tsr_status tsr_kernel_attention_backward(
    float *dq /* (B, Hq, Lq, D) */, float *dk /* (B, Hkv, Lk, D) */,
    float *dv /* (B, Hkv, Lk, D) */, const float *dout /* (B, Hq, Lq, D) */,
    const float *q /* (B, Hq, Lq, D) */, const float *k /* (B, Hkv, Lk, D) */,
    const float *v /* (B, Hkv, Lk, D) */, const float *out /* (B, Hq, Lq, D) */,
    const float *lse /* (B, Hq, Lq) */, const int32_t *q_pos /* (Lq) or NULL */,
    const int32_t *k_pos /* (Lk) or NULL */, int B, int Hq, int Hkv, int Lq, int Lk, int D,
    bool causal);

/* The same two kernels on the projection layout, without layout changes: q, out, dq, dout are
 * (B, Lq, Hq, D) and k, v, dk, dv (B, Lk, Hkv, D); lse stays (B, Hq, Lq). Results equal those of
 * the (B, H, L, D) kernels on the transposed tensors bit for bit. */
TSR_API tsr_status tsr_kernel_attention_forward_blhd(
    float *out /* (B, Lq, Hq, D) */, float *lse /* (B, Hq, Lq) */,
    const float *q /* (B, Lq, Hq, D) */, const float *k /* (B, Lk, Hkv, D) */,
    const float *v /* (B, Lk, Hkv, D) */, const int32_t *q_pos /* (Lq) or NULL */,
    const int32_t *k_pos /* (Lk) or NULL */, int B, int Hq, int Hkv, int Lq, int Lk, int D,
    bool causal);

TSR_API tsr_status tsr_kernel_attention_backward_blhd(
    float *dq /* (B, Lq, Hq, D) */, float *dk /* (B, Lk, Hkv, D) */,
    float *dv /* (B, Lk, Hkv, D) */, const float *dout /* (B, Lq, Hq, D) */,
    const float *q /* (B, Lq, Hq, D) */, const float *k /* (B, Lk, Hkv, D) */,
    const float *v /* (B, Lk, Hkv, D) */, const float *out /* (B, Lq, Hq, D) */,
    const float *lse /* (B, Hq, Lq) */, const int32_t *q_pos /* (Lq) or NULL */,
    const int32_t *k_pos /* (Lk) or NULL */, int B, int Hq, int Hkv, int Lq, int Lk, int D,
    bool causal);

/* Document masking (since ABI 1.3): the four kernels above with segment ids. q_seg (B, Lq) and
 * k_seg (B, Lk) i32 name each row's document; query i of batch row b sees key j only when
 * q_seg[b, i] == k_seg[b, j], besides the causal rule on positions. A query that sees no key (in
 * a block of another rank's keys, say) gets out = 0 and lse = -inf, as above. Reached through
 * the kernel table by name (tsr_kernel_lookup). */
TSR_API tsr_status tsr_kernel_attention_forward_seg(
    float *out /* (B, Hq, Lq, D) */, float *lse /* (B, Hq, Lq) */,
    const float *q /* (B, Hq, Lq, D) */, const float *k /* (B, Hkv, Lk, D) */,
    const float *v /* (B, Hkv, Lk, D) */, const int32_t *q_pos /* (Lq) or NULL */,
    const int32_t *k_pos /* (Lk) or NULL */, const int32_t *q_seg /* (B, Lq) */,
    const int32_t *k_seg /* (B, Lk) */, int B, int Hq, int Hkv, int Lq, int Lk, int D, bool causal);
TSR_API tsr_status tsr_kernel_attention_backward_seg(
    float *dq /* (B, Hq, Lq, D) */, float *dk /* (B, Hkv, Lk, D) */,
    float *dv /* (B, Hkv, Lk, D) */, const float *dout /* (B, Hq, Lq, D) */,
    const float *q /* (B, Hq, Lq, D) */, const float *k /* (B, Hkv, Lk, D) */,
    const float *v /* (B, Hkv, Lk, D) */, const float *out /* (B, Hq, Lq, D) */,
    const float *lse /* (B, Hq, Lq) */, const int32_t *q_pos /* (Lq) or NULL */,
    const int32_t *k_pos /* (Lk) or NULL */, const int32_t *q_seg /* (B, Lq) */,
    const int32_t *k_seg /* (B, Lk) */, int B, int Hq, int Hkv, int Lq, int Lk, int D, bool causal);
TSR_API tsr_status tsr_kernel_attention_forward_seg_blhd(
    float *out /* (B, Lq, Hq, D) */, float *lse /* (B, Hq, Lq) */,
    const float *q /* (B, Lq, Hq, D) */, const float *k /* (B, Lk, Hkv, D) */,
    const float *v /* (B, Lk, Hkv, D) */, const int32_t *q_pos /* (Lq) or NULL */,
    const int32_t *k_pos /* (Lk) or NULL */, const int32_t *q_seg /* (B, Lq) */,
    const int32_t *k_seg /* (B, Lk) */, int B, int Hq, int Hkv, int Lq, int Lk, int D, bool causal);
TSR_API tsr_status tsr_kernel_attention_backward_seg_blhd(
    float *dq /* (B, Lq, Hq, D) */, float *dk /* (B, Lk, Hkv, D) */,
    float *dv /* (B, Lk, Hkv, D) */, const float *dout /* (B, Lq, Hq, D) */,
    const float *q /* (B, Lq, Hq, D) */, const float *k /* (B, Lk, Hkv, D) */,
    const float *v /* (B, Lk, Hkv, D) */, const float *out /* (B, Lq, Hq, D) */,
    const float *lse /* (B, Hq, Lq) */, const int32_t *q_pos /* (Lq) or NULL */,
    const int32_t *k_pos /* (Lk) or NULL */, const int32_t *q_seg /* (B, Lq) */,
    const int32_t *k_seg /* (B, Lk) */, int B, int Hq, int Hkv, int Lq, int Lk, int D, bool causal);

/* Combines two partial attention results over disjoint key sets A and B into the result over
 * A ∪ B: lse = log(exp(lse_a) + exp(lse_b)), out = exp(lse_a − lse)·out_a + exp(lse_b − lse)·out_b,
 * computed against the larger lse so nothing overflows; two -inf rows give out = 0, lse = -inf.
 * Rows are any flattening of (B, H, L). out/lse may alias out_a/lse_a (the usual ring update). */
TSR_API void tsr_kernel_attention_merge(float *out /* (R, D) */, float *lse /* (R) */,
                                        const float *out_a /* (R, D) */,
                                        const float *lse_a /* (R) */,
                                        const float *out_b /* (R, D) */,
                                        const float *lse_b /* (R) */, int R, int D);

/* ---------------------------------------------------------------------------------------------
 * Sparse mixture of experts (since ABI 1.2), tessera/ops.h's moe ops in pieces: an expert-parallel
 * rule routes locally, moves the rows to their experts' ranks, runs the FFNs there and combines
 * them back home, with the same functions the 1-rank op uses, so both sum in the same order.
 *
 * Routed rows: every (token n, expert e) with combine[n, e] != 0, ordered by e, then n. offsets
 * (E + 1) gives each expert's first row (offsets[E] = M rows); token (M) each row's token.
 * ------------------------------------------------------------------------------------------- */

/* Per token n: p = softmax(logits[n]), the top_k largest p (ties to the lower index), combine[n]
 * = those p / their sum, 0 elsewhere; probs[n] = p. Accumulates stats (2, E): row 0 += scale for
 * each selected expert, row 1 += scale * p. 1 <= top_k <= E. */
TSR_API void tsr_kernel_moe_router_forward(float *combine /* (N, E) */, float *probs /* (N, E) */,
                                           float *stats /* (2, E) */,
                                           const float *logits /* (N, E) */, int N, int E,
                                           int top_k, float scale);
/* dlogits += the gradient through combine (dcombine, may be NULL) and through stats row 1
 * (dstats (2, E), may be NULL; row 0 is not read), from the forward's probs and combine. */
TSR_API void tsr_kernel_moe_router_backward(float *dlogits /* (N, E) */,
                                            const float *dcombine /* (N, E) or NULL */,
                                            const float *dstats /* (2, E) or NULL */,
                                            const float *probs /* (N, E) */,
                                            const float *combine /* (N, E) */, int N, int E,
                                            float scale);
/* The routed rows of combine: fills offsets and token (capacity N * E) as above. */
TSR_API void tsr_kernel_moe_route(int64_t *offsets /* (E + 1) */, int32_t *token /* (M) */,
                                  const float *combine /* (N, E) */, int N, int E);
/* xs[m] = x[token[m]]. */
TSR_API void tsr_kernel_moe_gather(float *xs /* (M, C) */, const float *x /* (N, C) */,
                                   const int32_t *token /* (M) */, int64_t M, int C);
/* dx[token[m]] += dxs[m], m in order. */
TSR_API void tsr_kernel_moe_scatter_add(float *dx /* (N, C) */, const float *dxs /* (M, C) */,
                                        const int32_t *token /* (M) */, int64_t M, int C);
/* Expert FFNs of width F over rows grouped by expert (offsets (E + 1), relative to these rows and
 * experts): h = x w13[e]^T (gate then up), out = (silu(h[:, :F]) * h[:, F:]) w2[e]^T. h is kept for
 * the backward. TSR_ENOMEM when its (M, F) scratch cannot be had. */
TSR_API tsr_status tsr_kernel_moe_ffn_forward(float *out /* (M, C) */, float *h /* (M, 2F) */,
                                              const float *x /* (M, C) */,
                                              const float *w13 /* (E, 2F, C) */,
                                              const float *w2 /* (E, C, F) */,
                                              const int64_t *offsets /* (E + 1) */, int E, int C,
                                              int F);
/* dx += (NULL: not wanted), dw13 += and dw2 += (NULL: not wanted) from dout and the forward's h.
 * TSR_ENOMEM when its scratch cannot be had, with nothing written. */
TSR_API tsr_status tsr_kernel_moe_ffn_backward(
    float *dx /* (M, C) or NULL */, float *dw13 /* (E, 2F, C) or NULL */,
    float *dw2 /* (E, C, F) or NULL */, const float *dout /* (M, C) */, const float *x /* (M, C) */,
    const float *h /* (M, 2F) */, const float *w13 /* (E, 2F, C) */,
    const float *w2 /* (E, C, F) */, const int64_t *offsets /* (E + 1) */, int E, int C, int F);
/* out[token[m]] += combine[token[m], e] * y[m] over the routed rows in order, so each token's
 * experts add in ascending order (the caller zeroes out first). */
TSR_API void tsr_kernel_moe_combine(float *out /* (N, C) */, const float *y /* (M, C) */,
                                    const float *combine /* (N, E) */,
                                    const int32_t *token /* (M) */,
                                    const int64_t *offsets /* (E + 1) */, int E, int C);
/* Its backward: dy[m] = combine[n, e] * dout[n] (overwrites), dcombine[n, e] += dout[n] . y[m]
 * (dcombine may be NULL). */
TSR_API void
tsr_kernel_moe_combine_backward(float *dy /* (M, C) */, float *dcombine /* (N, E) or NULL */,
                                const float *dout /* (N, C) */, const float *y /* (M, C) */,
                                const float *combine /* (N, E) */, const int32_t *token /* (M) */,
                                const int64_t *offsets /* (E + 1) */, int E, int C);

/* ---------------------------------------------------------------------------------------------
 * Optimizer and gradient clipping
 * ------------------------------------------------------------------------------------------- */

/* One torch.optim.AdamW step (amsgrad=False, maximize=False) on n parameters. `step` is the
 * step number after increment (1 on the first call). See optim.c for the rounding order, which
 * follows torch's single-tensor implementation. */
TSR_API void tsr_kernel_adamw(float *param /* (n) */, const float *grad /* (n) */,
                              float *m /* (n) */, float *v /* (n) */, int64_t n, int step,
                              double lr, double beta1, double beta2, double eps,
                              double weight_decay);

/* Σ x², accumulated in double. */
TSR_API double tsr_kernel_sum_squares(const float *x /* (n) */, int64_t n);

/* sqrt of Σ over all buffers of Σ x², in double: the 2-norm of the concatenated gradients. */
TSR_API double tsr_kernel_global_norm(const float *const *bufs /* (nbufs) pointers */,
                                      const int64_t *sizes /* (nbufs) */, int nbufs);

/* clip_grad_norm_'s coefficient: min(1, max_norm / (total_norm + 1e-6)). */
TSR_API float tsr_kernel_clip_coef(double total_norm, double max_norm);

/* x *= s. */
TSR_API void tsr_kernel_scale(float *x /* (n) */, int64_t n, float s);

#ifdef __cplusplus
}
#endif
#endif
