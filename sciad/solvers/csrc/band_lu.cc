// LU factorization with partial pivoting of a banded matrix, and its solves
// (`A x = b`, `A^T x = b`, `A^H x = b`), as XLA FFI handlers on the CPU: the
// stiff integrators' iteration matrices whose pattern is a narrow band
// (sciad.solvers.direct._band). The arithmetic is LAPACK's unblocked dgbtf2 /
// dgbtrs; the storage is by rows, so that a row of the band is contiguous
// for XLA's row-major arrays.
//
// Storage: the matrix `A` (n x n, kl subdiagonals, ku superdiagonals) as an
// `(n, w)` array, `w = 2 kl + ku + 1`, row `i` holding `A[i, j]` at column
// `j - i + kl` for `i - kl <= j <= i + ku + kl`: the first `kl + ku + 1`
// columns hold `A`'s band, the last `kl` the fill of `U`'s rows that
// pivoting brings up (zero on input). After the factorization, row `k`
// holds `U[k, k .. k + kl + ku]` at columns `kl .. 2 kl + ku` and the
// multipliers `L[i, k]` (i = k + 1 .. k + kl, before the later row swaps, as
// LAPACK keeps them) at row `i`, column `k - i + kl`; `piv[k]` is the row
// swapped with row `k` at step `k`. Unlike LAPACK's, `U = D U'` is kept as
// the reciprocals of its diagonal `D` and its rows scaled by them (`U'`, a
// unit diagonal): the solves' substitutions are chains of dependent
// operations, and this way each link is one multiply-add (a division's
// latency was most of a solve's time, and the multiply after the sum half
// of the rest).
//
// Every buffer may have leading batch dimensions (one factorization or solve
// each: `jax.vmap` with `vmap_method="broadcast_all"`). A zero pivot leaves
// its column uneliminated (as LAPACK's `info > 0`); `info` is its 1-based
// column, and a solve with that factor divides by zero (inf or NaN, which
// the callers' Newton iterations judge).

#include <algorithm>
#include <complex>
#include <cstdint>
#include <cmath>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// (the loops over a band's compile-time widths unrolled, so that the windows
// of unknowns they index stay in registers: GCC's -O2 does not unroll them,
// and kept the complex ones' windows in memory)
#if defined(__clang__)
#define SCIAD_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define SCIAD_UNROLL _Pragma("GCC unroll 16")
#else
#define SCIAD_UNROLL
#endif

namespace {

inline double magnitude(double x) { return std::fabs(x); }
inline double magnitude(std::complex<double> x) {  // (LAPACK's cabs1)
  return std::fabs(x.real()) + std::fabs(x.imag());
}
// The product, the complex one in its textbook form: without C99's
// recovery of infinite parts from NaN ones (a call, behind a test of every
// product, which took most of a complex solve's time). A zero pivot's
// infinite reciprocal still makes its solve's values inf or NaN.
inline double mul(double a, double b) { return a * b; }
inline std::complex<double> mul(std::complex<double> a, std::complex<double> b) {
  return {a.real() * b.real() - a.imag() * b.imag(), a.real() * b.imag() + a.imag() * b.real()};
}
inline double conjugate(double x) { return x; }
inline std::complex<double> conjugate(std::complex<double> x) { return std::conj(x); }

template <typename T>
int32_t Factor(int64_t n, int64_t kl, int64_t ku, T* a, int32_t* piv) {
  const int64_t w = 2 * kl + ku + 1;
  auto at = [&](int64_t i, int64_t j) -> T& { return a[i * w + (j - i + kl)]; };
  int32_t info = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t last = std::min(n - 1, k + kl);
    int64_t p = k;
    double best = magnitude(at(k, k));
    for (int64_t i = k + 1; i <= last; ++i) {
      const double m = magnitude(at(i, k));
      if (m > best) best = m, p = i;
    }
    piv[k] = static_cast<int32_t>(p);
    if (best == 0.0) {  // (a zero pivot: the column is left as it is, its
      // reciprocal infinite, as a division by it)
      if (info == 0) info = static_cast<int32_t>(k + 1);
      at(k, k) = T(1) / at(k, k);
      continue;
    }
    const int64_t right = std::min(n - 1, k + kl + ku);
    if (p != k)
      for (int64_t j = k; j <= right; ++j) std::swap(at(k, j), at(p, j));
    const T inverse = T(1) / at(k, k);
    at(k, k) = inverse;
    T* u = &at(k, k);  // (row k of U, contiguous: u[j - k])
    for (int64_t j = 1; j <= right - k; ++j) u[j] = mul(u[j], inverse);
    for (int64_t i = k + 1; i <= last; ++i) {
      T* r = &at(i, k);  // (row i from column k, contiguous)
      const T l = mul(r[0], inverse);
      const T a_ik = r[0];
      r[0] = l;
      if (a_ik == T(0)) continue;
      for (int64_t j = 1; j <= right - k; ++j) r[j] -= mul(a_ik, u[j]);
    }
  }
  return info;
}

