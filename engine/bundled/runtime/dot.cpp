// prebake's decode product, linked into an AOTInductor package (runtime/dot.py says why):
//   out[m, n] = sum over k of x[m, k] * w[n, k], x and w both bf16 or both float32, out float32 (m: one
// or two sequences), bf16 by AVX512-BF16's vdpbf16ps (bf16 pairs multiplied and summed into float32
// lanes), float32 by AVX-512's fused multiply-add; the weight read once, row by row, as stored (a
// linear's [out, in] weight, in contiguous), each line of it prefetched ahead of its load. Called by the
// package's wrapper through AOTInductor's C shim ABI (custom_ops_to_c_shims): it sees only
// AtenTensorHandles and the shim's C functions, so it builds against torch's headers alone.
#include <immintrin.h>
#include <stdint.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>

namespace {

constexpr int64_t kRows = 8;  // weight rows a thread walks at once, sharing each load of x's values
// each weight line asked into L2 this many bytes before it is read: decode reads a weight once, so the
// hardware prefetcher, following eight short rows at once, leaves the loads waiting on memory (measured
// on SmolLM2's products: 0.70x the time of the same loop without it; docs/performance.md)
constexpr int64_t kAhead = 16384;

// one target for both element types: the kernel applies only where the platform promises AMX
// (runtime/dot.py), whose CPUs all have these
#define PREBAKE_DOT __attribute__((target("avx512f,avx512bw,avx512bf16")))

// what differs between the element types: a 64-byte line's values, a masked load of a line's first
// `count` values, a multiply-add (a whole line is loaded alike: _mm512_loadu_si512)
struct Bf16 {
  using Elem = uint16_t;
  static constexpr int64_t kLanes = 32;
  PREBAKE_DOT static __m512i load(const Elem* p, int64_t count) {
    return _mm512_maskz_loadu_epi16((__mmask32)((1ull << count) - 1), p);
  }
  PREBAKE_DOT static __m512 madd(__m512 acc, __m512i x, __m512i w) {
    return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w);
  }
};

struct F32 {
  using Elem = float;
  static constexpr int64_t kLanes = 16;
  PREBAKE_DOT static __m512i load(const Elem* p, int64_t count) {
    return _mm512_maskz_loadu_epi32((__mmask16)((1u << count) - 1), p);
  }
  PREBAKE_DOT static __m512 madd(__m512 acc, __m512i x, __m512i w) {
    return _mm512_fmadd_ps(_mm512_castsi512_ps(x), _mm512_castsi512_ps(w), acc);
  }
};

// `Rows` x `M` outputs: rows of w that lie `ldw` apart against rows of x that lie `ldx` apart, each
// weight load shared by the M rows of x (two sequences' decode reads the weights once); the counts
// constants, so the accumulators stay in registers; k's last partial line loaded under a mask
template <typename E, int64_t Rows, int64_t M>
PREBAKE_DOT void block(const typename E::Elem* x, int64_t ldx, const typename E::Elem* w, int64_t ldw, int64_t k,
                       float* out, int64_t ldo) {
  __m512 acc[M][Rows];
  for (int64_t j = 0; j < M; ++j)
    for (int64_t r = 0; r < Rows; ++r) acc[j][r] = _mm512_setzero_ps();
  const int64_t whole = k / E::kLanes * E::kLanes;
  for (int64_t i = 0; i < whole; i += E::kLanes) {
    __m512i xv[M];
    for (int64_t j = 0; j < M; ++j) xv[j] = _mm512_loadu_si512(x + j * ldx + i);
    for (int64_t r = 0; r < Rows; ++r) {
      // a prefetch never faults: past the weight's end (its last rows) it asks for nothing harmful; the
      // address computed as an integer, since a pointer past its allocation is undefined in C++
      _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(w + r * ldw + i) + kAhead), _MM_HINT_T1);
      const __m512i wv = _mm512_loadu_si512(w + r * ldw + i);
      for (int64_t j = 0; j < M; ++j) acc[j][r] = E::madd(acc[j][r], xv[j], wv);
    }
  }
  if (whole < k) {
    __m512i xv[M];
    for (int64_t j = 0; j < M; ++j) xv[j] = E::load(x + j * ldx + whole, k - whole);
    for (int64_t r = 0; r < Rows; ++r) {
      const __m512i wv = E::load(w + r * ldw + whole, k - whole);
      for (int64_t j = 0; j < M; ++j) acc[j][r] = E::madd(acc[j][r], xv[j], wv);
    }
  }
  for (int64_t j = 0; j < M; ++j)
    for (int64_t r = 0; r < Rows; ++r) out[j * ldo + r] = _mm512_reduce_add_ps(acc[j][r]);
}

