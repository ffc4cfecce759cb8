// sciad's checks of a sparse matrix and of a solve with it, in one pass each:
// two XLA FFI handlers (CPU, float64) that compute what the in-program checks
// of a sparse direct solve measure (`sciad.primitives._linalg_run`), where
// XLA's gathers, scatters and reductions took longer than the factorization
// of a small matrix (measured: 0.57 ms for the three matrix measures of a
// 4,096-unknown 2-D matrix, against 0.25 ms for CHOLMOD's solve).
//
// Both take a leading batch axis of L matrices on one pattern (CSR: `indptr`
// (n + 1), `indices` (nnz), int32), as the solvers' kernels do.
//
// `sciad_matrix_measures(a (L, nnz), tpos (nnz or 0), diag (n or 0))
//   -> (L, 5)`: per matrix `[nonfinite, max |a - a^T|, max |a|, min diagonal,
//   zero line]`: nonfinite 1 where a value is NaN or infinite; the
//   asymmetry's numerator (0 where `tpos`, the position of each entry's
//   transpose, is empty); the largest magnitude; the smallest diagonal
//   entry (`diag`: each row's diagonal position, -1 where none is stored,
//   which reads 0; +inf where `diag` is empty); 1 where a row or a column
//   holds only zeros (or NaN), from `indptr` and `indices`.
//
// `sciad_solve_measures(indptr, indices, a (L, nnz), x (L, n, k),
//   b (L, n, k); transpose) -> (L, 4)`: per matrix the worst over the k
//   columns of `[backward error, relative residual, max |b|]`, and 1 where
//   every entry of x is NaN (a solver's mark of a failed factorization), with
//   `r = op(A) x - b`, `eta = ||r|| / (||op(A)|| ||x|| + ||b||)` and
//   `rel = ||r|| / ||b||` in the infinity norm (`ratio`'s rules: 0 / 0 = 0,
//   r / 0 = inf, NaN stays NaN, and NaN wins every maximum), as
//   `_linalg_run._measures` computes them.
//
// No Python API: loaded with ctypes by `sciad.solvers._sparse_checks`, which
// registers the two handlers as FFI targets.

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// max with NaN winning (as jnp.max)
inline double nanmax(double m, double v) {
  if (std::isnan(m) || std::isnan(v)) return kNaN;
  return v > m ? v : m;
}

inline double nanmin(double m, double v) {
  if (std::isnan(m) || std::isnan(v)) return kNaN;
  return v < m ? v : m;
}

// `_measures.ratio`: num / den for norms
inline double ratio(double num, double den) {
  if (den > 0) return num / den;
  return (num > 0 ? kInf : num * 0.0) + den * 0.0;
}

ffi::Error MatrixMeasures(ffi::Buffer<ffi::S32> indptr, ffi::Buffer<ffi::S32> indices,
                          ffi::Buffer<ffi::F64> a, ffi::Buffer<ffi::S32> tpos,
                          ffi::Buffer<ffi::S32> diag, ffi::ResultBuffer<ffi::F64> out) {
  const auto adims = a.dimensions();
  if (adims.size() != 2) return ffi::Error::InvalidArgument("sciad_matrix_measures: a is not 2-D");
  const int64_t L = adims[0], nnz = adims[1];
  const int64_t n = indptr.element_count() - 1;
  if (n < 0 || indices.element_count() != nnz)
    return ffi::Error::InvalidArgument("sciad_matrix_measures: a pattern of another size");
  const bool sym = tpos.element_count() == nnz && nnz > 0;
  const bool has_diag = diag.element_count() == n && n > 0;
  const int32_t* ip = indptr.typed_data();
  const int32_t* ix = indices.typed_data();
  const int32_t* tp = tpos.typed_data();
  const int32_t* dg = diag.typed_data();
  double* o = out->typed_data();
  std::vector<double> colsum(n);
  for (int64_t l = 0; l < L; ++l) {
    const double* v = a.typed_data() + l * nnz;
    double nonfinite = 0, asym = 0, scale = 0, mind = kInf, zero = 0;
    std::fill(colsum.begin(), colsum.end(), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      double rowsum = 0;
      for (int64_t p = ip[i]; p < ip[i + 1]; ++p) {
        const double m = std::fabs(v[p]);
        if (!std::isfinite(v[p])) nonfinite = 1;
        scale = nanmax(scale, m);
        rowsum += m;
        const int32_t c = ix[p];
        if (c >= 0 && c < n) colsum[c] += m;
        if (sym) asym = nanmax(asym, std::fabs(v[p] - v[tp[p]]));
      }
      if (!(rowsum > 0)) zero = 1;
      if (has_diag) mind = nanmin(mind, dg[i] >= 0 ? v[dg[i]] : 0.0);
    }
    for (int64_t c = 0; c < n; ++c)
      if (!(colsum[c] > 0)) zero = 1;
    double* r = o + 5 * l;
    r[0] = nonfinite;
    r[1] = asym;
    r[2] = scale;
    r[3] = mind;
    r[4] = zero;
  }
  return ffi::Error::Success();
}