// The substitutions (see the storage above: U's rows scaled by their pivots,
// `U = D U'`, the reciprocals of `D` on the diagonal), any number of
// right-hand sides; trans: 0 `A x = b`, 1 `A^T x = b`, 2 `A^H x = b`; `x`
// holds `b` on entry, `(n, nrhs)` row-major.
template <typename T>
void Solve(int64_t n, int64_t kl, int64_t ku, const T* a, const int32_t* piv, int64_t nrhs,
           int trans, T* x) {
  const int64_t w = 2 * kl + ku + 1;
  auto at = [&](int64_t i, int64_t j) -> T { return a[i * w + (j - i + kl)]; };
  auto op = [&](T v) -> T { return trans == 2 ? conjugate(v) : v; };
  auto row = [&](int64_t i) -> T* { return x + i * nrhs; };
  if (trans == 0) {
    // L: the row swaps and multipliers in the order they were made
    for (int64_t k = 0; k < n; ++k) {
      const int64_t p = piv[k];
      if (p != k) std::swap_ranges(row(k), row(k) + nrhs, row(p));
      const int64_t last = std::min(n - 1, k + kl);
      for (int64_t i = k + 1; i <= last; ++i) {
        const T l = at(i, k);
        if (l == T(0)) continue;
        for (int64_t r = 0; r < nrhs; ++r) row(i)[r] -= mul(l, row(k)[r]);
      }
    }
    // D U' x = y, from the last row
    for (int64_t k = n - 1; k >= 0; --k) {
      const T d = at(k, k);  // (the reciprocal)
      for (int64_t r = 0; r < nrhs; ++r) row(k)[r] = mul(row(k)[r], d);
      const int64_t right = std::min(n - 1, k + kl + ku);
      for (int64_t j = k + 1; j <= right; ++j) {
        const T u = at(k, j);
        if (u == T(0)) continue;
        for (int64_t r = 0; r < nrhs; ++r) row(k)[r] -= mul(u, row(j)[r]);
      }
    }
    return;
  }
  // U'^T (or U'^H), from the first row: row k of U' updates the rows after
  // it, then D^-T
  for (int64_t k = 0; k < n; ++k) {
    const int64_t right = std::min(n - 1, k + kl + ku);
    for (int64_t j = k + 1; j <= right; ++j) {
      const T u = op(at(k, j));
      if (u == T(0)) continue;
      for (int64_t r = 0; r < nrhs; ++r) row(j)[r] -= mul(u, row(k)[r]);
    }
    const T d = op(at(k, k));  // (the reciprocal)
    for (int64_t r = 0; r < nrhs; ++r) row(k)[r] = mul(row(k)[r], d);
  }
  // L^T (or L^H), then the swaps, in the reverse order
  for (int64_t k = n - 1; k >= 0; --k) {
    const int64_t last = std::min(n - 1, k + kl);
    for (int64_t i = k + 1; i <= last; ++i) {
      const T l = op(at(i, k));
      if (l == T(0)) continue;
      for (int64_t r = 0; r < nrhs; ++r) row(k)[r] -= mul(l, row(i)[r]);
    }
    const int64_t p = piv[k];
    if (p != k) std::swap_ranges(row(k), row(k) + nrhs, row(p));
  }
}

