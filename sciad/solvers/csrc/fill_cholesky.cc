// A sparse Cholesky factorization on a kept symbolic structure, and the
// linear maps its derivatives of every order are made of.
//
// Every array lives on one layout, that of the factor L of an ordered
// symmetric matrix: n diagonal entries, then the strictly lower entries of
// its filled pattern S (CSC: Sp, Si, rows sorted). A lower-triangular
// matrix X on that pattern is the vector [diag(X), X at S]; a symmetric
// matrix E is its lower triangle on that layout (the filled pattern of the
// ordered A + A^T holds every product X Y^T of two such matrices: column k
// of S is a clique of the filled graph).
//
//   sciad_chol:          L with L L^T = E                  (left-looking)
//   sciad_chol_tangent:  X with tril(X L^T + L X^T) = E    (dL for dA = E)
//   sciad_chol_adjoint:  the transpose of that map          (reverse mode)
//   sciad_fill_symprod:  tril(X Y^T + Y X^T) on the layout
//   sciad_fill_symmul:   (C + C^T - diag C) Y, C lower, on the layout
//   sciad_fill_trisolve: L^-1 B or L^-T B, in place
//
// The derivative of the tangent map in L is -tangent(symprod(X, dL)), that
// of the adjoint map -adjoint(symmul(E, dL)), and symprod and symmul are
// each other's transposes, so this set is closed under differentiation.
// Each costs about the factorization's flops. The scans read the row
// structure of S (per row its positions, and each position's column), kept
// with the layout by the caller. Called from Python with ctypes
// (sciad.solvers.direct._fill_cholesky).

#include <cmath>
#include <cstdint>
#include <vector>

namespace {

// the row structure of S: per row i, the positions of its entries
// (pos[ptr[i]] .. pos[ptr[i + 1] - 1], by column), and each position's column
struct Rows {
  const int64_t *ptr, *pos, *col;
};

// column j of a lower-triangular matrix out of the dense work vector w
// (its diagonal to d[j], the rows below to o at S's positions), w zeroed
inline void take_column(int64_t j, const int64_t* Sp, const int64_t* Si, double* w, double* d,
                        double* o) {
  d[j] = w[j];
  w[j] = 0.0;
  for (int64_t p = Sp[j]; p < Sp[j + 1]; ++p) {
    o[p] = w[Si[p]];
    w[Si[p]] = 0.0;
  }
}

}  // namespace

