// What cuDSS's factor exposes, and what its mixed-precision factors cost and
// give, measured on the GPU (issues 49 and 53): one JSON object per line.
//
// A. Small matrices (n = 6) factored as SPD, symmetric and general: the
//    factor's diagonal (CUDSS_DATA_DIAG), the reordering permutations, the
//    pivot count and inertia, next to the matrix, so that what the diagonal
//    is (L's, D's or U's; permuted or not) can be read off against NumPy's
//    determinant (bench/cudss_probe.py does that).
// B. The 7-point Laplacian plus a unit diagonal on m^3 grids (SPD: Cholesky)
//    and a 3-D convection-diffusion matrix (general: LU): analysis,
//    factorization and solve times, cuDSS's memory estimates and the
//    backward error ||b - A x||_inf / (||A||_inf ||x||_inf + ||b||_inf), with
//    float64 factors, with CUDSS_CONFIG_DOWNCAST_FACTORS (float32 factors,
//    the strict or the block diagonal kept in float64), and with the strict
//    mode plus cuDSS's iterative refinement (CUDSS_CONFIG_IR_N_STEPS).
//
// Built and run by bench/cudss_probe.py (g++ against the cuDSS and CUDA
// runtime wheels, as sciad's extension):  cudss_probe [m ...]

#include <cuda_runtime.h>
#include <cudss.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

cudssHandle_t g_h = nullptr;

#define CK(expr)                                                                  \
  do {                                                                            \
    auto s_ = (expr);                                                             \
    if (static_cast<int>(s_) != 0) {                                              \
      std::printf("{\"error\": \"%s\", \"status\": %d, \"line\": %d}\n", #expr,     \
                  static_cast<int>(s_), __LINE__);                                \
      std::fflush(stdout);                                                        \
      return false;                                                               \
    }                                                                             \
  } while (0)

double now() {
  cudaDeviceSynchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Csr {
  int n = 0;
  std::vector<int> off, col;
  std::vector<double> val;
};

// Entries of a row added in column order (the caller adds them sorted).
void add(Csr& a, int j, double v) {
  a.col.push_back(j);
  a.val.push_back(v);
}

Csr laplacian3(int m, double shift, double wind) {
  Csr a;
  a.n = m * m * m;
  a.off.push_back(0);
  auto id = [m](int i, int j, int k) { return (i * m + j) * m + k; };
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < m; ++j)
      for (int k = 0; k < m; ++k) {
        if (i > 0) add(a, id(i - 1, j, k), -1.0 - wind);
        if (j > 0) add(a, id(i, j - 1, k), -1.0);
        if (k > 0) add(a, id(i, j, k - 1), -1.0);
        add(a, id(i, j, k), 6.0 + shift);
        if (k < m - 1) add(a, id(i, j, k + 1), -1.0);
        if (j < m - 1) add(a, id(i, j + 1, k), -1.0);
        if (i < m - 1) add(a, id(i + 1, j, k), -1.0 + wind);
        a.off.push_back(static_cast<int>(a.col.size()));
      }
  return a;
}

Csr dense_to_csr(int n, const double* d) {
  Csr a;
  a.n = n;
  a.off.push_back(0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j)
      if (d[i * n + j] != 0.0) add(a, j, d[i * n + j]);
    a.off.push_back(static_cast<int>(a.col.size()));
  }
  return a;
}

struct Dev {
  int* off = nullptr;
  int* col = nullptr;
  double* val = nullptr;
  double* b = nullptr;
  double* x = nullptr;
  ~Dev() {
    cudaFree(off);
    cudaFree(col);
    cudaFree(val);
    cudaFree(b);
    cudaFree(x);
  }
};

bool upload(const Csr& a, const std::vector<double>& b, Dev& d) {
  size_t nnz = a.col.size();
  CK(cudaMalloc(&d.off, (a.n + 1) * sizeof(int)));
  CK(cudaMalloc(&d.col, nnz * sizeof(int)));
  CK(cudaMalloc(&d.val, nnz * sizeof(double)));
  CK(cudaMalloc(&d.b, a.n * sizeof(double)));
  CK(cudaMalloc(&d.x, a.n * sizeof(double)));
  CK(cudaMemcpy(d.off, a.off.data(), (a.n + 1) * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.col, a.col.data(), nnz * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.val, a.val.data(), nnz * sizeof(double), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.b, b.data(), a.n * sizeof(double), cudaMemcpyHostToDevice));
  CK(cudaMemset(d.x, 0, a.n * sizeof(double)));
  return true;
}

