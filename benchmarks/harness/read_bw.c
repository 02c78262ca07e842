// Read bandwidth of this machine: NT threads stream a 178 MiB buffer (the size of Gemma 3 270M's
// Q8_0 output head) with AVX-512 loads (AVX2 where the CPU has no AVX-512), optionally
// prefetching PF bytes ahead into L2; best of 5
// passes after one warm-up. The bound decode figures are held against (benchmarks/e2e.md).
//
//   gcc -O2 -march=native -fopenmp benchmarks/harness/read_bw.c -o /tmp/read_bw
//   /tmp/read_bw THREADS PF_BYTES        (e.g. 2 0, 2 8192)
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  int nt = argc > 1 ? atoi(argv[1]) : 2, pf = argc > 2 ? atoi(argv[2]) : 0;
  size_t n = (size_t)178 << 20;
  char *b = aligned_alloc(1 << 21, n);
  if (!b) return 1;
  memset(b, 1, n);
  double best = 0;
  long sink = 0;
  for (int rep = 0; rep < 6; rep++) {
    double t = now();
    long tot = 0;
#pragma omp parallel num_threads(nt) reduction(+ : tot)
    {
      int id = omp_get_thread_num();
      size_t lo = n / nt * id, hi = lo + n / nt;
#ifdef __AVX512F__
      __m512i acc = _mm512_setzero_si512();
      for (size_t i = lo; i < hi; i += 256) {
        if (pf)
          for (int l = 0; l < 256; l += 64) _mm_prefetch(b + i + pf + l, _MM_HINT_T1);
        for (int l = 0; l < 256; l += 64) acc = _mm512_add_epi32(acc, _mm512_load_si512(b + i + l));
      }
      tot += _mm512_reduce_add_epi32(acc);
#else
      __m256i acc = _mm256_setzero_si256();
      for (size_t i = lo; i < hi; i += 256) {
        if (pf)
          for (int l = 0; l < 256; l += 64) _mm_prefetch(b + i + pf + l, _MM_HINT_T1);
        for (int l = 0; l < 256; l += 32) acc = _mm256_add_epi32(acc, _mm256_load_si256((const __m256i *)(b + i + l)));
      }
      int lanes[8];
      _mm256_storeu_si256((__m256i *)lanes, acc);
      for (int l = 0; l < 8; l++) tot += lanes[l];
#endif
    }
    t = now() - t;
    sink += tot;
    if (rep && n / t / 1e9 > best) best = n / t / 1e9;
  }
  printf("threads %d prefetch %d: %.1f GB/s (checksum %ld)\n", nt, pf, best, sink & 1);
  return 0;
}
