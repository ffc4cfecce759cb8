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
// swapped with row `k` at step `k`. Unlike LAPACK's, the diagonal of `U` is
// stored as its reciprocals: the solves' substitutions, a chain of dependent
// operations, then multiply where they would divide (a division's latency
// was most of a solve's time).
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

namespace {

inline double magnitude(double x) { return std::fabs(x); }
inline double magnitude(std::complex<double> x) {  // (LAPACK's cabs1)
  return std::fabs(x.real()) + std::fabs(x.imag());
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
    for (int64_t i = k + 1; i <= last; ++i) {
      const T l = at(i, k) * inverse;
      at(i, k) = l;
      if (l == T(0)) continue;
      for (int64_t j = k + 1; j <= right; ++j) at(i, j) -= l * at(k, j);
    }
  }
  return info;
}

// trans: 0 `A x = b`, 1 `A^T x = b`, 2 `A^H x = b`; `x` holds `b` on entry,
// `(n, nrhs)` row-major.
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
        for (int64_t r = 0; r < nrhs; ++r) row(i)[r] -= l * row(k)[r];
      }
    }
    // U, from the last row
    for (int64_t k = n - 1; k >= 0; --k) {
      const int64_t right = std::min(n - 1, k + kl + ku);
      for (int64_t j = k + 1; j <= right; ++j) {
        const T u = at(k, j);
        if (u == T(0)) continue;
        for (int64_t r = 0; r < nrhs; ++r) row(k)[r] -= u * row(j)[r];
      }
      const T d = at(k, k);  // (the reciprocal)
      for (int64_t r = 0; r < nrhs; ++r) row(k)[r] *= d;
    }
    return;
  }
  // U^T (or U^H), from the first row: row k of U updates the rows after it
  for (int64_t k = 0; k < n; ++k) {
    const T d = op(at(k, k));  // (the reciprocal)
    for (int64_t r = 0; r < nrhs; ++r) row(k)[r] *= d;
    const int64_t right = std::min(n - 1, k + kl + ku);
    for (int64_t j = k + 1; j <= right; ++j) {
      const T u = op(at(k, j));
      if (u == T(0)) continue;
      for (int64_t r = 0; r < nrhs; ++r) row(j)[r] -= u * row(k)[r];
    }
  }
  // L^T (or L^H), then the swaps, in the reverse order
  for (int64_t k = n - 1; k >= 0; --k) {
    const int64_t last = std::min(n - 1, k + kl);
    for (int64_t i = k + 1; i <= last; ++i) {
      const T l = op(at(i, k));
      if (l == T(0)) continue;
      for (int64_t r = 0; r < nrhs; ++r) row(k)[r] -= l * row(i)[r];
    }
    const int64_t p = piv[k];
    if (p != k) std::swap_ranges(row(k), row(k) + nrhs, row(p));
  }
}

template <ffi::DataType D>
ffi::Error FactorImpl(ffi::Buffer<D> ab, int64_t kl, int64_t ku, ffi::ResultBuffer<D> lu,
                      ffi::ResultBuffer<ffi::S32> piv, ffi::ResultBuffer<ffi::S32> info) {
  using T = ffi::NativeType<D>;
  auto dims = ab.dimensions();
  if (dims.size() < 2) return ffi::Error::InvalidArgument("sciad_band_factor: ab is not 2-D");
  const int64_t n = dims[dims.size() - 2], w = dims[dims.size() - 1];
  if (w != 2 * kl + ku + 1 || kl < 0 || ku < 0)
    return ffi::Error::InvalidArgument("sciad_band_factor: the band's width is not 2 kl + ku + 1");
  const int64_t batch = n == 0 ? 0 : static_cast<int64_t>(ab.element_count()) / (n * w);
  const T* src = ab.typed_data();
  T* dst = lu->typed_data();
  std::copy(src, src + ab.element_count(), dst);
  for (int64_t l = 0; l < batch; ++l)
    info->typed_data()[l] = Factor<T>(n, kl, ku, dst + l * n * w, piv->typed_data() + l * n);
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
    Solve<T>(n, kl, ku, lu.typed_data() + l * n * w, piv.typed_data() + l * n, nrhs,
             static_cast<int>(trans), dst + l * n * nrhs);
  return ffi::Error::Success();
}

}  // namespace

#define SCIAD_BAND_HANDLERS(SUFFIX, D)                                                  \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(sciad_band_factor_##SUFFIX, FactorImpl<D>,              \
                                ffi::Ffi::Bind()                                        \
                                    .Arg<ffi::Buffer<D>>()                              \
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
