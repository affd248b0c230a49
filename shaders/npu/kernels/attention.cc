//===- attention.cc - tandem NPU attention, per-tile functions --*- C++ -*-===//
//
// tandem NPU kernel ABI v1 (see ../CONTRACT.md). One source for both
// generations:
//   npu1 (Phoenix / Hawk Point, AIE2,  __AIE_ARCH__ == 20)
//   npu4 (Strix / Krackan,      AIE2P, __AIE_ARCH__ == 21)
//
// NOT COMPILED HERE. Written against aie_api (aie_api/aie.hpp shipped with
// mlir-aie) and Peano (llvm-aie); see ../README.md, "Not verified".
//
// Compile-time configuration (passed by build.sh as -D flags):
//   TANDEM_HEAD_DIM   128 or 256
//   TANDEM_GROUP      query heads per kv head (1, 2, 4, 8)
//   TANDEM_PREFILL    0 = decode tile, 1 = prefill tile
//   TANDEM_NLANES     lanes of the design (decode: npu1 2, npu4 4;
//                     prefill: npu1 1, npu4 2), see designs/attention.py
//   TANDEM_MAX_ROWS   rows the fixed-size params window holds
//   TANDEM_SOFT_EXP2  1 = software exp2 also on aie2p (aie2 always uses it)
//
// The design (../designs/attention.py) calls these functions from each
// compute tile, in this order, per work item:
//
//   tandem_attn_plan                       once per dispatch (params)
//   for each item of this core:
//     tandem_attn_item_begin               (q tile acquired)
//     for each 128-key block of the item:
//       tandem_attn_block_begin
//       tandem_attn_score_chunk   x CHUNKS (K chunks, ascending)
//       tandem_attn_softmax
//       tandem_attn_pv_chunk      x CHUNKS (V chunks, ascending)
//       tandem_attn_block_end
//     tandem_attn_item_end                 (out tile acquired)
//
// Object-FIFO synchronisation lives in the design; these functions take no
// locks. Counters that the loops need are kept in the `ctl` buffer so that no
// loop induction variable has to be passed from the design.
//===----------------------------------------------------------------------===//

#include <aie_api/aie.hpp>
#include <stdint.h>
#include <string.h>

// The contract's f32 steps are separately rounded; build.sh also passes
// -ffp-contract=off.
#pragma STDC FP_CONTRACT OFF

#ifndef TANDEM_HEAD_DIM
#define TANDEM_HEAD_DIM 256
#endif
#ifndef TANDEM_GROUP
#define TANDEM_GROUP 4
#endif
#ifndef TANDEM_PREFILL
#define TANDEM_PREFILL 0
#endif
#ifndef TANDEM_NLANES
#define TANDEM_NLANES 4
#endif
#ifndef TANDEM_MAX_ROWS
#if TANDEM_PREFILL
#define TANDEM_MAX_ROWS 256
#else
#define TANDEM_MAX_ROWS 64
#endif
#endif
#ifndef TANDEM_SOFT_EXP2
#define TANDEM_SOFT_EXP2 0
#endif

#if __AIE_ARCH__ == 21 && !TANDEM_SOFT_EXP2
#define TANDEM_HW_EXP2 1 // AIE2P: aie::exp2<bfloat16> (hardware, bf16 result)
#else
#define TANDEM_HW_EXP2 0 // AIE2 has no exp2 unit: software, see exp2_bf16_soft
#endif

