// sciad's batch splitter: one XLA FFI handler (CPU) that runs another
// handler on slices of its leading batch axis, on several threads at once,
// and the table of factor handles that handler's calls go through.
//
// XLA:CPU runs a custom call on one thread, and a batch of independent
// factorizations in one call (KLU's kernels take a leading batch axis) uses
// one core. `sciad_batch_split` takes the inner handler's arguments plus one
// trailing int64[5] argument `(slot, mask, threads, harg, hmode)`:
//
// - `slot`: which inner handler (set once with `sciad_batch_set_inner`);
// - `mask`: bit i set where argument i carries the batch axis first (every
//   result does, with the same length);
// - `threads`: how many slices (1 calls the inner handler once);
// - `harg`, `hmode`: how the call meets the handle table (below): `hmode` 0,
//   none; 1 (`READ`), argument `harg` holds handles, passed to the inner
//   handler as the raw pointers they stand for (a stale one fails the call);
//   2 (`TAKE`), the same, each live handle's entry then ended (the inner
//   handler frees what it is given; a stale or repeated handle is passed as
//   0, which it skips; a 0 handle is refused by `READ`: a solve with no
//   factor); 3 (`MAKE`), the first result holds raw pointers the inner
//   handler made, each entered in the table and replaced by its handle; a
//   slice whose inner call failed (KLU's factorization of a singular matrix,
//   which frees what it made) gets 0 handles and the call succeeds: the
//   program judges a 0 handle (a check that names the node and the user's
//   line), where a failed call could only stop it with the kernel's text;
//   4 (`SOFT`), no handles: a slice whose inner call failed (KLU's one-call
//   factor and solve of a singular matrix) gets NaN results (float64 or
//   complex128) and the call succeeds, for the program's checks to judge.
//
// Each slice is the inner handler's own call frame: the same API, context,
// stage and attributes, its batched buffers offset and their leading
// dimension shortened. The calling thread runs the first slice, new threads
// the others (the calling thread runs a slice itself where a thread cannot
// start); the call returns when all are done, with the first slice's error
// (in slice order) where any failed. Only synchronous inner handlers (no
// `future`) are supported.
//
// The handle table. A compiled factorization (KLU's numeric object) is a raw
// pointer; a program holds a handle instead: `(generation << 32) | (index +
// 1)`, never 0 (0 means "no factor"). Ending an entry (`TAKE`, or
// `sciad_handles_take` from the host, where a failed check stops the program
// before its own frees run) bumps its generation, so a second release of the
// same handle, or a stale one after the entry was reused, finds no live
// entry and frees nothing: a repeated release is refused, never a double
// free.
//
// No Python API: loaded with ctypes by `sciad.solvers._batch_split`, which
// registers `sciad_batch_split` as an FFI target.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "xla/ffi/api/c_api.h"

