"""The C source of PANM's fused recurrences (compiled by `panm_hf.recurrence_kernel`).

Kept as a Python string, not a `.c` file, so that `save_pretrained`'s copy of the modeling code (which
follows relative imports of `.py` files only) carries it: a `trust_remote_code` load then builds the
same kernel and computes the same numbers.
"""

SOURCE = r"""
/* PANM's two recurrences for all decoding steps in one call each, forward and backward: the Pointer Units
 * (paper, Eqs. 1-3; PointerUnits.forward with pointer_update="attention") and, at the end of this file,
 * the Controller GRU (Eq. 7). Plain C, no torch headers: compiled once
 * per machine by panm_hf/recurrence_kernel.py with `cc -O3 -shared -fPIC [-DUSE_DOUBLE]` and
 * called through ctypes on contiguous tensors. The eager loop in pointer_unit.py (and nn.GRU) is the reference.
 *
 * Per row (sample b, unit u) and step t, with p = p_{t-1}, h = h_{t-1}:
 *   gi = b_i[u] + p W_i[u]         gh = b_h[u] + h W_h[u]            (3H each, gates r | z | n)
 *   r = sig(gi_r + gh_r)  z = sig(gi_z + gh_z)  n = tanh(gi_n + r gh_n)  h' = (1 - z) n + z h
 *   q = tau h' / max(|h'|, 1e-12) (cosine) or h' (dot; the keys carry 1/sqrt(H))
 *   P = softmax_s(q . K[s] + (mask[s] ? 0 : -65504))   w = P mask   p' = sum_s w[s] A[s]
 * Rows are independent; a tile of rows of one unit is processed together so each row of W_h is
 * read once per tile and step.
 *
 * Layouts (row-major, contiguous unless a stride is given):
 *   p0 (B, U, NB), h0 (B, U, H), keys: row (b, u) at keys + b*ks_b + u*ks_u, (S, H) contiguous,
 *   bank (B, S, NB), mask (B, S) bytes, w_i (U, NB, 3H), b_i (U, 3H), w_h (U, H, 3H), b_h (U, 3H).
 *   Outputs: weights (B, T, U, S), p_final (B, U, NB), h_final (B, U, H).
 *   Saved for the backward: hs (B, U, T+1, H), ps (B, U, T+1, NB), gates (B, U, T, 4H) = r | z | n | gh_n,
 *   norms (B, U, T), probs (B, U, T, S).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef USE_DOUBLE
typedef double real;
#define EXP exp
#define TANH tanh
#define SQRT sqrt
#else
typedef float real;
#define EXP expf
#define TANH tanhf
#define SQRT sqrtf
#endif

#define TILE 8
#define EPS 1e-12
#define MASKED (-65504.0)

static real sigmoid(real x) { return (real)1 / ((real)1 + EXP(-x)); }

void pointer_forward(long U, long B, long T, long S, long NB, long H, int cosine, double tau_d,
                     const real *p0, const real *h0, const real *keys, long ks_b, long ks_u,
                     const real *bank, const unsigned char *mask, const real *w_i, const real *b_i,
                     const real *w_h, const real *b_h, real *weights, real *p_final, real *h_final,
                     real *hs, real *ps, real *gates, real *norms, real *probs) {
    const long G = 3 * H;
    const real tau = (real)tau_d;
    real *gh = malloc(sizeof(real) * TILE * G);
    real *gi = malloc(sizeof(real) * G);
    real *q = malloc(sizeof(real) * H);
    for (long u = 0; u < U; u++) {
        const real *Wi = w_i + u * NB * G, *Bi = b_i + u * G, *Wh = w_h + u * H * G, *Bh = b_h + u * G;
        for (long b0 = 0; b0 < B; b0 += TILE) {
            const long nb = B - b0 < TILE ? B - b0 : TILE;
            for (long i = 0; i < nb; i++) {  /* step 0 of the saved states: h_0 and p_0 */
                const long row = (b0 + i) * U + u;
                memcpy(hs + row * (T + 1) * H, h0 + row * H, sizeof(real) * H);
                memcpy(ps + row * (T + 1) * NB, p0 + row * NB, sizeof(real) * NB);
            }
            for (long t = 0; t < T; t++) {
                /* gh = b_h + h W_h for the tile: each row of W_h read once */
                for (long i = 0; i < nb; i++) memcpy(gh + i * G, Bh, sizeof(real) * G);
                for (long k = 0; k < H; k++) {
                    const real *wrow = Wh + k * G;
                    for (long i = 0; i < nb; i++) {
                        const real hk = hs[((b0 + i) * U + u) * (T + 1) * H + t * H + k];
                        real *g = gh + i * G;
                        for (long j = 0; j < G; j++) g[j] += hk * wrow[j];
                    }
                }
                for (long i = 0; i < nb; i++) {
                    const long b = b0 + i, row = b * U + u;
                    const real *h = hs + row * (T + 1) * H + t * H, *p = ps + row * (T + 1) * NB + t * NB;
                    real *hn = hs + row * (T + 1) * H + (t + 1) * H, *pn = ps + row * (T + 1) * NB + (t + 1) * NB;
                    real *gt = gates + (row * T + t) * 4 * H;
                    const real *g = gh + i * G;
                    memcpy(gi, Bi, sizeof(real) * G);
                    for (long k = 0; k < NB; k++) {
                        const real pk = p[k], *wrow = Wi + k * G;
                        for (long j = 0; j < G; j++) gi[j] += pk * wrow[j];
                    }
                    real sq = 0;
                    for (long j = 0; j < H; j++) {
                        const real r = sigmoid(gi[j] + g[j]);
                        const real z = sigmoid(gi[H + j] + g[H + j]);
                        const real n = TANH(gi[2 * H + j] + r * g[2 * H + j]);
                        const real hj = (1 - z) * n + z * h[j];
                        gt[j] = r; gt[H + j] = z; gt[2 * H + j] = n; gt[3 * H + j] = g[2 * H + j];
                        hn[j] = hj;
                        sq += hj * hj;
                    }
                    const real norm = SQRT(sq);
                    norms[row * T + t] = norm;
                    const real scale = cosine ? tau / (norm > (real)EPS ? norm : (real)EPS) : (real)1;
                    for (long j = 0; j < H; j++) q[j] = hn[j] * scale;
                    const real *K = keys + b * ks_b + u * ks_u;
                    const unsigned char *m = mask + b * S;
                    real *P = probs + (row * T + t) * S;
                    real top = -INFINITY;
                    for (long s = 0; s < S; s++) {
                        real sc = m[s] ? 0 : (real)MASKED;
                        const real *k = K + s * H;
                        for (long j = 0; j < H; j++) sc += q[j] * k[j];
                        P[s] = sc;
                        if (sc > top) top = sc;
                    }
                    real total = 0;
                    for (long s = 0; s < S; s++) { P[s] = EXP(P[s] - top); total += P[s]; }
                    real *w = weights + ((b * T + t) * U + u) * S;
                    for (long j = 0; j < NB; j++) pn[j] = 0;
                    for (long s = 0; s < S; s++) {
                        P[s] /= total;
                        w[s] = m[s] ? P[s] : 0;
                        const real *a = bank + (b * S + s) * NB;
                        for (long j = 0; j < NB; j++) pn[j] += w[s] * a[j];
                    }
                }
            }
            for (long i = 0; i < nb; i++) {
                const long row = (b0 + i) * U + u;
                memcpy(h_final + row * H, hs + row * (T + 1) * H + T * H, sizeof(real) * H);
                memcpy(p_final + row * NB, ps + row * (T + 1) * NB + T * NB, sizeof(real) * NB);
            }
        }
    }
    free(gh); free(gi); free(q);
}

/* Gradients of every input but the mask; accumulators are zeroed here. g_weights (B, T, U, S),
 * g_p_final (B, U, NB), g_h_final (B, U, H); d_keys (B, U, S, H) contiguous; d_tau one value. */
void pointer_backward(long U, long B, long T, long S, long NB, long H, int cosine, double tau_d,
                      const real *keys, long ks_b, long ks_u, const real *bank, const unsigned char *mask,
                      const real *w_i, const real *w_h, const real *hs, const real *ps, const real *gates,
                      const real *norms, const real *probs, const real *g_weights, const real *g_p_final,
                      const real *g_h_final, real *d_p0, real *d_h0, real *d_keys, real *d_bank, real *d_w_i,
                      real *d_b_i, real *d_w_h, real *d_b_h, real *d_tau) {
    const long G = 3 * H;
    const real tau = (real)tau_d;
    memset(d_keys, 0, sizeof(real) * B * U * S * H);
    memset(d_bank, 0, sizeof(real) * B * S * NB);
    memset(d_w_i, 0, sizeof(real) * U * NB * G);
    memset(d_b_i, 0, sizeof(real) * U * G);
    memset(d_w_h, 0, sizeof(real) * U * H * G);
    memset(d_b_h, 0, sizeof(real) * U * G);
    double dtau = 0;
    real *dh = malloc(sizeof(real) * TILE * H), *dp = malloc(sizeof(real) * TILE * NB);
    real *dgi = malloc(sizeof(real) * TILE * G), *dgh = malloc(sizeof(real) * TILE * G);
    real *dw = malloc(sizeof(real) * S), *q = malloc(sizeof(real) * H), *dq = malloc(sizeof(real) * H);
    for (long u = 0; u < U; u++) {
        const real *Wi = w_i + u * NB * G, *Wh = w_h + u * H * G;
        real *dWi = d_w_i + u * NB * G, *dBi = d_b_i + u * G, *dWh = d_w_h + u * H * G, *dBh = d_b_h + u * G;
        for (long b0 = 0; b0 < B; b0 += TILE) {
            const long nb = B - b0 < TILE ? B - b0 : TILE;
            for (long i = 0; i < nb; i++) {
                const long row = (b0 + i) * U + u;
                memcpy(dh + i * H, g_h_final + row * H, sizeof(real) * H);
                memcpy(dp + i * NB, g_p_final + row * NB, sizeof(real) * NB);
            }
            for (long t = T - 1; t >= 0; t--) {
                for (long i = 0; i < nb; i++) {
                    const long b = b0 + i, row = b * U + u;
                    real *dhi = dh + i * H, *dpi = dp + i * NB;
                    const real *P = probs + (row * T + t) * S, *gw = g_weights + ((b * T + t) * U + u) * S;
                    const unsigned char *m = mask + b * S;
                    /* p_t = sum_s w[s] A[s], and w_t is an output: dL/dw, then through w = P mask */
                    real dot_pd = 0;
                    for (long s = 0; s < S; s++) {
                        const real *a = bank + (b * S + s) * NB;
                        real *da = d_bank + (b * S + s) * NB;
                        const real ws = m[s] ? P[s] : 0;
                        real d = gw[s];
                        for (long j = 0; j < NB; j++) { d += dpi[j] * a[j]; da[j] += ws * dpi[j]; }
                        dw[s] = m[s] ? d : 0;
                        dot_pd += P[s] * dw[s];
                    }
                    /* softmax backward, then scores = q . K[s] */
                    const real *hn = hs + row * (T + 1) * H + (t + 1) * H;
                    const real norm = norms[row * T + t];
                    const real denom = norm > (real)EPS ? norm : (real)EPS;
                    const real scale = cosine ? tau / denom : (real)1;
                    for (long j = 0; j < H; j++) { q[j] = hn[j] * scale; dq[j] = 0; }
                    const real *K = keys + b * ks_b + u * ks_u;
                    real *dK = d_keys + row * S * H;
                    for (long s = 0; s < S; s++) {
                        const real ds = P[s] * (dw[s] - dot_pd);
                        const real *k = K + s * H;
                        real *dk = dK + s * H;
                        for (long j = 0; j < H; j++) { dq[j] += ds * k[j]; dk[j] += ds * q[j]; }
                    }
                    if (cosine) {  /* q = tau u, u = h / max(|h|, eps) */
                        real udu = 0, dt = 0;
                        for (long j = 0; j < H; j++) {
                            const real uj = hn[j] / denom;
                            dt += dq[j] * uj;
                            udu += uj * tau * dq[j];
                        }
                        dtau += dt;
                        for (long j = 0; j < H; j++) {
                            const real du = tau * dq[j];
                            dhi[j] += norm > (real)EPS ? (du - hn[j] / denom * udu) / norm : du / (real)EPS;
                        }
                    } else {
                        for (long j = 0; j < H; j++) dhi[j] += dq[j];
                    }
                    /* GRU cell backward */
                    const real *h = hs + row * (T + 1) * H + t * H, *gt = gates + (row * T + t) * 4 * H;
                    real *gi = dgi + i * G, *gh = dgh + i * G;
                    for (long j = 0; j < H; j++) {
                        const real r = gt[j], z = gt[H + j], n = gt[2 * H + j], ghn = gt[3 * H + j];
                        const real d = dhi[j];
                        const real dan = d * (1 - z) * (1 - n * n);
                        const real daz = d * (h[j] - n) * z * (1 - z);
                        const real dar = dan * ghn * r * (1 - r);
                        gi[j] = dar; gi[H + j] = daz; gi[2 * H + j] = dan;
                        gh[j] = dar; gh[H + j] = daz; gh[2 * H + j] = dan * r;
                        dhi[j] = d * z;  /* through h' = ... + z h */
                    }
                    for (long j = 0; j < G; j++) { dBi[j] += gi[j]; dBh[j] += gh[j]; }
                    const real *p = ps + row * (T + 1) * NB + t * NB;
                    for (long k = 0; k < NB; k++) {
                        const real pk = p[k], *wrow = Wi + k * G;
                        real *dwrow = dWi + k * G, acc = 0;
                        for (long j = 0; j < G; j++) { dwrow[j] += pk * gi[j]; acc += wrow[j] * gi[j]; }
                        dpi[k] = acc;
                    }
                }
                /* the W_h products for the whole tile: dW_h += h (x) dgh, dh += W_h dgh */
                for (long k = 0; k < H; k++) {
                    const real *wrow = Wh + k * G;
                    real *dwrow = dWh + k * G;
                    for (long i = 0; i < nb; i++) {
                        const long row = (b0 + i) * U + u;
                        const real hk = hs[row * (T + 1) * H + t * H + k];
                        const real *gh = dgh + i * G;
                        real acc = 0;
                        for (long j = 0; j < G; j++) { dwrow[j] += hk * gh[j]; acc += wrow[j] * gh[j]; }
                        dh[i * H + k] += acc;
                    }
                }
            }
            for (long i = 0; i < nb; i++) {
                const long row = (b0 + i) * U + u;
                memcpy(d_h0 + row * H, dh + i * H, sizeof(real) * H);
                memcpy(d_p0 + row * NB, dp + i * NB, sizeof(real) * NB);
            }
        }
    }
    *d_tau = (real)dtau;
    free(dh); free(dp); free(dgi); free(dgh); free(dw); free(q); free(dq);
}

/* The Controller GRU (nn.GRU, one layer, one direction, batch_first) over all steps, its input gates
 * gi = x W_ih^T + b_ih computed beforehand for every step in one matmul. PyTorch's GRU equations:
 *   gh = W_hh h + b_hh   r = sig(gi_r + gh_r)  z = sig(gi_z + gh_z)  n = tanh(gi_n + r gh_n)
 *   h' = (1 - z) n + z h
 * Layouts: gi (B, T, 3H), h0 (B, H), w_hh (3H, H) (nn.GRU's), b_hh (3H); outputs states (B, T, H),
 * last (B, H); saved gates (B, T, 4H) = r | z | n | gh_n. */
void gru_forward(long B, long T, long H, const real *gi, const real *h0, const real *w_hh, const real *b_hh,
                 real *states, real *last, real *gates) {
    const long G = 3 * H;
    real *gh = malloc(sizeof(real) * TILE * G);
    for (long b0 = 0; b0 < B; b0 += TILE) {
        const long nb = B - b0 < TILE ? B - b0 : TILE;
        for (long t = 0; t < T; t++) {
            for (long j = 0; j < G; j++) {  /* each row of W_hh read once per tile */
                const real *w = w_hh + j * H;
                for (long i = 0; i < nb; i++) {
                    const long b = b0 + i;
                    const real *h = t ? states + (b * T + t - 1) * H : h0 + b * H;
                    real acc = b_hh[j];
                    for (long k = 0; k < H; k++) acc += w[k] * h[k];
                    gh[i * G + j] = acc;
                }
            }
            for (long i = 0; i < nb; i++) {
                const long b = b0 + i;
                const real *h = t ? states + (b * T + t - 1) * H : h0 + b * H, *x = gi + (b * T + t) * G;
                const real *g = gh + i * G;
                real *hn = states + (b * T + t) * H, *gt = gates + (b * T + t) * 4 * H;
                for (long j = 0; j < H; j++) {
                    const real r = sigmoid(x[j] + g[j]);
                    const real z = sigmoid(x[H + j] + g[H + j]);
                    const real n = TANH(x[2 * H + j] + r * g[2 * H + j]);
                    hn[j] = (1 - z) * n + z * h[j];
                    gt[j] = r; gt[H + j] = z; gt[2 * H + j] = n; gt[3 * H + j] = g[2 * H + j];
                }
            }
        }
        for (long i = 0; i < nb; i++)
            memcpy(last + (b0 + i) * H, states + ((b0 + i) * T + T - 1) * H, sizeof(real) * H);
    }
    free(gh);
}

/* g_states (B, T, H), g_last (B, H) -> d_gi (B, T, 3H), d_h0 (B, H), d_w_hh (3H, H), d_b_hh (3H). */
void gru_backward(long B, long T, long H, const real *h0, const real *w_hh, const real *states, const real *gates,
                  const real *g_states, const real *g_last, real *d_gi, real *d_h0, real *d_w_hh, real *d_b_hh) {
    const long G = 3 * H;
    memset(d_w_hh, 0, sizeof(real) * G * H);
    memset(d_b_hh, 0, sizeof(real) * G);
    real *dh = malloc(sizeof(real) * TILE * H), *dgh = malloc(sizeof(real) * TILE * G);
    for (long b0 = 0; b0 < B; b0 += TILE) {
        const long nb = B - b0 < TILE ? B - b0 : TILE;
        for (long i = 0; i < nb; i++) memcpy(dh + i * H, g_last + (b0 + i) * H, sizeof(real) * H);
        for (long t = T - 1; t >= 0; t--) {
            for (long i = 0; i < nb; i++) {
                const long b = b0 + i;
                const real *h = t ? states + (b * T + t - 1) * H : h0 + b * H, *gt = gates + (b * T + t) * 4 * H;
                const real *gs = g_states + (b * T + t) * H;
                real *dhi = dh + i * H, *dx = d_gi + (b * T + t) * G, *dg = dgh + i * G;
                for (long j = 0; j < H; j++) {
                    const real r = gt[j], z = gt[H + j], n = gt[2 * H + j], ghn = gt[3 * H + j];
                    const real d = dhi[j] + gs[j];
                    const real dan = d * (1 - z) * (1 - n * n);
                    const real daz = d * (h[j] - n) * z * (1 - z);
                    const real dar = dan * ghn * r * (1 - r);
                    dx[j] = dar; dx[H + j] = daz; dx[2 * H + j] = dan;
                    dg[j] = dar; dg[H + j] = daz; dg[2 * H + j] = dan * r;
                    dhi[j] = d * z;
                }
                for (long j = 0; j < G; j++) d_b_hh[j] += dg[j];
            }
            for (long j = 0; j < G; j++) {  /* dh += W_hh^T dgh, dW_hh += dgh h^T, W_hh's row j once per tile */
                const real *w = w_hh + j * H;
                real *dw = d_w_hh + j * H;
                for (long i = 0; i < nb; i++) {
                    const long b = b0 + i;
                    const real *h = t ? states + (b * T + t - 1) * H : h0 + b * H;
                    const real dj = dgh[i * G + j];
                    real *dhi = dh + i * H;
                    for (long k = 0; k < H; k++) { dhi[k] += dj * w[k]; dw[k] += dj * h[k]; }
                }
            }
        }
        for (long i = 0; i < nb; i++) memcpy(d_h0 + (b0 + i) * H, dh + i * H, sizeof(real) * H);
    }
    free(dh); free(dgh);
}
"""