ffi::Error SolveMeasures(ffi::Buffer<ffi::S32> indptr, ffi::Buffer<ffi::S32> indices,
                         ffi::Buffer<ffi::F64> a, ffi::Buffer<ffi::F64> x,
                         ffi::Buffer<ffi::F64> b, bool transpose,
                         ffi::ResultBuffer<ffi::F64> out) {
  const auto adims = a.dimensions(), xdims = x.dimensions();
  if (adims.size() != 2 || xdims.size() != 3 || b.dimensions().size() != 3)
    return ffi::Error::InvalidArgument("sciad_solve_measures: bad ranks");
  const int64_t L = adims[0], nnz = adims[1], n = xdims[1], k = xdims[2];
  if (indptr.element_count() != n + 1 || indices.element_count() != nnz || xdims[0] != L)
    return ffi::Error::InvalidArgument("sciad_solve_measures: a pattern of another size");
  const int32_t* ip = indptr.typed_data();
  const int32_t* ix = indices.typed_data();
  double* o = out->typed_data();
  std::vector<double> r(n * k), absrow(n);
  for (int64_t l = 0; l < L; ++l) {
    const double* v = a.typed_data() + l * nnz;
    const double* xs = x.typed_data() + l * n * k;
    const double* bs = b.typed_data() + l * n * k;
    // r = op(A) x - b (row-major (n, k)); absrow: op(A)'s row sums of |a|
    for (int64_t j = 0; j < n * k; ++j) r[j] = transpose ? 0.0 : -bs[j];
    std::fill(absrow.begin(), absrow.end(), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t p = ip[i]; p < ip[i + 1]; ++p) {
        const int64_t c = ix[p];
        const double w = v[p];
        if (!transpose) {
          absrow[i] += std::fabs(w);
          for (int64_t q = 0; q < k; ++q) r[i * k + q] += w * xs[c * k + q];
        } else {
          absrow[c] += std::fabs(w);
          for (int64_t q = 0; q < k; ++q) r[c * k + q] += w * xs[i * k + q];
        }
      }
    }
    if (transpose)
      for (int64_t j = 0; j < n * k; ++j) r[j] -= bs[j];
    double anorm = 0;
    for (int64_t i = 0; i < n; ++i) anorm = nanmax(anorm, absrow[i]);
    double eta = 0, rel = 0, bworst = 0, allnan = n * k > 0 ? 1 : 0;
    for (int64_t j = 0; j < n * k && allnan; ++j)
      if (!std::isnan(xs[j])) allnan = 0;
    for (int64_t q = 0; q < k; ++q) {
      double rn = 0, xn = 0, bn = 0;
      for (int64_t i = 0; i < n; ++i) {
        rn = nanmax(rn, std::fabs(r[i * k + q]));
        xn = nanmax(xn, std::fabs(xs[i * k + q]));
        bn = nanmax(bn, std::fabs(bs[i * k + q]));
      }
      eta = nanmax(eta, ratio(rn, anorm * xn + bn));
      rel = nanmax(rel, ratio(rn, bn));
      bworst = nanmax(bworst, bn);
    }
    double* res = o + 4 * l;
    res[0] = eta;
    res[1] = rel;
    res[2] = bworst;
    res[3] = allnan;
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(sciad_matrix_measures, MatrixMeasures,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F64>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(sciad_solve_measures, SolveMeasures,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Attr<bool>("transpose")
                                  .Ret<ffi::Buffer<ffi::F64>>());