// One right-hand side, the band's widths fixed at compile time (KL
// subdiagonals, KW = kl + ku superdiagonals of U): each substitution keeps
// the unknowns in flight (the next KL, or KW) in registers, a window that
// slides by one row per step, so that a row waits on the one before it for
// one multiply-add (U's rows are scaled by their pivots for that), not for
// a store, a load and a multiply. The same arithmetic as `Solve`; rows
// within a window's width of the end take `Solve`'s loops.
template <typename T, int KL, int KW>
void SolveOne(int64_t n, const T* a, const int32_t* piv, int trans, T* x) {
  constexpr int64_t w = KL + KW + 1;  // (2 kl + ku + 1)
  auto at = [&](int64_t i, int64_t j) -> T { return a[i * w + (j - i + KL)]; };
  const bool conj = trans == 2;
  auto op = [&](T v) -> T { return conj ? conjugate(v) : v; };
  if (trans == 0) {
    // L, forward: v[i] holds x[k + i] (i <= KL) as updated so far
    T v[KL + 1];
    SCIAD_UNROLL
    for (int i = 0; i <= KL; ++i) v[i] = x[i];
    const int64_t stop = n - KL - 1;  // (k + KL + 1 < n: the next row exists)
    int64_t k = 0;
    for (; k < stop; ++k) {
      const int64_t s = piv[k] - k;
      T xk = v[0];
      SCIAD_UNROLL
      for (int i = 1; i <= KL; ++i) {  // (the swap, as selects)
        const T vi = v[i];
        v[i] = s == i ? v[0] : vi;
        xk = s == i ? vi : xk;
      }
      x[k] = xk;
      const T* l = a + (k + 1) * w + (KL - 1);  // (L[k + i, k] at l[i (w - 1)])
      SCIAD_UNROLL
      for (int i = 1; i <= KL; ++i) v[i - 1] = v[i] - mul(l[(i - 1) * (w - 1)], xk);
      v[KL] = x[k + KL + 1];
    }
    SCIAD_UNROLL
    for (int i = 0; i <= KL; ++i) x[k + i] = v[i];
    for (; k < n; ++k) {  // (the last rows)
      const int64_t p = piv[k];
      if (p != k) std::swap(x[k], x[p]);
      const int64_t last = std::min(n - 1, k + KL);
      for (int64_t i = k + 1; i <= last; ++i) x[i] -= mul(at(i, k), x[k]);
    }
    // D U' x = y, backward: v[j] holds x[k + 1 + j] (final)
    k = n - 1;
    for (; k >= n - KW; --k) {
      T s = mul(x[k], at(k, k));
      for (int64_t j = k + 1; j < n; ++j) s -= mul(at(k, j), x[j]);
      x[k] = s;
    }
    T u[KW];
    SCIAD_UNROLL
    for (int j = 0; j < KW; ++j) u[j] = x[k + 1 + j];
    for (; k >= 0; --k) {
      const T* r = a + k * w + KL;  // (r[0]: the reciprocal pivot, r[j]: U'[k, k + j])
      T far = T(0);
      SCIAD_UNROLL
      for (int j = KW; j >= 2; --j) far += mul(r[j], u[j - 1]);
      const T s = mul(x[k], r[0]) - far - mul(r[1], u[0]);
      SCIAD_UNROLL
      for (int j = KW - 1; j >= 1; --j) u[j] = u[j - 1];
      u[0] = s;
      x[k] = s;
    }
    return;
  }
  // U'^T, forward: v[j] holds x[k + j] (j <= KW) as updated so far; then
  // D^-T (or the conjugate) as each row is done
  {
    T v[KW + 1];
    const int64_t stop = n - KW - 1;
    int64_t k = 0;
    SCIAD_UNROLL
    for (int j = 0; j <= KW; ++j) v[j] = x[j];
    for (; k < stop; ++k) {
      const T* r = a + k * w + KL;
      const T yk = v[0];
      x[k] = mul(yk, op(r[0]));
      SCIAD_UNROLL
      for (int j = 1; j <= KW; ++j) v[j - 1] = v[j] - mul(op(r[j]), yk);
      v[KW] = x[k + KW + 1];
    }
    SCIAD_UNROLL
    for (int j = 0; j <= KW; ++j) x[k + j] = v[j];
    for (; k < n; ++k) {
      const int64_t right = std::min(n - 1, k + KW);
      for (int64_t j = k + 1; j <= right; ++j) x[j] -= mul(op(at(k, j)), x[k]);
      x[k] = mul(x[k], op(at(k, k)));
    }
  }
  // L^T, backward, then the swaps: v[i] holds x[k + 1 + i] (i < KL) as
  // updated so far (x[k + KL] is final once step k is done: no later step's
  // swap reaches it)
  int64_t k = n - 1;
  for (; k >= n - KL; --k) {
    for (int64_t i = k + 1; i < n; ++i) x[k] -= mul(op(at(i, k)), x[i]);
    const int64_t p = piv[k];
    if (p != k) std::swap(x[k], x[p]);
  }
  T v[KL];
  SCIAD_UNROLL
  for (int i = 0; i < KL; ++i) v[i] = x[k + 1 + i];
  for (; k >= 0; --k) {
    const T* l = a + (k + 1) * w + (KL - 1);  // (L[k + i, k] at l[(i - 1) (w - 1)])
    T s = x[k];
    SCIAD_UNROLL
    for (int i = KL; i >= 1; --i) s -= mul(op(l[(i - 1) * (w - 1)]), v[i - 1]);
    const int64_t d = piv[k] - k;
    T xk = s;
    SCIAD_UNROLL
    for (int i = 1; i <= KL; ++i) {  // (the swap, as selects)
      const T vi = v[i - 1];
      v[i - 1] = d == i ? s : vi;
      xk = d == i ? vi : xk;
    }
    x[k + KL] = v[KL - 1];
    SCIAD_UNROLL
    for (int i = KL - 1; i >= 1; --i) v[i] = v[i - 1];
    v[0] = xk;
  }
  SCIAD_UNROLL
  for (int i = 0; i < KL; ++i) x[i] = v[i];
}

