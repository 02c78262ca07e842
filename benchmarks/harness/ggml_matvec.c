// llama.cpp's side of benchmarks/matvec.md: one ggml_mul_mat of an M x K weight
// matrix of TYPE with one f32 column, on the CPU backend, with N threads —
// the same shapes and thread counts ferrox's `benches/matvec.rs` measures.
// Prints the median GB/s of weight bytes over repeats.
//
//   ggml_matvec TYPE M K THREADS      (TYPE: q8_0, q4_K, q6_K, q5_0, ...)
//
// Built and run by benchmarks/run_matvec.sh against the ggml of the
// llama-cpp-python 0.3.36 tree (ggml 0c1e570).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ggml.h"
#include "ggml-cpu.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s TYPE M K THREADS\n", argv[0]);
        return 2;
    }
    enum ggml_type type = GGML_TYPE_COUNT;
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char *name = ggml_type_name((enum ggml_type)t);
        if (name && strcasecmp(name, argv[1]) == 0) type = (enum ggml_type)t;
    }
    if (type == GGML_TYPE_COUNT) {
        fprintf(stderr, "unknown type %s\n", argv[1]);
        return 2;
    }
    const int64_t m = atoll(argv[2]), k = atoll(argv[3]);
    const int threads = atoi(argv[4]);
    ggml_cpu_init();

    const size_t wbytes = ggml_row_size(type, k) * m;
    struct ggml_init_params ip = {wbytes + (size_t)k * 8 + (size_t)m * 8 + (64u << 20), NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *w = ggml_new_tensor_2d(ctx, type, k, m);
    struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, 1);

    // Quantize 64 random rows and tile them, as the ferrox bench does.
    uint64_t s = 0x9E3779B97F4A7C15ull;
    const int64_t tile_rows = m < 64 ? m : 64;
    float *src = malloc(sizeof(float) * k * tile_rows);
    for (int64_t i = 0; i < k * tile_rows; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        src[i] = (float)(s >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
    }
    const size_t tile = ggml_quantize_chunk(type, src, w->data, 0, tile_rows, k, NULL);
    for (size_t off = tile; off < wbytes; off += tile) {
        memcpy((char *)w->data + off, w->data, off + tile <= wbytes ? tile : wbytes - off);
    }
    for (int64_t i = 0; i < k; i++) ((float *)x->data)[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;

    struct ggml_tensor *y = ggml_mul_mat(ctx, w, x);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);

    ggml_graph_compute_with_ctx(ctx, gf, threads); // warm-up
    double times[25];
    int n = 0;
    const double start = now();
    while (n < 3 || (n < 25 && now() - start < 0.6)) {
        const double t = now();
        ggml_graph_compute_with_ctx(ctx, gf, threads);
        times[n++] = now() - t;
    }
    qsort(times, n, sizeof(double), cmp);
    printf("%.2f\n", (double)wbytes / times[n / 2] / 1e9);
    ggml_free(ctx);
    free(src);
    return 0;
}
