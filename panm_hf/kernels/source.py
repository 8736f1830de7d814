"""The C source of PANM's fused recurrences (compiled by `loader.py`).

Kept as a Python string, not a `.c` file, so that `save_pretrained`'s copy of the modeling code (which
carries `.py` files only; `remote_code_files` flattens this folder into it) carries it: a
`trust_remote_code` load then builds the same kernel and computes the same numbers.
"""

SOURCE = r"""
/* PANM's two recurrences for all decoding steps in one call each, forward and backward: the Pointer Units
 * (paper, Eqs. 1-3; PointerUnits.forward with pointer_update="attention", and "shift": struct shift below)
 * and, further down, the Controller GRU (Eq. 7). Plain C, no torch headers: compiled once per machine by
 * panm_hf/kernels/loader.py with `cc -O3 -fopenmp-simd -shared -fPIC [-DUSE_DOUBLE]` and called through
 * ctypes on contiguous tensors. The eager loop in panm_hf/pointer_unit.py (and nn.GRU) is the reference.
 *
 * Per row (sample b, unit u) and step t, with p = p_{t-1}, h = h_{t-1}:
 *   gi = b_i[u] + p W_i[u]         gh = b_h[u] + h W_h[u]            (3H each, gates r | z | n)
 *   r = sig(gi_r + gh_r)  z = sig(gi_z + gh_z)  n = tanh(gi_n + r gh_n)  h' = (1 - z) n + z h
 *   q = tau h' / max(|h'|, 1e-12) (cosine) or h' (dot; the keys carry 1/sqrt(H))
 *   P = softmax_s(q . K[s] + (mask[s] ? 0 : -65504))   w = P mask   p' = sum_s w[s] A[s]
 * Rows are independent. A tile of TILE rows of one unit runs through all steps together: its states are
 * packed into TILE x n blocks (rows past the batch are zeros) so the GRU's matrix products are small
 * register-blocked GEMMs (tile_matmul) that read each weight once per tile and step. The weight gradients,
 * one GEMM over all rows and steps per weight, are left to BLAS (the backward writes their factors).
 *
 * Layouts (row-major, contiguous unless a stride is given):
 *   p0 (B, U, NB), h0 (B, U, H), keys: row (b, u) at keys + b*ks_b + u*ks_u, (S, H) contiguous,
 *   bank (B, S, NB), mask (B, S) bytes, w_i (U, NB, 3H), b_i (U, 3H), w_h (U, H, 3H), b_h (U, 3H).
 *   Outputs: weights (B, T, U, S), p_final (B, U, NB), h_final (B, U, H).
 *   Saved for the backward: hs (B, U, T+1, H), ps (B, U, T+1, NB), gates (B, U, T, 4H) = r | z | n | gh_n,
 *   norms (B, U, T), probs (B, U, T, S).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef USE_DOUBLE
typedef double real;
#define EXP exp
#define TANH tanh
#define SQRT sqrt
#define LOG log
#define LOG1P log1p
#define TINY DBL_MIN
#define JB 8
#else
typedef float real;
#define EXP expf
#define TANH tanhf
#define SQRT sqrtf
#define LOG logf
#define LOG1P log1pf
#define TINY FLT_MIN
#define JB 16
#endif

#define TILE 8
#define EPS 1e-12
#define MASKED (-65504.0)

static real sigmoid(real x) { return (real)1 / ((real)1 + EXP(-x)); }

static real *zeros(long n) { return calloc(n, sizeof(real)); }

/* JB reals in one GCC/Clang vector (64 bytes: one AVX-512 register, two AVX2 ones), for the GEMM tiles. */
typedef real vec __attribute__((vector_size(64)));

static inline vec vload(const real *p) { vec v; memcpy(&v, p, sizeof v); return v; }
static inline void vstore(real *p, vec v) { memcpy(p, &v, sizeof v); }

/* out (TILE x N) = (accumulate ? out : 0) + x (TILE x K) W (K x N): TILE x JB accumulators in registers. */
static void tile_matmul(const real *x, long K, const real *W, long N, real *out, int accumulate) {
    long j0 = 0;
    for (; j0 + JB <= N; j0 += JB) {
        vec acc[TILE];
        for (long i = 0; i < TILE; i++) {
            const vec zero = {0};
            acc[i] = accumulate ? vload(out + i * N + j0) : zero;
        }
        for (long k = 0; k < K; k++) {
            const vec w = vload(W + k * N + j0);
            for (long i = 0; i < TILE; i++) acc[i] += x[i * K + k] * w;
        }
        for (long i = 0; i < TILE; i++) vstore(out + i * N + j0, acc[i]);
    }
    if (j0 < N) {  /* the last N % JB columns */
        const long jb = N - j0;
        real acc[TILE][JB];
        for (long i = 0; i < TILE; i++)
            for (long jj = 0; jj < jb; jj++) acc[i][jj] = accumulate ? out[i * N + j0 + jj] : 0;
        for (long k = 0; k < K; k++) {
            const real *w = W + k * N + j0;
            for (long i = 0; i < TILE; i++)
                for (long jj = 0; jj < jb; jj++) acc[i][jj] += x[i * K + k] * w[jj];
        }
        for (long i = 0; i < TILE; i++)
            for (long jj = 0; jj < jb; jj++) out[i * N + j0 + jj] = acc[i][jj];
    }
}

static void transpose(const real *W, long rows, long cols, real *out) {
    for (long r = 0; r < rows; r++)
        for (long c = 0; c < cols; c++) out[c * rows + r] = W[r * cols + c];
}

static real dot(const real *a, const real *b, long n) {
    real acc = 0;
#pragma omp simd reduction(+ : acc)
    for (long j = 0; j < n; j++) acc += a[j] * b[j];
    return acc;
}

/* pointer_update="shift" (pointer_arithmetic.py), NULL for "attention": per unit u, a head of M = 2K + 2 move
 * logits on h' and a sharpening exponent. Per row and step, with P the address attention above (not masked)
 * and v = w_{t-1} (w_0 given, then the previous step's output weights):
 *   c = softmax(h' W_m[u] + b_m[u])   mixed[s] = sum_{i=0}^{2K} c_i v[s - (K - i)] + c_{M-1} P[s]
 *   gamma = 1 + softplus(sharpening[u])
 *   Q = softmax_s(gamma log max(mixed, TINY) + (mask[s] ? 0 : -65504))   w = Q mask   p' = sum_s w[s] A[s]
 * (weight moved past either end of [0, S) is dropped). Layouts: w0 (B, U, S), head_w (U, H, M), head_b (U, M),
 * sharpening (U); saved for the backward: moves c (B, U, T, M), mixed and Q (B, U, T, S). */
struct shift {
    long K;
    const real *w0, *head_w, *head_b, *sharpening;
    real *moves, *mixed, *sharp;  /* forward: written; backward: read */
    real *d_w0, *d_head_w, *d_head_b, *d_sharpening;  /* backward only: (B, U, S), (U, H, M), (U, M), (U) */
};

static real softplus(real x) { return x > 20 ? x : LOG1P(EXP(x)); }  /* torch's threshold 20 */

/* One row's GRU update from the tile's products x = p W_i and g = h W_h (biases added here): h' into hn, the
 * gates r | z | n | gh_n into gt; returns |h'|. */
static real gru_cell(long H, const real *x, const real *g, const real *Bi, const real *Bh, const real *h, real *hn,
                     real *gt) {
    real sq = 0;
    for (long j = 0; j < H; j++) {
        const real r = sigmoid(x[j] + Bi[j] + g[j] + Bh[j]);
        const real z = sigmoid(x[H + j] + Bi[H + j] + g[H + j] + Bh[H + j]);
        const real ghn = g[2 * H + j] + Bh[2 * H + j];
        const real n = TANH(x[2 * H + j] + Bi[2 * H + j] + r * ghn);
        const real hj = (1 - z) * n + z * h[j];
        gt[j] = r; gt[H + j] = z; gt[2 * H + j] = n; gt[3 * H + j] = ghn;
        hn[j] = hj;
        sq += hj * hj;
    }
    return SQRT(sq);
}

/* The address attention of one row: P = softmax_s(q . K[s] + (m[s] ? 0 : -65504)), q the scaled h' (q: scratch). */
static void address_attention(long S, long H, int cosine, real tau, const real *hn, real norm, const real *K,
                              const unsigned char *m, real *q, real *P) {
    const real scale = cosine ? tau / (norm > (real)EPS ? norm : (real)EPS) : (real)1;
    for (long j = 0; j < H; j++) q[j] = hn[j] * scale;
    real top = -INFINITY, total = 0;
    for (long s = 0; s < S; s++) {
        P[s] = (m[s] ? 0 : (real)MASKED) + dot(q, K + s * H, H);
        if (P[s] > top) top = P[s];
    }
    for (long s = 0; s < S; s++) { P[s] = EXP(P[s] - top); total += P[s]; }
    for (long s = 0; s < S; s++) P[s] /= total;
}

/* The shift update of one row (struct shift): c, mixed and Q from h', P and v = w_{t-1}. */
static void shift_update(long S, long H, long K, real gamma, const real *hn, const real *Wm, const real *Bm,
                         const real *P, const real *v, const unsigned char *m, real *c, real *mixed, real *Q) {
    const long M = 2 * K + 2;
    real top = -INFINITY, total = 0;
    for (long k = 0; k < M; k++) {
        real acc = Bm[k];
        for (long j = 0; j < H; j++) acc += hn[j] * Wm[j * M + k];
        c[k] = acc;
        if (acc > top) top = acc;
    }
    for (long k = 0; k < M; k++) { c[k] = EXP(c[k] - top); total += c[k]; }
    for (long k = 0; k < M; k++) c[k] /= total;
    top = -INFINITY;
    for (long s = 0; s < S; s++) {
        real acc = 0;
        for (long i = 0; i <= 2 * K; i++) {
            const long from = s - (K - i);
            if (from >= 0 && from < S) acc += c[i] * v[from];
        }
        mixed[s] = acc + c[M - 1] * P[s];
        Q[s] = (m[s] ? 0 : (real)MASKED) + gamma * LOG(mixed[s] >= (real)TINY ? mixed[s] : (real)TINY);
        if (Q[s] > top) top = Q[s];
    }
    total = 0;
    for (long s = 0; s < S; s++) { Q[s] = EXP(Q[s] - top); total += Q[s]; }
    for (long s = 0; s < S; s++) Q[s] /= total;
}

/* Both Pointer-Unit recurrences' forward ("shift" when sh is not NULL); see pointer_forward and struct shift. */
static void recurrence_forward(long U, long B, long T, long S, long NB, long H, int cosine, double tau_d,
                               const real *p0, const real *h0, const real *keys, long ks_b, long ks_u,
                               const real *bank, const unsigned char *mask, const real *w_i, const real *b_i,
                               const real *w_h, const real *b_h, real *weights, real *p_final, real *h_final,
                               real *hs, real *ps, real *gates, real *norms, real *probs, const struct shift *sh) {
    const long G = 3 * H, M = sh ? 2 * sh->K + 2 : 0;
    const real tau = (real)tau_d;
    real *hpack = zeros(TILE * H), *ppack = zeros(TILE * NB), *gh = zeros(TILE * G), *gi = zeros(TILE * G);
    real *q = zeros(H);
    for (long u = 0; u < U; u++) {
        const real *Wi = w_i + u * NB * G, *Bi = b_i + u * G, *Wh = w_h + u * H * G, *Bh = b_h + u * G;
        const real gamma = sh ? 1 + softplus(sh->sharpening[u]) : (real)1;
        for (long b0 = 0; b0 < B; b0 += TILE) {
            const long nb = B - b0 < TILE ? B - b0 : TILE;
            memset(hpack, 0, sizeof(real) * TILE * H);
            memset(ppack, 0, sizeof(real) * TILE * NB);
            for (long i = 0; i < nb; i++) {  /* step 0 of the saved states: h_0 and p_0 */
                const long row = (b0 + i) * U + u;
                memcpy(hs + row * (T + 1) * H, h0 + row * H, sizeof(real) * H);
                memcpy(ps + row * (T + 1) * NB, p0 + row * NB, sizeof(real) * NB);
                memcpy(hpack + i * H, h0 + row * H, sizeof(real) * H);
                memcpy(ppack + i * NB, p0 + row * NB, sizeof(real) * NB);
            }
            for (long t = 0; t < T; t++) {
                tile_matmul(hpack, H, Wh, G, gh, 0);  /* h W_h for the tile */
                tile_matmul(ppack, NB, Wi, G, gi, 0);  /* p W_i */
                for (long i = 0; i < nb; i++) {
                    const long b = b0 + i, row = b * U + u, step = row * T + t;
                    const real *h = hs + row * (T + 1) * H + t * H;
                    real *hn = hs + row * (T + 1) * H + (t + 1) * H, *pn = ps + row * (T + 1) * NB + (t + 1) * NB;
                    const real norm = gru_cell(H, gi + i * G, gh + i * G, Bi, Bh, h, hn, gates + step * 4 * H);
                    norms[step] = norm;
                    const unsigned char *m = mask + b * S;
                    real *P = probs + step * S, *w = weights + ((b * T + t) * U + u) * S;
                    address_attention(S, H, cosine, tau, hn, norm, keys + b * ks_b + u * ks_u, m, q, P);
                    const real *chosen = P;
                    if (sh) {
                        const real *v = t ? w - U * S : sh->w0 + row * S;  /* w_{t-1}: step t - 1's output */
                        shift_update(S, H, sh->K, gamma, hn, sh->head_w + u * H * M, sh->head_b + u * M, P, v, m,
                                     sh->moves + step * M, sh->mixed + step * S, sh->sharp + step * S);
                        chosen = sh->sharp + step * S;
                    }
                    for (long j = 0; j < NB; j++) pn[j] = 0;
                    for (long s = 0; s < S; s++) {
                        w[s] = m[s] ? chosen[s] : 0;
                        const real *a = bank + (b * S + s) * NB;
                        for (long j = 0; j < NB; j++) pn[j] += w[s] * a[j];
                    }
                    memcpy(hpack + i * H, hn, sizeof(real) * H);
                    memcpy(ppack + i * NB, pn, sizeof(real) * NB);
                }
            }
            for (long i = 0; i < nb; i++) {
                const long row = (b0 + i) * U + u;
                memcpy(h_final + row * H, hpack + i * H, sizeof(real) * H);
                memcpy(p_final + row * NB, ppack + i * NB, sizeof(real) * NB);
            }
        }
    }
    free(hpack); free(ppack); free(gh); free(gi); free(q);
}

void pointer_forward(long U, long B, long T, long S, long NB, long H, int cosine, double tau_d,
                     const real *p0, const real *h0, const real *keys, long ks_b, long ks_u,
                     const real *bank, const unsigned char *mask, const real *w_i, const real *b_i,
                     const real *w_h, const real *b_h, real *weights, real *p_final, real *h_final,
                     real *hs, real *ps, real *gates, real *norms, real *probs) {
    recurrence_forward(U, B, T, S, NB, H, cosine, tau_d, p0, h0, keys, ks_b, ks_u, bank, mask, w_i, b_i, w_h, b_h,
                       weights, p_final, h_final, hs, ps, gates, norms, probs, NULL);
}

/* pointer_forward's arguments, then the shift's (struct shift): K, w0, head_w, head_b, sharpening, and the saved
 * moves, mixed, sharp. */
void shift_forward(long U, long B, long T, long S, long NB, long H, int cosine, double tau_d,
                   const real *p0, const real *h0, const real *keys, long ks_b, long ks_u,
                   const real *bank, const unsigned char *mask, const real *w_i, const real *b_i,
                   const real *w_h, const real *b_h, real *weights, real *p_final, real *h_final,
                   real *hs, real *ps, real *gates, real *norms, real *probs, long K, const real *w0,
                   const real *head_w, const real *head_b, const real *sharpening, real *moves, real *mixed,
                   real *sharp) {
    const struct shift sh = {K, w0, head_w, head_b, sharpening, moves, mixed, sharp, NULL, NULL, NULL, NULL};
    recurrence_forward(U, B, T, S, NB, H, cosine, tau_d, p0, h0, keys, ks_b, ks_u, bank, mask, w_i, b_i, w_h, b_h,
                       weights, p_final, h_final, hs, ps, gates, norms, probs, &sh);
}

/* Backward of address_attention for one row: dP (dL/dP) -> dh += dL/dh', dK += dL/dK, *dtau += dL/dtau
 * (q, dq: scratch). */
static void address_attention_backward(long S, long H, int cosine, real tau, const real *P, const real *dP,
                                       const real *hn, real norm, const real *K, real *dK, real *q, real *dq,
                                       real *dh, double *dtau) {
    real dot_pd = 0;
    for (long s = 0; s < S; s++) dot_pd += P[s] * dP[s];
    const real denom = norm > (real)EPS ? norm : (real)EPS;
    const real scale = cosine ? tau / denom : (real)1;
    for (long j = 0; j < H; j++) { q[j] = hn[j] * scale; dq[j] = 0; }
    for (long s = 0; s < S; s++) {  /* softmax backward, then scores = q . K[s] */
        const real ds = P[s] * (dP[s] - dot_pd);
        const real *k = K + s * H;
        real *dk = dK + s * H;
        for (long j = 0; j < H; j++) { dq[j] += ds * k[j]; dk[j] += ds * q[j]; }
    }
    if (cosine) {  /* q = tau u, u = h / max(|h|, eps) */
        const real dt = dot(dq, hn, H) / denom, udu = tau * dt;
        *dtau += dt;
        for (long j = 0; j < H; j++) {
            const real du = tau * dq[j];
            dh[j] += norm > (real)EPS ? (du - hn[j] / denom * udu) / norm : du / (real)EPS;
        }
    } else {
        for (long j = 0; j < H; j++) dh[j] += dq[j];
    }
}

/* Backward of shift_update for one row: dw (dL/dw, w = Q mask) -> dP (dL/dP), dv (dL/dw_{t-1}), dh += the head's
 * share of dL/dh', dWm += and dBm += the head's gradients; returns dL/dgamma (dz, dc: scratch of S and M). */
static real shift_update_backward(long S, long H, long K, real gamma, const real *hn, const real *Wm, const real *P,
                                  const real *v, const unsigned char *m, const real *c, const real *mixed,
                                  const real *Q, const real *dw, real *dP, real *dv, real *dh, real *dWm, real *dBm,
                                  real *dz, real *dc) {
    const long M = 2 * K + 2;
    real qd = 0, dgamma = 0;
    for (long s = 0; s < S; s++) qd += Q[s] * (m[s] ? dw[s] : 0);
    for (long s = 0; s < S; s++) {  /* softmax backward, then z = gamma log max(mixed, TINY) */
        const real d = Q[s] * ((m[s] ? dw[s] : 0) - qd), kept = mixed[s] >= (real)TINY ? mixed[s] : (real)TINY;
        dgamma += d * LOG(kept);
        dz[s] = mixed[s] >= (real)TINY ? gamma * d / kept : 0;  /* dL/dmixed; the clamp passes none below TINY */
    }
    for (long i = 0; i <= 2 * K; i++) {  /* mixed = sum_i c_i v[s - (K - i)] + c_{M-1} P */
        real acc = 0;
        for (long s = 0; s < S; s++) {
            const long from = s - (K - i);
            if (from >= 0 && from < S) acc += dz[s] * v[from];
        }
        dc[i] = acc;
    }
    dc[M - 1] = dot(dz, P, S);
    for (long s = 0; s < S; s++) dP[s] = c[M - 1] * dz[s];
    for (long j = 0; j < S; j++) {
        real acc = 0;
        for (long i = 0; i <= 2 * K; i++) {
            const long to = j + (K - i);
            if (to >= 0 && to < S) acc += c[i] * dz[to];
        }
        dv[j] = acc;
    }
    real cd = 0;  /* c = softmax(h' W_m + b_m) */
    for (long k = 0; k < M; k++) cd += c[k] * dc[k];
    for (long k = 0; k < M; k++) { dc[k] = c[k] * (dc[k] - cd); dBm[k] += dc[k]; }
    for (long j = 0; j < H; j++) {
        real acc = 0;
        for (long k = 0; k < M; k++) { acc += Wm[j * M + k] * dc[k]; dWm[j * M + k] += hn[j] * dc[k]; }
        dh[j] += acc;
    }
    return dgamma;
}

/* Backward of gru_cell for one row: dh (dL/dh') -> the gate gradients gi (of p W_i + b_i) and gh (of h W_h + b_h);
 * dh becomes the direct share of dL/dh (through h' = ... + z h). */
static void gru_cell_backward(long H, const real *gt, const real *h, real *dh, real *gi, real *gh) {
    for (long j = 0; j < H; j++) {
        const real r = gt[j], z = gt[H + j], n = gt[2 * H + j], ghn = gt[3 * H + j];
        const real d = dh[j];
        const real dan = d * (1 - z) * (1 - n * n);
        const real daz = d * (h[j] - n) * z * (1 - z);
        const real dar = dan * ghn * r * (1 - r);
        gi[j] = dar; gi[H + j] = daz; gi[2 * H + j] = dan;
        gh[j] = dar; gh[H + j] = daz; gh[2 * H + j] = dan * r;
        dh[j] = d * z;
    }
}

/* Both recurrences' backward ("shift" when sh is not NULL); see pointer_backward and struct shift. */
static void recurrence_backward(long U, long B, long T, long S, long NB, long H, int cosine, double tau_d,
                                const real *keys, long ks_b, long ks_u, const real *bank, const unsigned char *mask,
                                const real *w_i, const real *w_h, const real *hs, const real *ps, const real *gates,
                                const real *norms, const real *probs, const real *g_weights, const real *g_p_final,
                                const real *g_h_final, real *d_p0, real *d_h0, real *d_keys, real *d_bank,
                                real *d_b_i, real *d_b_h, real *d_tau, real *h_rows_all, real *p_rows_all,
                                real *dgh_rows_all, real *dgi_rows_all, const struct shift *sh) {
    const long G = 3 * H, M = sh ? 2 * sh->K + 2 : 1;
    const real tau = (real)tau_d;
    memset(d_keys, 0, sizeof(real) * B * U * S * H);
    memset(d_bank, 0, sizeof(real) * B * S * NB);
    memset(d_b_i, 0, sizeof(real) * U * G);
    memset(d_b_h, 0, sizeof(real) * U * G);
    if (sh) {
        memset(sh->d_head_w, 0, sizeof(real) * U * H * M);
        memset(sh->d_head_b, 0, sizeof(real) * U * M);
    }
    double dtau = 0;
    real *dh = zeros(TILE * H), *dp = zeros(TILE * NB), *dgi = zeros(TILE * G), *dgh = zeros(TILE * G);
    real *dv = zeros(TILE * S);  /* shift: dL/dw_{t-1} of each row of the tile, carried one step back */
    const long R = B * T;  /* rows (b, t) of one unit, for its weight gradients */
    real *WhT = zeros(G * H), *WiT = zeros(G * NB);
    real *dw = zeros(S), *dP = zeros(S), *dz = zeros(S), *vm = zeros(S), *dc = zeros(M), *q = zeros(H);
    real *dq = zeros(H);
    for (long u = 0; u < U; u++) {
        real *dBi = d_b_i + u * G, *dBh = d_b_h + u * G;
        real *h_rows = h_rows_all + u * R * H, *p_rows = p_rows_all + u * R * NB;
        real *dgh_rows = dgh_rows_all + u * R * G, *dgi_rows = dgi_rows_all + u * R * G;
        const real gamma = sh ? 1 + softplus(sh->sharpening[u]) : (real)1;
        double dgamma = 0;
        transpose(w_h + u * H * G, H, G, WhT);
        transpose(w_i + u * NB * G, NB, G, WiT);
        for (long b0 = 0; b0 < B; b0 += TILE) {
            const long nb = B - b0 < TILE ? B - b0 : TILE;
            memset(dh, 0, sizeof(real) * TILE * H);
            memset(dp, 0, sizeof(real) * TILE * NB);
            memset(dgh, 0, sizeof(real) * TILE * G);
            memset(dgi, 0, sizeof(real) * TILE * G);
            memset(dv, 0, sizeof(real) * TILE * S);
            for (long i = 0; i < nb; i++) {
                const long row = (b0 + i) * U + u;
                memcpy(dh + i * H, g_h_final + row * H, sizeof(real) * H);
                memcpy(dp + i * NB, g_p_final + row * NB, sizeof(real) * NB);
            }
            for (long t = T - 1; t >= 0; t--) {
                for (long i = 0; i < nb; i++) {
                    const long b = b0 + i, row = b * U + u, step = row * T + t;
                    real *dhi = dh + i * H, *dpi = dp + i * NB;
                    const real *P = probs + step * S, *gw = g_weights + ((b * T + t) * U + u) * S;
                    const real *chosen = sh ? sh->sharp + step * S : P;
                    const unsigned char *m = mask + b * S;
                    /* p_t = sum_s w[s] A[s], and w_t is an output (and, under shift, step t + 1's w_{t-1}) */
                    for (long s = 0; s < S; s++) {
                        const real *a = bank + (b * S + s) * NB;
                        real *da = d_bank + (b * S + s) * NB;
                        const real ws = m[s] ? chosen[s] : 0;
                        real d = gw[s] + (sh ? dv[i * S + s] : 0);
                        for (long j = 0; j < NB; j++) { d += dpi[j] * a[j]; da[j] += ws * dpi[j]; }
                        dw[s] = d;
                    }
                    const real *hn = hs + row * (T + 1) * H + (t + 1) * H;
                    if (sh) {
                        const real *v = t ? sh->sharp + (step - 1) * S : sh->w0 + row * S;
                        if (t)  /* w_{t-1} = Q_{t-1} mask (step 0: w_0 as given) */
                            for (long s = 0; s < S; s++) vm[s] = m[s] ? v[s] : 0;
                        dgamma += shift_update_backward(S, H, sh->K, gamma, hn, sh->head_w + u * H * M, P,
                                                        t ? vm : v, m, sh->moves + step * M, sh->mixed + step * S,
                                                        sh->sharp + step * S, dw, dP, dv + i * S, dhi,
                                                        sh->d_head_w + u * H * M, sh->d_head_b + u * M, dz, dc);
                    } else {
                        for (long s = 0; s < S; s++) dP[s] = m[s] ? dw[s] : 0;
                    }
                    address_attention_backward(S, H, cosine, tau, P, dP, hn, norms[step], keys + b * ks_b + u * ks_u,
                                               d_keys + row * S * H, q, dq, dhi, &dtau);
                    const real *h = hs + row * (T + 1) * H + t * H;
                    real *gi = dgi + i * G, *gh = dgh + i * G;
                    gru_cell_backward(H, gates + step * 4 * H, h, dhi, gi, gh);
                    for (long j = 0; j < G; j++) { dBi[j] += gi[j]; dBh[j] += gh[j]; }
                    const long r = b * T + t;
                    for (long j = 0; j < H; j++) h_rows[j * R + r] = h[j];
                    for (long j = 0; j < NB; j++) p_rows[j * R + r] = ps[row * (T + 1) * NB + t * NB + j];
                    memcpy(dgh_rows + r * G, gh, sizeof(real) * G);
                    memcpy(dgi_rows + r * G, gi, sizeof(real) * G);
                }
                /* through the tile's GRU products: dh += dgh W_h^T, dp = dgi W_i^T */
                tile_matmul(dgh, G, WhT, H, dh, 1);
                tile_matmul(dgi, G, WiT, NB, dp, 0);
            }
            for (long i = 0; i < nb; i++) {
                const long row = (b0 + i) * U + u;
                memcpy(d_h0 + row * H, dh + i * H, sizeof(real) * H);
                memcpy(d_p0 + row * NB, dp + i * NB, sizeof(real) * NB);
                if (sh) memcpy(sh->d_w0 + row * S, dv + i * S, sizeof(real) * S);
            }
        }
        if (sh) {  /* gamma = 1 + softplus(x): d/dx = sigmoid(x), 1 past the threshold */
            const real x = sh->sharpening[u], e = EXP(x);
            sh->d_sharpening[u] = (real)dgamma * (x > 20 ? (real)1 : e / (e + 1));
        }
    }
    *d_tau = (real)dtau;
    free(dh); free(dp); free(dgi); free(dgh); free(dv); free(WhT); free(WiT);
    free(dw); free(dP); free(dz); free(vm); free(dc); free(q); free(dq);
}

/* Gradients of every input but the mask and the GRU weights; accumulators are zeroed here. g_weights
 * (B, T, U, S), g_p_final (B, U, NB), g_h_final (B, U, H); d_keys (B, U, S, H) contiguous; d_tau one value.
 * The weight gradients are one GEMM over all rows and steps, left to BLAS: this writes their factors,
 * per unit and row r = b T + t, h_rows (U, H, B T) = h_t and p_rows (U, NB, B T) = p_t (transposed: the GEMM
 * reads them as they are) and the gate gradients dgh_rows, dgi_rows (U, B T, 3H), so that
 * dW_h[u] = h_rows[u] dgh_rows[u], and likewise W_i. */
void pointer_backward(long U, long B, long T, long S, long NB, long H, int cosine, double tau_d,
                      const real *keys, long ks_b, long ks_u, const real *bank, const unsigned char *mask,
                      const real *w_i, const real *w_h, const real *hs, const real *ps, const real *gates,
                      const real *norms, const real *probs, const real *g_weights, const real *g_p_final,
                      const real *g_h_final, real *d_p0, real *d_h0, real *d_keys, real *d_bank, real *d_b_i,
                      real *d_b_h, real *d_tau, real *h_rows_all, real *p_rows_all, real *dgh_rows_all,
                      real *dgi_rows_all) {
    recurrence_backward(U, B, T, S, NB, H, cosine, tau_d, keys, ks_b, ks_u, bank, mask, w_i, w_h, hs, ps, gates,
                        norms, probs, g_weights, g_p_final, g_h_final, d_p0, d_h0, d_keys, d_bank, d_b_i, d_b_h, d_tau,
                        h_rows_all, p_rows_all, dgh_rows_all, dgi_rows_all, NULL);
}

/* pointer_backward's arguments, then the shift's (struct shift): K, w0, head_w, sharpening, the saved moves, mixed,
 * sharp, and the gradients d_w0, d_head_w, d_head_b, d_sharpening (zeroed here). */
void shift_backward(long U, long B, long T, long S, long NB, long H, int cosine, double tau_d,
                    const real *keys, long ks_b, long ks_u, const real *bank, const unsigned char *mask,
                    const real *w_i, const real *w_h, const real *hs, const real *ps, const real *gates,
                    const real *norms, const real *probs, const real *g_weights, const real *g_p_final,
                    const real *g_h_final, real *d_p0, real *d_h0, real *d_keys, real *d_bank, real *d_b_i,
                    real *d_b_h, real *d_tau, real *h_rows_all, real *p_rows_all, real *dgh_rows_all,
                    real *dgi_rows_all, long K, const real *w0, const real *head_w, const real *sharpening,
                    real *moves, real *mixed, real *sharp, real *d_w0, real *d_head_w, real *d_head_b,
                    real *d_sharpening) {
    const struct shift sh = {K, w0, head_w, NULL, sharpening, moves, mixed, sharp, d_w0, d_head_w, d_head_b,
                             d_sharpening};
    recurrence_backward(U, B, T, S, NB, H, cosine, tau_d, keys, ks_b, ks_u, bank, mask, w_i, w_h, hs, ps, gates,
                        norms, probs, g_weights, g_p_final, g_h_final, d_p0, d_h0, d_keys, d_bank, d_b_i, d_b_h, d_tau,
                        h_rows_all, p_rows_all, dgh_rows_all, dgi_rows_all, &sh);
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
    real *gh = zeros(TILE * G), *hpack = zeros(TILE * H), *WT = zeros(H * G);
    transpose(w_hh, G, H, WT);  /* (H, 3H): h W_hh^T as a tile GEMM */
    for (long b0 = 0; b0 < B; b0 += TILE) {
        const long nb = B - b0 < TILE ? B - b0 : TILE;
        memset(hpack, 0, sizeof(real) * TILE * H);
        for (long i = 0; i < nb; i++) memcpy(hpack + i * H, h0 + (b0 + i) * H, sizeof(real) * H);
        for (long t = 0; t < T; t++) {
            tile_matmul(hpack, H, WT, G, gh, 0);
            for (long i = 0; i < nb; i++) {
                const long b = b0 + i;
                const real *x = gi + (b * T + t) * G, *g = gh + i * G;
                real *h = hpack + i * H, *hn = states + (b * T + t) * H, *gt = gates + (b * T + t) * 4 * H;
                for (long j = 0; j < H; j++) {
                    const real r = sigmoid(x[j] + g[j] + b_hh[j]);
                    const real z = sigmoid(x[H + j] + g[H + j] + b_hh[H + j]);
                    const real ghn = g[2 * H + j] + b_hh[2 * H + j];
                    const real n = TANH(x[2 * H + j] + r * ghn);
                    hn[j] = (1 - z) * n + z * h[j];
                    gt[j] = r; gt[H + j] = z; gt[2 * H + j] = n; gt[3 * H + j] = ghn;
                }
                memcpy(h, hn, sizeof(real) * H);
            }
        }
        for (long i = 0; i < nb; i++) memcpy(last + (b0 + i) * H, hpack + i * H, sizeof(real) * H);
    }
    free(gh); free(hpack); free(WT);
}

/* g_states (B, T, H), g_last (B, H) -> d_gi (B, T, 3H), d_h0 (B, H), d_b_hh (3H), and the factors of
 * d_w_hh = dgh_rows h_rows (one GEMM, left to BLAS): h_rows (B T, H) = h_{t-1}, dgh_rows (3H, B T). */
void gru_backward(long B, long T, long H, const real *h0, const real *w_hh, const real *states, const real *gates,
                  const real *g_states, const real *g_last, real *d_gi, real *d_h0, real *d_b_hh, real *h_rows,
                  real *dgh_rows) {
    const long G = 3 * H;
    memset(d_b_hh, 0, sizeof(real) * G);
    real *dh = zeros(TILE * H), *dgh = zeros(TILE * G);
    for (long b0 = 0; b0 < B; b0 += TILE) {
        const long nb = B - b0 < TILE ? B - b0 : TILE;
        memset(dh, 0, sizeof(real) * TILE * H);
        memset(dgh, 0, sizeof(real) * TILE * G);
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
                memcpy(h_rows + (b * T + t) * H, h, sizeof(real) * H);
                for (long j = 0; j < G; j++) dgh_rows[j * B * T + b * T + t] = dg[j];
            }
            tile_matmul(dgh, G, w_hh, H, dh, 1);  /* dh += dgh W_hh */
        }
        for (long i = 0; i < nb; i++) memcpy(d_h0 + (b0 + i) * H, dh + i * H, sizeof(real) * H);
    }
    free(dh); free(dgh);
}
/* Cosine normalisation of the attention queries and keys (attention.py, AttentionScorer), the same math as
 * `scale * torch.nn.functional.normalize(x, dim=-1)` (eps 1e-12) in one pass forward and one backward:
 *   y = s x / d,  d = max(|x|, EPS)
 * Backward (clamp_min passes the gradient where |x| >= EPS, as torch's does):
 *   g = s dy;  dx = (g - xh (xh . g)) / |x| if |x| >= EPS, else g / EPS;  ds = sum_rows dy . xh,  xh = x / d.
 * x holds A x Bt x S rows of D (contiguous); with swap, row (a, b, s) of x is row (b, a, s) of y (the Pointer
 * Units' address keys go from unit-major to batch-major on the way); norms (A, Bt, S) are saved for the
 * backward, in x's order; scale NULL for s = 1. */
static long swapped(long row, long A, long Bt, long S) {
    const long a = row / (Bt * S), b = (row / S) % Bt, s = row % S;
    return (b * A + a) * S + s;
}

void normalize_forward(long A, long Bt, long S, long D, int swap, const real *x, const real *scale, real *y,
                       real *norms) {
    const real s = scale ? *scale : (real)1;
    for (long r = 0; r < A * Bt * S; r++) {
        const real *xr = x + r * D;
        real *yr = y + (swap ? swapped(r, A, Bt, S) : r) * D;
        const real n = SQRT(dot(xr, xr, D)), d = n > (real)EPS ? n : (real)EPS;
        norms[r] = n;
        for (long j = 0; j < D; j++) yr[j] = xr[j] / d * s;
    }
}

void normalize_backward(long A, long Bt, long S, long D, int swap, const real *x, const real *scale,
                        const real *norms, const real *dy, real *dx, real *d_scale) {
    const real s = scale ? *scale : (real)1;
    real ds = 0;
    for (long r = 0; r < A * Bt * S; r++) {
        const real *xr = x + r * D, *dyr = dy + (swap ? swapped(r, A, Bt, S) : r) * D;
        real *dxr = dx + r * D;
        const real n = norms[r], d = n > (real)EPS ? n : (real)EPS;
        real xg = 0, xdy = 0;
        for (long j = 0; j < D; j++) {
            const real xh = xr[j] / d;
            xg += xh * dyr[j] * s;
            xdy += xh * dyr[j];
        }
        ds += xdy;
        if (n >= (real)EPS)
            for (long j = 0; j < D; j++) dxr[j] = (dyr[j] * s - xr[j] / d * xg) / n;
        else
            for (long j = 0; j < D; j++) dxr[j] = dyr[j] * s / (real)EPS;
    }
    if (d_scale) *d_scale = ds;
}

/* The Mode-2 read (reads.py, Mode2Reader after its query MLP; paper Eqs. 5-6) in one kernel forward and one
 * backward, per sample b and query row q (steps x heads) over the slots s of M (B, S, D):
 *   cosine:  qn = tau q / max(|q|, EPS),  K[s] = M[s] / max(|M[s]|, EPS)
 *   dot:     qn = q,                      K[s] = M[s] / sqrt(D)
 *   P = softmax_s(qn . K[s], masked slots at the dtype's lowest value)   w = P mask   v = sum_s w[s] M[s]
 * A row with no real slot gets w = 0 and v = 0 (masked_softmax's convention). Saved for the backward: the
 * unit queries U = q / max(|q|, EPS) and |q| (B, Q, D), (B, Q), the keys K and |M[s]| (B, S, D), (B, S). */
void attention_forward(long B, long Q, long S, long D, int cosine, const real *scale, const real *q,
                       const real *mem, const unsigned char *mask, real *values, real *weights, real *q_unit,
                       real *q_norms, real *k_unit, real *k_norms) {
    const real tau = cosine ? *scale : (real)1, root = SQRT((real)D);
    real *qn = malloc(sizeof(real) * (D ? D : 1)), *sc = malloc(sizeof(real) * (S ? S : 1));
    for (long b = 0; b < B; b++) {
        const real *M = mem + b * S * D;
        const unsigned char *mk = mask + b * S;
        real *K = k_unit + b * S * D;
        for (long s = 0; s < S; s++) {
            const real *m = M + s * D, n = SQRT(dot(m, m, D)), d = n > (real)EPS ? n : (real)EPS;
            k_norms[b * S + s] = n;
            for (long j = 0; j < D; j++) K[s * D + j] = cosine ? m[j] / d : m[j] / root;
        }
        for (long i = 0; i < Q; i++) {
            const long row = b * Q + i;
            const real *x = q + row * D;
            real *u = q_unit + row * D, *w = weights + row * S, *v = values + row * D;
            const real n = SQRT(dot(x, x, D)), d = n > (real)EPS ? n : (real)EPS;
            q_norms[row] = n;
            for (long j = 0; j < D; j++) {
                u[j] = x[j] / d;
                qn[j] = cosine ? u[j] * tau : x[j];
            }
            real top = 0, total = 0;
            int any = 0;
            for (long s = 0; s < S; s++) {
                sc[s] = dot(qn, K + s * D, D);
                if (mk[s] && (!any || sc[s] > top)) top = sc[s], any = 1;
            }
            for (long s = 0; s < S; s++) {
                w[s] = (any && mk[s]) ? EXP(sc[s] - top) : (real)0;
                total += w[s];
            }
            for (long s = 0; s < S; s++) w[s] = any ? w[s] / total : (real)0;
            memset(v, 0, sizeof(real) * D);
            for (long s = 0; s < S; s++)
                if (w[s] != 0)
                    for (long j = 0; j < D; j++) v[j] += w[s] * M[s * D + j];
        }
    }
    free(qn); free(sc);
}

void attention_backward(long B, long Q, long S, long D, int cosine, const real *scale, const real *q,
                        const real *mem, const unsigned char *mask, const real *weights, const real *q_unit,
                        const real *q_norms, const real *k_unit, const real *k_norms, const real *d_values,
                        const real *d_weights, real *d_q, real *d_mem, real *d_scale) {
    const real tau = cosine ? *scale : (real)1, root = SQRT((real)D);
    real *dk = malloc(sizeof(real) * (S * D ? S * D : 1)), *ds = malloc(sizeof(real) * (S ? S : 1));
    real *dqn = malloc(sizeof(real) * (D ? D : 1));
    real d_tau = 0;
    for (long b = 0; b < B; b++) {
        const real *M = mem + b * S * D, *K = k_unit + b * S * D;
        const unsigned char *mk = mask + b * S;
        real *dM = d_mem + b * S * D;
        memset(dM, 0, sizeof(real) * S * D);
        memset(dk, 0, sizeof(real) * S * D);
        for (long i = 0; i < Q; i++) {
            const long row = b * Q + i;
            const real *w = weights + row * S, *dv = d_values + row * D, *u = q_unit + row * D, *x = q + row * D;
            real sp = 0;
            for (long s = 0; s < S; s++) {
                ds[s] = mk[s] ? dot(dv, M + s * D, D) + (d_weights ? d_weights[row * S + s] : (real)0) : (real)0;
                sp += w[s] * ds[s];
            }
            memset(dqn, 0, sizeof(real) * D);
            for (long s = 0; s < S; s++) {
                const real g = mk[s] ? w[s] * (ds[s] - sp) : (real)0;
                for (long j = 0; j < D; j++) {
                    dM[s * D + j] += w[s] * dv[j];
                    dqn[j] += g * K[s * D + j];
                    dk[s * D + j] += g * (cosine ? u[j] * tau : x[j]);
                }
            }
            real *dx = d_q + row * D;
            if (cosine) {
                const real n = q_norms[row];
                d_tau += dot(dqn, u, D);
                real ug = 0;
                for (long j = 0; j < D; j++) ug += u[j] * dqn[j] * tau;
                for (long j = 0; j < D; j++)
                    dx[j] = n >= (real)EPS ? (dqn[j] * tau - u[j] * ug) / n : dqn[j] * tau / (real)EPS;
            } else {
                memcpy(dx, dqn, sizeof(real) * D);
            }
        }
        for (long s = 0; s < S; s++) {
            const real *k = K + s * D, *g = dk + s * D, n = k_norms[b * S + s];
            real *dm = dM + s * D;
            if (cosine) {
                const real kg = dot(k, g, D);
                for (long j = 0; j < D; j++) dm[j] += n >= (real)EPS ? (g[j] - k[j] * kg) / n : g[j] / (real)EPS;
            } else {
                for (long j = 0; j < D; j++) dm[j] += g[j] / root;
            }
        }
    }
    if (d_scale) *d_scale = d_tau;
    free(dk); free(ds); free(dqn);
}
/* h^c_0's pooling (controller.py, Controller.initial_hidden): out[b] = sum_s m[b, s] M[b, s] / c[b] with
 * c = max(sum_s m[b, s], 1) for the mean (c = 1 for the paper's sum); m is the 0/1 slot mask. Backward:
 * dM[b, s] = m[b, s] dout[b] / c[b]. */
void pool_forward(long B, long S, long D, int mean, const real *mem, const unsigned char *mask, real *out) {
    for (long b = 0; b < B; b++) {
        real *o = out + b * D, count = 0;
        memset(o, 0, sizeof(real) * D);
        for (long s = 0; s < S; s++) {
            const real m = mask[b * S + s] ? (real)1 : (real)0, *x = mem + (b * S + s) * D;
            count += m;
            for (long j = 0; j < D; j++) o[j] += x[j] * m;
        }
        if (mean)
            for (long j = 0; j < D; j++) o[j] /= count > (real)1 ? count : (real)1;
    }
}

void pool_backward(long B, long S, long D, int mean, const unsigned char *mask, const real *d_out, real *d_mem) {
    for (long b = 0; b < B; b++) {
        real count = 0;
        for (long s = 0; s < S; s++) count += mask[b * S + s] ? (real)1 : (real)0;
        const real c = mean && count > (real)1 ? count : (real)1;
        for (long s = 0; s < S; s++) {
            const real m = mask[b * S + s] ? (real)1 : (real)0;
            real *dx = d_mem + (b * S + s) * D;
            for (long j = 0; j < D; j++) dx[j] = d_out[b * D + j] / c * m;
        }
    }
}
"""
