// sciad's cuDSS kernels: XLA FFI handlers (CUDA platform) that factor and
// solve sparse matrices with NVIDIA cuDSS on the stream XLA gives them.
//
// Needs cuDSS >= 1.0 (cudssMatrixCreateCsr's offset type, the transposed
// solve mode). Built on first use by sciad.solvers.direct._cudss_build (g++, the
// headers of the cuDSS and CUDA runtime wheels and jaxlib's XLA FFI headers),
// linked against libcudss.so.N and libcudart.so.M with the wheels' folders
// as rpath. Loaded with ctypes; the handlers are registered as custom-call
// targets `sciad_cudss_*` by sciad.solvers.direct._cudss_ffi.
//
// Objects:
// - Pattern (made from Python with `sciad_cudss_pattern`, kept for the
//   process): the CSR structure on the host (int32), the cuDSS matrix type
//   (general / symmetric / SPD), and per device and value type a pool of
//   `Slot`s. Its raw address is the `pattern` attribute of every call.
// - Slot: one cudssData_t and its matrix wrapper. Its first factorization
//   runs cuDSS's analysis (reordering + symbolic factorization); a slot
//   returned to the pool keeps that analysis, so each pattern is analysed as
//   many times as factors of it were ever live at once (one for a single
//   solve or a chain of them, L for a batch of L), never again afterwards.
// - A numeric factor is a Member of a Slot taken from the pool: the
//   member's address, tagged with the slot's generation, is the uint64
//   handle `factor` writes; `free` (or `sciad_cudss_release`, from the host)
//   counts the slot's members down and returns it to the pool at zero. `solve`
//   reads handles back from the device (one small copy and a stream sync).
//   `factor_solve` factors, solves and returns the slot in one call (a
//   handle of 0 in Python: no factor outlives the call).
// - Batches: a call for L > 1 matrices (sd.vmap folds its batch into the
//   kernels' axis) takes one slot in cuDSS's uniform-batch mode
//   (CUDSS_CONFIG_UBATCH_SIZE = L, its own config and scratch): one
//   analysis, one factorization and one solve call for the L matrices,
//   their values and right-hand sides batch-major as XLA lays them out.
//   A solve that reads a batch's members in another order, or that cuDSS
//   refuses in batch mode, solves each example by a factorization of its
//   own in the call (counted by `sciad_cudss_batch_fallbacks`); a batch
//   factorization that cuDSS refuses switches batch mode off for the
//   process (`sciad_cudss_batch_status` says why) and factors one slot per
//   matrix, as with SCIAD_CUDSS_BATCH=0.
//
// Transposed solves use the same factor: cuDSS's CUDSS_CONFIG_SOLVE_MODE =
// CUDSS_SOLVE_MODE_TRANSPOSE (plain transpose, never conjugated); a factor of
// a symmetric or SPD matrix (real: sciad asks for those types for real
// matrices only) solves the transpose in the normal mode.
//
// Right-hand sides arrive as (L, k, n) row-major arrays: each column
// contiguous, i.e. cuDSS's column-major (n, k) with ld = n.
//
// Thread and call safety: one cudssHandle_t per device; every handler holds
// one process-wide mutex while it calls cuDSS and synchronizes its stream
// before it lets go (cuDSS's per-handle workspace is then never shared by
// two streams at once). Calls therefore serialize; each is still on the
// stream XLA passes.
//
// A factorization that cuDSS reports as failed (CUDSS_DATA_INFO != 0: a zero
// pivot, or a Cholesky breakdown) is a value, not an error: its handle is 0
// (the program judges it, naming the node and the user's line, as KLU's
// handle table does), and a one-call solve (`factor_solve`) of such a matrix,
// or a solve that reads a 0 handle, writes NaN for that matrix (the solve's
// checks judge it). In a uniform batch only the matrices that failed get 0
// (where cuDSS's info names them; else each matrix is factored again alone to
// tell). Errors are left for what is not the matrix's fault: a CUDA or cuDSS
// call that fails, a handle that is stale or of another pattern.

#include <cuda_runtime.h>
#include <cudss.h>

#include <atomic>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

std::mutex g_mu;                       // every cuDSS call holds it
std::map<int, cudssHandle_t> g_handles;  // one library handle per device
std::atomic<int64_t> g_live{0};        // numeric factors made and not freed
std::atomic<int64_t> g_fallbacks{0};   // batch solves done one example at a time
bool g_batch_on = true;                // uniform-batch mode (under g_mu)
bool g_batch_read = false;             // SCIAD_CUDSS_BATCH read (under g_mu)
bool g_batch_refused = false;          // cuDSS refused a batch factorization (under g_mu)
std::string g_batch_status = "on";     // why it is off, where it is

