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
//   sciad_fill_symmul:   (C + C^T) Y, C lower, on the layout
//   sciad_fill_trisolve: L^-1 B or L^-T B, in place
//
// The derivative of the tangent map in L is -tangent(symprod(X, dL)), that
// of the adjoint map -adjoint(symmul(E, dL)), and symprod and symmul are
// each other's transposes, so this set is closed under differentiation.
// The factorization costs F multiply-adds, each other map 2F. All but the
// triangular solves work on supernodes (`struct Super`): dense panels
// whose products run as vector loops (AVX2 and FMA where the processor
// has them), one indirect store per product entry. Each kernel works in
// its caller's workspace `work` of three panel buffers (3 poff[ns]
// doubles), which the caller keeps between calls: buffers made afresh
// cost their page faults on every call (a third of a call's time at
// 65,536 unknowns). Called from Python with ctypes
// (sciad.solvers.direct._fill_cholesky).

// (the dense loops vectorized, their sums reassociated; the build is -O2)
#pragma GCC optimize("O3", "associative-math", "no-signed-zeros", "no-trapping-math")

// the dense products also built for AVX2 and FMA, chosen when the library loads
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define SCIAD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SCIAD_CLONES
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

// the row structure of S: per row i, the positions of its entries
// (pos[ptr[i]] .. pos[ptr[i + 1] - 1], by column), and each position's column
struct Rows {
  const int64_t *ptr, *pos, *col;
};

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

}  // extern "C"

// The supernodal form of the layout (`_fill_cholesky.Layout`): consecutive
// columns whose structures nest (column j's rows below it are j + 1 and
// column j + 1's) make a supernode J, columns first[J] .. first[J + 1] - 1,
// whose panel is dense: rows R_J = ridx[rptr[J] .. rptr[J + 1]) (its own
// columns, then the rows below them), column-major at poff[J], zero above
// the diagonal. Pairs uptr[J] .. uptr[J + 1] - 1 are the supernodes K < J
// with rows in J, pair u being pairs[7u ..]: K, its panel's offset, rows,
// width and first row's index in ridx, then a and b: R_K's positions
// a .. b - 1 are J's columns, and R_K from a on is inside R_J (the fill is
// closed). Every kernel is left-looking over supernodes (the adjoint is
// the tangent's steps reversed): each (K, J) pair is a dense product of
// K's panel rows from a on with those in J, scattered into J's panel
// through the rows' positions in it (one indirect store per product entry,
// not per multiply-add), then a dense step inside J. 65,536 unknowns (a
// 2-D 5-point matrix): 49,221 supernodes, most one column wide, but those
// of 8 columns or more hold 93% of the flops.
struct Super {
  int64_t n, ns;
  const int64_t *Sp, *Si;
  const int64_t *first, *rptr, *ridx, *poff;
  const int64_t *uptr, *pairs;
  int64_t maxrows;
};