// `SolveOne` where the widths have an instance (kl 1 .. 4, ku 0 .. 4) and
// the matrix is longer than two windows, else `Solve`.
template <typename T>
void SolveVector(int64_t n, int64_t kl, int64_t ku, const T* a, const int32_t* piv, int trans,
                 T* x) {
#define SCIAD_BAND_ONE(KL, KU) \
  case KL * 8 + KU:            \
    return SolveOne<T, KL, KL + KU>(n, a, piv, trans, x);
#define SCIAD_BAND_ROW(KL) \
  SCIAD_BAND_ONE(KL, 0)    \
  SCIAD_BAND_ONE(KL, 1)    \
  SCIAD_BAND_ONE(KL, 2)    \
  SCIAD_BAND_ONE(KL, 3)    \
  SCIAD_BAND_ONE(KL, 4)
  if (kl <= 4 && ku <= 4 && n > 2 * (2 * kl + ku + 1)) {
    switch (kl * 8 + ku) {
      SCIAD_BAND_ROW(1)
      SCIAD_BAND_ROW(2)
      SCIAD_BAND_ROW(3)
      SCIAD_BAND_ROW(4)
      default:
        break;
    }
  }
#undef SCIAD_BAND_ROW
#undef SCIAD_BAND_ONE
  Solve<T>(n, kl, ku, a, piv, 1, trans, x);
}

// The factorization of the matrices whose entries `values` (`(batch...,
// nnz)`) are at `positions` in the flat band storage (`(batch..., nnz)` or
// `(nnz)`, shared; int32) the band zeroed and the values placed here, where the
// program's zeros and scatter were two more passes over it a call.
template <ffi::DataType D>
ffi::Error FactorImpl(ffi::Buffer<D> values, ffi::Buffer<ffi::S32> positions, int64_t kl,
                      int64_t ku, ffi::ResultBuffer<D> lu, ffi::ResultBuffer<ffi::S32> piv,
                      ffi::ResultBuffer<ffi::S32> info) {
  using T = ffi::NativeType<D>;
  auto dims = lu->dimensions(), vdims = values.dimensions();
  if (dims.size() < 2 || vdims.size() < 1)
    return ffi::Error::InvalidArgument("sciad_band_factor: lu is not 2-D or values is not 1-D");
  const int64_t n = dims[dims.size() - 2], w = dims[dims.size() - 1];
  if (w != 2 * kl + ku + 1 || kl < 0 || ku < 0)
    return ffi::Error::InvalidArgument("sciad_band_factor: the band's width is not 2 kl + ku + 1");
  const int64_t batch = n == 0 ? 0 : static_cast<int64_t>(lu->element_count()) / (n * w);
  const int64_t nnz = vdims[vdims.size() - 1];
  const int64_t pcount = static_cast<int64_t>(positions.element_count());
  if (static_cast<int64_t>(values.element_count()) != batch * nnz ||
      (pcount != nnz && pcount != batch * nnz))
    return ffi::Error::InvalidArgument("sciad_band_factor: values and positions do not match");
  const T* src = values.typed_data();
  const int32_t* at = positions.typed_data();
  T* dst = lu->typed_data();
  std::fill(dst, dst + lu->element_count(), T(0));
  for (int64_t l = 0; l < batch; ++l) {
    T* band = dst + l * n * w;
    const int32_t* where = pcount == nnz ? at : at + l * nnz;
    for (int64_t e = 0; e < nnz; ++e) {
      const int64_t q = where[e];
      if (q < 0 || q >= n * w)
        return ffi::Error::InvalidArgument("sciad_band_factor: a position outside the band");
      band[q] = src[l * nnz + e];
    }
    info->typed_data()[l] = Factor<T>(n, kl, ku, band, piv->typed_data() + l * n);
  }
  return ffi::Error::Success();
}