// rows [first, first + Rows) of w (Rows a constant, or 1 for n's last rows) against every row of x,
// two at a time
template <typename E, int64_t Rows>
PREBAKE_DOT void against_x(const typename E::Elem* x, int64_t ldx, int64_t m, const typename E::Elem* w, int64_t ldw,
                           int64_t k, float* out, int64_t n) {
  int64_t j = 0;
  for (; j + 2 <= m; j += 2) block<E, Rows, 2>(x + j * ldx, ldx, w, ldw, k, out + j * n, n);
  if (j < m) block<E, Rows, 1>(x + j * ldx, ldx, w, ldw, k, out + j * n, n);
}

template <typename E>
void product(const void* x_data, int64_t ldx, int64_t m, const void* w_data, int64_t ldw, int64_t n, int64_t k,
             float* out) {
  const auto* xs = static_cast<const typename E::Elem*>(x_data);
  const auto* ws = static_cast<const typename E::Elem*>(w_data);
  const int64_t blocks = (n + kRows - 1) / kRows;
  // as Inductor's own kernels under cpp.dynamic_threads: the serving process's OpenMP thread count
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t first = b * kRows;
    const auto* rows = ws + first * ldw;
    if (n - first >= kRows) {
      against_x<E, kRows>(xs, ldx, m, rows, ldw, k, out + first, n);
    } else {
      for (int64_t one = 0; first + one < n; ++one)  // n's last rows, one at a time
        against_x<E, 1>(xs, ldx, m, rows + one * ldw, ldw, k, out + first + one, n);
    }
  }
}

}  // namespace

extern "C" AOTITorchError aoti_torch_cpu_prebake_dot(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* ret0) {
  int64_t *x_sizes, *x_strides, *w_sizes, *w_strides, x_dim, w_dim;
  int32_t x_dtype, w_dtype;
  void *x_data, *w_data, *out_data;
  if (aoti_torch_get_dim(x, &x_dim) || aoti_torch_get_dim(w, &w_dim) || x_dim != 2 || w_dim != 2 ||
      aoti_torch_get_sizes(x, &x_sizes) || aoti_torch_get_strides(x, &x_strides) ||
      aoti_torch_get_sizes(w, &w_sizes) || aoti_torch_get_strides(w, &w_strides) ||
      aoti_torch_get_dtype(x, &x_dtype) || aoti_torch_get_dtype(w, &w_dtype) || x_dtype != w_dtype ||
      (x_dtype != aoti_torch_dtype_bfloat16() && x_dtype != aoti_torch_dtype_float32()) ||
      x_sizes[1] != w_sizes[1] || x_strides[1] != 1 || w_strides[1] != 1 || aoti_torch_get_data_ptr(x, &x_data) ||
      aoti_torch_get_data_ptr(w, &w_data))
    return AOTI_TORCH_FAILURE;  // runtime.gemv hands over 2-D x [m, k] and w [n, k] of one dtype, k contiguous: else a bug
  const int64_t m = x_sizes[0], n = w_sizes[0], k = x_sizes[1];
  const int64_t sizes[2] = {m, n}, strides[2] = {n, 1};
  if (aoti_torch_empty_strided(2, sizes, strides, aoti_torch_dtype_float32(), aoti_torch_device_type_cpu(), 0, ret0) ||
      aoti_torch_get_data_ptr(*ret0, &out_data))
    return AOTI_TORCH_FAILURE;
  float* out = static_cast<float*>(out_data);
  if (x_dtype == aoti_torch_dtype_bfloat16())
    product<Bf16>(x_data, x_strides[0], m, w_data, w_strides[0], n, k, out);
  else
    product<F32>(x_data, x_strides[0], m, w_data, w_strides[0], n, k, out);
  return AOTI_TORCH_SUCCESS;
}