namespace {

struct Panel {  // supernode J's panel in a buffer of panels
  int64_t f, w, m;
  const int64_t* rows;
  int64_t off;
};

// pair u's K (its panel; f unused), and its rows a .. b - 1 (those in J)
struct Pair {
  Panel k;
  int64_t a, b;
};

inline Pair pair(const Super& s, int64_t u) {
  const int64_t* q = s.pairs + 7 * u;
  return {{0, q[3], q[2], s.ridx + q[4], q[1]}, q[5], q[6]};
}

inline Panel panel(const Super& s, int64_t J) {
  return {s.first[J], s.first[J + 1] - s.first[J], s.rptr[J + 1] - s.rptr[J],
          s.ridx + s.rptr[J], s.poff[J]};
}

// buffer k of the caller's workspace (three buffers of poff[ns] doubles)
inline double* buffer(const Super& s, double* work, int k) {
  return work + k * s.poff[s.ns];
}

// buffer k, zeroed (an accumulator)
double* zeroed(const Super& s, double* work, int k) {
  double* P = buffer(s, work, k);
  std::fill(P, P + s.poff[s.ns], 0.0);
  return P;
}

// the layout's vector v as panels in buffer k (zero above each panel's
// diagonal: every entry written, the buffer's old values never read)
double* to_panels(const Super& s, const double* v, double* work, int k) {
  double* P = buffer(s, work, k);
  const double* vo = v + s.n;
  for (int64_t J = 0; J < s.ns; ++J) {
    const Panel p = panel(s, J);
    for (int64_t c = 0; c < p.w; ++c) {
      const int64_t j = p.f + c;
      double* col = P + p.off + c * p.m;
      std::fill(col, col + c, 0.0);
      col[c] = v[j];
      for (int64_t q = s.Sp[j], r = c + 1; q < s.Sp[j + 1]; ++q, ++r) col[r] = vo[q];
    }
  }
  return P;
}

void from_panels(const Super& s, const double* P, double* v) {
  double* vo = v + s.n;
  for (int64_t J = 0; J < s.ns; ++J) {
    const Panel p = panel(s, J);
    for (int64_t c = 0; c < p.w; ++c) {
      const int64_t j = p.f + c;
      const double* col = P + p.off + c * p.m;
      v[j] = col[c];
      for (int64_t q = s.Sp[j], r = c + 1; q < s.Sp[j + 1]; ++q, ++r) vo[q] = col[r];
    }
  }
}

// t[0 .. len) = sum_k x[k][0 .. len) * y[k][0] (+ y[k][0 .. len) * x[k][0]
// with both), k < wk: column c of a product of panel columns, x and y at
// the row of c, each column ld apart. Four columns k a sweep over t.
template <bool both>
inline void product_column_(const double* x, const double* y, int64_t ld, int64_t wk, int64_t len,
                     double* __restrict t) {
  for (int64_t r = 0; r < len; ++r) t[r] = 0.0;
  int64_t k = 0;
  for (; k + 4 <= wk; k += 4) {
    const double *__restrict x0 = x + k * ld, *__restrict x1 = x0 + ld,
                 *__restrict x2 = x1 + ld, *__restrict x3 = x2 + ld;
    const double *__restrict y0 = y + k * ld, *__restrict y1 = y0 + ld,
                 *__restrict y2 = y1 + ld, *__restrict y3 = y2 + ld;
    const double a0 = y0[0], a1 = y1[0], a2 = y2[0], a3 = y3[0];
    if (both) {
      const double b0 = x0[0], b1 = x1[0], b2 = x2[0], b3 = x3[0];
      for (int64_t r = 0; r < len; ++r)
        t[r] += x0[r] * a0 + x1[r] * a1 + x2[r] * a2 + x3[r] * a3 + y0[r] * b0 + y1[r] * b1 +
                y2[r] * b2 + y3[r] * b3;
    } else {
      for (int64_t r = 0; r < len; ++r)
        t[r] += x0[r] * a0 + x1[r] * a1 + x2[r] * a2 + x3[r] * a3;
    }
  }
  for (; k < wk; ++k) {
    const double *__restrict xk = x + k * ld, *__restrict yk = y + k * ld;
    const double a0 = yk[0], b0 = xk[0];
    if (both) {
      for (int64_t r = 0; r < len; ++r) t[r] += xk[r] * a0 + yk[r] * b0;
    } else {
      for (int64_t r = 0; r < len; ++r) t[r] += xk[r] * a0;
    }
  }
}

template <bool both>
void product_column(const double* x, const double* y, int64_t ld, int64_t wk, int64_t len,
                    double* t);
template <>
SCIAD_CLONES void product_column<false>(const double* x, const double* y, int64_t ld,
                                        int64_t wk, int64_t len, double* t) {
  product_column_<false>(x, y, ld, wk, len, t);
}
template <>
SCIAD_CLONES void product_column<true>(const double* x, const double* y, int64_t ld,
                                       int64_t wk, int64_t len, double* t) {
  product_column_<true>(x, y, ld, wk, len, t);
}

// the transpose in x of product_column<true>(x, y) for a cotangent g of t:
// gx[k][0 .. len) += sign * g * y[k][0] (the first term's) and gx[k][0] +=
// sign * g . y[k] (the second's), gx at the row of c, as x.
SCIAD_CLONES void product_column_t(const double* __restrict g, const double* y, int64_t ld,
                                   int64_t wk, int64_t len, double sign, double* gx) {
  int64_t k = 0;
  for (; k + 4 <= wk; k += 4) {
    const double *__restrict y0 = y + k * ld, *__restrict y1 = y0 + ld,
                 *__restrict y2 = y1 + ld, *__restrict y3 = y2 + ld;
    double *__restrict g0 = gx + k * ld, *__restrict g1 = g0 + ld, *__restrict g2 = g1 + ld,
           *__restrict g3 = g2 + ld;
    const double a0 = sign * y0[0], a1 = sign * y1[0], a2 = sign * y2[0], a3 = sign * y3[0];
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (int64_t r = 0; r < len; ++r) {
      s0 += g[r] * y0[r];
      s1 += g[r] * y1[r];
      s2 += g[r] * y2[r];
      s3 += g[r] * y3[r];
    }
    for (int64_t r = 0; r < len; ++r) {
      g0[r] += g[r] * a0;
      g1[r] += g[r] * a1;
      g2[r] += g[r] * a2;
      g3[r] += g[r] * a3;
    }
    g0[0] += sign * s0;
    g1[0] += sign * s1;
    g2[0] += sign * s2;
    g3[0] += sign * s3;
  }
  for (; k < wk; ++k) {
    const double* __restrict yk = y + k * ld;
    double* __restrict gk = gx + k * ld;
    const double a0 = sign * yk[0];
    double s0 = 0.0;
    for (int64_t r = 0; r < len; ++r) s0 += g[r] * yk[r];
    for (int64_t r = 0; r < len; ++r) gk[r] += g[r] * a0;
    gk[0] += sign * s0;
  }
}

// many columns' product_column_t at once: G holds the cotangents of nc
// columns (len rows each, ldg apart, column c's rows from c on, zero
// above), y and gx are at the row of the first: gx[k][r] += sign * sum_c
// G[r, c] y[k][c] and gx[k][c] += sign * sum_r G[r, c] y[k][r]. Four
// columns of G a sweep over gx's and y's columns, so gx is written once
// per four (the adjoint's step inside a panel: 10-15% off its time at
// 65,536 unknowns, where the pairs' products gained nothing from it).
SCIAD_CLONES void block_t(const double* G, int64_t ldg, int64_t len, int64_t nc,
                          const double* y, int64_t ld, int64_t wk, double sign, double* gx) {
  for (int64_t k = 0; k < wk; ++k) {
    const double* __restrict yk = y + k * ld;
    double* __restrict xk = gx + k * ld;
    int64_t c = 0;
    for (; c + 4 <= nc; c += 4) {
      const double *__restrict g0 = G + c * ldg, *__restrict g1 = g0 + ldg,
                   *__restrict g2 = g1 + ldg, *__restrict g3 = g2 + ldg;
      const double b0 = sign * yk[c], b1 = sign * yk[c + 1], b2 = sign * yk[c + 2],
                   b3 = sign * yk[c + 3];
      double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
      for (int64_t r = c; r < len; ++r) {
        s0 += g0[r] * yk[r];
        s1 += g1[r] * yk[r];
        s2 += g2[r] * yk[r];
        s3 += g3[r] * yk[r];
      }
      for (int64_t r = c; r < len; ++r)
        xk[r] += g0[r] * b0 + g1[r] * b1 + g2[r] * b2 + g3[r] * b3;
      xk[c] += sign * s0;
      xk[c + 1] += sign * s1;
      xk[c + 2] += sign * s2;
      xk[c + 3] += sign * s3;
    }
    for (; c < nc; ++c) {
      const double* __restrict g0 = G + c * ldg;
      const double b0 = sign * yk[c];
      double s0 = 0.0;
      for (int64_t r = c; r < len; ++r) s0 += g0[r] * yk[r];
      for (int64_t r = c; r < len; ++r) xk[r] += g0[r] * b0;
      xk[c] += sign * s0;
    }
  }
}

// the adjoint's panel step: columns handed to block_t at once
constexpr int64_t kChunk = 64;

void set_positions(const Panel& p, int64_t* pos) {
  for (int64_t r = 0; r < p.m; ++r) pos[p.rows[r]] = r;
}

// rel[r] = the position in J's panel of pair q's row a + r (r < m - a),
// pos holding J's rows' positions; its first b - a are J's columns
inline void relative(const Pair& q, const int64_t* pos, int64_t* rel) {
  const int64_t* rows = q.k.rows + q.a;
  for (int64_t r = 0; r < q.k.m - q.a; ++r) rel[r] = pos[rows[r]];
}

// the pair products into J's panel D (sign -1 or +1; pos takes J's rows'
// positions): for each K with rows in J, D[pos(R_K[c + r]), pos(R_K[c])]
// += sign * sum_k X_K Y_K^T (+ Y_K X_K^T with both), for J's columns c,
// r >= 0
void pair_products(const Super& s, int64_t J, const Panel& p, int64_t* pos,
                   const double* X, const double* Y, bool both, double sign, double* D,
                   double* t, int64_t* rel) {
  set_positions(p, pos);
  for (int64_t u = s.uptr[J]; u < s.uptr[J + 1]; ++u) {
    const Pair q = pair(s, u);
    const Panel& k = q.k;
    relative(q, pos, rel);
    for (int64_t c = q.a; c < q.b; ++c) {
      const int64_t len = k.m - c;
      if (both)
        product_column<true>(X + k.off + c, Y + k.off + c, k.m, k.w, len, t);
      else
        product_column<false>(X + k.off + c, Y + k.off + c, k.m, k.w, len, t);
      const int64_t* at = rel + (c - q.a);
      double* dst = D + p.off + at[0] * p.m;
      for (int64_t r = 0; r < len; ++r) dst[at[r]] += sign * t[r];
    }
  }
}


// the pair products' transposes for J's panel W (the cotangent of J's
// columns, mJ rows): for each K with rows in J, gx_K += sign * each
// column's product_column_t with y_K, the column's cotangent gathered into G
void pair_products_t(const Super& s, int64_t J, int64_t* pos, const double* W, int64_t mJ,
                     const double* Y, double sign, double* GX, double* G, int64_t* rel) {
  set_positions(panel(s, J), pos);
  for (int64_t u = s.uptr[J]; u < s.uptr[J + 1]; ++u) {
    const Pair q = pair(s, u);
    const Panel& k = q.k;
    relative(q, pos, rel);
    for (int64_t c = q.a; c < q.b; ++c) {
      const int64_t len = k.m - c;
      const int64_t* at = rel + (c - q.a);
      const double* src = W + at[0] * mJ;
      for (int64_t r = 0; r < len; ++r) G[r] = src[at[r]];
      product_column_t(G, Y + k.off + c, k.m, k.w, len, sign, GX + k.off + c);
    }
  }
}

}  // namespace

