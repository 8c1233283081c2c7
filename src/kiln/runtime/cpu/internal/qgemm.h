// Kiln's exact int8 GEMM (qgemm.cc) for CPUs where oneDNN's int8 kernels are not exact
// (runtime/cpu/isa.h, OneDnnHasExactInt8: below AVX-512 VNNI). There oneDNN multiplies u8 x s8
// pairs with vpmaddubsw, whose s16 pair sums saturate (and its AVX2 kernels may halve the s8
// weights first), so a quantized_dot or quantized_conv2d could differ from the reference
// backend's integer math in the leading digits. This kernel widens both operands to s16 and uses
// pmaddwd, whose products and pair sums are exact in int32 (|x0 w0 + x1 w1| <= 2 * 128 * 128), and
// adds them into int32 accumulators (wrapping as the reference's int32 conversion does), then
// converts each sum to f32 (nearest even, as static_cast) and multiplies by its scale once: the
// reference kernels' two roundings, so results agree bit for bit on every CPU.
//
// The product is Y[r, c] = f32(sum_k A[r, k] * B[k, c]) * scale:
//   A  s16, row-major [rows][K2 * 2] (K2 = ceil(K / 2), zero past K): the operand broadcast one
//      k-pair (one int32) at a time. QGemmWidenRows makes it from s8 rows.
//   B  s8, packed into panels of 16 columns (QGemmPack): panel p is K2 blocks of 32 bytes, block
//      kp holding B[2 kp, c] and B[2 kp + 1, c] for its 16 columns c, adjacent. It stays s8 in
//      memory (a quarter of f32's bytes: what bounds a batch-1 matmul) and is widened in
//      registers (pmovsxbw; SSE2: an unpack and a shift), once per block of rows.
// quantized_dot runs it with A = the activations (widened per run) and B = the weights (packed
// once), quantized_conv2d with A = the filter (widened once) and B = an im2col of the input
// (QConvIm2colPanels, per run): rows are output channels, columns output positions, so NCHW is
// written directly and a depthwise convolution (one row per group) still fills whole panels.
//
// Variants: AVX-512BW (x86-64-v4, one zmm per panel), AVX2 (x86-64-v3, two ymm) and SSE2 (the
// baseline, four xmm), picked from the process's capped ISA level (base/isa_dispatch.h).
//
//   std::vector<int8_t> pack(QGemmPackedBytes(K, N));
//   QGemmPack(w, /*k_stride=*/N, K, N, pack.data());
//   std::vector<int16_t> a(M * 2 * QGemmPairs(K));
//   QGemmWidenRows(x, /*row_stride=*/K, M, K, a.data());
//   QGemmArgs g = {a.data(), QGemmPairs(K), pack.data(), QGemmPairs(K), N, out};
//   QGemmTile(g, 0, M, 0, QGemmPanels(N));
#ifndef KILN_RUNTIME_CPU_INTERNAL_QGEMM_H_
#define KILN_RUNTIME_CPU_INTERNAL_QGEMM_H_

#include <cstdint>