template <ffi::DataType D>
ffi::Error SolveImpl(ffi::Buffer<D> lu, ffi::Buffer<ffi::S32> piv, ffi::Buffer<D> b, int64_t kl,
                     int64_t ku, int64_t trans, ffi::ResultBuffer<D> x) {
  using T = ffi::NativeType<D>;
  auto ldims = lu.dimensions(), bdims = b.dimensions();
  if (ldims.size() < 2 || bdims.size() < 2)
    return ffi::Error::InvalidArgument("sciad_band_solve: lu or b is not 2-D");
  const int64_t n = ldims[ldims.size() - 2], w = ldims[ldims.size() - 1];
  const int64_t nrhs = bdims[bdims.size() - 1];
  if (w != 2 * kl + ku + 1 || bdims[bdims.size() - 2] != n)
    return ffi::Error::InvalidArgument("sciad_band_solve: shapes do not match");
  const int64_t batch = n == 0 ? 0 : static_cast<int64_t>(lu.element_count()) / (n * w);
  if (static_cast<int64_t>(b.element_count()) != batch * n * nrhs)
    return ffi::Error::InvalidArgument("sciad_band_solve: batch sizes do not match");
  const T* src = b.typed_data();
  T* dst = x->typed_data();
  std::copy(src, src + b.element_count(), dst);
  for (int64_t l = 0; l < batch; ++l)
    if (nrhs == 1)
      SolveVector<T>(n, kl, ku, lu.typed_data() + l * n * w, piv.typed_data() + l * n,
                     static_cast<int>(trans), dst + l * n);
    else
      Solve<T>(n, kl, ku, lu.typed_data() + l * n * w, piv.typed_data() + l * n, nrhs,
               static_cast<int>(trans), dst + l * n * nrhs);
  return ffi::Error::Success();
}

}  // namespace

#define SCIAD_BAND_HANDLERS(SUFFIX, D)                                                  \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(sciad_band_factor_##SUFFIX, FactorImpl<D>,              \
                                ffi::Ffi::Bind()                                        \
                                    .Arg<ffi::Buffer<D>>()                              \
                                    .Arg<ffi::Buffer<ffi::S32>>()                       \
                                    .Attr<int64_t>("kl")                                \
                                    .Attr<int64_t>("ku")                                \
                                    .Ret<ffi::Buffer<D>>()                              \
                                    .Ret<ffi::Buffer<ffi::S32>>()                       \
                                    .Ret<ffi::Buffer<ffi::S32>>());                     \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(sciad_band_solve_##SUFFIX, SolveImpl<D>,                \
                                ffi::Ffi::Bind()                                        \
                                    .Arg<ffi::Buffer<D>>()                              \
                                    .Arg<ffi::Buffer<ffi::S32>>()                       \
                                    .Arg<ffi::Buffer<D>>()                              \
                                    .Attr<int64_t>("kl")                                \
                                    .Attr<int64_t>("ku")                                \
                                    .Attr<int64_t>("trans")                             \
                                    .Ret<ffi::Buffer<D>>());

SCIAD_BAND_HANDLERS(f64, ffi::F64)
SCIAD_BAND_HANDLERS(c128, ffi::C128)