extern "C" {

// l = [diag, S] with l l^T = e, S closed (`sciad_fill_closed`). Returns 0;
// (j + 1) where the pivot of column j is not positive (or NaN).
int sciad_chol(const Super* sp, const double* e, double* l, double* work) {
  const Super& s = *sp;
  double* P = to_panels(s, e, work, 0);
  std::vector<double> t(s.maxrows);
  std::vector<int64_t> pos(s.n), rel(s.maxrows);
  for (int64_t J = 0; J < s.ns; ++J) {
    const Panel p = panel(s, J);
    pair_products(s, J, p, pos.data(), P, P, false, -1.0, P, t.data(), rel.data());
    double* L = P + p.off;
    for (int64_t c = 0; c < p.w; ++c) {  // (left-looking inside the panel too)
      double* col = L + c * p.m;
      product_column<false>(L + c, L + c, p.m, c, p.m - c, t.data());
      for (int64_t r = c; r < p.m; ++r) col[r] -= t[r - c];
      const double pivot = col[c];
      if (!(pivot > 0.0)) return static_cast<int>(p.f + c + 1);
      const double d = std::sqrt(pivot);
      col[c] = d;
      for (int64_t r = c + 1; r < p.m; ++r) col[r] /= d;
    }
  }
  from_panels(s, P, l);
  return 0;
}

// x with tril(x l^T + l x^T) = e: the forward mode of the factorization.
void sciad_chol_tangent(const Super* sp, const double* l, const double* e, double* x,
                        double* work) {
  const Super& s = *sp;
  const double* PL = to_panels(s, l, work, 0);
  double* PX = to_panels(s, e, work, 1);
  std::vector<double> t(s.maxrows);
  std::vector<int64_t> pos(s.n), rel(s.maxrows);
  for (int64_t J = 0; J < s.ns; ++J) {
    const Panel p = panel(s, J);
    pair_products(s, J, p, pos.data(), PX, PL, true, -1.0, PX, t.data(), rel.data());
    const double* L = PL + p.off;
    double* X = PX + p.off;
    for (int64_t c = 0; c < p.w; ++c) {
      const double* lc = L + c * p.m;
      double* xc = X + c * p.m;
      product_column<true>(X + c, L + c, p.m, c, p.m - c, t.data());
      for (int64_t r = c; r < p.m; ++r) xc[r] -= t[r - c];
      const double d = lc[c], xd = xc[c] / (2.0 * d);
      xc[c] = xd;
      for (int64_t r = c + 1; r < p.m; ++r) xc[r] = (xc[r] - lc[r] * xd) / d;
    }
  }
  from_panels(s, PX, x);
}

// eb = the transpose of the tangent map applied to xb (reverse mode): the
// tangent's steps in reverse, supernodes last to first.
void sciad_chol_adjoint(const Super* sp, const double* l, const double* xb, double* eb,
                        double* work) {
  const Super& s = *sp;
  const double* PL = to_panels(s, l, work, 0);
  double *A = to_panels(s, xb, work, 1), *E = zeroed(s, work, 2);
  std::vector<double> g(s.maxrows);
  std::vector<int64_t> pos(s.n), rel(s.maxrows);
  for (int64_t J = s.ns - 1; J >= 0; --J) {
    const Panel p = panel(s, J);
    const double* L = PL + p.off;
    double* X = A + p.off;
    double* W = E + p.off;
    // the tangent's panel step, reversed: by chunks of columns from the
    // right, each column's cotangent to the chunk's columns before it, then
    // the chunk's to the columns before the chunk at once
    for (int64_t c1 = p.w; c1 > 0; c1 -= kChunk) {
      const int64_t c0 = std::max<int64_t>(0, c1 - kChunk);
      for (int64_t c = c1 - 1; c >= c0; --c) {
        const double* lc = L + c * p.m;
        double* xc = X + c * p.m;
        const double d = lc[c];
        double xd = xc[c];
        double* wc = W + c * p.m;
        for (int64_t r = c + 1; r < p.m; ++r) {
          wc[r] = xc[r] / d;
          xd -= xc[r] * lc[r] / d;
        }
        wc[c] = xd / (2.0 * d);
        product_column_t(wc + c, L + c0 * p.m + c, p.m, c - c0, p.m - c, -1.0,
                         X + c0 * p.m + c);
      }
      block_t(W + c0 * p.m + c0, p.m, p.m - c0, c1 - c0, L + c0, p.m, c0, -1.0, X + c0);
    }
    pair_products_t(s, J, pos.data(), W, p.m, PL, -1.0, A, g.data(), rel.data());
  }
  from_panels(s, E, eb);
}

// w = tril(x y^T + y x^T) on the layout.
void sciad_fill_symprod(const Super* sp, const double* x, const double* y, double* w,
                        double* work) {
  const Super& s = *sp;
  const double *PX = to_panels(s, x, work, 0), *PY = to_panels(s, y, work, 1);
  double* W = zeroed(s, work, 2);
  std::vector<double> t(s.maxrows);
  std::vector<int64_t> pos(s.n), rel(s.maxrows);
  for (int64_t J = 0; J < s.ns; ++J) {
    const Panel p = panel(s, J);
    pair_products(s, J, p, pos.data(), PX, PY, true, 1.0, W, t.data(), rel.data());
    for (int64_t c = 0; c < p.w; ++c) {  // J's own columns (X_J, Y_J zero above c)
      product_column<true>(PX + p.off + c, PY + p.off + c, p.m, c + 1, p.m - c, t.data());
      double* dst = W + p.off + c * p.m + c;
      for (int64_t r = 0; r < p.m - c; ++r) dst[r] += t[r];
    }
  }
  from_panels(s, W, w);
}

// w = (C + C^T) y on the layout, C the lower-triangular matrix c (its
// diagonal counted twice: c is the lower triangle of a symmetric matrix's
// cotangent), y lower-triangular: the transpose of symprod in x, each of
// its pair products transposed.
void sciad_fill_symmul(const Super* sp, const double* c, const double* y, double* w,
                       double* work) {
  const Super& s = *sp;
  const double *PC = to_panels(s, c, work, 0), *PY = to_panels(s, y, work, 1);
  double* W = zeroed(s, work, 2);
  std::vector<double> g(s.maxrows);
  std::vector<int64_t> pos(s.n), rel(s.maxrows);
  for (int64_t J = 0; J < s.ns; ++J) {
    const Panel p = panel(s, J);
    for (int64_t q = 0; q < p.w; ++q)
      product_column_t(PC + p.off + q * p.m + q, PY + p.off + q, p.m, q + 1, p.m - q, 1.0,
                       W + p.off + q);
    pair_products_t(s, J, pos.data(), PC + p.off, p.m, PY, 1.0, W, g.data(), rel.data());
  }
  from_panels(s, W, w);
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