struct Slot;
struct Member {  // one factor: what a handle points to
  Slot* slot = nullptr;
  int64_t index = 0;
  bool live = false;  // made in the slot's current generation and not freed
};

// A handle: the member's address (below 2^48 on x86-64 and AArch64) with the
// slot's generation in the top 16 bits, so a handle released already (a
// failed check's host release, then the program's own free, or a stale copy)
// is told apart from the slot's next factor, and ignored or refused.
constexpr int kGenShift = 48;
constexpr uint64_t kAddressMask = (uint64_t{1} << kGenShift) - 1;

struct Slot {
  cudssData_t data = nullptr;
  cudssMatrix_t a = nullptr;  // the CSR wrapper (values pointer set per call)
  cudssConfig_t config = nullptr;  // the pattern's (batch 1) or its own (uniform batch)
  void* scratch = nullptr;    // batch > 1: the dummy x/b of 2 * batch * n values
  bool analyzed = false;
  int device = 0;
  cudaDataType_t vtype = CUDA_R_64F;
  struct Pattern* pattern = nullptr;
  int64_t batch = 1;
  std::vector<Member> members;  // `batch` of them (never resized: handles point here)
  int64_t live = 0;             // members not yet freed
  uint16_t gen = 0;             // bumped by every factorization
};

uint64_t handle_of(Member* m) {
  return reinterpret_cast<uint64_t>(m) | (uint64_t{m->slot->gen} << kGenShift);
}

// The live factor a handle names, or null (0, released, or stale).
Member* member_of(uint64_t h) {
  Member* m = reinterpret_cast<Member*>(h & kAddressMask);
  if (m == nullptr || m->slot == nullptr || !m->live ||
      m->slot->gen != static_cast<uint16_t>(h >> kGenShift))
    return nullptr;
  return m;
}

using PoolKey = std::pair<int, int64_t>;  // (value type, batch)

struct PerDevice {
  int32_t* offsets = nullptr;  // device copies of the structure
  int32_t* cols = nullptr;
  void* scratch = nullptr;     // n complex128 values: the dummy x/b of a factorization
  std::map<PoolKey, std::vector<Slot*>> idle;
  std::vector<Slot*> all;
};

struct Pattern {
  int64_t n = 0, nnz = 0;
  std::vector<int32_t> offsets, cols;
  cudssMatrixType_t mtype = CUDSS_MTYPE_GENERAL;
  cudssConfig_t config = nullptr;  // shared by its calls (under g_mu)
  std::map<int, PerDevice> devices;
};

ffi::Error cuda_error(cudaError_t e, const char* what) {
  return ffi::Error::Internal(std::string("sciad cudss: ") + what + ": " +
                              cudaGetErrorString(e));
}

ffi::Error cudss_error(cudssStatus_t s, const char* what) {
  return ffi::Error::Internal(std::string("sciad cudss: ") + what + " returned cudssStatus " +
                              std::to_string(static_cast<int>(s)));
}

#define CUDA_TRY(expr, what)                         \
  do {                                               \
    cudaError_t e_ = (expr);                         \
    if (e_ != cudaSuccess) return cuda_error(e_, what); \
  } while (0)

#define CUDSS_TRY(expr, what)                                   \
  do {                                                          \
    cudssStatus_t s_ = (expr);                                  \
    if (s_ != CUDSS_STATUS_SUCCESS) return cudss_error(s_, what); \
  } while (0)

ffi::Error value_type(ffi::DataType t, cudaDataType_t* out, size_t* width) {
  switch (t) {
    case ffi::DataType::F64: *out = CUDA_R_64F; *width = 8; return ffi::Error::Success();
    case ffi::DataType::F32: *out = CUDA_R_32F; *width = 4; return ffi::Error::Success();
    case ffi::DataType::C128: *out = CUDA_C_64F; *width = 16; return ffi::Error::Success();
    case ffi::DataType::C64: *out = CUDA_C_32F; *width = 8; return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument("sciad cudss: values must be float32/64 or "
                                         "complex64/128");
  }
}

// The library handle of the current device, bound to `stream` (under g_mu).
ffi::Error handle_on(cudaStream_t stream, int* device, cudssHandle_t* out) {
  CUDA_TRY(cudaGetDevice(device), "cudaGetDevice");
  auto it = g_handles.find(*device);
  if (it == g_handles.end()) {
    cudssHandle_t h = nullptr;
    CUDSS_TRY(cudssCreate(&h), "cudssCreate");
    it = g_handles.emplace(*device, h).first;
  }
  CUDSS_TRY(cudssSetStream(it->second, stream), "cudssSetStream");
  *out = it->second;
  return ffi::Error::Success();
}

