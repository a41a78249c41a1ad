// prebake's bf16 decode product, linked into an AOTInductor package (runtime/bf16_dot.py says why):
//   out[m, n] = sum over k of x[m, k] * w[n, k], x and w bf16, out float32 (m: one or two sequences),
// the products by AVX512-BF16's vdpbf16ps (bf16 pairs multiplied and summed into float32 lanes), the
// weight read once, row by row, as stored (a linear's [out, in] weight, in contiguous). Called by the
// package's wrapper through AOTInductor's C shim ABI (custom_ops_to_c_shims): it sees only
// AtenTensorHandles and the shim's C functions, so it builds against torch's headers alone.
#include <immintrin.h>
#include <stdint.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>

namespace {

constexpr int64_t kRows = 8;  // weight rows a thread walks at once, sharing each load of x's 32 values
// each weight line asked into L2 this many bytes before it is read: decode reads a weight once, so the
// hardware prefetcher, following eight short rows at once, leaves the loads waiting on memory (measured
// on SmolLM2's products: 0.70x the time of the same loop without it; docs/performance.md)
constexpr int64_t kAhead = 16384;

#define PREBAKE_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

// `Rows` x `M` outputs: rows of w that lie `ldw` apart against rows of x that lie `ldx` apart, each
// weight load shared by the M rows of x (two sequences' decode reads the weights once); the counts
// constants, so the accumulators stay in registers; k's last partial 32 lanes loaded under a mask
template <int64_t Rows, int64_t M>
PREBAKE_BF16 void block(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t ldw, int64_t k, float* out,
                        int64_t ldo) {
  __m512 acc[M][Rows];
  for (int64_t j = 0; j < M; ++j)
    for (int64_t r = 0; r < Rows; ++r) acc[j][r] = _mm512_setzero_ps();
  const int64_t whole = k / 32 * 32;
  for (int64_t i = 0; i < whole; i += 32) {
    __m512bh xv[M];
    for (int64_t j = 0; j < M; ++j) xv[j] = (__m512bh)_mm512_loadu_si512(x + j * ldx + i);
    for (int64_t r = 0; r < Rows; ++r) {
      // a prefetch never faults: past the weight's end (its last rows) it asks for nothing harmful; the
      // address computed as an integer, since a pointer past its allocation is undefined in C++
      _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(w + r * ldw + i) + kAhead), _MM_HINT_T1);
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + r * ldw + i);
      for (int64_t j = 0; j < M; ++j) acc[j][r] = _mm512_dpbf16_ps(acc[j][r], xv[j], wv);
    }
  }
  if (whole < k) {
    const __mmask32 tail = (__mmask32)((1ull << (k - whole)) - 1);
    __m512bh xv[M];
    for (int64_t j = 0; j < M; ++j) xv[j] = (__m512bh)_mm512_maskz_loadu_epi16(tail, x + j * ldx + whole);
    for (int64_t r = 0; r < Rows; ++r) {
      const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(tail, w + r * ldw + whole);
      for (int64_t j = 0; j < M; ++j) acc[j][r] = _mm512_dpbf16_ps(acc[j][r], xv[j], wv);
    }
  }
  for (int64_t j = 0; j < M; ++j)
    for (int64_t r = 0; r < Rows; ++r) out[j * ldo + r] = _mm512_reduce_add_ps(acc[j][r]);
}

// rows [first, first + Rows) of w (Rows a constant, or 1 for n's last rows) against every row of x,
// two at a time
template <int64_t Rows>
PREBAKE_BF16 void against_x(const uint16_t* x, int64_t ldx, int64_t m, const uint16_t* w, int64_t ldw, int64_t k,
                            float* out, int64_t n) {
  int64_t j = 0;
  for (; j + 2 <= m; j += 2) block<Rows, 2>(x + j * ldx, ldx, w, ldw, k, out + j * n, n);
  if (j < m) block<Rows, 1>(x + j * ldx, ldx, w, ldw, k, out + j * n, n);
}

}  // namespace

extern "C" AOTITorchError aoti_torch_cpu_prebake_bf16_dot(AtenTensorHandle x, AtenTensorHandle w,
                                                          AtenTensorHandle* ret0) {
  int64_t *x_sizes, *x_strides, *w_sizes, *w_strides, x_dim, w_dim;
  int32_t x_dtype, w_dtype;
  void *x_data, *w_data, *out_data;
  if (aoti_torch_get_dim(x, &x_dim) || aoti_torch_get_dim(w, &w_dim) || x_dim != 2 || w_dim != 2 ||
      aoti_torch_get_sizes(x, &x_sizes) || aoti_torch_get_strides(x, &x_strides) ||
      aoti_torch_get_sizes(w, &w_sizes) || aoti_torch_get_strides(w, &w_strides) ||
      aoti_torch_get_dtype(x, &x_dtype) || aoti_torch_get_dtype(w, &w_dtype) ||
      x_dtype != aoti_torch_dtype_bfloat16() || w_dtype != aoti_torch_dtype_bfloat16() || x_sizes[1] != w_sizes[1] ||
      x_strides[1] != 1 || w_strides[1] != 1 || aoti_torch_get_data_ptr(x, &x_data) ||
      aoti_torch_get_data_ptr(w, &w_data))
    return AOTI_TORCH_FAILURE;  // runtime.gemv hands over 2-D bf16 x [m, k] and w [n, k], k contiguous: else a bug
  const int64_t m = x_sizes[0], n = w_sizes[0], k = x_sizes[1];
  const int64_t sizes[2] = {m, n}, strides[2] = {n, 1};
  if (aoti_torch_empty_strided(2, sizes, strides, aoti_torch_dtype_float32(), aoti_torch_device_type_cpu(), 0, ret0) ||
      aoti_torch_get_data_ptr(*ret0, &out_data))
    return AOTI_TORCH_FAILURE;
  const uint16_t* xs = static_cast<const uint16_t*>(x_data);
  const uint16_t* ws = static_cast<const uint16_t*>(w_data);
  float* out = static_cast<float*>(out_data);
  const int64_t blocks = (n + kRows - 1) / kRows;
  // as Inductor's own kernels under cpp.dynamic_threads: the serving process's OpenMP thread count
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t first = b * kRows;
    const uint16_t* rows = ws + first * w_strides[0];
    if (n - first >= kRows) {
      against_x<kRows>(xs, x_strides[0], m, rows, w_strides[0], k, out + first, n);
    } else {
      for (int64_t one = 0; first + one < n; ++one)  // n's last rows, one at a time
        against_x<1>(xs, x_strides[0], m, rows + one * w_strides[0], w_strides[0], k, out + first + one, n);
    }
  }
  return AOTI_TORCH_SUCCESS;
}
