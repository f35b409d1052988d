/* CBLAS sgemm throughput on this machine: square sizes and the GEMM shapes of a training step of
 * the small Llama preset (1024 tokens, hidden 512, intermediate 1408), with 1 and 2 threads.
 * Training benchmarks report MFU against the peak this measures.
 *
 * usage: bench_sgemm [seconds per measurement, default 0.2]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tessera/kernels.h"

typedef struct shape {
  const char *name;
  int M, N, K;
  bool trans_a, trans_b;
} shape;

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best GFLOP/s over repetitions filling `seconds` (at least one after a warm-up). */
static double measure(const shape *s, float *a, float *b, float *c, double seconds) {
  tsr_kernel_gemm(c, a, b, s->M, s->N, s->K, s->trans_a, s->trans_b, 1.0f, 0.0f);
  double flops = 2.0 * s->M * s->N * s->K, best = 0.0, start = now_seconds();
  do {
    double t0 = now_seconds();
    tsr_kernel_gemm(c, a, b, s->M, s->N, s->K, s->trans_a, s->trans_b, 1.0f, 0.0f);
    double dt = now_seconds() - t0;
    if (dt > 0 && flops / dt > best) best = flops / dt;
  } while (now_seconds() - start < seconds);
  return best * 1e-9;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 0.2;
  if (!(seconds > 0)) {
    fprintf(stderr, "usage: %s [seconds per measurement > 0]\n", argv[0]);
    return 2;
  }
  /* Linear layers compute x · wᵀ (trans_b); their weight gradients doutᵀ · x (trans_a). */
  static const shape shapes[] = {
      {"square 256", 256, 256, 256, false, false},
      {"square 512", 512, 512, 512, false, false},
      {"square 1024", 1024, 1024, 1024, false, false},
      {"square 2048", 2048, 2048, 2048, false, false},
      {"attn proj fwd  x.W^T", 1024, 512, 512, false, true},
      {"mlp up/gate fwd x.W^T", 1024, 1408, 512, false, true},
      {"mlp down fwd   x.W^T", 1024, 512, 1408, false, true},
      {"mlp down dX    dy.W", 1024, 1408, 512, false, false},
      {"mlp up dW      dy^T.x", 1408, 512, 1024, true, false},
      {"mlp down dW    dy^T.x", 512, 1408, 1024, true, false},
  };
  size_t max_elems = (size_t)2048 * 2048;
  float *a = malloc(max_elems * sizeof(float)), *b = malloc(max_elems * sizeof(float));
  float *c = malloc(max_elems * sizeof(float));
  if (a == NULL || b == NULL || c == NULL) {
    fprintf(stderr, "bench_sgemm: cannot allocate %zu-float buffers\n", max_elems);
    return 1;
  }
  for (size_t i = 0; i < max_elems; i++) {
    a[i] = (float)(i % 31) * 0.03f - 0.4f;
    b[i] = (float)(i % 29) * 0.03f - 0.4f;
  }
  printf("cores available: %d\n", tsr_kernel_num_cores());
  printf("%-24s %6s %6s %6s %12s %12s\n", "shape", "M", "N", "K", "1 thr GF/s", "2 thr GF/s");
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const shape *s = &shapes[i];
    tsr_kernel_set_threads(1);
    double g1 = measure(s, a, b, c, seconds);
    tsr_kernel_set_threads(2);
    double g2 = measure(s, a, b, c, seconds);
    printf("%-24s %6d %6d %6d %12.1f %12.1f\n", s->name, s->M, s->N, s->K, g1, g2);
  }
  tsr_kernel_set_threads(1);
  printf("peak (tsr_kernel_sgemm_peak_gflops, 1024^3): 1 thread %.1f GFLOP/s, 2 threads %.1f "
         "GFLOP/s\n",
         tsr_kernel_sgemm_peak_gflops(1, 2 * seconds),
         tsr_kernel_sgemm_peak_gflops(2, 2 * seconds));
  free(a);
  free(b);
  free(c);
  return 0;
}