namespace {

// ---- Shapes (CONTRACT.md "Tile shapes") -----------------------------------
constexpr int D = TANDEM_HEAD_DIM;
constexpr int G = TANDEM_GROUP;
constexpr int KV_BLOCK = 128;  // keys per block, aligned to multiples of 128
constexpr int LANES16 = 16;    // f32 lanes of the score dot product
#if TANDEM_PREFILL
constexpr int Q_BLOCK = 32;          // query rows per prefill q-block
constexpr int JOBS = 16;             // compute tiles per lane (4 columns)
constexpr int CPH = JOBS / G;        // tiles per query head
constexpr int NV = Q_BLOCK / CPH;    // query vectors per tile (rows, 1 head)
constexpr int CH = 1024 / D;         // keys per K/V chunk object
#else
constexpr int JOBS = 1;
constexpr int CPH = 1;
constexpr int NV = G;                // query vectors per tile (heads, 1 row)
constexpr int CH = 2048 / D;
#endif
constexpr int CHUNKS = KV_BLOCK / CH;
constexpr int PARAM_WORDS = 9 + 2 * TANDEM_MAX_ROWS;

static_assert(D == 128 || D == 256, "head_dim must be 128 or 256");
static_assert(D % LANES16 == 0, "head_dim must be a multiple of 16");
static_assert(G == 1 || G == 2 || G == 4 || G == 8, "group must divide 8");
static_assert(KV_BLOCK % CH == 0, "chunk must divide the key block");
#if TANDEM_PREFILL
static_assert(!(D == 256 && G == 8), "prefill d256 g8 does not fit a tile");
#endif

// ---- ctl layout (int32[CTL_WORDS]) -----------------------------------------
enum Ctl : int {
  C_NITEMS = 0,   // items of this core in this dispatch (loop bound)
  C_NBLOCKS = 1,  // blocks of the current item (loop bound)
  C_ITEM = 2,     // next item ordinal of this core
  C_BLOCK = 3,    // current block ordinal within the item
  C_FIRSTBLK = 4, // first absolute block index of the item
  C_SLOT = 5,
  C_KVHEAD = 6,
  C_ROW0 = 7,     // first params row of the item
  C_NROWS = 8,    // valid rows of the item (decode: 1)
  C_HEAD0 = 9,    // query head of vector 0
  C_KCHUNK = 10,  // K chunk counter within the block
  C_VCHUNK = 11,  // V chunk counter within the block
  C_CURBLK = 12,  // absolute index of the current block
  C_LANE = 13,
  C_JOB = 14,
  C_POS = 16,             // + v: position of vector v
  C_LO = C_POS + 32,      // + v: first visible position of vector v
  C_JLO = C_LO + 32,      // + v: first visible key in the block (abs), or -1
  C_JHI = C_JLO + 32,     // + v: last visible key in the block (abs)
  CTL_WORDS = C_JHI + 32, // 144
};
static_assert(NV <= 32, "at most 32 query vectors per tile");

// stat layout (float[4 * NV]): m, l, c, skip-flag per vector.
inline float *st_m(float *s) { return s; }
inline float *st_l(float *s) { return s + NV; }
inline float *st_c(float *s) { return s + 2 * NV; }
inline float *st_skip(float *s) { return s + 3 * NV; }

// ---- Params (CONTRACT.md "bo0 params") ------------------------------------
struct Params {
  uint32_t abi, rows, heads, kv_heads, head_dim, capacity, window, slots;
  float scale;
  const uint32_t *rowv;
  uint32_t position(int r) const { return rowv[2 * r]; }
  uint32_t slot(int r) const { return rowv[2 * r + 1]; }
};

inline float f32_from_bits(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}
inline uint32_t bits_from_f32(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

inline Params read_params(const uint32_t *p) {
  Params P;
  P.abi = p[0];
  P.rows = p[1];
  P.heads = p[2];
  P.kv_heads = p[3];
  P.head_dim = p[4];
  P.capacity = p[5];
  P.window = p[6];
  P.scale = f32_from_bits(p[7]);
  P.slots = p[8];
  P.rowv = p + 9;
  return P;
}

// Visible positions of a row: lo..=p, lo = p + 1 - window saturating at 0.
inline uint32_t visible_lo(const Params &P, uint32_t pos) {
  if (P.window == 0)
    return 0;
  return (pos + 1 > P.window) ? pos + 1 - P.window : 0;
}

// ---- bf16 helpers: round to nearest, ties to even, on the f32 bits ---------
inline uint16_t bf16_rne(float f) {
  uint32_t b = bits_from_f32(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) // NaN: keep quiet NaN
    return (uint16_t)((b >> 16) | 0x40);
  uint32_t lsb = (b >> 16) & 1u;
  b += 0x7fffu + lsb;
  return (uint16_t)(b >> 16);
}
inline float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

// LOG2E = bf16(1.4426950408889634) = 1.4453125 (exact in f32).
constexpr float LOG2E = 1.4453125f;

// ---- exp2 -> bf16 -----------------------------------------------------------
// Contract: p = bf16(exp2(x)), taken as the correctly rounded bf16 of exp2(x).
//
// Software path (always on aie2, optional on aie2p): x = n + f with
// n = round(x), |f| <= 1/2; 2^f by a degree-7 Taylor polynomial in f32
// (truncation < 2^-27), scaled by 2^n on the exponent, then rounded to bf16
// from the 24-bit significand. When the f32 value lies within a few f32 ulps of
// a bf16 rounding tie, the polynomial is re-evaluated in double (soft-float) so
// the rounding decision is made on ~50 good bits. Scalar float on these cores
// is soft-float from compiler-rt (no libm), which is IEEE-exact but slow.

// Round significand `mant` (with the implicit one at bit `top`) times
// 2^(e - top) to bf16 bits, RNE, handling overflow and subnormals.
inline uint16_t round_sig_to_bf16(uint64_t mant, int top, int e) {
  // bf16 keeps 8 significant bits for normals (e >= -126).
  int drop = top - 7;
  if (e < -126)
    drop += (-126 - e); // subnormal: fewer bits survive
  if (drop > top + 1)   // below half the smallest subnormal
    return 0;
  uint64_t kept = mant >> drop;
  uint64_t rem = mant & ((1ull << drop) - 1);
  uint64_t half = 1ull << (drop - 1);
  if (rem > half || (rem == half && (kept & 1)))
    kept += 1;
  int be; // biased exponent
  if (e < -126) {
    // subnormal result, kept is the 7-bit fraction (may carry into normal)
    if (kept >= 0x80)
      return (uint16_t)(0x0080 | (kept & 0x7f)); // became the smallest normal
    return (uint16_t)kept;
  }
  if (kept >= 0x100) { // carry out of the significand
    kept >>= 1;
    e += 1;
  }
  be = e + 127;
  if (be >= 255)
    return 0x7f80; // +inf
  return (uint16_t)((be << 7) | (kept & 0x7f));
}

inline float exp2_poly_f32(float f) {
  // sum_{k<=7} (f ln2)^k / k!, Horner in f.
  const float c1 = 0.693147180559945f, c2 = 0.240226506959101f,
              c3 = 0.0555041086648216f, c4 = 0.00961812910762848f,
              c5 = 0.00133335581464284f, c6 = 0.000154035303933816f,
              c7 = 1.52527338040598e-05f;
  return 1.0f + f * (c1 + f * (c2 + f * (c3 + f * (c4 + f * (c5 + f * (c6 + f * c7))))));
}
inline double exp2_poly_f64(double f) {
  // degree 11 Taylor, |f| <= 1/2: truncation < 2^-52.
  double t = 1.0, s = 1.0;
  const double ln2 = 0.6931471805599453;
  for (int k = 1; k <= 11; k++) {
    t = t * f * ln2 / (double)k;
    s += t;
  }
  return s;
}

inline uint16_t exp2_bf16_soft(float x) {
  uint32_t xb = bits_from_f32(x);
  if ((xb & 0x7fffffffu) > 0x7f800000u)
    return 0x7fc0; // NaN
  if (x >= 128.0f)
    return 0x7f80;
  if (x < -135.0f) // also -inf
    return 0;
  // n = round-half-even(x) without libm: x is in (-135, 128)
  int n = (int)x; // truncates toward zero
  float fr = x - (float)n;  // exact
  if (fr > 0.5f) { n += 1; fr -= 1.0f; }
  else if (fr < -0.5f) { n -= 1; fr += 1.0f; }
  float y = exp2_poly_f32(fr); // in [0.70, 1.42]
  uint32_t yb = bits_from_f32(y);
  int ey = (int)((yb >> 23) & 0xff) - 127;
  uint64_t my = (uint64_t)((yb & 0x7fffffu) | 0x800000u);
  int e = ey + n;
  // Near-tie guard: distance of the dropped bits from a half, in f32 ulps.
  int drop = 16 + (e < -126 ? (-126 - e) : 0);
  if (drop <= 24) {
    uint64_t rem = my & ((1ull << drop) - 1);
    uint64_t half = 1ull << (drop - 1);
    uint64_t dist = rem > half ? rem - half : half - rem;
    if (dist <= 8) { // re-decide on the double evaluation
      double yd = exp2_poly_f64((double)fr);
      uint64_t db;
      memcpy(&db, &yd, 8);
      int ed = (int)((db >> 52) & 0x7ff) - 1023;
      uint64_t md = (db & ((1ull << 52) - 1)) | (1ull << 52);
      return round_sig_to_bf16(md, 52, ed + n);
    }
  }
  return round_sig_to_bf16(my, 23, e);
}

// exp2 of N f32 arguments into bf16 bits; hardware on aie2p.
template <int N>
inline void exp2_bf16_many(const float *x, uint16_t *out) {
#if TANDEM_HW_EXP2
  static_assert(N % 16 == 0, "hardware exp2 in 16-lane groups");
  for (int i = 0; i < N; i += 16) {
    aie::vector<float, 16> xv = aie::load_v<16>(x + i);
    aie::vector<bfloat16, 16> e = aie::exp2<bfloat16>(xv);
    aie::store_v((bfloat16 *)(out + i), e);
  }
#else
  for (int i = 0; i < N; i++)
    out[i] = exp2_bf16_soft(x[i]);
#endif
}

// Scratch for the exp2 arguments/results of one vector's block (+16 for c).
alignas(64) float g_exp_args[KV_BLOCK + 16];
alignas(64) uint16_t g_exp_out[KV_BLOCK + 16];

// ---- exact f32 x bf16 product, vectorised -----------------------------------
// a = hi + mid + lo exactly (three bf16 limbs, RNE splits). lo*c + mid*c is
// (a - hi)*c, at most 16 x 8 significant bits, hence exact in f32; adding hi*c
// rounds once. Result: the correctly rounded f32 product a*c, provided the
// accumulator adds in IEEE round-to-nearest-even (see README "Not verified").
inline aie::vector<float, 16> mul_f32_bf16_exact(aie::vector<float, 16> a,
                                                 aie::vector<bfloat16, 16> cv) {
  const aie::vector<bfloat16, 16> ones = aie::broadcast<bfloat16, 16>(1.0f);
  aie::accum<accfloat, 16> A;
  A.from_vector(a);
  aie::vector<bfloat16, 16> hi = A.template to_vector<bfloat16>();
  aie::accum<accfloat, 16> r1 = aie::msc(A, hi, ones);
  aie::vector<bfloat16, 16> mid = r1.template to_vector<bfloat16>();
  aie::accum<accfloat, 16> r2 = aie::msc(r1, mid, ones);
  aie::vector<bfloat16, 16> lo = r2.template to_vector<bfloat16>();
  aie::accum<accfloat, 16> p = aie::mul(lo, cv);
  p = aie::mac(p, mid, cv);
  p = aie::mac(p, hi, cv);
  return p.template to_vector<float>();
}

// ---- Step 1: score ----------------------------------------------------------
// s = dot(q, k) * scale. 16 f32 lanes, lane l accumulates q[i]*k[i] for
// i = l (mod 16) in ascending i (one aie::mac per 16 elements: bf16 x bf16
// products are exact in f32, each add rounds once). Then lanes are reduced
// pairwise (l, l+8), (l, l+4), (l, l+2), (l, l+1) in scalar f32, and the
// result is multiplied by scale in scalar f32.
inline float score(const bfloat16 *__restrict q, const bfloat16 *__restrict k,
                   float scale) {
  aie::accum<accfloat, 16> acc = aie::zeros<accfloat, 16>();
  for (int i = 0; i < D; i += LANES16) {
    aie::vector<bfloat16, 16> qv = aie::load_v<16>(q + i);
    aie::vector<bfloat16, 16> kv = aie::load_v<16>(k + i);
    acc = aie::mac(acc, qv, kv);
  }
  aie::vector<float, 16> lanes = acc.template to_vector<float>();
  float t[16];
  for (int l = 0; l < 16; l++)
    t[l] = lanes.get(l);
  for (int w = 8; w >= 1; w >>= 1)
    for (int l = 0; l < w; l++)
      t[l] = t[l] + t[l + w];
  return t[0] * scale;
}

inline float neg_inf() { return f32_from_bits(0xff800000u); }

// Work-item enumeration: shared with designs/attention.py (plan_dispatch).
// Decode: item i = r * kv_heads + g. Prefill: q-blocks are maximal runs of
// consecutive rows with equal slot, cut every 32 rows; item i = b*kv_heads+g.
// Lane L takes items i with i % NLANES == L, in ascending i.
inline int count_qblocks(const Params &P) {
#if TANDEM_PREFILL
  int nb = 0, run = 0;
  for (uint32_t r = 0; r < P.rows; r++) {
    if (run == 0 || run == Q_BLOCK || P.slot(r) != P.slot(r - 1)) {
      nb++;
      run = 0;
    }
    run++;
  }
  return nb;
#else
  return (int)P.rows;
#endif
}

// First row and row count of q-block b.
inline void qblock_rows(const Params &P, int b, int *row0, int *nrows) {
#if TANDEM_PREFILL
  int nb = -1, run = 0;
  *row0 = 0;
  *nrows = 0;
  for (uint32_t r = 0; r < P.rows; r++) {
    if (run == 0 || run == Q_BLOCK || P.slot(r) != P.slot(r - 1)) {
      nb++;
      run = 0;
      if (nb == b)
        *row0 = (int)r;
      if (nb > b)
        break;
    }
    run++;
    if (nb == b)
      *nrows = run;
  }
#else
  *row0 = b;
  *nrows = 1;
#endif
}

} // namespace

extern "C" {

// ---- Plan: read params once per dispatch -----------------------------------
void tandem_attn_plan(const uint32_t *params, int32_t *ctl, int32_t lane,
                      int32_t job) {
  Params P = read_params(params);
  for (int i = 0; i < CTL_WORDS; i++)
    ctl[i] = 0;
  ctl[C_LANE] = lane;
  ctl[C_JOB] = job;
  // The host refuses what the build cannot serve (CONTRACT.md "Refused");
  // a mismatch here leaves the core with no items.
  if (P.abi != 1 || P.head_dim != (uint32_t)D || P.kv_heads == 0 ||
      P.heads != P.kv_heads * (uint32_t)G || P.rows > TANDEM_MAX_ROWS) {
    ctl[C_NITEMS] = 0;
    return;
  }
  int items = count_qblocks(P) * (int)P.kv_heads;
  int mine = items > lane ? (items - lane + TANDEM_NLANES - 1) / TANDEM_NLANES : 0;
  ctl[C_NITEMS] = mine;
}

// ---- Item begin: which rows/heads, block range; reset m, l, acc ------------
void tandem_attn_item_begin(const uint32_t *params, int32_t *ctl, float *stat,
                            float *acc, float *part) {
  Params P = read_params(params);
  int k = ctl[C_ITEM];
  int item = ctl[C_LANE] + k * TANDEM_NLANES;
  int qb = item / (int)P.kv_heads;
  int g = item % (int)P.kv_heads;
  int row0, nrows;
  qblock_rows(P, qb, &row0, &nrows);
  int job = ctl[C_JOB];
  ctl[C_SLOT] = (int32_t)P.slot(row0);
  ctl[C_KVHEAD] = g;
  ctl[C_ROW0] = row0;
  ctl[C_NROWS] = nrows;
  ctl[C_HEAD0] = g * G + job / CPH;
  uint32_t lo_min = 0xffffffffu, p_max = 0;
  for (int v = 0; v < NV; v++) {
#if TANDEM_PREFILL
    // Tile rows rc*NV .. rc*NV+NV-1 of the q-block; rows past the block
    // repeat its last row (the design pads q and out the same way).
    int rr = (job % CPH) * NV + v;
    if (rr > nrows - 1)
      rr = nrows - 1;
    uint32_t pos = P.position(row0 + rr);
#else
    uint32_t pos = P.position(row0);
#endif
    uint32_t lo = visible_lo(P, pos);
    ctl[C_POS + v] = (int32_t)pos;
    ctl[C_LO + v] = (int32_t)lo;
    if (lo < lo_min) lo_min = lo;
    if (pos > p_max) p_max = pos;
  }
  // Visit blocks floor(lo_min/128) ..= floor(p_max/128), ascending (the
  // design streams exactly these). Per vector, blocks without a visible key
  // are skipped in tandem_attn_softmax.
  int first = (int)(lo_min / KV_BLOCK);
  int last = (int)(p_max / KV_BLOCK);
  ctl[C_FIRSTBLK] = first;
  ctl[C_NBLOCKS] = last - first + 1;
  ctl[C_BLOCK] = 0;
  for (int v = 0; v < NV; v++) {
    st_m(stat)[v] = neg_inf(); // m starts at -inf
    st_l(stat)[v] = 0.0f;
    st_c(stat)[v] = 0.0f;
    st_skip(stat)[v] = 1.0f;
  }
  for (int i = 0; i < NV * D; i += 16) {
    aie::store_v(acc + i, aie::zeros<float, 16>());
    aie::store_v(part + i, aie::zeros<float, 16>());
  }
}

// ---- Block begin: visible key range of this block per vector ---------------
void tandem_attn_block_begin(int32_t *ctl, float *scores) {
  int b = ctl[C_FIRSTBLK] + ctl[C_BLOCK];
  ctl[C_CURBLK] = b;
  ctl[C_KCHUNK] = 0;
  ctl[C_VCHUNK] = 0;
  int32_t bl = b * KV_BLOCK, bh = b * KV_BLOCK + KV_BLOCK - 1;
  for (int v = 0; v < NV; v++) {
    int32_t lo = ctl[C_LO + v], hi = ctl[C_POS + v];
    int32_t jl = lo > bl ? lo : bl;
    int32_t jh = hi < bh ? hi : bh;
    if (jl > jh) { // empty for this vector: skipped
      ctl[C_JLO + v] = -1;
      ctl[C_JHI + v] = -2;
    } else {
      ctl[C_JLO + v] = jl;
      ctl[C_JHI + v] = jh;
    }
  }
  for (int i = 0; i < NV * KV_BLOCK; i++)
    scores[i] = neg_inf();
}

// ---- Step 1 per K chunk: scores of the visible keys -------------------------
// q: [NV][D] bf16 (decode: the G heads of one row; prefill: NV rows of one
// head). kchunk: [CH][D] bf16, keys 128*b + c*CH + [0, CH).
void tandem_attn_score_chunk(const bfloat16 *__restrict q,
                             const bfloat16 *__restrict kchunk,
                             const uint32_t *params, int32_t *ctl,
                             float *scores) {
  Params P = read_params(params);
  int c = ctl[C_KCHUNK];
  int32_t j0 = ctl[C_CURBLK] * KV_BLOCK + c * CH;
  for (int v = 0; v < NV; v++) {
    int32_t jl = ctl[C_JLO + v], jh = ctl[C_JHI + v];
    for (int jj = 0; jj < CH; jj++) {
      int32_t j = j0 + jj;
      if (j < jl || j > jh)
        continue;
      scores[v * KV_BLOCK + c * CH + jj] = score(q + v * D, kchunk + jj * D, P.scale);
    }
  }
  ctl[C_KCHUNK] = c + 1;
}

// ---- Step 2: online-softmax update for the block ----------------------------
// m_new = max(m_old, max_j s_j); c = bf16(exp2((m_old - m_new) * LOG2E));
// p_j = bf16(exp2((s_j - m_new) * LOG2E)) (stored back into scores as f32);
// l = l * c + sum_j p_j (block sum in ascending j, from 0); acc = acc * c.
// The block's P.V partial is added to acc in tandem_attn_block_end, so that
// acc_new = (acc * c) + partial, two roundings, as the contract has it.
void tandem_attn_softmax(int32_t *ctl, float *stat, float *scores, float *acc) {
  ::aie::set_rounding(aie::rounding_mode::conv_even);
  int32_t b0 = ctl[C_CURBLK] * KV_BLOCK;
  // Scratch at file scope, not on the (small, ~1 KiB by default) core stack.
  float *args = g_exp_args;
  uint16_t *pb = g_exp_out;
  for (int v = 0; v < NV; v++) {
    int32_t jl = ctl[C_JLO + v], jh = ctl[C_JHI + v];
    if (jl < 0) { // empty block for this vector: state unchanged
      st_skip(stat)[v] = 1.0f;
      continue;
    }
    st_skip(stat)[v] = 0.0f;
    float *s = scores + v * KV_BLOCK;
    float m_old = st_m(stat)[v];
    float m_new = m_old;
    for (int32_t j = jl; j <= jh; j++) {
      float sj = s[j - b0];
      if (sj > m_new)
        m_new = sj;
    }
    // Correction factor (exp2(-inf) = 0 on the first visited block).
    float carg = (m_old - m_new) * LOG2E;
    // Probabilities of the visible keys; other lanes get -inf (-> 0, unused).
    for (int i = 0; i < KV_BLOCK; i++) {
      int32_t j = b0 + i;
      args[i] = (j >= jl && j <= jh) ? (s[i] - m_new) * LOG2E : neg_inf();
    }
    exp2_bf16_many<KV_BLOCK>(args, pb);
    uint16_t cb;
    {
      float *ca = g_exp_args;  // the 16 slots after the block's 128
      uint16_t *cr = g_exp_out + KV_BLOCK;
      for (int i = 0; i < 16; i++)
        ca[KV_BLOCK + i] = carg;
      exp2_bf16_many<16>(ca + KV_BLOCK, cr);
      cb = cr[0];
    }
    float cf = bf16_to_f32(cb);
    float bsum = 0.0f;
    for (int32_t j = jl; j <= jh; j++) {
      float pj = bf16_to_f32(pb[j - b0]);
      s[j - b0] = pj;
      bsum = bsum + pj;
    }
    float lc = st_l(stat)[v] * cf; // two roundings: no fused multiply-add
    st_l(stat)[v] = lc + bsum;
    st_m(stat)[v] = m_new;
    st_c(stat)[v] = cf;
    // acc *= c, exactly rounded per element.
    aie::vector<bfloat16, 16> cv =
        aie::broadcast<bfloat16, 16>(bfloat16(cf)); // cf is bf16-exact
    float *a = acc + v * D;
    for (int d = 0; d < D; d += 16)
      aie::store_v(a + d, mul_f32_bf16_exact(aie::load_v<16>(a + d), cv));
  }
}

// ---- Step 3 per V chunk: partial[d] += p_j * v_j[d], ascending j ----------
// part is zero on entry to each block: tandem_attn_item_begin zeroes it, and
// tandem_attn_block_end zeroes it after adding it to acc.
void tandem_attn_pv_chunk(const bfloat16 *__restrict vchunk, int32_t *ctl,
                          const float *stat, const float *scores, float *part) {
  int c = ctl[C_VCHUNK];
  int32_t b0 = ctl[C_CURBLK] * KV_BLOCK;
  int32_t j0 = b0 + c * CH;
  for (int v = 0; v < NV; v++) {
    if (st_skip((float *)stat)[v] != 0.0f)
      continue;
    int32_t jl = ctl[C_JLO + v], jh = ctl[C_JHI + v];
    float *pp = part + v * D;
    for (int jj = 0; jj < CH; jj++) {
      int32_t j = j0 + jj;
      if (j < jl || j > jh)
        continue;
      // p_j is bf16-exact; p_j * v_j[d] is exact in f32, so the fused mac is
      // the same as (part + product) rounded once.
      aie::vector<bfloat16, 16> pv =
          aie::broadcast<bfloat16, 16>(bfloat16(scores[v * KV_BLOCK + (j - b0)]));
      const bfloat16 *vr = vchunk + jj * D;
      for (int d = 0; d < D; d += 16) {
        aie::accum<accfloat, 16> A;
        A.from_vector(aie::load_v<16>(pp + d));
        A = aie::mac(A, pv, aie::load_v<16>(vr + d));
        aie::store_v(pp + d, A.template to_vector<float>());
      }
    }
  }
  ctl[C_VCHUNK] = c + 1;
}

// ---- Step 3 end: acc = (acc * c) + partial ----------------------------------
void tandem_attn_block_end(int32_t *ctl, const float *stat, float *acc,
                           float *part) {
  for (int v = 0; v < NV; v++) {
    if (st_skip((float *)stat)[v] != 0.0f)
      continue;
    float *a = acc + v * D;
    float *pp = part + v * D;
    for (int d = 0; d < D; d += 16) {
      aie::vector<float, 16> s = aie::add(aie::load_v<16>(a + d), aie::load_v<16>(pp + d));
      aie::store_v(a + d, s);
    }
  }
  for (int i = 0; i < NV * D; i += 16)
    aie::store_v(part + i, aie::zeros<float, 16>());
  ctl[C_BLOCK] = ctl[C_BLOCK] + 1;
}

// ---- Step 4: out[d] = bf16(acc[d] / l) --------------------------------------
// Scalar f32 division (IEEE, soft-float), then round to nearest even.
void tandem_attn_item_end(int32_t *ctl, const float *stat, const float *acc,
                          bfloat16 *out) {
  uint16_t *o = (uint16_t *)out;
  for (int v = 0; v < NV; v++) {
    float l = st_l((float *)stat)[v];
    for (int d = 0; d < D; d++)
      o[v * D + d] = bf16_rne(acc[v * D + d] / l);
  }
  ctl[C_ITEM] = ctl[C_ITEM] + 1;
}

} // extern "C"