extern "C" {

// 0 where S is closed (each column k's rows below any row j of it are in
// column j: S is the fill of its pattern, which every kernel here needs);
// else -(j + 1) for the first column j that misses one. Checked once per
// structure (`_fill_cholesky.Layout`), not in the kernels' inner loops.
int sciad_fill_closed(int64_t n, const int64_t* Sp, const int64_t* Si, const int64_t* Rp,
                      const int64_t* Rq, const int64_t* Rc) {
  const Rows R{Rp, Rq, Rc};
  std::vector<int64_t> mark(n, -1);
  for (int64_t j = 0; j < n; ++j) {
    mark[j] = j;
    for (int64_t p = Sp[j]; p < Sp[j + 1]; ++p) mark[Si[p]] = j;
    for (int64_t t = R.ptr[j]; t < R.ptr[j + 1]; ++t) {
      const int64_t p = R.pos[t], k = R.col[p];
      for (int64_t q = p + 1; q < Sp[k + 1]; ++q)
        if (mark[Si[q]] != j) return static_cast<int>(-(j + 1));
    }
  }
  return 0;
}

// l = [diag, S] with l l^T = e, S closed (`sciad_fill_closed`). Returns 0;
// (j + 1) where the pivot of column j is not positive (or NaN).
int sciad_chol(int64_t n, const int64_t* Sp, const int64_t* Si, const int64_t* Rp,
               const int64_t* Rq, const int64_t* Rc, const double* e, double* l) {
  const Rows R{Rp, Rq, Rc};
  std::vector<double> w(n, 0.0);
  const double* eo = e + n;
  double* lo = l + n;
  for (int64_t j = 0; j < n; ++j) {
    w[j] = e[j];
    for (int64_t p = Sp[j]; p < Sp[j + 1]; ++p) w[Si[p]] = eo[p];
    for (int64_t t = R.ptr[j]; t < R.ptr[j + 1]; ++t) {
      const int64_t p = R.pos[t], k = R.col[p];
      const double ljk = lo[p];
      w[j] -= ljk * ljk;
      for (int64_t q = p + 1; q < Sp[k + 1]; ++q) w[Si[q]] -= lo[q] * ljk;
    }
    const double pivot = w[j];
    w[j] = 0.0;
    if (!(pivot > 0.0)) {
      for (int64_t p = Sp[j]; p < Sp[j + 1]; ++p) w[Si[p]] = 0.0;
      return static_cast<int>(j + 1);
    }
    const double d = std::sqrt(pivot);
    l[j] = d;
    for (int64_t p = Sp[j]; p < Sp[j + 1]; ++p) {
      lo[p] = w[Si[p]] / d;
      w[Si[p]] = 0.0;
    }
  }
  return 0;
}

// x with tril(x l^T + l x^T) = e: the forward mode of the factorization.
void sciad_chol_tangent(int64_t n, const int64_t* Sp, const int64_t* Si, const int64_t* Rp,
                        const int64_t* Rq, const int64_t* Rc, const double* l,
                        const double* e, double* x) {
  const Rows R{Rp, Rq, Rc};
  std::vector<double> w(n, 0.0);
  const double *lo = l + n, *eo = e + n;
  double* xo = x + n;
  for (int64_t j = 0; j < n; ++j) {
    w[j] = e[j];
    for (int64_t p = Sp[j]; p < Sp[j + 1]; ++p) w[Si[p]] = eo[p];
    for (int64_t t = R.ptr[j]; t < R.ptr[j + 1]; ++t) {
      const int64_t p = R.pos[t], k = R.col[p];
      const double ljk = lo[p], xjk = xo[p];
      w[j] -= 2.0 * ljk * xjk;
      for (int64_t q = p + 1; q < Sp[k + 1]; ++q) w[Si[q]] -= xo[q] * ljk + lo[q] * xjk;
    }
    const double d = l[j], xd = w[j] / (2.0 * d);
    x[j] = xd;
    w[j] = 0.0;
    for (int64_t p = Sp[j]; p < Sp[j + 1]; ++p) {
      xo[p] = (w[Si[p]] - lo[p] * xd) / d;
      w[Si[p]] = 0.0;
    }
  }
}

// eb = the transpose of the tangent map applied to xb (reverse mode).
void sciad_chol_adjoint(int64_t n, const int64_t* Sp, const int64_t* Si, const int64_t* Rp,
                        const int64_t* Rq, const int64_t* Rc, const double* l,
                        const double* xb, double* eb) {
  const Rows R{Rp, Rq, Rc};
  const int64_t nnz = Sp[n];
  std::vector<double> acc(xb, xb + n + nnz);  // the cotangent of x, accumulated
  std::vector<double> w(n, 0.0);
  const double* lo = l + n;
  double *ao = acc.data() + n, *ebo = eb + n;
  for (int64_t j = n - 1; j >= 0; --j) {
    const double d = l[j];
    double xd = acc[j];
    for (int64_t p = Sp[j]; p < Sp[j + 1]; ++p) {
      w[Si[p]] = ao[p] / d;
      xd -= ao[p] * lo[p] / d;
    }
    w[j] = xd / (2.0 * d);
    for (int64_t t = R.ptr[j]; t < R.ptr[j + 1]; ++t) {
      const int64_t p = R.pos[t], k = R.col[p];
      const double ljk = lo[p];
      double s = 2.0 * ljk * w[j];
      for (int64_t q = p + 1; q < Sp[k + 1]; ++q) {
        const double wi = w[Si[q]];
        ao[q] -= ljk * wi;
        s += lo[q] * wi;
      }
      ao[p] -= s;
    }
    take_column(j, Sp, Si, w.data(), eb, ebo);
  }
}

// w = tril(x y^T + y x^T) on the layout.
void sciad_fill_symprod(int64_t n, const int64_t* Sp, const int64_t* Si, const int64_t* Rp,
                        const int64_t* Rq, const int64_t* Rc, const double* x,
                        const double* y, double* w) {
  const Rows R{Rp, Rq, Rc};
  std::vector<double> u(n, 0.0);
  const double *xo = x + n, *yo = y + n;
  double* wo = w + n;
  for (int64_t j = 0; j < n; ++j) {
    const double xjj = x[j], yjj = y[j];
    u[j] = 2.0 * xjj * yjj;
    for (int64_t p = Sp[j]; p < Sp[j + 1]; ++p) u[Si[p]] = xo[p] * yjj + yo[p] * xjj;
    for (int64_t t = R.ptr[j]; t < R.ptr[j + 1]; ++t) {
      const int64_t p = R.pos[t], k = R.col[p];
      const double xjk = xo[p], yjk = yo[p];
      u[j] += 2.0 * xjk * yjk;
      for (int64_t q = p + 1; q < Sp[k + 1]; ++q) u[Si[q]] += xo[q] * yjk + yo[q] * xjk;
    }
    take_column(j, Sp, Si, u.data(), w, wo);
  }
}

// w = (C + C^T) y on the layout, C the lower-triangular matrix c (its
// diagonal counted twice: c is the lower triangle of a symmetric matrix's
// cotangent), y lower-triangular. Column j of w is the dense block of
// C + C^T on K = {j} + struct(j) (a clique) times y's column j: one walk of
// column k of C for each k in K gives both (C y)_ij += C_ik y_kj (into a
// dense accumulator, rows outside K dropped) and (C^T y)_kj += C_ik y_ij
// (y's column scattered, zero outside K): no membership test in the loop.
// The accumulator is zeroed on K before the walks; what they add at rows
// outside K is never read (a later column zeroes its own K first).
void sciad_fill_symmul(int64_t n, const int64_t* Sp, const int64_t* Si, const int64_t*,
                       const int64_t*, const int64_t*, const double* c, const double* y,
                       double* w) {
  std::vector<double> v(n, 0.0), u(n, 0.0), t(n, 0.0);
  const double *co = c + n, *yo = y + n;
  double* wo = w + n;
  auto walk = [&](int64_t k) {
    const double vk = v[k];
    double acc = c[k] * vk;  // (C^T y)_kj: the diagonal, then the rows below it
    u[k] += c[k] * vk;       // (C y)_kj: the diagonal
    for (int64_t q = Sp[k]; q < Sp[k + 1]; ++q) {
      const int64_t i = Si[q];
      const double cq = co[q];
      u[i] += cq * vk;
      acc += cq * v[i];
    }
    t[k] = acc;
  };
  for (int64_t j = 0; j < n; ++j) {
    v[j] = y[j];
    u[j] = 0.0;
    for (int64_t p = Sp[j]; p < Sp[j + 1]; ++p) {
      v[Si[p]] = yo[p];
      u[Si[p]] = 0.0;
    }
    walk(j);
    for (int64_t p = Sp[j]; p < Sp[j + 1]; ++p) walk(Si[p]);
    w[j] = u[j] + t[j];
    for (int64_t p = Sp[j]; p < Sp[j + 1]; ++p) wo[p] = u[Si[p]] + t[Si[p]];
    v[j] = 0.0;
    for (int64_t p = Sp[j]; p < Sp[j + 1]; ++p) v[Si[p]] = 0.0;
  }
}

// b (m vectors of length n, one after another) <- L^-1 b, or L^-T b.
void sciad_fill_trisolve(int64_t n, const int64_t* Sp, const int64_t* Si, const double* l,
                         int transpose, int64_t m, double* b) {
  const double* lo = l + n;
  for (int64_t r = 0; r < m; ++r) {
    double* x = b + r * n;
    if (!transpose) {
      for (int64_t j = 0; j < n; ++j) {
        const double xj = x[j] / l[j];
        x[j] = xj;
        for (int64_t p = Sp[j]; p < Sp[j + 1]; ++p) x[Si[p]] -= lo[p] * xj;
      }
    } else {
      for (int64_t j = n - 1; j >= 0; --j) {
        double s = x[j];
        for (int64_t p = Sp[j]; p < Sp[j + 1]; ++p) s -= lo[p] * x[Si[p]];
        x[j] = s / l[j];
      }
    }
  }
}

}  // extern "C"