namespace kiln::runtime::cpu {

inline constexpr int64_t kQGemmPanel = 16;       // columns per packed panel
inline constexpr int64_t kQGemmBlockBytes = 32;  // one panel's 2 k x 16 columns

inline constexpr int64_t QGemmPairs(int64_t K) { return (K + 1) / 2; }
inline constexpr int64_t QGemmPanels(int64_t N) { return (N + kQGemmPanel - 1) / kQGemmPanel; }
inline constexpr int64_t QGemmPackedBytes(int64_t K, int64_t N) {
  return QGemmPanels(N) * QGemmPairs(K) * kQGemmBlockBytes;
}

// Packs s8 B (element (k, c) at b[k * k_stride + c]) into QGemmPanels(N) panels at `pack`
// (QGemmPackedBytes(K, N) bytes), zeros past K and N. Panels [p0, p1) only with the second form.
void QGemmPack(const int8_t* b, int64_t k_stride, int64_t K, int64_t N, int8_t* pack);
void QGemmPackPanels(const int8_t* b, int64_t k_stride, int64_t K, int64_t N, int64_t p0,
                     int64_t p1, int8_t* pack);

// rows x K s8 (row r at x + r * row_stride) -> s16 [rows][2 * QGemmPairs(K)], zero-padded.
void QGemmWidenRows(const int8_t* x, int64_t row_stride, int64_t rows, int64_t K, int16_t* a);

// Where the f32 results go: element (r, c) at y + r * row_stride + (g / seg) * seg_stride +
// g % seg, g = col_offset + c (a convolution's columns run over images of `seg` positions each;
// a matmul's seg is N). Exactly one of col_scale (indexed by c) and row_scale (by r) is set.
struct QGemmOut {
  float* y = nullptr;
  int64_t row_stride = 0, seg = 1, seg_stride = 0, col_offset = 0;
  const float* col_scale = nullptr;
  const float* row_scale = nullptr;
};

struct QGemmArgs {
  const int16_t* a = nullptr;  // [rows][2 * a_pairs]
  int64_t a_pairs = 0;         // int32 pairs between rows (>= K2)
  const int8_t* b = nullptr;   // packed panels
  int64_t K2 = 0;              // k-pairs summed
  int64_t N = 0;               // valid columns (panels past it are not read)
  QGemmOut out;
};

// Rows [r0, r1) x panels [p0, p1) of the product, on the calling thread.
void QGemmTile(const QGemmArgs& a, int64_t r0, int64_t r1, int64_t p0, int64_t p1);

// The variant QGemmTile runs at the process's level: "avx512", "avx2" or "sse2".
const char* QGemmIsa();
// Rows the variant blocks in registers (a row chunk that is a multiple of it leaves no tail).
int64_t QGemmRowBlock();

// A quantized_conv2d's geometry (NCHW s8 input, OIHW filter with CG = C / groups input channels
// per group; padding top, bottom, left, right).
struct QConvGeometry {
  int64_t N = 0, C = 0, H = 0, W = 0, CG = 0, KH = 0, KW = 0, OH = 0, OW = 0;
  int64_t sh = 1, sw = 1, pt = 0, pb = 0, pl = 0, pr = 0, dh = 1, dw = 1;
  int64_t K() const { return CG * KH * KW; }
  int64_t columns() const { return N * OH * OW; }
  bool padded() const { return pt != 0 || pb != 0 || pl != 0 || pr != 0; }
  // The same convolution over the zero-padded input (QConvPadPlanes' result).
  QConvGeometry Padded() const {
    QConvGeometry g = *this;
    g.H = H + pt + pb;
    g.W = W + pl + pr;
    g.pt = g.pb = g.pl = g.pr = 0;
    return g;
  }
};

// Planes [p0, p1) (plane = image * C + channel) of the input, zero-padded: Padded().H x
// Padded().W bytes each at xp.
void QConvPadPlanes(const QConvGeometry& g, const int8_t* x, int64_t p0, int64_t p1, int8_t* xp);

// The B panels of group `group`'s output columns [c0, c0 + cols) (columns image-major, then oy,
// ox; k = (ci * KH + ky) * KW + kx, the filter's OIHW order): QGemmPanels(cols) panels at
// `panels`. `g` has no padding (pad first: Padded() and QConvPadPlanes); `x` is its input of
// x_bytes bytes. `col` is scratch of QConvColBytes(K, cols) bytes for the im2col rows.
void QConvIm2colPanels(const QConvGeometry& g, const int8_t* x, int64_t x_bytes, int64_t group,
                       int64_t c0, int64_t cols, int8_t* col, int8_t* panels);
struct QConvRun {  // (QConvIm2colPanels' bookkeeping)
  int64_t src, dst, len;
};
inline constexpr int64_t QConvColBytes(int64_t K, int64_t cols) {
  return K * (QGemmPanels(cols) + 1) * kQGemmPanel + cols * static_cast<int64_t>(sizeof(QConvRun));
}

}  // namespace kiln::runtime::cpu

#endif  // KILN_RUNTIME_CPU_INTERNAL_QGEMM_H_