std::string ints(const int* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string reals(const double* v, int n) {
  std::string s = "[";
  char buf[64];
  for (int i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%s%.17g", i ? ", " : "", v[i]);
    s += buf;
  }
  return s + "]";
}

// cuDSS's objects for `a` (uploaded in `d`) with matrix type `mtype`.
struct Objects {
  cudssConfig_t cfg = nullptr;
  cudssData_t data = nullptr;
  cudssMatrix_t A = nullptr, X = nullptr, B = nullptr;
  ~Objects() {
    if (A) cudssMatrixDestroy(A);
    if (X) cudssMatrixDestroy(X);
    if (B) cudssMatrixDestroy(B);
    if (data) cudssDataDestroy(g_h, data);
    if (cfg) cudssConfigDestroy(cfg);
  }
};

bool wrap(const Csr& a, const Dev& d, cudssMatrixType_t mtype, Objects& o) {
  int n = a.n;
  CK(cudssConfigCreate(&o.cfg));
  CK(cudssDataCreate(g_h, &o.data));
  CK(cudssMatrixCreateCsr(&o.A, n, n, a.col.size(), d.off, nullptr, d.col, d.val, CUDA_R_32I,
                          CUDA_R_32I, CUDA_R_64F, mtype, CUDSS_MVIEW_FULL, CUDSS_BASE_ZERO));
  CK(cudssMatrixCreateDn(&o.X, n, 1, n, d.x, CUDA_R_64F, CUDSS_LAYOUT_COL_MAJOR));
  CK(cudssMatrixCreateDn(&o.B, n, 1, n, d.b, CUDA_R_64F, CUDSS_LAYOUT_COL_MAJOR));
  return true;
}

// A. what the factor of a small matrix exposes
bool small(const char* name, int n, const double* dense, cudssMatrixType_t mtype) {
  Csr a = dense_to_csr(n, dense);
  std::vector<double> b(n, 1.0);
  Dev d;
  if (!upload(a, b, d)) return false;
  Objects o;
  if (!wrap(a, d, mtype, o)) return false;
  CK(cudssExecute(g_h, CUDSS_PHASE_ANALYSIS, o.cfg, o.data, o.A, o.X, o.B));
  CK(cudssExecute(g_h, CUDSS_PHASE_FACTORIZATION, o.cfg, o.data, o.A, o.X, o.B));
  CK(cudssExecute(g_h, CUDSS_PHASE_SOLVE, o.cfg, o.data, o.A, o.X, o.B));
  cudaDeviceSynchronize();
  // (host buffers; a managed one where cuDSS may write from the device)
  double* diag = nullptr;
  int* perm_r = nullptr;
  int* perm_c = nullptr;
  CK(cudaMallocManaged(&diag, n * sizeof(double)));
  CK(cudaMallocManaged(&perm_r, n * sizeof(int)));
  CK(cudaMallocManaged(&perm_c, n * sizeof(int)));
  size_t w = 0;
  int info = 0, npiv = -1, inertia[2] = {-1, -1};
  int64_t lu_nnz = -1;
  int s_info = cudssDataGet(g_h, o.data, CUDSS_DATA_INFO, &info, sizeof info, &w);
  int s_npiv = cudssDataGet(g_h, o.data, CUDSS_DATA_NPIVOTS, &npiv, sizeof npiv, &w);
  int s_inertia = cudssDataGet(g_h, o.data, CUDSS_DATA_INERTIA, inertia, sizeof inertia, &w);
  int s_lunnz = cudssDataGet(g_h, o.data, CUDSS_DATA_LU_NNZ, &lu_nnz, sizeof lu_nnz, &w);
  int s_diag = cudssDataGet(g_h, o.data, CUDSS_DATA_DIAG, diag, n * sizeof(double), &w);
  size_t w_diag = w;
  int s_pr = cudssDataGet(g_h, o.data, CUDSS_DATA_PERM_REORDER_ROW, perm_r, n * sizeof(int), &w);
  int s_pc = cudssDataGet(g_h, o.data, CUDSS_DATA_PERM_REORDER_COL, perm_c, n * sizeof(int), &w);
  cudaDeviceSynchronize();
  std::vector<double> x(n);
  cudaMemcpy(x.data(), d.x, n * sizeof(double), cudaMemcpyDeviceToHost);
  std::printf(
      "{\"part\": \"A\", \"name\": \"%s\", \"mtype\": %d, \"n\": %d, \"matrix\": %s, "
      "\"x\": %s, \"info\": [%d, %d], \"npivots\": [%d, %d], \"inertia\": [%d, %s], "
      "\"lu_nnz\": [%d, %lld], \"diag\": [%d, %zu, %s], \"perm_reorder_row\": [%d, %s], "
      "\"perm_reorder_col\": [%d, %s]}\n",
      name, static_cast<int>(mtype), n, reals(dense, n * n).c_str(), reals(x.data(), n).c_str(),
      s_info, info, s_npiv, npiv, s_inertia, ints(inertia, 2).c_str(), s_lunnz,
      static_cast<long long>(lu_nnz), s_diag, w_diag, reals(diag, n).c_str(), s_pr,
      ints(perm_r, n).c_str(), s_pc, ints(perm_c, n).c_str());
  std::fflush(stdout);
  cudaFree(diag);
  cudaFree(perm_r);
  cudaFree(perm_c);
  return true;
}

// B. one factorization mode on one matrix
bool big(const char* name, const Csr& a, cudssMatrixType_t mtype, int downcast, int ir_steps) {
  int n = a.n;
  std::vector<double> b(n);
  for (int i = 0; i < n; ++i) b[i] = 1.0 + 0.5 * std::sin(0.37 * i);
  Dev d;
  if (!upload(a, b, d)) return false;
  Objects o;
  if (!wrap(a, d, mtype, o)) return false;
  int s_down = 0, s_ir = 0;
  if (downcast) {
    cudssDowncastFactorsMode_t mode = static_cast<cudssDowncastFactorsMode_t>(downcast);
    s_down = cudssConfigSet(o.cfg, CUDSS_CONFIG_DOWNCAST_FACTORS, &mode, sizeof mode);
  }
  if (ir_steps) s_ir = cudssConfigSet(o.cfg, CUDSS_CONFIG_IR_N_STEPS, &ir_steps, sizeof ir_steps);
  size_t free0 = 0, total = 0, free1 = 0;
  cudaMemGetInfo(&free0, &total);
  double t0 = now();
  CK(cudssExecute(g_h, CUDSS_PHASE_ANALYSIS, o.cfg, o.data, o.A, o.X, o.B));
  double t1 = now();
  int64_t est[16] = {0};
  size_t w = 0;
  int s_est = cudssDataGet(g_h, o.data, CUDSS_DATA_MEMORY_ESTIMATES, est, sizeof est, &w);
  double t2 = now();
  CK(cudssExecute(g_h, CUDSS_PHASE_FACTORIZATION, o.cfg, o.data, o.A, o.X, o.B));
  double t3 = now();
  cudaMemGetInfo(&free1, &total);
  CK(cudssExecute(g_h, CUDSS_PHASE_SOLVE, o.cfg, o.data, o.A, o.X, o.B));
  double t4 = now();
  // a second factorization (same values: the refactor cost) and solve
  CK(cudssExecute(g_h, CUDSS_PHASE_FACTORIZATION, o.cfg, o.data, o.A, o.X, o.B));
  double t5 = now();
  CK(cudssExecute(g_h, CUDSS_PHASE_SOLVE, o.cfg, o.data, o.A, o.X, o.B));
  double t6 = now();
  int info = 0, ir_done = -1;
  cudssDataGet(g_h, o.data, CUDSS_DATA_INFO, &info, sizeof info, &w);
  int s_irn = cudssDataGet(g_h, o.data, CUDSS_DATA_IR_N_STEPS, &ir_done, sizeof ir_done, &w);
  std::vector<double> x(n);
  CK(cudaMemcpy(x.data(), d.x, n * sizeof(double), cudaMemcpyDeviceToHost));
  double rmax = 0, anorm = 0, xmax = 0, bmax = 0;
  for (int i = 0; i < n; ++i) {
    double r = b[i], rowsum = 0;
    for (int p = a.off[i]; p < a.off[i + 1]; ++p) {
      r -= a.val[p] * x[a.col[p]];
      rowsum += std::fabs(a.val[p]);
    }
    rmax = std::fmax(rmax, std::fabs(r));
    anorm = std::fmax(anorm, rowsum);
    xmax = std::fmax(xmax, std::fabs(x[i]));
    bmax = std::fmax(bmax, std::fabs(b[i]));
  }
  std::printf(
      "{\"part\": \"B\", \"name\": \"%s\", \"n\": %d, \"nnz\": %zu, \"mtype\": %d, "
      "\"downcast\": [%d, %d], \"ir_steps\": [%d, %d, %d, %d], \"info\": %d, "
      "\"analysis_s\": %.4f, \"factor_s\": %.4f, \"solve_s\": %.4f, \"refactor_s\": %.4f, "
      "\"resolve_s\": %.4f, \"backward_error\": %.3e, \"factor_device_bytes\": %lld, "
      "\"estimates\": [%d, %lld, %lld, %lld, %lld, %lld, %lld]}\n",
      name, n, a.col.size(), static_cast<int>(mtype), downcast, s_down, ir_steps, s_ir, s_irn,
      ir_done, info, t1 - t0, t3 - t2, t4 - t3, t5 - t4, t6 - t5,
      rmax / (anorm * xmax + bmax), static_cast<long long>(free0) - static_cast<long long>(free1),
      s_est, (long long)est[0], (long long)est[1], (long long)est[2], (long long)est[3],
      (long long)est[4], (long long)est[5]);
  std::fflush(stdout);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (cudssCreate(&g_h) != CUDSS_STATUS_SUCCESS) {
    std::printf("{\"error\": \"cudssCreate\"}\n");
    return 1;
  }
  const int n = 6;
  double spd[n * n] = {0}, gen[n * n] = {0}, indef[n * n] = {0};
  for (int i = 0; i < n; ++i) {
    spd[i * n + i] = 2.5 + 0.1 * i;
    gen[i * n + i] = (i % 2 ? -3.0 : 2.0) + 0.1 * i;
    indef[i * n + i] = (i % 2 ? -2.0 : 2.0);
    if (i + 1 < n) {
      spd[i * n + i + 1] = spd[(i + 1) * n + i] = -1.0;
      gen[i * n + i + 1] = 1.5;
      gen[(i + 1) * n + i] = -0.5;
      indef[i * n + i + 1] = indef[(i + 1) * n + i] = 1.0;
    }
  }
  gen[0 * n + 5] = 4.0;  // (a pivot LU may swap)
  gen[0] = 0.01;
  small("spd as SPD", n, spd, CUDSS_MTYPE_SPD);
  small("spd as SYMMETRIC", n, spd, CUDSS_MTYPE_SYMMETRIC);
  small("spd as GENERAL", n, spd, CUDSS_MTYPE_GENERAL);
  small("general as GENERAL", n, gen, CUDSS_MTYPE_GENERAL);
  small("indefinite as SYMMETRIC", n, indef, CUDSS_MTYPE_SYMMETRIC);
  for (int i = 1; i < argc; ++i) {
    int m = std::atoi(argv[i]);
    Csr lap = laplacian3(m, 1.0, 0.0);
    std::string tag = "laplacian " + std::to_string(m) + "^3";
    big(tag.c_str(), lap, CUDSS_MTYPE_SPD, 0, 0);
    big(tag.c_str(), lap, CUDSS_MTYPE_SPD, CUDSS_DOWNCAST_FACTORS_MODE_KEEP_STRICT_DIAGONAL, 0);
    big(tag.c_str(), lap, CUDSS_MTYPE_SPD, CUDSS_DOWNCAST_FACTORS_MODE_KEEP_BLOCK_DIAGONAL, 0);
    big(tag.c_str(), lap, CUDSS_MTYPE_SPD, CUDSS_DOWNCAST_FACTORS_MODE_KEEP_STRICT_DIAGONAL, 2);
    if (m <= 64) {
      Csr cd = laplacian3(m, 0.0, 0.4);
      std::string t2 = "convection-diffusion " + std::to_string(m) + "^3";
      big(t2.c_str(), cd, CUDSS_MTYPE_GENERAL, 0, 0);
      big(t2.c_str(), cd, CUDSS_MTYPE_GENERAL, CUDSS_DOWNCAST_FACTORS_MODE_KEEP_STRICT_DIAGONAL,
          0);
      big(t2.c_str(), cd, CUDSS_MTYPE_GENERAL, CUDSS_DOWNCAST_FACTORS_MODE_KEEP_STRICT_DIAGONAL,
          2);
    }
  }
  cudssDestroy(g_h);
  return 0;
}
