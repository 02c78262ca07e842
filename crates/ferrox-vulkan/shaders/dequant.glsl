// One dequantizer per kind: `deq32` writes elements [32c, 32c + lim) of the
// row starting at byte `base` into v (lim < 32 only in a float row's tail).

#if defined(KIND_F32)
void deq32(U8 w, uint base, uint c, uint lim, inout float v[32]) {
    F32 f = F32(w);
    uint e0 = base / 4u + c * 32u;
    for (uint l = 0u; l < lim; l++) v[l] = f.v[e0 + l];
}
#elif defined(KIND_F16) || defined(KIND_BF16)
void deq32(U8 w, uint base, uint c, uint lim, inout float v[32]) {
    U32 u = U32(w);
    for (uint l = 0u; l < lim; l++) {
        uint half_index = base / 2u + c * 32u + l;
        uint bits = (u.v[half_index >> 1] >> ((half_index & 1u) * 16u)) & 0xffffu;
#if defined(KIND_F16)
        v[l] = unpackHalf2x16(bits).x;
#else
        v[l] = uintBitsToFloat(bits << 16);
#endif
    }
}
#elif defined(KIND_Q4_0)
void deq32(U8 w, uint base, uint c, uint lim, inout float v[32]) {
    uint o = base + c * 18u;
    float d = f16at(w, o);
    for (uint l = 0u; l < 16u; l++) {
        uint q = b8(w, o + 2u + l);
        v[l] = d * (float(q & 15u) - 8.0);
        v[l + 16u] = d * (float(q >> 4) - 8.0);
    }
}
#elif defined(KIND_Q4_1)
void deq32(U8 w, uint base, uint c, uint lim, inout float v[32]) {
    uint o = base + c * 20u;
    float d = f16at(w, o), m = f16at(w, o + 2u);
    for (uint l = 0u; l < 16u; l++) {
        uint q = b8(w, o + 4u + l);
        v[l] = d * float(q & 15u) + m;
        v[l + 16u] = d * float(q >> 4) + m;
    }
}
#elif defined(KIND_Q5_0)
void deq32(U8 w, uint base, uint c, uint lim, inout float v[32]) {
    uint o = base + c * 22u;
    float d = f16at(w, o);
    uint qh = b8(w, o + 2u) | (b8(w, o + 3u) << 8) | (b8(w, o + 4u) << 16) | (b8(w, o + 5u) << 24);
    for (uint l = 0u; l < 16u; l++) {
        uint q = b8(w, o + 6u + l);
        uint x0 = (q & 15u) | (((qh >> l) << 4) & 16u);
        uint x1 = (q >> 4) | ((qh >> (l + 12u)) & 16u);
        v[l] = d * (float(x0) - 16.0);
        v[l + 16u] = d * (float(x1) - 16.0);
    }
}
#elif defined(KIND_Q5_1)
void deq32(U8 w, uint base, uint c, uint lim, inout float v[32]) {
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
#elif defined(KIND_Q8_0)
void deq32(U8 w, uint base, uint c, uint lim, inout float v[32]) {
    uint o = base + c * 34u;
    float d = f16at(w, o);
    for (uint l = 0u; l < 32u; l++) v[l] = d * float(s8(w, o + 2u + l));
}
#elif defined(KIND_Q2_K)
void deq32(U8 w, uint base, uint c, uint lim, inout float v[32]) {
    uint o = base + (c / 8u) * 84u, sub = c % 8u, h = sub / 4u, j = sub % 4u;
    float d = f16at(w, o + 80u), dmin = f16at(w, o + 82u);
    for (uint l = 0u; l < 32u; l++) {
        uint q = b8(w, o + 16u + 32u * h + l);
        uint sc = b8(w, o + 8u * h + 2u * j + l / 16u);
        v[l] = d * float(sc & 15u) * float((q >> (2u * j)) & 3u) - dmin * float(sc >> 4);
    }
}
#elif defined(KIND_Q4_K) || defined(KIND_Q5_K)
// ggml's get_scale_min_k4 over the 12 packed scale bytes at `s`.
void scale_min(U8 w, uint s, uint j, out float sc, out float m) {
    if (j < 4u) {
        sc = float(b8(w, s + j) & 63u);
        m = float(b8(w, s + j + 4u) & 63u);
    } else {
        sc = float((b8(w, s + j + 4u) & 15u) | ((b8(w, s + j - 4u) >> 6) << 4));
        m = float((b8(w, s + j + 4u) >> 4) | ((b8(w, s + j) >> 6) << 4));
    }
}
void deq32(U8 w, uint base, uint c, uint lim, inout float v[32]) {
#if defined(KIND_Q4_K)
    uint o = base + (c / 8u) * 144u;
#else
    uint o = base + (c / 8u) * 176u;
#endif
    uint sub = c % 8u, jp = sub / 2u, hi = sub & 1u;
    float d = f16at(w, o), dmin = f16at(w, o + 2u), sc, m;
    scale_min(w, o + 4u, sub, sc, m);
    float d1 = d * sc, m1 = dmin * m;
    for (uint l = 0u; l < 32u; l++) {
#if defined(KIND_Q4_K)
        uint q = b8(w, o + 16u + 32u * jp + l);
        uint n = hi != 0u ? q >> 4 : q & 15u;
#else
        uint q = b8(w, o + 48u + 32u * jp + l);
        uint n = (hi != 0u ? q >> 4 : q & 15u) + ((b8(w, o + 16u + l) & (1u << (2u * jp + hi))) != 0u ? 16u : 0u);
#endif
        v[l] = d1 * float(n) - m1;
    }
}
#elif defined(KIND_Q6_K)
void deq32(U8 w, uint base, uint c, uint lim, inout float v[32]) {
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
#elif defined(KIND_Q3_K)
// 256 per block (110 bytes): hmask[32], qs[64], 12 packed 6-bit scales, d.
void deq32(U8 w, uint base, uint c, uint lim, inout float v[32]) {
    uint o = base + (c / 8u) * 110u, sub = c % 8u, n = sub / 4u, j = sub % 4u;
    float d = f16at(w, o + 108u);
    uint m = 1u << (4u * n + j);
    for (uint half_ = 0u; half_ < 2u; half_++) {
        uint i = 8u * n + 2u * j + half_;
        uint lo = i < 8u ? b8(w, o + 96u + i) & 15u : b8(w, o + 96u + i - 8u) >> 4;
        uint hi = (b8(w, o + 104u + i % 4u) >> (2u * (i / 4u))) & 3u;
        float dl = d * float(int(lo | (hi << 4)) - 32);
        for (uint l = 16u * half_; l < 16u * half_ + 16u; l++) {
            uint q = (b8(w, o + 32u + 32u * n + l) >> (2u * j)) & 3u;
            v[l] = dl * float(int(q) - ((b8(w, o + l) & m) != 0u ? 0 : 4));
        }
    }
}
#elif defined(KIND_IQ4_NL) || defined(KIND_IQ4_XS)
const float IQ4_VALUES[16] = float[16](-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);
void deq32(U8 w, uint base, uint c, uint lim, inout float v[32]) {
#if defined(KIND_IQ4_NL)
    // 32 per block (18 bytes): d, qs[16].
    uint o = base + c * 18u, q0 = o + 2u;
    float dl = f16at(w, o);
#else
    // 256 per block (136 bytes): d, scales_h (u16), scales_l[4], qs[128].
    uint o = base + (c / 8u) * 136u, ib = c % 8u, q0 = o + 8u + 16u * ib;
    uint sh = b8(w, o + 2u) | (b8(w, o + 3u) << 8);
    uint ls = ((b8(w, o + 4u + ib / 2u) >> (4u * (ib % 2u))) & 15u) | (((sh >> (2u * ib)) & 3u) << 4);
    float dl = f16at(w, o) * float(int(ls) - 32);
#endif
    for (uint l = 0u; l < 16u; l++) {
        uint q = b8(w, q0 + l);
        v[l] = dl * IQ4_VALUES[q & 15u];
        v[l + 16u] = dl * IQ4_VALUES[q >> 4];
    }
}
#elif defined(KIND_MXFP4)
// 32 per block (17 bytes): an E8M0 exponent, then 16 bytes of E2M1 pairs
// (doubled: 0, 1, 2, 3, 4, 6, 8, 12, signed), times half the scale.
const float MXFP4_VALUES[16] = float[16](0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0);
void deq32(U8 w, uint base, uint c, uint lim, inout float v[32]) {
    uint o = base + c * 17u, e = b8(w, o);
    float d = uintBitsToFloat(e < 2u ? (0x00200000u << e) : ((e - 1u) << 23));
    for (uint l = 0u; l < 16u; l++) {
        uint q = b8(w, o + 1u + l);
        v[l] = d * MXFP4_VALUES[q & 15u];
        v[l + 16u] = d * MXFP4_VALUES[q >> 4];
    }
}
#else
#error "no dequantizer for this kind"
#endif
