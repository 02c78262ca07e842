// One dequantizer per kind: `deq32` writes elements [32c, 32c + lim) of the
// row starting at byte `base` into v (lim < 32 only in a float row's tail).

struct KF32 {
    static void deq32(device const uchar* w, uint base, uint c, uint lim, thread float* v) {
        device const float* f = (device const float*)(w + base) + c * 32u;
        for (uint l = 0u; l < lim; l++) v[l] = f[l];
    }
};

struct KF16 {
    static void deq32(device const uchar* w, uint base, uint c, uint lim, thread float* v) {
        device const half* h = (device const half*)(w + base) + c * 32u;
        for (uint l = 0u; l < lim; l++) v[l] = float(h[l]);
    }
};

struct KBF16 {
    static void deq32(device const uchar* w, uint base, uint c, uint lim, thread float* v) {
        device const ushort* h = (device const ushort*)(w + base) + c * 32u;
        for (uint l = 0u; l < lim; l++) v[l] = as_type<float>(uint(h[l]) << 16);
    }
};

struct KQ4_0 {
    static void deq32(device const uchar* w, uint base, uint c, uint lim, thread float* v) {
        uint o = base + c * 18u;
        float d = f16at(w, o);
        for (uint l = 0u; l < 16u; l++) {
            uint q = b8(w, o + 2u + l);
            v[l] = d * (float(q & 15u) - 8.0f);
            v[l + 16u] = d * (float(q >> 4) - 8.0f);
        }
    }
};

struct KQ4_1 {
    static void deq32(device const uchar* w, uint base, uint c, uint lim, thread float* v) {
        uint o = base + c * 20u;
        float d = f16at(w, o), m = f16at(w, o + 2u);
        for (uint l = 0u; l < 16u; l++) {
            uint q = b8(w, o + 4u + l);
            v[l] = d * float(q & 15u) + m;
            v[l + 16u] = d * float(q >> 4) + m;
        }
    }
};

struct KQ5_0 {
    static void deq32(device const uchar* w, uint base, uint c, uint lim, thread float* v) {
        uint o = base + c * 22u;
        float d = f16at(w, o);
        uint qh = b8(w, o + 2u) | (b8(w, o + 3u) << 8) | (b8(w, o + 4u) << 16) | (b8(w, o + 5u) << 24);
        for (uint l = 0u; l < 16u; l++) {
            uint q = b8(w, o + 6u + l);
            uint x0 = (q & 15u) | (((qh >> l) << 4) & 16u);
            uint x1 = (q >> 4) | ((qh >> (l + 12u)) & 16u);
            v[l] = d * (float(x0) - 16.0f);
            v[l + 16u] = d * (float(x1) - 16.0f);
        }
    }
};

struct KQ5_1 {
    static void deq32(device const uchar* w, uint base, uint c, uint lim, thread float* v) {
        uint o = base + c * 24u;
        float d = f16at(w, o), m = f16at(w, o + 2u);
        uint qh = b8(w, o + 4u) | (b8(w, o + 5u) << 8) | (b8(w, o + 6u) << 16) | (b8(w, o + 7u) << 24);
        for (uint l = 0u; l < 16u; l++) {
            uint q = b8(w, o + 8u + l);
            uint x0 = (q & 15u) | (((qh >> l) << 4) & 16u);
            uint x1 = (q >> 4) | ((qh >> (l + 12u)) & 16u);
            v[l] = d * float(x0) + m;
            v[l + 16u] = d * float(x1) + m;
        }
    }
};

struct KQ8_0 {
    static void deq32(device const uchar* w, uint base, uint c, uint lim, thread float* v) {
        uint o = base + c * 34u;
        float d = f16at(w, o);
        for (uint l = 0u; l < 32u; l++) v[l] = d * float(s8(w, o + 2u + l));
    }
};

struct KQ2_K {
    static void deq32(device const uchar* w, uint base, uint c, uint lim, thread float* v) {
        uint o = base + (c / 8u) * 84u, sub = c % 8u, h = sub / 4u, j = sub % 4u;
        float d = f16at(w, o + 80u), dmin = f16at(w, o + 82u);
        for (uint l = 0u; l < 32u; l++) {
            uint q = b8(w, o + 16u + 32u * h + l);
            uint sc = b8(w, o + 8u * h + 2u * j + l / 16u);
            v[l] = d * float(sc & 15u) * float((q >> (2u * j)) & 3u) - dmin * float(sc >> 4);
        }
    }
};

// ggml's get_scale_min_k4 over the 12 packed scale bytes at `s`.
static inline void scale_min(device const uchar* w, uint s, uint j, thread float& sc, thread float& m) {
    if (j < 4u) {
        sc = float(b8(w, s + j) & 63u);
        m = float(b8(w, s + j + 4u) & 63u);
    } else {
        sc = float((b8(w, s + j + 4u) & 15u) | ((b8(w, s + j - 4u) >> 6) << 4));
        m = float((b8(w, s + j + 4u) >> 4) | ((b8(w, s + j) >> 6) << 4));
    }
}

struct KQ4_K {
    static void deq32(device const uchar* w, uint base, uint c, uint lim, thread float* v) {
        uint o = base + (c / 8u) * 144u;
        uint sub = c % 8u, jp = sub / 2u, hi = sub & 1u;
        float d = f16at(w, o), dmin = f16at(w, o + 2u), sc, m;
        scale_min(w, o + 4u, sub, sc, m);
        float d1 = d * sc, m1 = dmin * m;
        for (uint l = 0u; l < 32u; l++) {
            uint q = b8(w, o + 16u + 32u * jp + l);
            uint n = hi != 0u ? q >> 4 : q & 15u;
            v[l] = d1 * float(n) - m1;
        }
    }
};

struct KQ5_K {
    static void deq32(device const uchar* w, uint base, uint c, uint lim, thread float* v) {
        uint o = base + (c / 8u) * 176u;
        uint sub = c % 8u, jp = sub / 2u, hi = sub & 1u;
        float d = f16at(w, o), dmin = f16at(w, o + 2u), sc, m;
        scale_min(w, o + 4u, sub, sc, m);
        float d1 = d * sc, m1 = dmin * m;
        for (uint l = 0u; l < 32u; l++) {
            uint q = b8(w, o + 48u + 32u * jp + l);
            uint n = (hi != 0u ? q >> 4 : q & 15u) + ((b8(w, o + 16u + l) & (1u << (2u * jp + hi))) != 0u ? 16u : 0u);
            v[l] = d1 * float(n) - m1;
        }
    }
};

struct KQ6_K {
    static void deq32(device const uchar* w, uint base, uint c, uint lim, thread float* v) {
        uint o = base + (c / 8u) * 210u, sub = c % 8u, h = sub / 4u, qq = sub % 4u;
        float d = f16at(w, o + 208u);
        for (uint l = 0u; l < 32u; l++) {
            uint qlb = b8(w, o + 64u * h + ((qq & 1u) != 0u ? 32u : 0u) + l);
            uint n = qq < 2u ? qlb & 15u : qlb >> 4;
            uint hb = (b8(w, o + 128u + 32u * h + l) >> (2u * qq)) & 3u;
            float sc = float(s8(w, o + 192u + 8u * h + l / 16u + 2u * qq));
            v[l] = d * sc * float(int(n | (hb << 4)) - 32);
        }
    }
};