namespace {

using Handler = XLA_FFI_Error* (*)(XLA_FFI_CallFrame*);

constexpr int kSlots = 64;
Handler g_inner[kSlots] = {};

XLA_FFI_Error* make_error(const XLA_FFI_Api* api, const char* message) {
  XLA_FFI_Error_Create_Args args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.message = message;
  args.errc = XLA_FFI_Error_Code_INVALID_ARGUMENT;
  return api->XLA_FFI_Error_Create(&args);
}

void destroy_error(const XLA_FFI_Api* api, XLA_FFI_Error* error) {
  XLA_FFI_Error_Destroy_Args args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
  args.error = error;
  api->XLA_FFI_Error_Destroy(&args);
}

size_t dtype_bytes(XLA_FFI_DataType t) {
  switch (t) {
    case XLA_FFI_DataType_PRED:
    case XLA_FFI_DataType_S8:
    case XLA_FFI_DataType_U8:
      return 1;
    case XLA_FFI_DataType_S16:
    case XLA_FFI_DataType_U16:
    case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16:
      return 2;
    case XLA_FFI_DataType_S32:
    case XLA_FFI_DataType_U32:
    case XLA_FFI_DataType_F32:
      return 4;
    case XLA_FFI_DataType_S64:
    case XLA_FFI_DataType_U64:
    case XLA_FFI_DataType_F64:
    case XLA_FFI_DataType_C64:
      return 8;
    case XLA_FFI_DataType_C128:
      return 16;
    default:
      return 0;
  }
}

// One buffer's slice: its own dims array (the leading one shortened).
struct Slice {
  XLA_FFI_Buffer buffer;
  std::vector<int64_t> dims;
};

// The buffers of one slice, and the frame that points to them.
struct SliceFrame {
  std::vector<Slice> args, rets;
  std::vector<void*> arg_ptrs, ret_ptrs;
  XLA_FFI_CallFrame frame;
};

// Fills `out` with buffer `b` sliced to rows [start, start + count) of its
// leading axis of length `total` (the whole buffer where not batched).
bool slice_buffer(const XLA_FFI_Buffer* b, bool batched, int64_t total, int64_t start,
                  int64_t count, Slice* out) {
  out->buffer = *b;
  out->dims.assign(b->dims, b->dims + b->rank);
  if (batched) {
    if (b->rank < 1 || b->dims[0] != total) return false;
    size_t elem = dtype_bytes(b->dtype);
    if (elem == 0) return false;
    int64_t row = 1;
    for (int64_t i = 1; i < b->rank; ++i) row *= b->dims[i];
    out->buffer.data = static_cast<char*>(b->data) + start * row * elem;
    out->dims[0] = count;
  }
  out->buffer.dims = out->dims.data();
  return true;
}


// --- the handle table ---

enum HandleMode : int64_t { kNone = 0, kRead = 1, kTake = 2, kMake = 3, kSoft = 4 };

struct Entry {
  uint64_t raw = 0;  // (0: a free entry)
  uint32_t generation = 1;
};

std::mutex g_table_lock;
std::vector<Entry> g_table;
std::vector<uint32_t> g_vacant;
int64_t g_live = 0;

uint64_t handle_of(uint32_t index, uint32_t generation) {
  return (static_cast<uint64_t>(generation) << 32) | (static_cast<uint64_t>(index) + 1);
}

// The entry `h` stands for where it is live, else nullptr (lock held).
Entry* live_entry(uint64_t h) {
  const uint64_t low = h & 0xffffffffu;
  if (low == 0 || low > g_table.size()) return nullptr;
  Entry& e = g_table[low - 1];
  if (e.raw == 0 || e.generation != static_cast<uint32_t>(h >> 32)) return nullptr;
  return &e;
}

// Enters `raw` (not 0) and returns its handle (lock held).
uint64_t put(uint64_t raw) {
  uint32_t index;
  if (!g_vacant.empty()) {
    index = g_vacant.back();
    g_vacant.pop_back();
  } else {
    index = static_cast<uint32_t>(g_table.size());
    g_table.emplace_back();
  }
  g_table[index].raw = raw;
  ++g_live;
  return handle_of(index, g_table[index].generation);
}

// The raw pointer of live handle `h`, ending its entry; 0 where `h` is 0,
// stale or repeated (lock held).
uint64_t take(uint64_t h) {
  Entry* e = live_entry(h);
  if (e == nullptr) return 0;
  const uint64_t raw = e->raw;
  e->raw = 0;
  if (++e->generation == 0) e->generation = 1;
  g_vacant.push_back(static_cast<uint32_t>(e - g_table.data()));
  --g_live;
  return raw;
}

size_t elements(const XLA_FFI_Buffer* b) {
  size_t n = 1;
  for (int64_t i = 0; i < b->rank; ++i) n *= static_cast<size_t>(b->dims[i]);
  return n;
}

}  // namespace