// The device copies of the pattern's structure (made on first use).
ffi::Error on_device(Pattern* p, int device, cudaStream_t stream, PerDevice** out) {
  PerDevice& d = p->devices[device];
  if (d.offsets == nullptr) {
    CUDA_TRY(cudaMalloc(&d.offsets, (p->n + 1) * sizeof(int32_t)), "cudaMalloc");
    CUDA_TRY(cudaMalloc(&d.cols, (p->nnz > 0 ? p->nnz : 1) * sizeof(int32_t)), "cudaMalloc");
    CUDA_TRY(cudaMalloc(&d.scratch, 2 * (p->n > 0 ? p->n : 1) * 16), "cudaMalloc");
    CUDA_TRY(cudaMemcpyAsync(d.offsets, p->offsets.data(), (p->n + 1) * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    CUDA_TRY(cudaMemcpyAsync(d.cols, p->cols.data(), p->nnz * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    CUDA_TRY(cudaMemsetAsync(d.scratch, 0, 2 * (p->n > 0 ? p->n : 1) * 16, stream),
             "cudaMemsetAsync");
  }
  *out = &d;
  return ffi::Error::Success();
}

ffi::Error dense(cudssMatrix_t* m, int64_t n, int64_t k, void* values, cudaDataType_t t) {
  CUDSS_TRY(cudssMatrixCreateDn(m, n, k, n, values, t, CUDSS_LAYOUT_COL_MAJOR),
            "cudssMatrixCreateDn");
  return ffi::Error::Success();
}

// Whether uniform-batch mode is on (SCIAD_CUDSS_BATCH=0 turns it off; a
// batch factorization cuDSS refuses turns it off for the process). Under g_mu.
bool batch_on() {
  if (!g_batch_read) {
    g_batch_read = true;
    const char* env = std::getenv("SCIAD_CUDSS_BATCH");
    if (env != nullptr && std::string(env) == "0") {
      g_batch_on = false;
      g_batch_status = "off: SCIAD_CUDSS_BATCH=0";
    }
  }
  return g_batch_on;
}

// A new slot of `p` for `batch` matrices of type `t` (values at `values`).
ffi::Error new_slot(cudssHandle_t h, Pattern* p, int device, PerDevice* d, cudaDataType_t t,
                    int64_t batch, void* values, Slot** out) {
  Slot* s = new Slot();
  s->device = device;
  s->vtype = t;
  s->pattern = p;
  s->batch = batch;
  s->members.resize(batch);
  for (int64_t i = 0; i < batch; ++i) s->members[i] = Member{s, i};
  d->all.push_back(s);  // (kept even if what follows fails: freed with nothing)
  CUDSS_TRY(cudssDataCreate(h, &s->data), "cudssDataCreate");
  if (batch > 1) {
    CUDSS_TRY(cudssConfigCreate(&s->config), "cudssConfigCreate");
    int ub = static_cast<int>(batch);
    CUDSS_TRY(cudssConfigSet(s->config, CUDSS_CONFIG_UBATCH_SIZE, &ub, sizeof(ub)),
              "cudssConfigSet(UBATCH_SIZE)");
    size_t bytes = 2 * static_cast<size_t>(batch) * (p->n > 0 ? p->n : 1) * 16;
    CUDA_TRY(cudaMalloc(&s->scratch, bytes), "cudaMalloc");
    CUDA_TRY(cudaMemset(s->scratch, 0, bytes), "cudaMemset");
  } else {
    s->config = p->config;
    s->scratch = d->scratch;
  }
  CUDSS_TRY(cudssMatrixCreateCsr(&s->a, p->n, p->n, p->nnz, d->offsets, nullptr, d->cols,
                                 values, CUDA_R_32I, CUDA_R_32I, t, p->mtype, CUDSS_MVIEW_FULL,
                                 CUDSS_BASE_ZERO),
            "cudssMatrixCreateCsr");
  *out = s;
  return ffi::Error::Success();
}

// A slot of `p` for `batch` matrices of type `t`, factored with the values at
// `values` (`batch` * nnz, batch-major; analysed first if new). A zero pivot
// is not an error: `(*failed)[i]` says which matrices failed (where cuDSS's
// info is one int for a batch, all of them, and `*unattributed` is set), their
// members are not live, and where all failed the slot goes back to the pool
// and `*out` is null. Any other failure returns an error (the slot back in
// the pool); `*refused` (where given) is then set where cuDSS returned a
// status other than success: batch mode may be what it refused.
ffi::Error take_and_factor(cudssHandle_t h, Pattern* p, int device, PerDevice* d,
                           cudaDataType_t t, void* values, int64_t batch, Slot** out,
                           std::vector<char>* failed, bool* unattributed = nullptr,
                           bool* refused = nullptr) {
  *out = nullptr;
  failed->assign(batch, 0);
  if (unattributed != nullptr) *unattributed = false;
  auto& idle = d->idle[PoolKey(static_cast<int>(t), batch)];
  Slot* s = nullptr;
  if (!idle.empty()) {
    s = idle.back();
    idle.pop_back();
  } else if (auto e = new_slot(h, p, device, d, t, batch, values, &s); e.failure()) {
    if (refused != nullptr) *refused = true;
    return e;
  }
  auto give_back = [&]() { idle.push_back(s); };
  if (cudssMatrixSetValues(s->a, values) != CUDSS_STATUS_SUCCESS) {
    give_back();
    return ffi::Error::Internal("sciad cudss: cudssMatrixSetValues failed");
  }
  cudssMatrix_t x = nullptr, b = nullptr;
  if (auto e = dense(&x, p->n, 1, s->scratch, t); e.failure()) { give_back(); return e; }
  if (auto e = dense(&b, p->n, 1, static_cast<char*>(s->scratch) + batch * p->n * 16, t);
      e.failure()) {
    cudssMatrixDestroy(x);
    give_back();
    return e;
  }
  cudssStatus_t st = CUDSS_STATUS_SUCCESS;
  if (!s->analyzed) {
    st = cudssExecute(h, CUDSS_PHASE_ANALYSIS, s->config, s->data, s->a, x, b);
    if (st == CUDSS_STATUS_SUCCESS) s->analyzed = true;
  }
  if (st == CUDSS_STATUS_SUCCESS)
    st = cudssExecute(h, CUDSS_PHASE_FACTORIZATION, s->config, s->data, s->a, x, b);
  cudssMatrixDestroy(x);
  cudssMatrixDestroy(b);
  if (st != CUDSS_STATUS_SUCCESS) {
    give_back();
    if (refused != nullptr) *refused = true;
    return cudss_error(st, "cudssExecute(FACTORIZATION)");
  }
  // CUDSS_DATA_INFO: one int per matrix (uniform batch), or one int
  std::vector<int> infos(batch, 0);
  size_t written = 0;
  bool per_matrix = true;
  cudssStatus_t got = cudssDataGet(h, s->data, CUDSS_DATA_INFO, infos.data(),
                                   infos.size() * sizeof(int), &written);
  if (got != CUDSS_STATUS_SUCCESS && batch > 1) {  // (a single int only)
    got = cudssDataGet(h, s->data, CUDSS_DATA_INFO, infos.data(), sizeof(int), &written);
    per_matrix = false;
  }
  if (got != CUDSS_STATUS_SUCCESS) {
    give_back();
    return cudss_error(got, "cudssDataGet(INFO)");
  }
  per_matrix = per_matrix && written >= infos.size() * sizeof(int);
  int64_t bad = 0;
  for (int64_t i = 0; i < batch; ++i)
    if ((per_matrix ? infos[i] : infos[0]) != 0) {
      (*failed)[i] = 1;
      ++bad;
    }
  if (bad > 0) {  // (reset the indicator for the slot's next factorization)
    std::vector<int> zeros(batch, 0);
    if (cudssDataSet(h, s->data, CUDSS_DATA_INFO, zeros.data(), zeros.size() * sizeof(int))
        != CUDSS_STATUS_SUCCESS)
      cudssDataSet(h, s->data, CUDSS_DATA_INFO, zeros.data(), sizeof(int));
    if (unattributed != nullptr && !per_matrix && batch > 1) *unattributed = true;
  }
  s->gen = static_cast<uint16_t>(s->gen + 1);
  if (bad == batch) {
    give_back();
    return ffi::Error::Success();
  }
  s->live = batch - bad;
  for (int64_t i = 0; i < batch; ++i) s->members[i].live = (*failed)[i] == 0;
  g_live.fetch_add(batch - bad);
  *out = s;
  return ffi::Error::Success();
}

void release(Member* m) {  // one live factor freed (under g_mu)
  Slot* s = m->slot;
  m->live = false;
  g_live.fetch_sub(1);
  if (--s->live == 0)
    s->pattern->devices[s->device].idle[PoolKey(static_cast<int>(s->vtype), s->batch)]
        .push_back(s);
}

void release_handle(uint64_t h) {  // (0, released or stale: nothing; under g_mu)
  if (Member* m = member_of(h)) release(m);
}

void release_all(Slot* s) {  // every live factor of a slot (under g_mu)
  for (auto& m : s->members)
    if (m.live) release(&m);
}

// Solves with every factor of slot `s` (values, b and x batch-major for a
// uniform batch). `*refused` (where given) is set where cuDSS's solve call
// itself failed.
ffi::Error solve_one(cudssHandle_t h, Pattern* p, Slot* s, void* values, void* b, void* x,
                     int64_t k, bool transpose, bool* refused = nullptr) {
  CUDSS_TRY(cudssMatrixSetValues(s->a, values), "cudssMatrixSetValues");
  // (a factor of a symmetric or SPD matrix, real here, is its transpose's too)
  bool symmetric = p->mtype == CUDSS_MTYPE_SYMMETRIC || p->mtype == CUDSS_MTYPE_SPD;
  int mode = transpose && !symmetric ? CUDSS_SOLVE_MODE_TRANSPOSE : CUDSS_SOLVE_MODE_NORMAL;
  CUDSS_TRY(cudssConfigSet(s->config, CUDSS_CONFIG_SOLVE_MODE, &mode, sizeof(mode)),
            "cudssConfigSet(SOLVE_MODE)");
  cudssMatrix_t bm = nullptr, xm = nullptr;
  if (auto e = dense(&bm, p->n, k, b, s->vtype); e.failure()) return e;
  if (auto e = dense(&xm, p->n, k, x, s->vtype); e.failure()) {
    cudssMatrixDestroy(bm);
    return e;
  }
  cudssStatus_t st = cudssExecute(h, CUDSS_PHASE_SOLVE, s->config, s->data, s->a, xm, bm);
  cudssMatrixDestroy(bm);
  cudssMatrixDestroy(xm);
  if (st != CUDSS_STATUS_SUCCESS && refused != nullptr) *refused = true;
  CUDSS_TRY(st, "cudssExecute(SOLVE)");
  return ffi::Error::Success();
}

// NaN in `bytes` bytes at `x` (all bits set: a NaN of every float type): the
// solution of a matrix whose factorization failed, for the checks to judge.
ffi::Error nan_fill(void* x, size_t bytes, cudaStream_t stream) {
  CUDA_TRY(cudaMemsetAsync(x, 0xFF, bytes, stream), "cudaMemsetAsync(NaN)");
  return ffi::Error::Success();
}

// Example i alone: a factorization of its own, a solve, the slot back (NaN
// where the factorization failed).
ffi::Error solve_alone(cudssHandle_t h, cudaStream_t stream, Pattern* p, int device,
                       PerDevice* d, cudaDataType_t t, size_t w, void* values, void* b,
                       void* x, int64_t k, bool transpose) {
  Slot* s = nullptr;
  std::vector<char> failed;
  if (auto e = take_and_factor(h, p, device, d, t, values, 1, &s, &failed); e.failure())
    return e;
  if (s == nullptr) return nan_fill(x, static_cast<size_t>(p->n * k) * w, stream);
  auto e = solve_one(h, p, s, values, b, x, k, transpose);
  release_all(s);
  return e;
}

struct Call {  // what every handler sets up first (under g_mu)
  Pattern* p;
  int device;
  cudssHandle_t h;
  PerDevice* d;
};

ffi::Error begin(cudaStream_t stream, uint64_t pattern, Call* c) {
  c->p = reinterpret_cast<Pattern*>(pattern);
  if (c->p == nullptr) return ffi::Error::InvalidArgument("sciad cudss: no pattern");
  if (auto e = handle_on(stream, &c->device, &c->h); e.failure()) return e;
  if (c->p->config == nullptr)
    CUDSS_TRY(cudssConfigCreate(&c->p->config), "cudssConfigCreate");
  return on_device(c->p, c->device, stream, &c->d);
}

ffi::Error read_handles(cudaStream_t stream, ffi::AnyBuffer h, std::vector<uint64_t>* out) {
  out->resize(h.element_count());
  CUDA_TRY(cudaMemcpyAsync(out->data(), h.untyped_data(), out->size() * sizeof(uint64_t),
                           cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync(handles)");
  CUDA_TRY(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return ffi::Error::Success();
}

// --- the handlers ---

// L matrices' factors: one uniform-batch slot (L > 1, batch mode on), else
// one slot each; out[i] = the handle (a Member's address) of matrix i, 0
// where its factorization failed.
ffi::Error factor_all(Call& c, cudaDataType_t t, size_t w, void* ax, int64_t L,
                      std::vector<uint64_t>* out) {
  out->assign(L, 0);
  std::vector<char> failed;
  if (L > 1 && batch_on()) {
    Slot* s = nullptr;
    bool refused = false, unattributed = false;
    auto e = take_and_factor(c.h, c.p, c.device, c.d, t, ax, L, &s, &failed, &unattributed,
                             &refused);
    if (!e.failure() && !unattributed) {
      for (int64_t i = 0; i < L; ++i)
        if (!failed[i]) (*out)[i] = handle_of(&s->members[i]);
      return e;
    }
    if (e.failure()) {
      if (!refused) return e;
      g_batch_on = false;  // (cuDSS refused batch mode: one slot per matrix from now on)
      g_batch_refused = true;
      g_batch_status = "off: a uniform-batch factorization of " + std::to_string(L) +
                       " matrices failed";
    }
    // (else a zero pivot that cuDSS's info does not attribute: each matrix
    // factored alone below, to tell which failed)
  }
  for (int64_t i = 0; i < L; ++i) {
    Slot* s = nullptr;
    void* v = static_cast<char*>(ax) + i * c.p->nnz * w;
    if (auto e = take_and_factor(c.h, c.p, c.device, c.d, t, v, 1, &s, &failed); e.failure()) {
      for (int64_t j = 0; j < i; ++j) release_handle((*out)[j]);
      return e;
    }
    if (s != nullptr) (*out)[i] = handle_of(&s->members[0]);
  }
  return ffi::Error::Success();
}

// ax: (L, nnz) values -> handles (L,) uint64 (0: the factorization failed)
ffi::Error Factor(cudaStream_t stream, uint64_t pattern, ffi::AnyBuffer ax,
                  ffi::Result<ffi::AnyBuffer> handles) {
  std::lock_guard<std::mutex> lock(g_mu);
  Call c;
  if (auto e = begin(stream, pattern, &c); e.failure()) return e;
  cudaDataType_t t;
  size_t w;
  if (auto e = value_type(ax.element_type(), &t, &w); e.failure()) return e;
  int64_t L = handles->element_count();
  std::vector<uint64_t> out;
  if (auto e = factor_all(c, t, w, ax.untyped_data(), L, &out); e.failure()) return e;
  CUDA_TRY(cudaMemcpyAsync(handles->untyped_data(), out.data(), L * sizeof(uint64_t),
                           cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync(handles)");
  CUDA_TRY(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return ffi::Error::Success();
}

// Solves example by example with factors `hs` (0: a failed factorization,
// NaN; a member of a uniform batch read apart from it: factored again alone).
ffi::Error solve_each(Call& c, cudaStream_t stream, cudaDataType_t t, size_t w,
                      const std::vector<uint64_t>& hs, char* axp, char* bp, char* xp,
                      int64_t per, int64_t k, bool transpose, bool count_fallbacks) {
  for (size_t i = 0; i < hs.size(); ++i) {
    void* v = axp + i * c.p->nnz * w;
    char* bi = bp + i * per * w;
    char* xi = xp + i * per * w;
    if (hs[i] == 0) {
      if (auto e = nan_fill(xi, static_cast<size_t>(per) * w, stream); e.failure()) return e;
      continue;
    }
    Slot* s = member_of(hs[i])->slot;
    if (s->batch == 1) {
      if (auto e = solve_one(c.h, s->pattern, s, v, bi, xi, k, transpose); e.failure())
        return e;
    } else {
      if (count_fallbacks) g_fallbacks.fetch_add(1);
      // (in the factor's own pattern object and pool: the structure is this
      // call's, the matrix type may be another)
      PerDevice* d = &s->pattern->devices[s->device];
      if (auto e = solve_alone(c.h, stream, s->pattern, s->device, d, t, w, v, bi, xi, k,
                               transpose);
          e.failure())
        return e;
    }
  }
  return ffi::Error::Success();
}

// Whether `hs` are a whole uniform batch's members, in order (one solve call).
bool whole_batch(const std::vector<uint64_t>& hs) {
  int64_t L = static_cast<int64_t>(hs.size());
  Member* m0 = L < 2 ? nullptr : member_of(hs[0]);  // (null for a 0 handle)
  if (m0 == nullptr || m0->slot->batch != L) return false;
  for (int64_t i = 0; i < L; ++i) {
    Member* m = member_of(hs[i]);
    if (m == nullptr || m->slot != m0->slot || m->index != i) return false;
  }
  return true;
}

// Solves with the factors `hs`, one per example (Solve's and FactorSolve's
// common part): in one call where they are a whole uniform batch, in their
// slot's own pattern object and pool (cuDSS refusing the batch solve: one
// fallback counted, then example by example); else example by example
// (`solve_each`, counting a member read apart from its batch as a fallback
// where `count_fallbacks`).
ffi::Error solve_members(Call& c, cudaStream_t stream, cudaDataType_t t, size_t w,
                         const std::vector<uint64_t>& hs, char* axp, char* bp, char* xp,
                         int64_t per, int64_t k, bool transpose, bool count_fallbacks) {
  bool whole = whole_batch(hs);
  if (whole) {
    Slot* s = member_of(hs[0])->slot;
    bool refused = false;
    auto e = solve_one(c.h, s->pattern, s, axp, bp, xp, k, transpose, &refused);
    if (!e.failure() || !refused) return e;
    g_fallbacks.fetch_add(1);  // (cuDSS refused the batch solve: one by one below)
  }
  return solve_each(c, stream, t, w, hs, axp, bp, xp, per, k, transpose,
                    count_fallbacks && !whole);
}

// h: (L,) handles, ax: (L, nnz), b: (L, k, n) -> x: (L, k, n)
ffi::Error Solve(cudaStream_t stream, uint64_t pattern, bool transpose, ffi::AnyBuffer h,
                 ffi::AnyBuffer ax, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> x) {
  std::lock_guard<std::mutex> lock(g_mu);
  Call c;
  if (auto e = begin(stream, pattern, &c); e.failure()) return e;
  cudaDataType_t t;
  size_t w;
  if (auto e = value_type(b.element_type(), &t, &w); e.failure()) return e;
  std::vector<uint64_t> hs;
  if (auto e = read_handles(stream, h, &hs); e.failure()) return e;
  int64_t L = static_cast<int64_t>(hs.size());
  int64_t per = L > 0 ? b.element_count() / L : 0;  // k * n
  int64_t k = c.p->n > 0 ? per / c.p->n : 0;
  for (int64_t i = 0; i < L; ++i) {
    if (hs[i] == 0) continue;  // (a failed factorization: NaN)
    Member* m = member_of(hs[i]);
    // (the factor's own pattern object: the same structure, maybe another
    // matrix type, as a factor made for `assume="spd"` read by a plain solve)
    if (m == nullptr || m->slot->pattern->n != c.p->n ||
        m->slot->pattern->nnz != c.p->nnz || m->slot->vtype != t)
      return ffi::Error::InvalidArgument("sciad cudss: a solve read a handle that is not a "
                                         "live factor of this pattern and type");
  }
  if (auto e = solve_members(c, stream, t, w, hs, static_cast<char*>(ax.untyped_data()),
                             static_cast<char*>(b.untyped_data()),
                             static_cast<char*>(x->untyped_data()), per, k, transpose, true);
      e.failure())
    return e;
  CUDA_TRY(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return ffi::Error::Success();
}

// ax: (L, nnz), b: (L, k, n) -> x: (L, k, n): factor, solve, give the factors
// back (NaN for a matrix whose factorization failed)
ffi::Error FactorSolve(cudaStream_t stream, uint64_t pattern, bool transpose, ffi::AnyBuffer ax,
                       ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> x) {
  std::lock_guard<std::mutex> lock(g_mu);
  Call c;
  if (auto e = begin(stream, pattern, &c); e.failure()) return e;
  cudaDataType_t t;
  size_t w;
  if (auto e = value_type(ax.element_type(), &t, &w); e.failure()) return e;
  int64_t L = c.p->nnz > 0 ? ax.element_count() / c.p->nnz : 0;
  int64_t per = L > 0 ? b.element_count() / L : 0;
  int64_t k = c.p->n > 0 ? per / c.p->n : 0;
  char* axp = static_cast<char*>(ax.untyped_data());
  char* bp = static_cast<char*>(b.untyped_data());
  char* xp = static_cast<char*>(x->untyped_data());
  std::vector<uint64_t> hs;
  if (auto e = factor_all(c, t, w, axp, L, &hs); e.failure()) return e;
  // (the factors were made here: a member solved apart from its batch, one
  // whose neighbour failed to factor, is not a fallback)
  ffi::Error result = solve_members(c, stream, t, w, hs, axp, bp, xp, per, k, transpose, false);
  for (uint64_t hv : hs) release_handle(hv);
  if (result.failure()) return result;
  CUDA_TRY(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return ffi::Error::Success();
}

// h: (L,) handles -> (L,) int32 zeros; counts each factor's slot down (back
// to its pool once all its factors are freed)
ffi::Error Free(cudaStream_t stream, ffi::AnyBuffer h, ffi::Result<ffi::AnyBuffer> token) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<uint64_t> hs;
  if (auto e = read_handles(stream, h, &hs); e.failure()) return e;
  for (uint64_t v : hs) release_handle(v);
  CUDA_TRY(cudaMemsetAsync(token->untyped_data(), 0, token->size_bytes(), stream),
           "cudaMemsetAsync");
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(sciad_cudss_factor, Factor,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Attr<uint64_t>("pattern")
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(sciad_cudss_solve, Solve,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Attr<uint64_t>("pattern")
                                  .Attr<bool>("transpose")
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(sciad_cudss_factor_solve, FactorSolve,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Attr<uint64_t>("pattern")
                                  .Attr<bool>("transpose")
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(sciad_cudss_free, Free,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

// --- plain C entry points (ctypes) ---

extern "C" {

// A pattern (CSR, int32, row offsets of n + 1 and column indices of nnz,
// copied) with cuDSS matrix type `mtype` (0 general, 1 symmetric, 3 SPD, as
// cudssMatrixType_t); kept for the life of the process. Needs no GPU.
uint64_t sciad_cudss_pattern(int64_t n, int64_t nnz, const int32_t* offsets,
                             const int32_t* cols, int mtype) {
  Pattern* p = new Pattern();
  p->n = n;
  p->nnz = nnz;
  p->offsets.assign(offsets, offsets + n + 1);
  p->cols.assign(cols, cols + nnz);
  p->mtype = static_cast<cudssMatrixType_t>(mtype);
  return reinterpret_cast<uint64_t>(p);
}

// Releases the factors `handles` (n of them) from the host: a failed check's
// release, for a program it stops before its own frees run. Handles that
// are 0, released already or stale are ignored.
void sciad_cudss_release(const uint64_t* handles, int64_t n) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (int64_t i = 0; i < n; ++i) release_handle(handles[i]);
}

// The number of numeric factors made and not yet freed (all patterns).
int64_t sciad_cudss_live_factors() { return g_live.load(); }

// The number of batch solves done one example at a time (a factorization
// each): members read apart from their batch, or a batch solve cuDSS refused.
int64_t sciad_cudss_batch_fallbacks() { return g_fallbacks.load(); }

// Turns uniform-batch mode on (1) or off (0) for the factorizations that
// run from now on (a benchmark's comparison; SCIAD_CUDSS_BATCH=0 at start);
// after cuDSS refused a batch factorization it stays off.
void sciad_cudss_set_batch(int on) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_batch_read = true;
  if (g_batch_refused) return;  // (stays off, and says why)
  g_batch_on = on != 0;
  g_batch_status = on != 0 ? "on" : "off: turned off (sciad_cudss_set_batch)";
}

// Whether uniform-batch mode is on: 1 on, 0 off; `why` (of `size` bytes, may
// be null) gets the reason, NUL-terminated.
int sciad_cudss_batch_status(char* why, int64_t size) {
  std::lock_guard<std::mutex> lock(g_mu);
  bool on = batch_on();
  if (why != nullptr && size > 0) {
    std::strncpy(why, g_batch_status.c_str(), static_cast<size_t>(size) - 1);
    why[size - 1] = '\0';
  }
  return on ? 1 : 0;
}

// The number of analysed cuDSS data objects the process holds (all pools).
int64_t sciad_cudss_pooled(uint64_t pattern) {
  std::lock_guard<std::mutex> lock(g_mu);
  Pattern* p = reinterpret_cast<Pattern*>(pattern);
  int64_t count = 0;
  for (auto& kv : p->devices) count += static_cast<int64_t>(kv.second.all.size());
  return count;
}

// cuDSS's version, major * 10000 + minor * 100 + patch (-1 if unknown).
// Needs no GPU: a check that the library loads and links.
int sciad_cudss_version() {
  int major = 0, minor = 0, patch = 0;
  if (cudssGetProperty(MAJOR_VERSION, &major) != CUDSS_STATUS_SUCCESS ||
      cudssGetProperty(MINOR_VERSION, &minor) != CUDSS_STATUS_SUCCESS ||
      cudssGetProperty(PATCH_LEVEL, &patch) != CUDSS_STATUS_SUCCESS)
    return -1;
  return major * 10000 + minor * 100 + patch;
}

}  // extern "C"
