// Takahashi's recurrence: the entries of Z = (L D U)^-1 on the filled pattern
// of a factorization without pivoting (L unit lower, D diagonal, U unit
// upper, on one structurally symmetric pattern S: the strictly lower part of
// L and the transpose of U's strictly upper part share S's positions; an
// entry missing from either factor is a stored zero).
//
// From Z = U^-1 D^-1 + Z (I - L) and Z = D^-1 L^-1 + (I - U) Z, column j of
// Z below the diagonal, row j right of it and Z_jj need only the entries of
// Z at rows and columns in struct(L[:, j]) (a clique of the filled graph,
// hence in S), so the columns are computed from the last:
//
//   Z_rj = -sum_{k in s} Z_rk L_kj    (r in s = struct(L[:, j]), r > j)
//   Z_jc = -sum_{k in s} U_jk Z_kc    (c in s)
//   Z_jj = 1 / d_j - sum_{k in s} U_jk Z_kj
//
// The work is that of the factorization (a scatter of column k of S for
// each k in s). Called from Python with ctypes (sciad.solvers.direct._selinv);
// no XLA headers needed.

#include <complex>
#include <cstdint>
#include <vector>

namespace {

// The recurrence for a real (double) or complex (std::complex<double>, laid
// out as NumPy's complex128) factor: the same arithmetic, no conjugation
// (Z is the inverse itself, not its adjoint).
template <typename T>
int selinv(int64_t n, const int64_t* Sp, const int64_t* Si, const T* Lx, const T* Ux,
           const T* d, T* Zl, T* Zu, T* Zd) {
  std::vector<int64_t> pos(n, -1);     // position of a row in the scattered column
  std::vector<int64_t> slot(n, -1);    // position of a row of s in column j
  for (int64_t j = n - 1; j >= 0; --j) {
    if (d[j] == T(0)) return static_cast<int>(j + 1);
    const int64_t b = Sp[j], e = Sp[j + 1];
    for (int64_t p = b; p < e; ++p) {
      slot[Si[p]] = p;
      Zl[p] = T(0);
      Zu[p] = T(0);
    }
    for (int64_t q = b; q < e; ++q) {   // k = Si[q]: its column scattered
      const int64_t k = Si[q];
      const T lk = Lx[q], uk = Ux[q];
      // the diagonal of Z at k
      Zl[q] -= Zd[k] * lk;  // Z_kj -= Z_kk L_kj
      Zu[q] -= uk * Zd[k];  // Z_jk -= U_jk Z_kk
      for (int64_t p = Sp[k]; p < Sp[k + 1]; ++p) pos[Si[p]] = p;
      // the rows r of s below k: Z_rk = Zl at (r, k), Z_kr = Zu at (r, k)
      for (int64_t t = q + 1; t < e; ++t) {
        const int64_t r = Si[t];
        const int64_t p = pos[r];
        if (p < 0) {
          for (int64_t pp = Sp[k]; pp < Sp[k + 1]; ++pp) pos[Si[pp]] = -1;
          for (int64_t pp = b; pp < e; ++pp) slot[Si[pp]] = -1;
          return static_cast<int>(-(j + 1));
        }
        const T zrk = Zl[p], zkr = Zu[p];
        const T lr = Lx[t], ur = Ux[t];
        Zl[t] -= zrk * lk;   // Z_rj -= Z_rk L_kj
        Zl[q] -= zkr * lr;   // Z_kj -= Z_kr L_rj
        Zu[q] -= ur * zrk;   // Z_jk -= U_jr Z_rk
        Zu[t] -= uk * zkr;   // Z_jr -= U_jk Z_kr
      }
      for (int64_t p = Sp[k]; p < Sp[k + 1]; ++p) pos[Si[p]] = -1;
    }
    T z = T(1) / d[j];
    for (int64_t p = b; p < e; ++p) {
      z -= Ux[p] * Zl[p];     // U_jk Z_kj
      slot[Si[p]] = -1;
    }
    Zd[j] = z;
  }
  return 0;
}

}  // namespace

extern "C" {

int sciad_selinv(int64_t n, const int64_t* Sp, const int64_t* Si, const double* Lx,
                 const double* Ux, const double* d, double* Zl, double* Zu, double* Zd) {
  return selinv<double>(n, Sp, Si, Lx, Ux, d, Zl, Zu, Zd);
}

// complex128: each array of n (or nnz) complex numbers as 2 n doubles
int sciad_selinv_c128(int64_t n, const int64_t* Sp, const int64_t* Si, const double* Lx,
                      const double* Ux, const double* d, double* Zl, double* Zu, double* Zd) {
  using C = std::complex<double>;
  return selinv<C>(n, Sp, Si, reinterpret_cast<const C*>(Lx), reinterpret_cast<const C*>(Ux),
                   reinterpret_cast<const C*>(d), reinterpret_cast<C*>(Zl),
                   reinterpret_cast<C*>(Zu), reinterpret_cast<C*>(Zd));
}

}  // extern "C"