extern "C" {

// Sets the inner handler of `slot` (0 <= slot < 64); returns 0 on success.
int sciad_batch_set_inner(int slot, void* handler) {
  if (slot < 0 || slot >= kSlots) return 1;
  g_inner[slot] = reinterpret_cast<Handler>(handler);
  return 0;
}

XLA_FFI_Error* sciad_batch_split(XLA_FFI_CallFrame* call) {
  const XLA_FFI_Api* api = call->api;
  if (call->extension_start != nullptr &&
      call->extension_start->type == XLA_FFI_Extension_Metadata) {
    auto* ext = reinterpret_cast<XLA_FFI_Metadata_Extension*>(call->extension_start);
    ext->metadata->api_version = XLA_FFI_Api_Version{XLA_FFI_Api_Version_STRUCT_SIZE, nullptr,
                                                     XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR};
    ext->metadata->traits = 0;
    return nullptr;
  }
  if (call->stage != XLA_FFI_ExecutionStage_EXECUTE) return nullptr;

  const int64_t nargs = call->args.size - 1;
  if (nargs < 0 || call->args.types[nargs] != XLA_FFI_ArgType_BUFFER)
    return make_error(api, "sciad_batch_split: no trailing (slot, mask, threads, harg, "
                           "hmode) argument");
  auto* ctl = static_cast<XLA_FFI_Buffer*>(call->args.args[nargs]);
  if (ctl->dtype != XLA_FFI_DataType_S64 || ctl->rank != 1 || ctl->dims[0] != 5)
    return make_error(api, "sciad_batch_split: the trailing argument is not int64[5]");
  const int64_t* c = static_cast<const int64_t*>(ctl->data);
  const int64_t slot = c[0], mask = c[1], harg = c[3], hmode = c[4];
  int64_t threads = c[2];
  if (slot < 0 || slot >= kSlots || g_inner[slot] == nullptr)
    return make_error(api, "sciad_batch_split: no inner handler in this slot");
  Handler inner = g_inner[slot];
  if (call->rets.size < 1 || call->rets.types[0] != XLA_FFI_RetType_BUFFER)
    return make_error(api, "sciad_batch_split: no result buffer");
  const int64_t total = static_cast<XLA_FFI_Buffer*>(call->rets.rets[0])->dims[0];
  if (threads > total) threads = total;
  if (threads < 1) threads = 1;
  if (hmode < kNone || hmode > kSoft ||
      ((hmode == kRead || hmode == kTake) && (harg < 0 || harg >= nargs)))
    return make_error(api, "sciad_batch_split: a bad handle mode");

  // (READ / TAKE: the handles' raw pointers, in a buffer of their own)
  XLA_FFI_Buffer raw_arg;
  std::vector<uint64_t> raws;
  if (hmode == kRead || hmode == kTake) {
    if (call->args.types[harg] != XLA_FFI_ArgType_BUFFER)
      return make_error(api, "sciad_batch_split: the handle argument is not a buffer");
    const auto* hb = static_cast<const XLA_FFI_Buffer*>(call->args.args[harg]);
    if (hb->dtype != XLA_FFI_DataType_U64)
      return make_error(api, "sciad_batch_split: the handle argument is not uint64");
    const size_t n = elements(hb);
    const auto* hs = static_cast<const uint64_t*>(hb->data);
    raws.assign(n + 1, 0);  // (one more: a valid pointer where n is 0)
    std::lock_guard<std::mutex> hold(g_table_lock);
    for (size_t i = 0; i < n; ++i) {
      if (hs[i] == 0) {
        if (hmode == kRead)
          return make_error(api, "sciad_batch_split: a solve was given no factor (its "
                                 "factorization failed: the matrix is singular)");
        continue;
      }
      if (hmode == kTake) {
        raws[i] = take(hs[i]);
        continue;
      }
      Entry* e = live_entry(hs[i]);
      if (e == nullptr)
        return make_error(api, "sciad: a factor handle was read after its release (a "
                               "failed check released the program's factors, or a bug in "
                               "sciad)");
      raws[i] = e->raw;
    }
    raw_arg = *hb;
    raw_arg.data = raws.data();
  }

  // (rows [start, start + count) of the batch: the inner handler's frame)
  auto build = [&](int64_t start, int64_t count, SliceFrame& f) -> const char* {
    f.args.resize(nargs);
    f.rets.resize(call->rets.size);
    for (int64_t i = 0; i < nargs; ++i) {
      if (call->args.types[i] != XLA_FFI_ArgType_BUFFER)
        return "sciad_batch_split: an argument is not a buffer";
      const auto* b = (hmode == kRead || hmode == kTake) && i == harg
                          ? &raw_arg : static_cast<XLA_FFI_Buffer*>(call->args.args[i]);
      if (!slice_buffer(b, (mask >> i) & 1, total, start, count, &f.args[i]))
        return "sciad_batch_split: a batched argument does not lead with the batch axis";
    }
    for (int64_t i = 0; i < call->rets.size; ++i) {
      if (call->rets.types[i] != XLA_FFI_RetType_BUFFER ||
          !slice_buffer(static_cast<XLA_FFI_Buffer*>(call->rets.rets[i]), true, total, start,
                        count, &f.rets[i]))
        return "sciad_batch_split: a result does not lead with the batch axis";
    }
    f.arg_ptrs.clear();
    f.ret_ptrs.clear();
    for (auto& s : f.args) f.arg_ptrs.push_back(&s.buffer);
    for (auto& s : f.rets) f.ret_ptrs.push_back(&s.buffer);
    f.frame = *call;
    f.frame.extension_start = nullptr;
    f.frame.args.size = nargs;
    f.frame.args.args = f.arg_ptrs.data();
    f.frame.rets.rets = f.ret_ptrs.data();
    f.frame.future = nullptr;
    return nullptr;
  };
  std::vector<SliceFrame> frames(threads);
  std::vector<int64_t> starts(threads + 1);
  for (int64_t t = 0; t <= threads; ++t) starts[t] = total * t / threads;
  for (int64_t t = 0; t < threads; ++t) {
    if (const char* bad = build(starts[t], starts[t + 1] - starts[t], frames[t]))
      return make_error(api, bad);
  }

  // (a failed item's results: 0 handles where it makes them, else NaN)
  auto fail_results = [&](SliceFrame& f) {
    for (Slice& r : f.rets) {
      const XLA_FFI_Buffer& b = r.buffer;
      size_t n = elements(&b);
      if (hmode == kMake || (b.dtype != XLA_FFI_DataType_F64 &&
                             b.dtype != XLA_FFI_DataType_C128)) {
        std::memset(b.data, 0, n * dtype_bytes(b.dtype));
        continue;
      }
      if (b.dtype == XLA_FFI_DataType_C128) n *= 2;
      std::fill_n(static_cast<double*>(b.data), n, std::numeric_limits<double>::quiet_NaN());
    }
  };
  std::vector<XLA_FFI_Error*> errors(threads, nullptr);
  std::vector<std::thread> workers;
  workers.reserve(threads - 1);
  int64_t inline_from = threads;  // (slices no thread could take: run here)
  for (int64_t t = 1; t < threads; ++t) {
    try {
      workers.emplace_back([&, t] { errors[t] = inner(&frames[t].frame); });
    } catch (...) {
      inline_from = t;
      break;
    }
  }
  errors[0] = inner(&frames[0].frame);
  for (int64_t t = inline_from; t < threads; ++t) errors[t] = inner(&frames[t].frame);
  for (auto& w : workers) w.join();

  if (hmode == kMake || hmode == kSoft) {
    // (a failed slice, which freed what it made: its items again one by one,
    // where it has more than one, so that only a failed item's results are 0
    // handles, or NaN)
    for (int64_t t = 0; t < threads; ++t) {
      if (errors[t] == nullptr) continue;
      destroy_error(api, errors[t]);
      errors[t] = nullptr;
      const int64_t count = starts[t + 1] - starts[t];
      for (int64_t j = 0; j < count; ++j) {
        SliceFrame one;
        if (count > 1) {
          if (build(starts[t] + j, 1, one) != nullptr) continue;  // (built once already)
          XLA_FFI_Error* e = inner(&one.frame);
          if (e == nullptr) continue;
          destroy_error(api, e);
        }
        fail_results(count > 1 ? one : frames[t]);
      }
    }
  }
  XLA_FFI_Error* first = nullptr;
  for (int64_t t = 0; t < threads; ++t) {
    if (errors[t] == nullptr && frames[t].frame.future != nullptr && first == nullptr)
      first = make_error(api, "sciad_batch_split: the inner handler is asynchronous");
    if (errors[t] == nullptr) continue;
    if (first == nullptr) {
      first = errors[t];
    } else {
      destroy_error(api, errors[t]);
    }
  }
  if (first == nullptr && hmode == kMake) {  // (enter the factors made)
    auto* made = static_cast<XLA_FFI_Buffer*>(call->rets.rets[0]);
    if (made->dtype != XLA_FFI_DataType_U64)
      return make_error(api, "sciad_batch_split: the made handles are not uint64");
    auto* hs = static_cast<uint64_t*>(made->data);
    std::lock_guard<std::mutex> hold(g_table_lock);
    for (size_t i = 0, n = elements(made); i < n; ++i)
      if (hs[i] != 0) hs[i] = put(hs[i]);
  }
  return first;
}

// Ends the live entries among the `n` handles `hs` and writes their raw
// pointers to `raws` (0 for a handle that is 0, stale or repeated), for the
// caller to free: the host's release of a failed program's factors.
void sciad_handles_take(const uint64_t* hs, int64_t n, uint64_t* raws) {
  std::lock_guard<std::mutex> hold(g_table_lock);
  for (int64_t i = 0; i < n; ++i) raws[i] = hs[i] == 0 ? 0 : take(hs[i]);
}

// How many handles are live (made and not yet released).
int64_t sciad_handles_live() {
  std::lock_guard<std::mutex> hold(g_table_lock);
  return g_live;
}

}  // extern "C"
